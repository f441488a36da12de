//! `DurableStore` in process: what one run writes, the next run's `recover` returns
//! (ARCHITECTURE §3, §5): persistent sessions with their subscriptions, the QoS 2 received set
//! minus what was released, PUBREL-pending exchanges, the messages after the session's cursor,
//! and retained messages, set and cleared.

use std::time::Duration;

use bytes::Bytes;
use tern_broker::message::Message;
use tern_broker::{DurableConfig, DurableStore, MessageStore};
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
                .is_none()
        );
        let m1 = msg("a/1", b"one", QoS::AtLeastOnce, false);
        durable(store.append_publish("pub", &m1, None)).await;
        let m2 = msg("a/2", b"two", QoS::ExactlyOnce, false);
        durable(store.append_publish("pub", &m2, Some(11))).await;
        let m3 = msg("a/3", b"three", QoS::ExactlyOnce, false);
        durable(store.append_publish("pub", &m3, Some(12))).await;
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
    let retained: Vec<&str> = recovered.retained.iter().map(|m| &*m.topic).collect();
    assert_eq!(retained, vec!["r/t"]);
    assert!(recovered.retained[0].retain);
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
    // Pending for "sub": m1 and m3 (m2 is PUBREL pending), resent in flight with the packet
    // ids derived from their positions; the PUBREL-pending exchange first.
    let inflight: Vec<(u16, bool, String)> = sub
        .inflight
        .iter()
        .map(|i| {
            (
                i.packet_id,
                i.pubrel_pending,
                String::from_utf8_lossy(&i.message.payload).into_owned(),
            )
        })
        .collect();
    assert_eq!(inflight[0], (40, true, String::new()));
    let resent: Vec<&str> = inflight[1..].iter().map(|(_, _, p)| p.as_str()).collect();
    assert_eq!(resent, vec!["one", "three"]);
    for i in &sub.inflight[1..] {
        assert_eq!(
            Some(i.packet_id),
            i.message.store_ref().map(|r| r.packet_id())
        );
    }
    assert_eq!(sub.inflight[1].qos, QoS::AtLeastOnce);
    assert_eq!(sub.inflight[2].qos, QoS::ExactlyOnce);
}

#[tokio::test]
async fn an_ended_session_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = DurableStore::open(dir.path(), DurableConfig::default()).unwrap();
        store.session_opened("gone", Protocol::V5, 60, true);
        store.session_subscribed("gone", "x", opts(QoS::AtLeastOnce), None);
        durable(store.append_publish("gone", &msg("x", b"1", QoS::ExactlyOnce, false), Some(1)))
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
