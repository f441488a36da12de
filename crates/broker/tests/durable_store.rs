//! `DurableStore` in process: what one run writes, the next run's `recover` returns
//! (ARCHITECTURE §3, §5): persistent sessions with their subscriptions, the QoS 2 received set
//! minus what was released, PUBREL-pending exchanges, the messages after the session's cursor,
//! and retained messages, set and cleared.

use std::time::Duration;

use bytes::Bytes;
use tern_broker::Message;
use tern_broker::{
    CursorStore, DurableConfig, DurableStore, ExchangeStore, MessageLog, Recovery, RetainedStore,
    SessionStore,
};
use tern_wire::{Properties, Protocol, QoS, Str, SubscriptionOptions};
use tokio::time::Instant;

fn msg(topic: &'static str, payload: &'static [u8], qos: QoS, retain: bool) -> Message {
    Message::new(
        Str::from_static(topic),
        Bytes::from_static(payload),
        qos,
        retain,
        Properties::default(),
        Some("pub".into()),
        Instant::now(),
    )
}

fn opts(qos: QoS) -> SubscriptionOptions {
    SubscriptionOptions {
        qos,
        ..SubscriptionOptions::default()
    }
}

async fn durable(t: Option<tern_broker::Ticket>) {
    let mut t = t.expect("a write was issued");
    tokio::time::timeout(Duration::from_secs(5), t.wait())
        .await
        .expect("durable in time")
        .expect("durable");
}

#[tokio::test]
async fn a_second_run_recovers_what_the_first_wrote() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = DurableStore::open(dir.path(), DurableConfig::default()).unwrap();
        store.session_opened("sub", Protocol::V5, 300, true);
        store.session_subscribed("sub", "a/#", opts(QoS::ExactlyOnce), Some(7));
        store.session_subscribed("sub", "$share/g/b", opts(QoS::AtLeastOnce), None);
        store.session_opened("pub", Protocol::V3_1_1, u32::MAX, true);
        // The cursor of "sub" is written before anything is published: all of it is pending.
        let floors = store.checkpoint_floors();
        store.checkpoint("sub", &floors, &Vec::new());
        // QoS 0 under durability `default`: no write, the caller waits for nothing.
        assert!(
            store
                .append_publish("pub", &msg("a/0", b"q0", QoS::AtMostOnce, false), None)
                .map(|a| a.ticket)
                .is_none()
        );
        let m1 = msg("a/1", b"one", QoS::AtLeastOnce, false);
        durable(
            store
                .append_publish("pub", &m1, None)
                .map(|a| a.record_on(&m1)),
        )
        .await;
        let m2 = msg("a/2", b"two", QoS::ExactlyOnce, false);
        durable(
            store
                .append_publish("pub", &m2, Some(11))
                .map(|a| a.record_on(&m2)),
        )
        .await;
        let m3 = msg("a/3", b"three", QoS::ExactlyOnce, false);
        durable(
            store
                .append_publish("pub", &m3, Some(12))
                .map(|a| a.record_on(&m3)),
        )
        .await;
        // pi 11 released; 12 still awaits its PUBREL.
        durable(store.qos2_released("pub", 11)).await;
        // "sub" got m2 and sent PUBREC: PUBREL pending, never the PUBLISH again.
        durable(store.outbound_pubrel_pending("sub", 40, m2.store_ref())).await;
        let r = msg("r/t", b"kept", QoS::AtLeastOnce, true);
        store.retained_changed("r/t", Some(&r));
        store.retained_changed("r/gone", Some(&msg("r/gone", b"x", QoS::AtMostOnce, true)));
        store.retained_changed("r/gone", None);
        // Not waited for above: let their group commits finish.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let store = DurableStore::open(dir.path(), DurableConfig::default()).unwrap();
    let recovered = store.recover();
    let retained: Vec<&str> = recovered.retained.iter().map(|m| &**m.topic()).collect();
    assert_eq!(retained, vec!["r/t"]);
    assert!(recovered.retained[0].retain());
    let mut sessions = recovered.sessions;
    sessions.sort_by(|a, b| a.client_id.cmp(&b.client_id));
    let [publisher, sub] = &sessions[..] else {
        panic!("two sessions expected: {sessions:?}");
    };
    assert_eq!(publisher.client_id, "pub");
    assert_eq!(publisher.qos2_received, vec![12], "pi 11 was released");
    assert_eq!(publisher.protocol, Protocol::V3_1_1);
    assert_eq!(sub.expiry_interval_s, 300);
    assert_eq!(sub.subscriptions.len(), 2);
    // "sub": m2 is PUBREL pending under its recorded id; m1 and m3 were never sent, so they
    // are queued (they get fresh packet ids when sent).
    let inflight: Vec<(u16, bool)> = sub
        .inflight
        .iter()
        .map(|i| (i.packet_id, i.pubrel_pending))
        .collect();
    assert_eq!(inflight, vec![(40, true)]);
    let queued: Vec<&[u8]> = sub.queued.iter().map(|(m, _)| &m.payload()[..]).collect();
    assert_eq!(queued, vec![&b"one"[..], &b"three"[..]]);
    assert_eq!(sub.queued[0].1, QoS::AtLeastOnce);
    assert_eq!(sub.queued[1].1, QoS::ExactlyOnce);
}

