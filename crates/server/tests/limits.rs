//! Resource limits that protect the broker: subscriptions per session, the per-connection
//! outbound queue (QoS 0 dropped and counted, a subscriber that stays full is disconnected
//! with 0x97), a slow subscriber never blocking a publisher, the offline queue's
//! `max_queued_bytes`, the store's disk budget, the broker-wide queued-bytes cap and
//! `max_connections` (issue 11 items 2 and 9).

mod common;

use std::time::Duration;

use common::raw::*;
use common::{Broker, WAIT};

#[path = "limits/disk_budget.rs"]
mod disk_budget;

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
/// for the ones in flight, DUP 1), none lost. (The publisher runs for a while, not for a
/// number of messages: the session queue's own `max_queued_bytes` is raised out of the way so
/// that it is not what this test measures; the next tests cover it.)
#[tokio::test]
async fn slow_persistent_qos1_subscriber_loses_nothing() {
    let b = Broker::start_with(
        "[limits]\noutbound_queue_max_bytes = 65536\noutbound_queue_max_messages = 100\nslow_subscriber_timeout_ms = 300\nmax_queued_bytes = 1073741824\n",
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

/// Reads `$SYS` messages on `c` (subscribed to them) until `topic` carries a number for which
/// `done` holds; bounded by `WAIT`×3.
async fn sys_until(c: &mut RawClient, topic: &str, done: impl Fn(u64) -> bool) -> u64 {
    let deadline = tokio::time::Instant::now() + WAIT * 3;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        assert!(!left.is_zero(), "{topic} never satisfied the check");
        if let Recv::Packet(Packet::Publish(m)) = c.recv(left).await {
            if m.topic.as_str() == topic {
                let n: u64 = String::from_utf8_lossy(&m.payload)
                    .trim()
                    .parse()
                    .expect("a number");
                if done(n) {
                    return n;
                }
            }
        }
    }
}

/// Sends a QoS 1 PUBLISH (v5) and returns the PUBACK's reason code.
async fn puback_reason(c: &mut RawClient, p: Publish) -> ReasonCode {
    let id = p.packet_id;
    c.send(&Packet::Publish(p)).await;
    match c.expect_non_publish().await {
        Packet::PubAck(a) if a.packet_id == id => a.reason,
        other => panic!("expected PUBACK {id}, got {}", brief(&other)),
    }
}

/// A v5 CONNECT with a session expiry (a persistent session).
fn persistent(client_id: &str, clean_start: bool) -> Connect {
    let mut c = connect_packet(Protocol::V5, client_id, clean_start, 0);
    c.properties.session_expiry_interval_s = Some(600);
    c
}

/// Issue 11 item 2: a persistent session that stays offline keeps at most `max_queued_bytes`
/// of messages: the newest, the oldest dropped, counted in
/// `$SYS/broker/messages/dropped/queue_limit`. After a SIGKILL the restored session comes back
/// through the same limit (the store's replay is bounded by bytes too) and holds exactly the
/// newest messages: nothing the limit kept is lost. Restarted with a smaller limit, it keeps
/// the newest that fit it, and the start-up drops are counted.
#[tokio::test]
async fn offline_queue_over_max_queued_bytes_keeps_the_newest() {
    // Each message: topic 4 + payload 200 + 64 overhead = 268 B; 2000 B hold 7 of them.
    let mut b = Broker::start_with(
        "[limits]\nmax_queued_bytes = 2000\nmax_queued_bytes_total = 1048576\n[sys]\ninterval_s = 1\n",
    );
    let (mut s, _) = RawClient::connect_ok(b.addr, persistent("oq-s", true)).await;
    s.sub("oq/#", 1).await;
    s.disconnect().await;
    let mut sys = RawClient::v5(b.addr, "oq-sys").await;
    sys.sub("$SYS/broker/messages/dropped/queue_limit", 0).await;
    let mut p = RawClient::v5(b.addr, "oq-p").await;
    for i in 0..20u8 {
        let mut payload = vec![i; 200];
        payload[0] = i;
        p.publish_acked(publish("oq/t", &payload, 1, u16::from(i) + 1))
            .await;
    }
    sys_until(&mut sys, "$SYS/broker/messages/dropped/queue_limit", |n| {
        n >= 13
    })
    .await;

    b.restart_after_kill();
    let (mut s, ca) = RawClient::connect_ok(b.addr, persistent("oq-s", false)).await;
    assert!(ca.session_present);
    let mut got = Vec::new();
    for _ in 0..7 {
        got.push(s.receive_acked().await.payload[0]);
    }
    assert_eq!(got, (13..20).collect::<Vec<u8>>(), "the newest 7, in order");
    let more = s.ping().await;
    assert!(
        more.is_empty(),
        "older messages came back: {}",
        briefs(&more)
    );
    s.disconnect().await;

    // The restart path applies the limit in force: 20 more queued (the newest 7 kept), then a
    // restart with room for 3 brings back the newest 3, counted.
    let mut p = RawClient::v5(b.addr, "oq-p").await;
    for i in 20..40u8 {
        p.publish_acked(publish("oq/t", &[i; 200], 1, u16::from(i) + 1))
            .await;
    }
    b.set_config(
        "[limits]\nmax_queued_bytes = 1000\nmax_queued_bytes_total = 1048576\n[sys]\ninterval_s = 1\n",
    );
    b.restart_after_kill();
    let mut sys = RawClient::v5(b.addr, "oq-sys").await;
    sys.sub("$SYS/broker/messages/dropped/queue_limit", 0).await;
    sys_until(&mut sys, "$SYS/broker/messages/dropped/queue_limit", |n| {
        n >= 4
    })
    .await;
    let (mut s, ca) = RawClient::connect_ok(b.addr, persistent("oq-s", false)).await;
    assert!(ca.session_present);
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(s.receive_acked().await.payload[0]);
    }
    assert_eq!(got, vec![37, 38, 39], "the newest 3 under the new limit");
    let more = s.ping().await;
    assert!(
        more.is_empty(),
        "older messages came back: {}",
        briefs(&more)
    );
}

