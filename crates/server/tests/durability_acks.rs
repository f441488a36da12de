//! Issue 11 items 4 and 7 with the real binary killed by SIGKILL: no silent memory-only path
//! (a topic no configured stream captures goes to the default stream `messages`), and what a
//! SUBACK, UNSUBACK or retained PUBACK confirmed is there after the restart, with no pause
//! between the acknowledgement and the kill.
//!
//! `kill -9` keeps the page cache, so these tests show that the writes were issued before the
//! acknowledgement and are replayed; that the acknowledgement waits for the write to be
//! durable is shown with hand-completed tickets in `crates/broker/tests/ack_durability.rs`.

mod common;

use common::Broker;
use common::raw::*;

/// The README's example: one stream capturing `sensors/#` only.
const README_STREAMS: &str = "[[stream]]\nname = \"telemetry\"\nfilters = [\"sensors/#\"]\n";

fn numbered(topic: &str, n: usize, qos_level: u8, packet_id: u16) -> Publish {
    publish(topic, n.to_string().as_bytes(), qos_level, packet_id)
}

fn number(p: &Publish) -> usize {
    std::str::from_utf8(&p.payload).unwrap().parse().unwrap()
}

fn persistent_v5(client_id: &str, clean: bool) -> Connect {
    let mut c = connect_packet(Protocol::V5, client_id, clean, 0);
    c.properties.session_expiry_interval_s = Some(300);
    c
}

/// The field report: with the README's config, 200 QoS 1 messages to `other/x` (no configured
/// stream captures it), queued for an offline persistent session, were PUBACKed and gone after
/// kill -9. They go to the default stream now and all come back, in order.
#[tokio::test]
async fn uncaptured_topic_queued_for_offline_session_survives_kill() {
    let mut b = Broker::start_with(README_STREAMS);
    let connect = || connect_packet(Protocol::V3_1_1, "unc-sub", false, 0);
    let mut s = RawClient::connect_ok(b.addr, connect()).await.0;
    s.sub("other/#", 1).await;
    s.disconnect().await;
    let mut p = RawClient::v4(b.addr, "unc-pub").await;
    const N: usize = 200;
    for i in 0..N {
        p.publish_acked(numbered("other/x", i, 1, (i + 1) as u16))
            .await;
    }
    b.restart_after_kill();
    let (mut s, ca) = RawClient::connect_ok(b.addr, connect()).await;
    assert!(ca.session_present);
    let mut got = Vec::new();
    while got.len() < N {
        let m = s.receive_acked().await;
        let n = number(&m);
        // At least once: a message may come again after the checkpointed cursor.
        if !got.contains(&n) {
            got.push(n);
        }
    }
    assert_eq!(got, (0..N).collect::<Vec<_>>(), "all of them, in order");
    assert!(
        b.data_dir().join("streams/messages").is_dir(),
        "kept in the default stream, beside `telemetry`"
    );
}

/// SUBACK received, then kill -9: after the restart the persistent session still has the
/// subscription (a message published after the restart reaches it without resubscribing);
/// UNSUBACK received, then kill -9: the removed subscription stays removed.
#[tokio::test]
async fn suback_and_unsuback_then_kill_are_kept() {
    let mut b = Broker::start_with(README_STREAMS);
    let mut s = RawClient::connect_ok(b.addr, persistent_v5("sk-sub", true))
        .await
        .0;
    s.sub("sk/gone", 1).await;
    let unsubscribe = Unsubscribe {
        packet_id: 2,
        properties: Properties::default(),
        filters: vec![s_("sk/gone")],
    };
    s.send(&Packet::Unsubscribe(unsubscribe)).await;
    match s.expect_packet().await {
        Packet::UnsubAck(a) => assert_eq!(a.reasons, vec![ReasonCode::SUCCESS]),
        other => panic!("expected UNSUBACK, got {}", brief(&other)),
    }
    s.sub("sk/kept", 1).await;
    b.restart_after_kill();

    let (mut s, ca) = RawClient::connect_ok(b.addr, persistent_v5("sk-sub", false)).await;
    assert!(ca.session_present, "the session survived");
    let mut p = RawClient::v5(b.addr, "sk-pub").await;
    p.publish_acked(publish("sk/gone", b"not for us", 1, 1))
        .await;
    p.publish_acked(publish("sk/kept", b"after restart", 1, 2))
        .await;
    let m = s.receive_acked().await;
    assert_eq!(
        (&*m.topic, &m.payload[..]),
        ("sk/kept", &b"after restart"[..])
    );
    s.expect_nothing(common::QUIET).await;
}

