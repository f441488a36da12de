//! Resource limits that protect the broker: subscriptions per session, the per-connection
//! outbound queue (QoS 0 dropped and counted, a subscriber that stays full is disconnected
//! with 0x97), and a slow subscriber never blocking a publisher.

mod common;

use std::time::Duration;

use common::raw::*;
use common::{Broker, WAIT};

/// `max_subscriptions_per_session = 2`: a third filter gets SUBACK 0x97 (Quota exceeded; v5
/// MQTT-3.9.3-2: a Subscribe reason code per filter) / 0x80 (3.1.1); replacing an existing
/// subscription is still allowed.
#[tokio::test]
async fn subscriptions_per_session_are_bounded() {
    let b = Broker::start_with("[limits]\nmax_subscriptions_per_session = 2\n");
    let mut c = RawClient::v5(b.addr, "subq5").await;
    let r = c
        .subscribe(subscribe(
            1,
            &[("q/a", opts(0)), ("q/b", opts(0)), ("q/c", opts(0))],
        ))
        .await;
    assert_eq!(
        r,
        vec![ReasonCode(0), ReasonCode(0), ReasonCode::QUOTA_EXCEEDED]
    );
    let r = c.subscribe(subscribe(2, &[("q/a", opts(1))])).await;
    assert_eq!(
        r,
        vec![ReasonCode(1)],
        "replacing an existing subscription is not a new one"
    );
    let mut c4 = RawClient::v4(b.addr, "subq4").await;
    let r = c4
        .subscribe(subscribe(
            1,
            &[("q/a", opts(0)), ("q/b", opts(1)), ("q/c", opts(2))],
        ))
        .await;
    assert_eq!(r, vec![ReasonCode(0), ReasonCode(1), ReasonCode(0x80)]);
}

