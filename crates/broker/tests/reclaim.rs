//! Reclamation by interest and the inbound QoS 2 checkpoint, in process over `DurableStore`
//! (ARCHITECTURE §5, "Reclamation"): blocks go once no cursor, unrouted message or open
//! exchange needs them, and recovery reads `$tern/` records from the oldest open exchange on.

use std::time::Duration;

use bytes::Bytes;
use tern_broker::Message;
use tern_broker::{
    CursorStore, DurableConfig, DurableStore, Keep, MessageLog, Recovery, SessionStore, StreamSpec,
};
use tern_wire::{Properties, Protocol, QoS, Str, SubscriptionOptions};
use tokio::time::Instant;

fn msg(topic: &'static str, qos: QoS) -> Message {
    Message::new(
        Str::from_static(topic),
        Bytes::from(vec![7u8; 200]),
        qos,
        false,
        Properties::default(),
        Some("pub".into()),
        Instant::now(),
    )
}

fn small_blocks() -> DurableConfig {
    let mut spec = StreamSpec::default_stream();
    spec.store.block_size_bytes = 4096;
    DurableConfig {
        streams: vec![spec],
        ..DurableConfig::default()
    }
}

async fn durable(t: Option<tern_broker::Ticket>) {
    let mut t = t.expect("a write was issued");
    tokio::time::timeout(Duration::from_secs(5), t.wait())
        .await
        .expect("durable in time")
        .expect("durable");
}

/// Publishes and routes (releases) one message; QoS 2 with its packet id.
async fn publish(store: &DurableStore, m: &Message, qos2: Option<u16>) {
    durable(store.append_publish("pub", m, qos2).map(|a| a.record_on(m))).await;
    store.message_released(m);
}

/// Two reclamation steps: the first computes floors, the second applies them once what they
/// rest on is durable (bounded wait).
async fn reclaim(store: &DurableStore) {
    store.reclaim_now();
    tokio::time::sleep(Duration::from_millis(50)).await;
    store.reclaim_now();
}

/// Reclamation steps until `done(first live sequence)` or 5 s (the state stream's fsync may
/// be slow on a busy machine); returns the first live sequence.
async fn reclaim_until(store: &DurableStore, done: impl Fn(u64) -> bool) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        reclaim(store).await;
        let first = first_seq(store);
        if done(first) || Instant::now() > deadline {
            return first;
        }
    }
}

fn first_seq(store: &DurableStore) -> u64 {
    store.streams().next().unwrap().info().first_seq.unwrap()
}

#[tokio::test]
async fn blocks_go_once_the_persistent_cursor_passed_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = DurableStore::open(dir.path(), small_blocks()).unwrap();
    store.session_opened("sub", Protocol::V3_1_1, u32::MAX, true);
    let opts = SubscriptionOptions {
        qos: QoS::AtLeastOnce,
        ..SubscriptionOptions::default()
    };
    durable(store.session_subscribed("sub", "t/#", opts, None)).await;
    store.session_opened("pub", Protocol::V3_1_1, u32::MAX, true);
    for _ in 0..100 {
        publish(&store, &msg("t/a", QoS::AtLeastOnce), None).await;
    }
    // An inbound QoS 2 exchange stays open (PUBREL not yet received).
    let open = msg("t/open", QoS::ExactlyOnce);
    publish(&store, &open, Some(9)).await;
    let rx_seq = open.store_ref().unwrap().seq + 1;
    for _ in 0..400 {
        publish(&store, &msg("t/a", QoS::AtLeastOnce), None).await;
    }
    assert!(store.streams().next().unwrap().info().blocks > 10);
    // The offline session's cursor is at the start: nothing goes.
    reclaim(&store).await;
    assert_eq!(first_seq(&store), 1, "the session's queue is kept");
    // Its cursor passes everything (it received it all); so does the publisher's.
    let floors = store.checkpoint_floors();
    assert!(store.checkpoint("sub", &floors, &Vec::new()));
    store.checkpoint("pub", &floors, &Vec::new());
    let first = reclaim_until(&store, |f| f > 50).await;
    assert!(
        first > 50 && first <= rx_seq,
        "blocks before the open exchange's rx record went, its block stayed: first {first}, rx {rx_seq}"
    );
    // PUBREL: the exchange is over, nothing pins the rest.
    durable(store.qos2_released("pub", 9)).await;
    let first = reclaim_until(&store, |f| f > 450).await;
    assert!(
        first > 450,
        "whole blocks below the cursor went: first {first}"
    );
}