fn s_(text: &str) -> Str {
    s(text)
}

/// A retained message PUBACKed (QoS 1) or PUBCOMPed (QoS 2), then kill -9 at once: served
/// after the restart; so is a clear (empty retained PUBLISH) of another one. The topics are
/// outside the configured stream, so the messages themselves go to the default stream.
#[tokio::test]
async fn retained_acked_then_kill_is_served_after_restart() {
    let mut b = Broker::start_with(README_STREAMS);
    let mut p = RawClient::v5(b.addr, "rk-pub").await;
    for (topic, payload, qos, id) in [
        ("rk/one", &b"one"[..], 1, 1),
        ("rk/gone", &b"x"[..], 1, 2),
        ("rk/two", &b"two"[..], 2, 3),
        ("rk/gone", &b""[..], 1, 4),
    ] {
        let mut m = publish(topic, payload, qos, id);
        m.retain = true;
        p.publish_acked(m).await;
    }
    b.restart_after_kill();
    let mut s = RawClient::v5(b.addr, "rk-sub").await;
    s.sub("rk/#", 2).await;
    let mut got = Vec::new();
    for _ in 0..2 {
        let m = s.receive_acked().await;
        assert!(m.retain);
        got.push((m.topic.to_string(), m.payload.to_vec()));
    }
    got.sort();
    assert_eq!(
        got,
        vec![
            ("rk/one".to_string(), b"one".to_vec()),
            ("rk/two".to_string(), b"two".to_vec()),
        ]
    );
    s.expect_nothing(common::QUIET).await;
}

/// A first stream with `sync = "never"` no longer sets the state streams' policy: the store
/// reports `[state] sync` (default always) at start-up, and the session state it keeps is
/// replayed after kill -9.
#[tokio::test]
async fn first_stream_sync_never_leaves_session_state_synced() {
    let mut b = Broker::start_with(
        "[[stream]]\nname = \"fast\"\nfilters = [\"fast/#\"]\nsync = \"never\"\n",
    );
    // Logged before `tern listening on` is printed.
    let log = b.log_tail(200);
    assert!(
        log.contains(r#"message streams ["fast", "messages"]; state streams sync Always"#),
        "{log}"
    );
    let mut s = RawClient::connect_ok(b.addr, persistent_v5("fn-sub", true))
        .await
        .0;
    s.sub("fast/t", 1).await;
    b.restart_after_kill();
    let (mut s, ca) = RawClient::connect_ok(b.addr, persistent_v5("fn-sub", false)).await;
    assert!(ca.session_present);
    let mut p = RawClient::v5(b.addr, "fn-pub").await;
    p.publish_acked(publish("fast/t", b"still subscribed", 1, 1))
        .await;
    assert_eq!(&s.receive_acked().await.payload[..], b"still subscribed");

    // `[state] sync` is what sets it.
    let b = Broker::start_with("[state]\nsync = \"never\"\n");
    let log = b.log_tail(200);
    assert!(log.contains("state streams sync Never"), "{log}");
}

/// `--sync` sets every message stream's policy, the configured ones and the default stream
/// `messages` the store appends after them; `[state] sync` stays what the file says.
#[tokio::test]
async fn sync_flag_reaches_every_message_stream() {
    let b = Broker::start_with_args(
        "[[stream]]\nname = \"fast\"\nfilters = [\"fast/#\"]\n",
        &["--sync", "never"],
    );
    let log = b.log_tail(200);
    assert!(
        log.contains("state streams sync Always; message streams sync fast=Never messages=Never"),
        "{log}"
    );
}
