//! The disk budget (`[store] max_disk_bytes`): what counts, and what frees it.
use super::*;
use bytes::Bytes;
use tern_wire::{Properties, Str};

fn msg(topic: &'static str, qos: QoS) -> Message {
    Message::new(
        Str::from_static(topic),
        Bytes::from(vec![0x42; 1000]),
        qos,
        false,
        Properties::default(),
        None,
        tokio::time::Instant::now(),
    )
}

/// `[store] max_disk_bytes`: measured from the blocks (plus what was appended since),
/// reached only for messages that would be written (not QoS 0 under durability
/// `default`, not a `never` stream), and no longer reached once removal freed blocks and
/// the use was measured again.
#[tokio::test]
async fn disk_budget_counts_written_messages_and_frees_with_removal() {
    let dir = tempfile::tempdir().unwrap();
    let mut memory = StreamSpec::default_stream();
    memory.name = "memory".into();
    memory.filters = vec!["m/#".into()];
    memory.durability = Durability::Never;
    let mut messages = StreamSpec::default_stream();
    messages.store.block_size_bytes = 4096;
    let store = DurableStore::open(
        dir.path(),
        DurableConfig {
            streams: vec![memory, messages],
            max_disk_bytes: Some(16 * 1024),
            ..DurableConfig::default()
        },
    )
    .unwrap();
    let (start, budget) = store.disk_usage().unwrap();
    assert_eq!(budget, 16 * 1024);
    assert!(start < budget, "{start}");
    assert!(!store.disk_budget_reached("x", QoS::AtLeastOnce));
    let mut appended = 0;
    while !store.disk_budget_reached("x", QoS::AtLeastOnce) {
        let mut ticket = store
            .append_publish("p", &msg("x", QoS::AtLeastOnce), None)
            .expect("written");
        ticket.wait().await.unwrap();
        appended += 1;
        assert!(appended < 100, "budget never reached");
    }
    // The estimate agrees with the blocks once measured.
    store.refresh_disk_usage();
    assert!(store.disk_budget_reached("x", QoS::ExactlyOnce));
    assert!(store.disk_bytes() >= 16 * 1024);
    assert!(
        !store.disk_budget_reached("x", QoS::AtMostOnce),
        "QoS 0 is not written under durability `default`"
    );
    assert!(
        !store.disk_budget_reached("m/a", QoS::AtLeastOnce),
        "a `never` stream writes nothing"
    );
    let stream = store.streams().nth(1).unwrap();
    stream.purge(&FilterSet::new(["#"].iter())).unwrap();
    store.refresh_disk_usage();
    assert!(
        !store.disk_budget_reached("x", QoS::AtLeastOnce),
        "{:?}",
        store.disk_usage()
    );
}

/// The state streams are not counted (docs/simulation.md, finding 12): retention cannot
/// free them, so state past the budget (here retained values; in the simulator, the session
/// records of refused publishers reconnecting) would refuse every message forever. They are
/// bounded by their own compaction instead (ARCHITECTURE §6.1).
#[tokio::test]
async fn disk_budget_does_not_count_the_state_streams() {
    let dir = tempfile::tempdir().unwrap();
    let mut messages = StreamSpec::default_stream();
    messages.store.block_size_bytes = 4096;
    let budget = 16 * 1024;
    let store = DurableStore::open(
        dir.path(),
        DurableConfig {
            streams: vec![messages],
            max_disk_bytes: Some(budget),
            ..DurableConfig::default()
        },
    )
    .unwrap();
    for i in 0..40 {
        let topic: &'static str = Box::leak(format!("r/{i}").into_boxed_str());
        let mut ticket = store
            .retained_changed(topic, Some(&msg(topic, QoS::AtLeastOnce)))
            .expect("a retained value is written");
        ticket.wait().await.unwrap();
    }
    store.refresh_disk_usage();
    assert!(
        store.disk_bytes() > budget,
        "the state streams hold more than the budget: {}",
        store.disk_bytes()
    );
    assert_eq!(
        store.disk_usage(),
        Some((store.message_disk_bytes(), budget))
    );
    assert!(
        !store.disk_budget_reached("x", QoS::AtLeastOnce),
        "{:?}",
        store.disk_usage()
    );
}
