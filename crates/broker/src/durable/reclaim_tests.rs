//! What reclamation and the retention limits may remove, against what open exchanges and
//! share-group queues still need (findings 5 and 8 of docs/simulation.md).
use super::*;
use bytes::Bytes;
use tern_wire::{Properties, Str};

fn msg(topic: &'static str) -> Message {
    Message::new(
        Str::from_static(topic),
        Bytes::from(vec![0x42; 1000]),
        QoS::ExactlyOnce,
        false,
        Properties::default(),
        None,
        tokio::time::Instant::now(),
    )
}

/// Appends `n` QoS 2 messages to `topic`, each durable and routed; returns their positions.
async fn publish(store: &DurableStore, topic: &'static str, n: usize) -> Vec<StoreRef> {
    let mut refs = Vec::with_capacity(n);
    for _ in 0..n {
        let m = msg(topic);
        let mut ticket = store
            .append_publish("pub", &m, None)
            .map(|a| a.record_on(&m))
            .expect("appended");
        ticket.wait().await.expect("durable");
        store.message_released(&m);
        refs.push(m.store_ref().expect("stored"));
    }
    refs
}

fn open(dir: &Path, spec: StreamSpec) -> DurableStore {
    let config = DurableConfig {
        streams: vec![spec],
        ..DurableConfig::default()
    };
    DurableStore::open(dir, config).expect("open")
}

/// Finding 5 (`--retention` seeds 28, 87, 473, ...): a QoS 2 message queued for a session
/// is removed by `max_msgs` (queued copies are not protected; the checkpoint drops them at
/// its next pass), and the session takes its queued copy before that pass. Its exchange
/// must not start: a `p` record of a removed message is dropped by the next start while
/// the client holds the packet id, never released (MQTT-4.4.0-1). An exchange that does
/// start pins its message from then on, and a restart resumes it.
#[tokio::test]
async fn an_exchange_never_starts_on_a_message_retention_removed() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = StreamSpec::default_stream();
    spec.store.limits.max_msgs = Some(4);
    {
        let store = open(dir.path(), spec.clone());
        store.session_opened("sub", tern_wire::Protocol::V5, u32::MAX, true);
        // The streams open pinned until the first floors are set; nothing is open.
        store.reclaim_step(true);
        let refs = publish(&store, "t", 10).await;
        let stream = &store.slots[0].stream;
        assert!(stream.is_removed(refs[0].seq).unwrap(), "the limit applies");
        assert!(
            matches!(store.record_sent("sub", 1, refs[0]), OutboundSent::Removed),
            "an exchange started on a message retention removed"
        );
        let OutboundSent::Recorded(mut t) = store.record_sent("sub", 2, refs[9]) else {
            panic!("a stored message's exchange did not start");
        };
        t.wait().await.unwrap();
        // Pinned: more messages do not push it out.
        publish(&store, "t", 10).await;
        assert!(!stream.is_removed(refs[9].seq).unwrap());
    }
    let store = open(dir.path(), spec);
    let recovered = store.recover();
    let sub = recovered
        .sessions
        .iter()
        .find(|s| s.client_id == "sub")
        .expect("the session survives");
    let ids: Vec<u16> = sub.inflight.iter().map(|i| i.packet_id).collect();
    assert_eq!(ids, vec![2], "every exchange that started is resumed");
}

/// Finding 8 (`--groups` seeds 343, 50): a share group's queued messages are held by the
/// group's cursor, not by its members'. Interest reclamation must not remove the blocks of
/// messages the group still holds once every session's own cursor passed them: a member
/// taking one in flight later could not have it resent after a restart.
#[tokio::test]
async fn interest_reclamation_keeps_what_a_share_group_holds() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = StreamSpec::default_stream();
    spec.store.block_size_bytes = 4096;
    let store = open(dir.path(), spec);
    let share = "$share/g/t";
    store.session_opened("member", tern_wire::Protocol::V5, u32::MAX, true);
    let options = tern_wire::SubscriptionOptions {
        qos: QoS::ExactlyOnce,
        ..Default::default()
    };
    store.session_subscribed("member", share, options, None);
    let refs = publish(&store, "t", 20).await;
    let stream = &store.slots[0].stream;
    // The member's own cursor passes everything; the group holds what it queues.
    let floors = store.floors();
    store.checkpoint("member", &floors, &Vec::new());
    let held: HeldSeqs = refs.iter().map(|r| (r.stream, r.seq)).collect();
    store.checkpoint_group(share, &floors, &held);
    store.sessions.kv.stream().flush().unwrap();
    // Floors computed, then applied (their cursors are durable), then the removal done.
    store.reclaim_step(true);
    store.reclaim_step(true);
    stream.flush().unwrap();
    assert!(
        !stream.is_removed(refs[0].seq).unwrap(),
        "blocks of messages the share group holds were removed"
    );
    // Once the group's cursor passes them too, they go.
    store.checkpoint_group(share, &floors, &Vec::new());
    store.sessions.kv.stream().flush().unwrap();
    store.reclaim_step(true);
    store.reclaim_step(true);
    stream.flush().unwrap();
    assert!(stream.is_removed(refs[0].seq).unwrap(), "reclamation works");
}