/// ARCHITECTURE §3 (outbound): a QoS 2 PUBLISH recorded as sent comes back in flight under the
/// same packet id (resent with DUP), and a completed exchange is never replayed, even while an
/// earlier message holds the cursor below it and its packet id was reused since.
#[tokio::test]
async fn outbound_exchanges_resume_under_their_packet_ids() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = DurableStore::open(dir.path(), DurableConfig::default()).unwrap();
        store.session_opened("sub", Protocol::V5, 300, true);
        store.session_subscribed("sub", "a/#", opts(QoS::ExactlyOnce), None);
        let mut stored = Vec::new();
        let topics = ["a/1", "a/2", "a/3", "a/4"];
        for (topic, payload) in topics.into_iter().zip([&b"m1"[..], b"m2", b"m3", b"m4"]) {
            let m = msg(topic, payload, QoS::ExactlyOnce, false);
            durable(
                store
                    .append_publish("pub", &m, None)
                    .map(|a| a.record_on(&m)),
            )
            .await;
            store.message_released(&m);
            stored.push(m.store_ref().unwrap());
        }
        // m1 sent under 7 (no PUBREC yet); m2 completed under 8; m3 sent under 8 (the id
        // reused at once), PUBREC received; m4 never sent.
        durable(store.outbound_sent("sub", 7, stored[0]).ticket()).await;
        durable(store.outbound_sent("sub", 8, stored[1]).ticket()).await;
        durable(store.outbound_pubrel_pending("sub", 8, Some(stored[1]))).await;
        store.outbound_completed("sub", 8);
        durable(store.outbound_sent("sub", 8, stored[2]).ticket()).await;
        durable(store.outbound_pubrel_pending("sub", 8, Some(stored[2]))).await;
        // A checkpoint while m1 is held: the cursor stays at m1, the done marker of m2 stays.
        let floors = store.checkpoint_floors();
        assert!(store.checkpoint("sub", &floors, &vec![(stored[0].stream, stored[0].seq)]));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let store = DurableStore::open(dir.path(), DurableConfig::default()).unwrap();
    let recovered = store.recover();
    let [sub] = &recovered.sessions[..] else {
        panic!("one session expected: {:?}", recovered.sessions);
    };
    let inflight: Vec<(u16, bool, &[u8])> = sub
        .inflight
        .iter()
        .map(|i| (i.packet_id, i.pubrel_pending, &i.message.payload()[..]))
        .collect();
    assert_eq!(inflight, vec![(7, false, &b"m1"[..]), (8, true, &b""[..])]);
    let queued: Vec<&[u8]> = sub.queued.iter().map(|(m, _)| &m.payload()[..]).collect();
    assert_eq!(
        queued,
        vec![&b"m4"[..]],
        "m2 completed, m3 is PUBREL pending"
    );
}

