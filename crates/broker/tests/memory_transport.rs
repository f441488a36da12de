//! A whole MQTT session over the in-memory transport (`tern_broker::duplex`): no
//! socket, the path the simulator (issue 12) will use.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tern_broker::{Broker, BrokerConfig};
use tern_broker::{ConnectionInfo, ListenerContext, TransportKind, duplex};
use tern_wire::{
    Ack, Connect, Packet, Properties, Protocol, Publish, QoS, ReasonCode, Str, Subscribe,
    SubscriptionOptions, decode, encode,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::watch;

const WAIT: Duration = Duration::from_secs(10);

struct MemClient {
    stream: DuplexStream,
    buf: BytesMut,
}

impl MemClient {
    /// A client whose connection runs on the broker through a duplex.
    fn open(
        broker: &Broker,
        stop: &watch::Receiver<bool>,
    ) -> (MemClient, tokio::task::JoinHandle<()>) {
        let (server, client) = duplex();
        let listener =
            std::sync::Arc::new(ListenerContext::new(0, "memory", TransportKind::Memory));
        let peer: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let broker = broker.clone();
        let stop = stop.clone();
        let task = tokio::spawn(async move {
            broker
                .run_connection(server, ConnectionInfo::new(listener, peer), stop)
                .await;
        });
        (
            MemClient {
                stream: client,
                buf: BytesMut::new(),
            },
            task,
        )
    }

    async fn send(&mut self, packet: &Packet) {
        let mut out = BytesMut::new();
        encode(packet, Protocol::V5, &mut out).unwrap();
        self.stream.write_all(&out).await.unwrap();
    }

    async fn recv(&mut self) -> Option<Packet> {
        tokio::time::timeout(WAIT, async {
            loop {
                if let Some(p) = decode(&mut self.buf, Protocol::V5, u32::MAX).unwrap() {
                    return Some(p);
                }
                if self.stream.read_buf(&mut self.buf).await.unwrap_or(0) == 0 {
                    return None;
                }
            }
        })
        .await
        .expect("no packet in time")
    }

    async fn connect(&mut self, id: &str) {
        self.send(&Packet::Connect(Box::new(Connect {
            protocol: Protocol::V5,
            clean_start: true,
            keep_alive_s: 0,
            properties: Properties::default(),
            client_id: Str::copy_from(id).unwrap(),
            will: None,
            username: None,
            password: None,
        })))
        .await;
        match self.recv().await {
            Some(Packet::ConnAck(ack)) => assert_eq!(ack.reason, ReasonCode::SUCCESS),
            other => panic!("expected CONNACK, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_subscribe_over_the_memory_transport() {
    let broker = Broker::new(BrokerConfig {
        sys_interval_s: 0,
        ..BrokerConfig::default()
    })
    .unwrap();
    let (stop_tx, stop) = watch::channel(false);
    let (mut sub, sub_task) = MemClient::open(&broker, &stop);
    let (mut publisher, pub_task) = MemClient::open(&broker, &stop);
    sub.connect("mem-sub").await;
    publisher.connect("mem-pub").await;

    sub.send(&Packet::Subscribe(Subscribe {
        packet_id: 1,
        properties: Properties::default(),
        filters: vec![(
            Str::copy_from("mem/#").unwrap(),
            SubscriptionOptions {
                qos: QoS::AtLeastOnce,
                ..SubscriptionOptions::default()
            },
        )],
    }))
    .await;
    assert!(matches!(sub.recv().await, Some(Packet::SubAck(_))));

    // Several packets in one write, and one packet split over two writes.
    let mut bytes = BytesMut::new();
    for (i, payload) in [&b"one"[..], b"two", b"three"].into_iter().enumerate() {
        let publish = Packet::Publish(Publish {
            dup: false,
            qos: QoS::AtLeastOnce,
            retain: false,
            topic: Str::copy_from("mem/t").unwrap(),
            packet_id: i as u16 + 1,
            properties: Properties::default(),
            payload: Bytes::copy_from_slice(payload),
        });
        encode(&publish, Protocol::V5, &mut bytes).unwrap();
    }
    let split = bytes.len() - 4;
    publisher.stream.write_all(&bytes[..split]).await.unwrap();
    publisher.stream.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    publisher.stream.write_all(&bytes[split..]).await.unwrap();

    for id in 1..=3 {
        match publisher.recv().await {
            Some(Packet::PubAck(ack)) => assert_eq!(ack.packet_id, id),
            other => panic!("expected PUBACK {id}, got {other:?}"),
        }
    }
    for expected in [&b"one"[..], b"two", b"three"] {
        match sub.recv().await {
            Some(Packet::Publish(p)) => {
                assert_eq!(&p.payload[..], expected);
                sub.send(&Packet::PubAck(Ack {
                    packet_id: p.packet_id,
                    reason: ReasonCode::SUCCESS,
                    properties: Properties::default(),
                }))
                .await;
            }
            other => panic!("expected PUBLISH, got {other:?}"),
        }
    }

    // A client DISCONNECT ends its connection task; shutdown ends the other.
    publisher
        .send(&Packet::Disconnect(tern_wire::Disconnect {
            reason: ReasonCode::SUCCESS,
            properties: Properties::default(),
        }))
        .await;
    assert!(publisher.recv().await.is_none());
    pub_task.await.unwrap();
    stop_tx.send(true).unwrap();
    match sub.recv().await {
        Some(Packet::Disconnect(d)) => assert_eq!(d.reason, ReasonCode::SERVER_SHUTTING_DOWN),
        other => panic!("expected DISCONNECT 0x8B, got {other:?}"),
    }
    sub_task.await.unwrap();
}

/// A subscriber that reads only once the broker's write to it is blocked still receives
/// everything: a stream transport keeps the bytes the stream did not take (here the tail of
/// the second message, copied whole into its write buffer), and the connection finishes that
/// write when the stream takes more, with nothing new queued to wake it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_stream_write_resumes_when_the_reader_catches_up() {
    // The first fills most of the duplex's 64 KiB; the second does not fit behind it.
    const PAYLOADS: [usize; 2] = [60_000, 10_000];
    let broker = Broker::new(BrokerConfig {
        sys_interval_s: 0,
        ..BrokerConfig::default()
    })
    .unwrap();
    let (_stop_tx, stop) = watch::channel(false);
    let (mut sub, _sub_task) = MemClient::open(&broker, &stop);
    let (mut publisher, _pub_task) = MemClient::open(&broker, &stop);
    sub.connect("slow-sub").await;
    publisher.connect("fast-pub").await;
    sub.send(&Packet::Subscribe(Subscribe {
        packet_id: 1,
        properties: Properties::default(),
        filters: vec![(
            Str::copy_from("slow/#").unwrap(),
            SubscriptionOptions::default(),
        )],
    }))
    .await;
    assert!(matches!(sub.recv().await, Some(Packet::SubAck(_))));

    for (i, len) in PAYLOADS.into_iter().enumerate() {
        let publish = Packet::Publish(Publish {
            dup: false,
            qos: QoS::AtMostOnce,
            retain: false,
            topic: Str::copy_from("slow/t").unwrap(),
            packet_id: 0,
            properties: Properties::default(),
            payload: Bytes::from(vec![i as u8; len]),
        });
        publisher.send(&publish).await;
        // Each message is its own batch: the second one's write blocks.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    for (i, len) in PAYLOADS.into_iter().enumerate() {
        match sub.recv().await {
            Some(Packet::Publish(p)) => {
                assert_eq!(p.payload.len(), len);
                assert_eq!(p.payload[0], i as u8, "in order");
            }
            other => panic!("expected PUBLISH {i}, got {other:?}"),
        }
    }
}
