//! A subscriber that stops reading (ARCHITECTURE §2.7): QoS 0 beyond the outbound limits is
//! dropped and counted, and once its queue stayed full past `slow_subscriber_timeout_ms` it is
//! disconnected (v5 0x97), while the publisher is never blocked and a fast subscriber of the
//! same topic receives everything. QoS 1 over the limits is kept for the session (the hand-off
//! to the session queue / store cursor) and delivered once the subscriber catches up.

mod common;

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use common::*;
use tern_broker::__internal::Counter;
use tern_wire::{Packet, Protocol, ReasonCode, decode, encode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const PAYLOAD_BYTES: usize = 1024;
const PER_ROUND: u16 = 40;

/// A v5 subscriber with a tiny receive buffer: CONNECT, SUBSCRIBE, wait for both acks, then it
/// reads nothing until the test says so.
async fn stalled_subscriber(
    addr: std::net::SocketAddr,
    id: &str,
    qos: u8,
    receive_maximum: Option<u16>,
) -> (TcpStream, BytesMut) {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket.connect(addr).await.unwrap();
    let mut connect = connect_packet(Protocol::V5, id, true, 0);
    connect.properties.receive_maximum = receive_maximum;
    let mut out = BytesMut::new();
    encode(&Packet::Connect(Box::new(connect)), Protocol::V5, &mut out).unwrap();
    let sub = tern_wire::Subscribe {
        packet_id: 1,
        properties: Default::default(),
        filters: vec![(
            s("slow/t"),
            tern_wire::SubscriptionOptions {
                qos: tern_wire::QoS::from_u8(qos).unwrap(),
                ..Default::default()
            },
        )],
    };
    encode(&Packet::Subscribe(sub), Protocol::V5, &mut out).unwrap();
    stream.write_all(&out).await.unwrap();
    let mut buf = BytesMut::new();
    let mut acks = 0;
    while acks < 2 {
        stream.read_buf(&mut buf).await.unwrap();
        while let Some(p) = decode(&mut buf, Protocol::V5, u32::MAX).unwrap() {
            assert!(matches!(p, Packet::ConnAck(_) | Packet::SubAck(_)));
            acks += 1;
        }
    }
    (stream, buf)
}

/// Payload: sequence number (8 bytes, big endian), padded to `PAYLOAD_BYTES`.
fn payload(seq: u64) -> Bytes {
    let mut b = BytesMut::with_capacity(PAYLOAD_BYTES);
    b.put_u64(seq);
    b.resize(PAYLOAD_BYTES, b'x');
    b.freeze()
}

/// One round of QoS 1 PUBLISHes, then their PUBACKs: the publisher completes a round only if
/// the broker accepted every message of it.
async fn publish_round(p: &mut Client, next_seq: &mut u64) {
    for id in 1..=PER_ROUND {
        let mut m = publish("slow/t", b"", 1, id);
        m.payload = payload(*next_seq);
        *next_seq += 1;
        p.send(&Packet::Publish(m)).await;
    }
    for _ in 0..PER_ROUND {
        match p.recv().await {
            Some(Packet::PubAck(a)) => assert_eq!(a.reason, ReasonCode::SUCCESS),
            other => panic!("publisher expected PUBACK, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn slow_subscriber_is_dropped_then_disconnected_while_the_fast_one_gets_everything() {
    let mut cfg = config();
    cfg.outbound_queue_max_bytes = 64 * 1024;
    cfg.slow_subscriber_timeout_ms = 100;
    let b = TestBroker::start(cfg).await;
    let shared = b.broker.shared().clone();

    let (mut slow, mut slow_buf) = stalled_subscriber(b.addr, "slow", 0, None).await;
    // The fast subscriber reads at full speed in its own task and checks order and gaps.
    let mut fast = Client::v5(b.addr, "fast").await;
    fast.subscribe("slow/t", 0).await;
    let fast_reader = tokio::spawn(async move {
        let mut next = 0u64;
        loop {
            let p = fast.expect_publish().await;
            let seq = u64::from_be_bytes(p.payload[..8].try_into().unwrap());
            assert_eq!(
                seq, next,
                "fast subscriber: nothing lost, nothing reordered"
            );
            next += 1;
            if p.payload.len() == 8 {
                return next;
            }
        }
    });

    // The publisher completes round after round (each acknowledged) while the slow subscriber
    // reads nothing, until the broker gives up on the slow one (kernel socket buffers absorb
    // the first megabytes, then its 64 KiB queue fills, then 100 ms pass).
    let mut p = Client::v5(b.addr, "pub").await;
    let mut next_seq = 0u64;
    let mut rounds = 0;
    while shared.sessions().get("slow").is_some() {
        rounds += 1;
        assert!(rounds < 5_000, "slow subscriber never disconnected");
        publish_round(&mut p, &mut next_seq).await;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // And it goes on at the same pace after the slow one left.
    for _ in 0..5 {
        publish_round(&mut p, &mut next_seq).await;
    }
    let mut end = publish("slow/t", b"", 1, 1);
    end.payload = Bytes::copy_from_slice(&next_seq.to_be_bytes());
    next_seq += 1;
    p.send(&Packet::Publish(end)).await;
    assert!(matches!(p.recv().await, Some(Packet::PubAck(_))));

    let fast_received = tokio::time::timeout(WAIT, fast_reader)
        .await
        .expect("fast subscriber did not get everything")
        .unwrap();
    assert_eq!(
        fast_received, next_seq,
        "the fast subscriber got every message"
    );

    // The slow subscriber, reading at last, gets what was buffered, then DISCONNECT 0x97.
    let mut slow_received = 0u64;
    let last = tokio::time::timeout(WAIT, async {
        let mut last = None;
        loop {
            match slow.read_buf(&mut slow_buf).await {
                Ok(0) | Err(_) => return last,
                Ok(_) => {
                    while let Ok(Some(p)) = decode(&mut slow_buf, Protocol::V5, u32::MAX) {
                        if matches!(p, Packet::Publish(_)) {
                            slow_received += 1;
                        }
                        last = Some(p);
                    }
                }
            }
        }
    })
    .await
    .expect("slow subscriber still connected");
    match last {
        Some(Packet::Disconnect(d)) => assert_eq!(d.reason, ReasonCode::QUOTA_EXCEEDED),
        other => panic!("expected DISCONNECT 0x97 last, got {other:?}"),
    }

    // The publisher was never held to the slow subscriber's pace: it completed many more
    // messages than the slow one ever received, and the counters say why.
    assert!(
        slow_received + 64 < next_seq,
        "slow got {slow_received} of {next_seq}"
    );
    let dropped = shared.metrics().count(Counter::MessagesDroppedQueueFull);
    assert!(dropped > 0, "QoS 0 over the limit is dropped and counted");
    assert_eq!(shared.metrics().count(Counter::MessagesDropped), dropped);
    assert_eq!(
        shared.metrics().count(Counter::SlowSubscribersDisconnected),
        1,
        "the slow subscriber, and only it, was disconnected"
    );
}

/// QoS 1 beyond the outbound limits is not dropped: it stays queued for the session (the
/// durable store keeps it for persistent sessions) and arrives, in order, as the subscriber
/// catches up; a queue that drains before `slow_subscriber_timeout_ms` costs no disconnect.
#[tokio::test]
async fn qos1_over_the_limit_waits_and_is_delivered_as_the_subscriber_catches_up() {
    let mut cfg = config();
    cfg.outbound_queue_max_bytes = 16 * 1024;
    cfg.slow_subscriber_timeout_ms = 60_000;
    let b = TestBroker::start(cfg).await;
    let shared = b.broker.shared().clone();
    // Receive Maximum 10: at most 10 in flight, everything else waits in the queue.
    let (slow, buf) = stalled_subscriber(b.addr, "slow1", 1, Some(10)).await;

    let mut p = Client::v5(b.addr, "pub1").await;
    let mut next_seq = 0u64;
    for _ in 0..10 {
        publish_round(&mut p, &mut next_seq).await;
    }
    // 400 KiB queued against a 16 KiB limit, the publisher done.
    assert!(shared.metrics().count(Counter::MessagesDropped) == 0);

    let mut slow = slow;
    let mut buf = buf;
    let mut expected = 0u64;
    tokio::time::timeout(WAIT, async {
        while expected < next_seq {
            while let Some(packet) = decode(&mut buf, Protocol::V5, u32::MAX).unwrap() {
                let Packet::Publish(m) = packet else {
                    panic!("expected PUBLISH, got {packet:?}");
                };
                let seq = u64::from_be_bytes(m.payload[..8].try_into().unwrap());
                assert_eq!(seq, expected, "in order, none lost");
                expected += 1;
                let mut out = BytesMut::new();
                encode(&Packet::PubAck(ack(m.packet_id)), Protocol::V5, &mut out).unwrap();
                slow.write_all(&out).await.unwrap();
            }
            if expected < next_seq {
                assert!(slow.read_buf(&mut buf).await.unwrap() > 0, "closed early");
            }
        }
    })
    .await
    .expect("the slow subscriber never caught up");
    assert_eq!(shared.metrics().count(Counter::MessagesDropped), 0);
    assert_eq!(
        shared.metrics().count(Counter::SlowSubscribersDisconnected),
        0
    );
}
