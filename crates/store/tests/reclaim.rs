//! Removal by a caller's floor in whole blocks, the retention floor that limits never cross,
//! and topics exempt from the per-topic limit.

use std::time::Duration;

use tern_store::{FilterSet, Limits, Store, StreamConfig};

fn cfg(limits: Limits) -> StreamConfig {
    StreamConfig {
        block_size_bytes: 4096,
        limits,
        ..Default::default()
    }
}

fn fill(s: &tern_store::Stream, n: u64, topic: &[u8]) {
    let mut last = None;
    for i in 0..n {
        last = Some(s.append_at(1000 + i, topic, b"", &[0u8; 100]).unwrap());
    }
    last.unwrap().wait().unwrap();
}

#[test]
fn remove_blocks_below_takes_whole_blocks_only() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let s = store.stream("s", cfg(Limits::default())).unwrap();
    fill(&s, 500, b"t");
    let blocks = s.info().blocks;
    assert!(blocks > 5, "{blocks}");
    let removed = s.remove_blocks_below(250).unwrap();
    let first = s.info().first_seq.unwrap();
    assert!(
        first <= 250,
        "the block holding the floor stays whole: {first}"
    );
    assert!(first > 1 && removed.records == first - 1, "{removed:?}");
    assert_eq!(s.info().msgs, 500 - (first - 1));
    // Nothing below the floor is walked record by record: the boundary block is intact.
    assert_eq!(s.get(first).unwrap().unwrap().seq, first);
    // A floor past the end never takes the active block.
    s.remove_blocks_below(u64::MAX).unwrap();
    assert_eq!(s.info().last_seq, Some(500));
    assert!(s.info().blocks >= 1);
    // Interest removals are the caller's: nothing is reported as retention.
    assert!(s.drain_removed().ranges.is_empty());
    drop(s);
    drop(store);
    let store = Store::open(dir.path()).unwrap();
    let s = store.stream("s", cfg(Limits::default())).unwrap();
    assert!(
        s.info().first_seq.unwrap() > first,
        "removal survives a reopen"
    );
}

#[test]
fn limits_never_cross_the_retention_floor() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let limits = Limits {
        max_msgs: Some(100),
        max_age: Some(Duration::from_secs(1)),
        max_msgs_per_topic: Some(10),
        ..Default::default()
    };
    let s = store.stream("s", cfg(limits)).unwrap();
    s.set_retention_floor(5);
    fill(&s, 300, b"t");
    // Only records below 5 could go, whatever max_msgs and max_msgs_per_topic say.
    assert_eq!(s.info().first_seq, Some(5));
    // max_age (every record is from 1970) stops at the floor too.
    s.expire_now().unwrap();
    assert_eq!(s.info().first_seq, Some(5));
    s.set_retention_floor(200);
    s.expire_now().unwrap();
    assert_eq!(s.info().first_seq, Some(200));
    s.set_retention_floor(u64::MAX);
    s.expire_now().unwrap();
    assert_eq!(s.info().msgs, 0);
}

#[test]
fn exempt_topics_are_not_trimmed_per_topic() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let limits = Limits {
        max_msgs_per_topic: Some(2),
        per_topic_exempt_prefix: Some(b"$ctl/".to_vec()),
        ..Default::default()
    };
    let s = store.stream("s", cfg(limits.clone())).unwrap();
    fill(&s, 20, b"$ctl/a");
    fill(&s, 20, b"data");
    let count = |s: &tern_store::Stream, f: &str| {
        s.read_from(1, &FilterSet::new([f]), 1000, usize::MAX)
            .unwrap()
            .records
            .len()
    };
    assert_eq!(count(&s, "$ctl/a"), 20);
    assert_eq!(count(&s, "data"), 2);
    drop(s);
    drop(store);
    // Reopen applies the limits to what is stored: still exempt.
    let store = Store::open(dir.path()).unwrap();
    let s = store.stream("s", cfg(limits)).unwrap();
    assert_eq!(count(&s, "$ctl/a"), 20);
}

/// `is_removed`: a record deleted by a limit, one in a removed block and one not applied yet
/// are told apart, and a retention floor lowered to a record keeps the answer `false` while
/// the limit goes on removing below it (what the broker's QoS 2 exchanges rely on).
#[test]
fn is_removed_tells_removed_from_kept_and_unapplied() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let s = store
        .stream(
            "s",
            cfg(Limits {
                max_msgs: Some(5),
                ..Default::default()
            }),
        )
        .unwrap();
    assert!(!s.is_removed(1).unwrap(), "not appended yet");
    fill(&s, 20, b"t");
    s.flush().unwrap();
    assert!(s.is_removed(1).unwrap(), "removed by max_msgs");
    assert!(!s.is_removed(20).unwrap(), "kept");
    assert!(!s.is_removed(21).unwrap(), "not appended yet");
    s.lower_retention_floor(17);
    fill(&s, 20, b"t");
    s.flush().unwrap();
    for seq in 17..=40 {
        assert!(!s.is_removed(seq).unwrap(), "{seq} at or above the floor");
    }
    assert!(
        s.is_removed(16).unwrap(),
        "below the floor the limit still applies"
    );
    s.remove_blocks_below(17).unwrap();
    assert!(s.is_removed(2).unwrap(), "in a removed block");
}