/// `keep = "retention"`: nothing is reclaimed, and still recovery reads `$tern/` records
/// only from the oldest open inbound exchange on (the rx checkpoint), not the whole history.
#[tokio::test]
async fn recovery_reads_control_records_from_the_rx_checkpoint_only() {
    let dir = tempfile::tempdir().unwrap();
    let config = || {
        let mut c = small_blocks();
        c.streams[0].keep = Keep::Retention;
        c
    };
    {
        let store = DurableStore::open(dir.path(), config()).unwrap();
        store.session_opened("pub", Protocol::V3_1_1, u32::MAX, true);
        for i in 0..500u16 {
            publish(&store, &msg("q/a", QoS::ExactlyOnce), Some(100 + i)).await;
            durable(store.qos2_released("pub", 100 + i)).await;
        }
        // pi 9 stays open: PUBREC went, PUBREL never came.
        let open = msg("q/open", QoS::ExactlyOnce);
        publish(&store, &open, Some(9)).await;
        let open_seq = open.store_ref().unwrap().seq;
        for i in 0..20u16 {
            publish(&store, &msg("q/a", QoS::ExactlyOnce), Some(1000 + i)).await;
            durable(store.qos2_released("pub", 1000 + i)).await;
        }
        // The publisher's session subscribes to nothing: its cursor follows the floors.
        let floors = store.checkpoint_floors();
        store.checkpoint("pub", &floors, &Vec::new());
        // Until the rx checkpoint is written (it lies past the first block then).
        let rx_start_written = || {
            store.state_streams()[0]
                .read_from(
                    1,
                    &tern_store::FilterSet::new(["xmessages"]),
                    10,
                    usize::MAX,
                )
                .is_ok_and(|b| !b.records.is_empty())
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while !rx_start_written() && Instant::now() < deadline {
            reclaim(&store).await;
        }
        assert_eq!(first_seq(&store), 1, "keep = retention: the log stays");
        assert!(open_seq > 1000);
        // Let the rx checkpoint's group commit finish.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let store = DurableStore::open(dir.path(), config()).unwrap();
    let recovered = store.recover();
    let session = recovered
        .sessions
        .iter()
        .find(|s| s.client_id == "pub")
        .unwrap();
    assert_eq!(session.qos2_received, vec![9], "the open exchange survived");
    let read = store.control_records_read();
    assert!(
        read <= 1 + 2 * 20 + 2,
        "recovery read {read} `$tern/` records: it started at the open exchange, not at 1"
    );
}

/// Offline sessions owed the same stored message share one decoded `Arc<Message>` after a
/// restart, each in its own order and from its own cursor.
#[tokio::test]
async fn recovered_sessions_share_one_message_per_record() {
    let dir = tempfile::tempdir().unwrap();
    let opts = SubscriptionOptions {
        qos: QoS::AtLeastOnce,
        ..SubscriptionOptions::default()
    };
    {
        let store = DurableStore::open(dir.path(), small_blocks()).unwrap();
        for (client, filter) in [("s1", "t/#"), ("s2", "t/a"), ("s3", "t/+")] {
            store.session_opened(client, Protocol::V3_1_1, u32::MAX, true);
            durable(store.session_subscribed(client, filter, opts, None)).await;
        }
        // s3 also subscribes with an overlapping filter: still one copy per message.
        durable(store.session_subscribed("s3", "t/a", opts, None)).await;
        publish(&store, &msg("t/a", QoS::AtLeastOnce), None).await;
        // s1 moves past the first message.
        let floors = store.checkpoint_floors();
        store.checkpoint("s1", &floors, &Vec::new());
        for _ in 0..3 {
            publish(&store, &msg("t/a", QoS::AtLeastOnce), None).await;
        }
        publish(&store, &msg("t/b", QoS::AtLeastOnce), None).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let store = DurableStore::open(dir.path(), small_blocks()).unwrap();
    let recovered = store.recover();
    let get = |c: &str| {
        recovered
            .sessions
            .iter()
            .find(|s| s.client_id == c)
            .unwrap()
    };
    let seqs = |c: &str| -> Vec<u64> {
        get(c)
            .queued
            .iter()
            .map(|(m, _)| m.store_ref().unwrap().seq)
            .collect()
    };
    // s3 gets every message once, in order; s2 the `t/a` ones; s1 all but the first.
    let all = seqs("s3");
    assert_eq!(all.len(), 5);
    assert!(all.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(seqs("s2"), all[..4].to_vec());
    assert_eq!(seqs("s1"), all[1..].to_vec());
    for i in 0..4 {
        assert!(std::sync::Arc::ptr_eq(
            &get("s2").queued[i].0,
            &get("s3").queued[i].0
        ));
    }
    assert!(std::sync::Arc::ptr_eq(
        &get("s1").queued[0].0,
        &get("s2").queued[1].0
    ));
}
