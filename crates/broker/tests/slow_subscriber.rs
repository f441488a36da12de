//! A subscriber that stops reading: QoS 0 beyond the outbound limits is dropped and counted,
//! and once its queue stayed full past `slow_subscriber_timeout_ms` it is disconnected, while
//! the publisher is never blocked.

mod common;

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use common::*;
use tern_broker::metrics::Metrics;
use tern_wire::{Packet, Protocol, decode, encode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;

#[tokio::test]
async fn slow_subscriber_is_dropped_and_then_disconnected() {
    let mut cfg = config();
    cfg.outbound_queue_max_bytes = 16 * 1024;
    cfg.slow_subscriber_timeout_ms = 100;
    let b = TestBroker::start(cfg).await;

    // A subscriber with a tiny receive buffer that subscribes and then stops reading.
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut slow = socket.connect(b.addr).await.unwrap();
    let mut out = BytesMut::new();
    encode(
        &Packet::Connect(Box::new(connect_packet(Protocol::V5, "slow", true, 0))),
        Protocol::V5,
        &mut out,
    )
    .unwrap();
    let sub = tern_wire::Subscribe {
        packet_id: 1,
        properties: Default::default(),
        filters: vec![(s("slow/t"), Default::default())],
    };
    encode(&Packet::Subscribe(sub), Protocol::V5, &mut out).unwrap();
    slow.write_all(&out).await.unwrap();
    let mut buf = BytesMut::new();
    let mut acks = 0;
    while acks < 2 {
        slow.read_buf(&mut buf).await.unwrap();
        while let Some(p) = decode(&mut buf, Protocol::V5, u32::MAX).unwrap() {
            assert!(matches!(p, Packet::ConnAck(_) | Packet::SubAck(_)));
            acks += 1;
        }
    }

    // The publisher keeps going, unhindered, until the broker gives up on the subscriber
    // (the kernel's socket buffers absorb the first megabytes).
    let shared = b.broker.shared().clone();
    let mut p = Client::v5(b.addr, "fast").await;
    let payload = Bytes::from(vec![b'x'; 1024]);
    let mut rounds = 0;
    while shared.sessions.get("slow").is_some() {
        rounds += 1;
        assert!(rounds < 2_000, "slow subscriber never disconnected");
        for _ in 0..50 {
            let mut m = publish("slow/t", b"", 0, 0);
            m.payload = payload.clone();
            p.send(&Packet::Publish(m)).await;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    p.send(&Packet::PingReq).await;
    assert_eq!(
        p.recv().await,
        Some(Packet::PingResp),
        "publisher never blocked"
    );
    assert!(
        Metrics::get(&shared.metrics.messages_dropped) > 0,
        "QoS 0 over the limit is dropped"
    );

    // The slow subscriber, reading at last, gets what was buffered, then DISCONNECT 0x97.
    let last = tokio::time::timeout(WAIT, async {
        let mut last = None;
        loop {
            match slow.read_buf(&mut buf).await {
                Ok(0) | Err(_) => return last,
                Ok(_) => {
                    while let Ok(Some(p)) = decode(&mut buf, Protocol::V5, u32::MAX) {
                        last = Some(p);
                    }
                }
            }
        }
    })
    .await
    .expect("slow subscriber still connected");
    match last {
        Some(Packet::Disconnect(d)) => assert_eq!(d.reason, tern_wire::ReasonCode::QUOTA_EXCEEDED),
        other => panic!("expected DISCONNECT 0x97 last, got {other:?}"),
    }
}