#[tokio::test]
async fn an_ended_session_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = DurableStore::open(dir.path(), DurableConfig::default()).unwrap();
        store.session_opened("gone", Protocol::V5, 60, true);
        store.session_subscribed("gone", "x", opts(QoS::AtLeastOnce), None);
        durable(
            store
                .append_publish("gone", &msg("x", b"1", QoS::ExactlyOnce, false), Some(1))
                .map(|a| a.ticket),
        )
        .await;
        store.session_ended("gone");
        // The same client id later starts afresh: the old received set is void.
        store.session_opened("gone", Protocol::V5, 60, true);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let store = DurableStore::open(dir.path(), DurableConfig::default()).unwrap();
    let recovered = store.recover();
    assert_eq!(recovered.sessions.len(), 1);
    let s = &recovered.sessions[0];
    assert!(s.subscriptions.is_empty());
    assert!(s.qos2_received.is_empty(), "{:?}", s.qos2_received);
    assert!(s.inflight.is_empty() && s.queued.is_empty());
}

/// A sequence appended but not yet durable is handed out again after a crash, to another
/// message: a cursor may not pass it, even once the message was routed (QoS 1 is routed
/// before its write completes). Found by crash_exactly_once as cursors moving back after a
/// restart and completed QoS 2 messages replayed.
#[tokio::test]
async fn checkpoint_floors_never_pass_what_is_not_durable() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = tern_broker::StreamSpec::default_stream();
    spec.store.sync = tern_broker::SyncPolicy::Interval(Duration::from_secs(3600));
    let config = DurableConfig {
        streams: vec![spec],
        ..DurableConfig::default()
    };
    let store = DurableStore::open(dir.path(), config).unwrap();
    let first = msg("a/1", b"one", QoS::AtLeastOnce, false);
    let ticket = store
        .append_publish("pub", &first, None)
        .map(|a| a.record_on(&first));
    assert!(ticket.is_some());
    // Routed at once (QoS 1), but the hour-long sync interval keeps it from being durable.
    store.message_released(&first);
    let seq = first.store_ref().unwrap().seq;
    assert!(
        store.checkpoint_floors()[0] <= seq,
        "floor {:?} passed the undurable sequence {seq}",
        store.checkpoint_floors()
    );
}

/// A live outbound exchange whose message lies below the session's durable cursor ended
/// before that cursor was written (the cursor never passes a held message): it is dropped at
/// start-up, not put back in flight, where it would pull the cursor below completed messages.
#[tokio::test]
async fn a_live_exchange_below_the_cursor_is_stale_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = DurableStore::open(dir.path(), DurableConfig::default()).unwrap();
        store.session_opened("sub", Protocol::V5, 300, true);
        store.session_subscribed("sub", "a/#", opts(QoS::ExactlyOnce), None);
        let m = msg("a/1", b"old", QoS::ExactlyOnce, false);
        durable(
            store
                .append_publish("pub", &m, None)
                .map(|a| a.record_on(&m)),
        )
        .await;
        store.message_released(&m);
        // Its record says "sent under 9", but the cursor was written past it.
        durable(
            store
                .outbound_sent("sub", 9, m.store_ref().unwrap())
                .ticket(),
        )
        .await;
        let floors = store.checkpoint_floors();
        assert!(store.checkpoint("sub", &floors, &Vec::new()));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let store = DurableStore::open(dir.path(), DurableConfig::default()).unwrap();
    let recovered = store.recover();
    let [sub] = &recovered.sessions[..] else {
        panic!("one session expected: {:?}", recovered.sessions);
    };
    assert!(sub.inflight.is_empty(), "{:?}", sub.inflight);
    assert!(sub.queued.is_empty());
    drop(store);
    // And its record is gone for good.
    let store = DurableStore::open(dir.path(), DurableConfig::default()).unwrap();
    assert!(store.recover().sessions[0].inflight.is_empty());
}