/// A subscriber that stops reading: its outbound queue fills (QoS 0 beyond it is dropped and
/// counted in `$SYS/broker/messages/dropped`), the publisher is never blocked, and once the
/// queue has stayed full for `slow_subscriber_timeout_ms` the subscriber is disconnected with
/// v5 DISCONNECT 0x97 (Quota exceeded). Another subscriber gets everything.
#[tokio::test]
async fn slow_subscriber_is_dropped_publisher_never_blocked() {
    let b = Broker::start_with(
        "[limits]\noutbound_queue_max_bytes = 65536\noutbound_queue_max_messages = 100\nslow_subscriber_timeout_ms = 300\n[sys]\ninterval_s = 1\n",
    );
    let mut slow = RawClient::open_small_window(b.addr, Protocol::V5).await;
    slow.send(&Packet::Connect(Box::new(connect_packet(
        Protocol::V5,
        "slow",
        true,
        0,
    ))))
    .await;
    assert!(
        matches!(slow.expect_packet().await, Packet::ConnAck(ca) if ca.reason == ReasonCode::SUCCESS)
    );
    slow.sub("flood/t", 0).await;
    let mut sys = RawClient::v5(b.addr, "flood-sys").await;
    sys.sub("$SYS/broker/messages/dropped", 0).await;

    let payload = vec![0x5Au8; 32 * 1024];
    let mut p = RawClient::v5(b.addr, "flood-p").await;
    // `slow` reads nothing from here on. Flood until the broker counts drops (socket buffers
    // and the 64 KiB queue are full), then keep publishing for well over the 300 ms timeout.
    let deadline = tokio::time::Instant::now() + WAIT * 4;
    let mut dropped_seen_at: Option<tokio::time::Instant> = None;
    let mut sent = 0u32;
    loop {
        let now = tokio::time::Instant::now();
        assert!(now < deadline, "no drop counted after {sent} messages");
        if dropped_seen_at.is_some_and(|t| now.duration_since(t) > Duration::from_millis(1500)) {
            break;
        }
        for _ in 0..10 {
            p.send(&Packet::Publish(publish("flood/t", &payload, 0, 0)))
                .await;
            sent += 1;
        }
        // A round trip per burst: the publisher is served while the subscriber is stuck.
        assert!(
            p.ping().await.is_empty(),
            "publisher disturbed after {sent} messages"
        );
        while dropped_seen_at.is_none() {
            match sys.recv(Duration::from_millis(1)).await {
                Recv::Packet(Packet::Publish(m)) => {
                    let dropped: u64 = String::from_utf8_lossy(&m.payload)
                        .trim()
                        .parse()
                        .expect("a number");
                    if dropped > 0 {
                        dropped_seen_at = Some(tokio::time::Instant::now());
                    }
                }
                Recv::Timeout => break,
                other => panic!("$SYS subscriber: {other}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Now read: whatever was buffered, then DISCONNECT 0x97 and the close.
    let before = slow.expect_closed_within(WAIT * 3).await;
    let delivered = before
        .iter()
        .filter(|p| matches!(p, Packet::Publish(_)))
        .count();
    assert!(
        delivered < 400,
        "nothing was dropped for the slow subscriber"
    );
    match before.last() {
        Some(Packet::Disconnect(d)) => assert_eq!(d.reason, ReasonCode::QUOTA_EXCEEDED),
        other => panic!("expected DISCONNECT 0x97 last, got {other:?} after {delivered} PUBLISHes"),
    }
}

/// Design §2.7: for a persistent session, QoS>0 is never dropped because a subscriber is slow.
/// The stuck subscriber is disconnected (0x97) like any slow one, but when it comes back
/// (clean start 0) it receives every message it had not acknowledged, in order ([MQTT-4.4.0-1]
/// for the ones in flight, DUP 1), none lost.
#[tokio::test]
async fn slow_persistent_qos1_subscriber_loses_nothing() {
    let b = Broker::start_with(
        "[limits]\noutbound_queue_max_bytes = 65536\noutbound_queue_max_messages = 100\nslow_subscriber_timeout_ms = 300\n",
    );
    let mut connect = connect_packet(Protocol::V5, "slowq1", true, 0);
    connect.properties.session_expiry_interval_s = Some(60);
    let mut slow = RawClient::open_small_window(b.addr, Protocol::V5).await;
    slow.send(&Packet::Connect(Box::new(connect.clone()))).await;
    assert!(
        matches!(slow.expect_packet().await, Packet::ConnAck(ca) if ca.reason == ReasonCode::SUCCESS)
    );
    slow.sub("slowq1/t", 1).await;

    let payload = vec![0x33u8; 32 * 1024];
    let mut p = RawClient::v5(b.addr, "slowq1-p").await;
    let started = tokio::time::Instant::now();
    let mut sent: u32 = 0;
    // Far beyond the socket buffers and the queue limit, for well over the 300 ms timeout.
    while started.elapsed() < Duration::from_millis(2000) || sent < 200 {
        let mut m = publish("slowq1/t", &payload, 1, (sent % 60000) as u16 + 1);
        m.payload = bytes::Bytes::from([sent.to_be_bytes().as_slice(), &payload].concat());
        p.publish_acked(m).await;
        sent += 1;
        assert!(
            started.elapsed() < WAIT * 4,
            "publisher slowed down: {sent} messages"
        );
    }
    let index = |m: &Publish| u32::from_be_bytes(m.payload[..4].try_into().unwrap());
    let before = slow.expect_closed_within(WAIT * 3).await;
    match before.last() {
        Some(Packet::Disconnect(d)) => assert_eq!(d.reason, ReasonCode::QUOTA_EXCEEDED),
        other => panic!("expected DISCONNECT 0x97 last, got {:?}", other.map(brief)),
    }
    let first_run: Vec<u32> = before
        .iter()
        .filter_map(|p| match p {
            Packet::Publish(m) => Some(index(m)),
            _ => None,
        })
        .collect();
    assert!(
        (first_run.len() as u32) < sent,
        "the subscriber was not stuck"
    );

    connect.clean_start = false;
    let (mut s, ca) = RawClient::connect_ok(b.addr, connect).await;
    assert!(ca.session_present);
    let mut seen = vec![false; sent as usize];
    let mut last: Option<u32> = None;
    let mut dups_done = false;
    // Nothing was acknowledged on the first connection, so every message comes now: the ones
    // already sent again (DUP 1, in order), then the rest (DUP 0, in order).
    let mut remaining = sent as usize;
    while remaining > 0 {
        let m = s.receive_acked().await;
        let i = index(&m);
        if m.dup {
            assert!(
                !dups_done,
                "DUP redelivery after new messages (message {i})"
            );
        } else {
            dups_done = true;
        }
        if let Some(l) = last {
            assert!(i > l, "order broken: {i} after {l}");
        }
        last = Some(i);
        assert!(
            !seen[i as usize],
            "message {i} delivered twice on the new connection"
        );
        seen[i as usize] = true;
        remaining -= 1;
    }
    assert!(s.ping().await.is_empty());
}