/// Issue 11 item 9, `max_queued_bytes_total`: with the queues of two offline persistent
/// sessions at the broker-wide cap, QoS 0 is dropped even for an online subscriber with an
/// empty queue (counted), a v5 QoS 1 PUBLISH is refused with PUBACK 0x97 and a 3.1.1 one by
/// closing without a PUBACK. Once a session drains its queue, QoS 1 is accepted again.
#[tokio::test]
async fn queued_bytes_cap_drops_qos0_and_refuses_qos1_until_queues_drain() {
    // Each message: 3 + 500 + 64 = 567 B. Each session keeps up to 3000 B; together 4000.
    let b = Broker::start_with(
        "[limits]\nmax_queued_bytes = 3000\nmax_queued_bytes_total = 4000\n[sys]\ninterval_s = 1\n",
    );
    for id in ["mq-s1", "mq-s2"] {
        let (mut s, _) = RawClient::connect_ok(b.addr, persistent(id, true)).await;
        s.sub("m/x", 1).await;
        s.disconnect().await;
    }
    let mut o = RawClient::v5(b.addr, "mq-o").await;
    o.sub("m/q0", 0).await;
    let mut sys = RawClient::v5(b.addr, "mq-sys").await;
    sys.sub("$SYS/broker/messages/+/memory_limit", 0).await;
    let mut p = RawClient::v5(b.addr, "mq-p").await;
    let payload = vec![7u8; 500];
    let mut accepted = 0u16;
    loop {
        let reason = puback_reason(&mut p, publish("m/x", &payload, 1, accepted + 1)).await;
        if reason == ReasonCode::QUOTA_EXCEEDED {
            break;
        }
        assert!(reason.is_success(), "{reason:?}");
        accepted += 1;
        assert!(accepted < 10, "the cap was never reached");
    }
    assert!(accepted >= 4, "refused too early: {accepted}");
    p.publish_acked(publish("m/q0", b"dropped", 0, 0)).await;
    assert!(p.ping().await.is_empty());
    let seen = o.ping().await;
    assert!(
        seen.is_empty(),
        "QoS 0 delivered over the cap: {}",
        briefs(&seen)
    );
    let mut v3 = RawClient::v4(b.addr, "mq-v3").await;
    v3.send(&Packet::Publish(publish("m/x", &payload, 1, 1)))
        .await;
    let before = v3.expect_closed().await;
    assert!(
        !before.iter().any(|p| matches!(p, Packet::PubAck(_))),
        "{}",
        briefs(&before)
    );

    // s1 comes back and takes its queue: room again.
    let (mut s1, _) = RawClient::connect_ok(b.addr, persistent("mq-s1", false)).await;
    for _ in 0..accepted {
        s1.receive_acked().await;
    }
    let deadline = tokio::time::Instant::now() + WAIT;
    while !puback_reason(&mut p, publish("m/x", &payload, 1, 100))
        .await
        .is_success()
    {
        assert!(tokio::time::Instant::now() < deadline, "still refused");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Read now: `$SYS` values are QoS 0 and were dropped too while over the cap.
    sys_until(&mut sys, "$SYS/broker/messages/refused/memory_limit", |n| {
        n >= 2
    })
    .await;
    sys_until(&mut sys, "$SYS/broker/messages/dropped/memory_limit", |n| {
        n >= 1
    })
    .await;
}

/// Issue 11 item 9, `max_connections = 2`: a third client gets CONNACK 0x97 (v5) / return
/// code 3 (3.1.1) and is closed, counted in `$SYS/broker/clients/refused/max_connections`;
/// a takeover of a connected client id still works at the limit; a freed place is taken again.
#[tokio::test]
async fn max_connections_refuses_the_next_client_takeover_still_works() {
    let b = Broker::start_with("[limits]\nmax_connections = 2\n[sys]\ninterval_s = 1\n");
    let mut c1 = RawClient::v5(b.addr, "mc-1").await;
    let c2 = RawClient::v4(b.addr, "mc-2").await;
    let (mut c3, first) =
        RawClient::connect_with(b.addr, connect_packet(Protocol::V5, "mc-3", true, 0)).await;
    match first {
        Packet::ConnAck(ca) => assert_eq!(ca.reason, ReasonCode::QUOTA_EXCEEDED),
        other => panic!("expected CONNACK 0x97, got {}", brief(&other)),
    }
    c3.expect_closed().await;
    let (mut c4, first) =
        RawClient::connect_with(b.addr, connect_packet(Protocol::V3_1_1, "mc-4", true, 0)).await;
    match first {
        // Return code 3 reads back as 0x88 Server unavailable.
        Packet::ConnAck(ca) => assert_eq!(ca.reason, ReasonCode::SERVER_UNAVAILABLE),
        other => panic!("expected CONNACK 3, got {}", brief(&other)),
    }
    c4.expect_closed().await;
    // Takeover at the limit: the new connection is accepted, the old one told 0x8E.
    let mut c1b = RawClient::v5(b.addr, "mc-1").await;
    assert_eq!(c1.expect_disconnect().await, ReasonCode::SESSION_TAKEN_OVER);
    assert!(c1b.ping().await.is_empty());
    // A place freed by a leaving client is taken again (it is given back as the connection
    // ends, so retry briefly).
    c2.disconnect().await;
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut sys = loop {
        let (c, first) =
            RawClient::connect_with(b.addr, connect_packet(Protocol::V5, "mc-sys", true, 0)).await;
        match first {
            Packet::ConnAck(ca) if ca.reason == ReasonCode::SUCCESS => break c,
            Packet::ConnAck(ca) => assert_eq!(ca.reason, ReasonCode::QUOTA_EXCEEDED),
            other => panic!("{}", brief(&other)),
        }
        assert!(tokio::time::Instant::now() < deadline, "place never freed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    sys.sub("$SYS/broker/clients/refused/max_connections", 0)
        .await;
    sys_until(
        &mut sys,
        "$SYS/broker/clients/refused/max_connections",
        |n| n >= 2,
    )
    .await;
}
