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

/// The budget of these tests, and the message stream's block (a quarter of it).
const BUDGET_BYTES: u64 = 16 * 1024;

/// The default message stream with 4 KiB blocks after `before`, under [`BUDGET_BYTES`].
fn budget_config(before: Vec<StreamSpec>) -> DurableConfig {
    let mut messages = StreamSpec::default_stream();
    messages.store.block_size_bytes = 4096;
    let mut streams = before;
    streams.push(messages);
    DurableConfig {
        streams,
        max_disk_bytes: Some(BUDGET_BYTES),
        ..DurableConfig::default()
    }
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
    let store = DurableStore::open(dir.path(), budget_config(vec![memory])).unwrap();
    let (start, budget) = store.disk_usage().unwrap();
    assert_eq!(budget, 16 * 1024);
    assert!(start < budget, "{start}");
    assert!(!store.disk_budget_reached("x", QoS::AtLeastOnce));
    let mut appended = 0;
    while !store.disk_budget_reached("x", QoS::AtLeastOnce) {
        let mut ticket = store
            .append_publish("p", &msg("x", QoS::AtLeastOnce), None)
            .map(|a| a.ticket)
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
    let budget = BUDGET_BYTES;
    let store = DurableStore::open(dir.path(), budget_config(Vec::new())).unwrap();
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

/// A disk measure taken while the writer holds a turn's write (and more messages wait in
/// the queue) counts those accepted, unwritten messages: the blocks alone do not show them,
/// and a measure that replaced the running estimate with the blocks forgot them, so a burst
/// could pass the budget by the publishers' windows.
#[tokio::test]
async fn a_disk_measure_counts_the_messages_accepted_and_not_yet_written() {
    let dir = tempfile::tempdir().unwrap();
    let disk = tern_store::sim::SimDisk::new(dir.path(), 1, tern_store::sim::SimConfig::default());
    let budget = BUDGET_BYTES;
    let store =
        DurableStore::open_with_vfs(dir.path(), budget_config(Vec::new()), disk.vfs()).unwrap();
    let held = Message::new(
        Str::from_static("x"),
        Bytes::from(vec![b'H'; 1000]),
        QoS::AtLeastOnce,
        false,
        Properties::default(),
        None,
        tokio::time::Instant::now(),
    );
    disk.hold_next_write_containing(&dir.path().join("streams"), b"HHHH");
    let mut tickets = vec![
        store
            .append_publish("p", &held, None)
            .map(|a| a.record_on(&held))
            .expect("written"),
    ];
    assert!(
        disk.wait_held(std::time::Duration::from_secs(10)),
        "the write was not held"
    );
    // Past the budget, by the estimate of each append.
    while !store.disk_budget_reached("x", QoS::AtLeastOnce) {
        let ticket = store
            .append_publish("p", &msg("x", QoS::AtLeastOnce), None)
            .map(|a| a.ticket);
        tickets.push(ticket.expect("written"));
        assert!(tickets.len() < 100, "budget never reached");
    }
    let (estimate, _) = store.disk_usage().unwrap();
    store.refresh_disk_usage();
    let (measured, _) = store.disk_usage().unwrap();
    disk.release();
    for mut t in tickets {
        t.wait().await.unwrap();
    }
    assert!(
        measured >= budget,
        "the measure forgot the unwritten messages: {measured} after an estimate of {estimate}"
    );
}
