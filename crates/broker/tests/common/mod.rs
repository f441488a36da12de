//! In-process harness: a broker on an ephemeral port and a raw MQTT client on tern-wire.
//! Works under `tokio::time::pause()` (the runtime auto-advances the clock when idle).
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tern_broker::{Broker, BrokerConfig};
use tern_wire::{
    Ack, ConnAck, Connect, Packet, Properties, PropertyValues, Protocol, Publish, QoS, ReasonCode,
    Str, Subscribe, SubscriptionOptions, Will, decode, encode,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

pub struct TestBroker {
    pub addr: SocketAddr,
    pub broker: Broker,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl TestBroker {
    pub async fn start(config: BrokerConfig) -> TestBroker {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let broker = Broker::new(config).unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let serving = broker.clone();
        let task = tokio::spawn(async move {
            serving
                .serve(listener, async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        TestBroker {
            addr,
            broker,
            stop: Some(stop),
            task,
        }
    }

    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}

pub fn config() -> BrokerConfig {
    BrokerConfig {
        sys_interval_s: 0,
        ..BrokerConfig::default()
    }
}

pub fn s(text: &str) -> Str {
    Str::copy_from(text).unwrap()
}

pub fn connect_packet(protocol: Protocol, id: &str, clean: bool, keep_alive_s: u16) -> Connect {
    Connect {
        protocol,
        clean_start: clean,
        keep_alive_s,
        properties: Properties::default(),
        client_id: s(id),
        will: None,
        username: None,
        password: None,
    }
}

pub fn will(topic: &str, payload: &'static [u8], delay_s: Option<u32>) -> Will {
    Will {
        topic: s(topic),
        payload: Bytes::from_static(payload),
        qos: QoS::AtLeastOnce,
        retain: false,
        properties: PropertyValues {
            will_delay_interval_s: delay_s,
            ..PropertyValues::default()
        }
        .into(),
    }
}

pub fn publish(topic: &str, payload: &'static [u8], qos: u8, packet_id: u16) -> Publish {
    Publish {
        dup: false,
        qos: QoS::from_u8(qos).unwrap(),
        retain: false,
        topic: s(topic),
        packet_id,
        properties: Properties::default(),
        payload: Bytes::from_static(payload),
    }
}

pub fn ack(packet_id: u16) -> Ack {
    Ack {
        packet_id,
        reason: ReasonCode::SUCCESS,
        properties: Properties::default(),
    }
}

pub struct Client {
    pub stream: TcpStream,
    pub protocol: Protocol,
    buf: BytesMut,
    /// PUBRELs expected for QoS 2 messages we sent PUBREC for.
    pubrels_due: usize,
}

/// Longest wait for one expected packet (virtual time under pause).
pub const WAIT: Duration = Duration::from_secs(30);

impl Client {
    pub async fn open(addr: SocketAddr, protocol: Protocol) -> Client {
        Client {
            stream: TcpStream::connect(addr).await.unwrap(),
            protocol,
            buf: BytesMut::new(),
            pubrels_due: 0,
        }
    }

    pub async fn connect(addr: SocketAddr, connect: Connect) -> (Client, ConnAck) {
        let mut client = Client::open(addr, connect.protocol).await;
        client.send(&Packet::Connect(Box::new(connect))).await;
        match client.recv().await {
            Some(Packet::ConnAck(ca)) => (client, ca),
            other => panic!("expected CONNACK, got {other:?}"),
        }
    }

    pub async fn v5(addr: SocketAddr, id: &str) -> Client {
        let (c, ca) = Client::connect(addr, connect_packet(Protocol::V5, id, true, 0)).await;
        assert_eq!(ca.reason, ReasonCode::SUCCESS);
        c
    }

    pub async fn send(&mut self, packet: &Packet) {
        let mut out = BytesMut::new();
        encode(packet, self.protocol, &mut out).unwrap();
        self.stream.write_all(&out).await.unwrap();
    }

    /// Next packet, or `None` once the broker closed the connection.
    pub async fn recv(&mut self) -> Option<Packet> {
        tokio::time::timeout(WAIT, self.recv_forever())
            .await
            .expect("no packet within WAIT")
    }

    pub async fn recv_forever(&mut self) -> Option<Packet> {
        loop {
            if let Some(p) = decode(&mut self.buf, self.protocol, u32::MAX).unwrap() {
                return Some(p);
            }
            let n = self.stream.read_buf(&mut self.buf).await.unwrap_or(0);
            if n == 0 {
                return None;
            }
        }
    }

    /// Nothing arrives within `window` (virtual time).
    pub async fn expect_silence(&mut self, window: Duration) {
        if let Ok(p) = tokio::time::timeout(window, self.recv_forever()).await {
            panic!("expected silence, got {p:?}");
        }
    }

    pub async fn subscribe(&mut self, filter: &str, qos: u8) {
        self.send(&Packet::Subscribe(Subscribe {
            packet_id: 1,
            properties: Properties::default(),
            filters: vec![(
                s(filter),
                SubscriptionOptions {
                    qos: QoS::from_u8(qos).unwrap(),
                    ..SubscriptionOptions::default()
                },
            )],
        }))
        .await;
        match self.recv().await {
            Some(Packet::SubAck(_)) => {}
            other => panic!("expected SUBACK, got {other:?}"),
        }
    }

    /// Next PUBLISH; PUBRELs for earlier PUBRECs met on the way are answered with PUBCOMP.
    pub async fn expect_publish(&mut self) -> Publish {
        loop {
            match self.recv().await {
                Some(Packet::Publish(p)) => return p,
                Some(Packet::PubRel(a)) if self.pubrels_due > 0 => {
                    self.pubrels_due -= 1;
                    self.send(&Packet::PubComp(ack(a.packet_id))).await;
                }
                other => panic!("expected PUBLISH, got {other:?}"),
            }
        }
    }

    /// Notes that a PUBREL is due for `packet_id` (answered by [`Client::expect_publish`] or
    /// [`Client::finish_pubrels`]).
    pub fn pending_pubrel(&mut self, _packet_id: u16) {
        self.pubrels_due += 1;
    }

    /// Answers every PUBREL still due.
    pub async fn finish_pubrels(&mut self) {
        while self.pubrels_due > 0 {
            match self.recv().await {
                Some(Packet::PubRel(a)) => {
                    self.pubrels_due -= 1;
                    self.send(&Packet::PubComp(ack(a.packet_id))).await;
                }
                other => panic!("expected PUBREL, got {other:?}"),
            }
        }
    }

    pub async fn expect_disconnect(&mut self) -> ReasonCode {
        match self.recv().await {
            Some(Packet::Disconnect(d)) => d.reason,
            other => panic!("expected DISCONNECT, got {other:?}"),
        }
    }

    pub async fn expect_closed(&mut self) {
        loop {
            match self.recv().await {
                None => return,
                Some(Packet::Disconnect(_)) => continue,
                Some(other) => panic!("expected close, got {other:?}"),
            }
        }
    }
}
