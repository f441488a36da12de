//! Straightforward behaviour of streams, reads, limits and keyed state. Tickets, the write
//! queue and concurrent use are in `basic/tickets.rs`, a module of this binary.

use std::time::Duration;

use tern_store::{
    Discard, FilterSet, Limits, NewRecord, Store, StoreError, StreamConfig, SyncPolicy,
};

#[path = "basic/tickets.rs"]
mod tickets;

fn cfg() -> StreamConfig {
    StreamConfig {
        block_size_bytes: 4096,
        ..Default::default()
    }
}

#[test]
fn append_read_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        let s = store.stream("s", cfg()).unwrap();
        let mut last = None;
        for i in 0..500u32 {
            let t = s
                .append_at(
                    1000 + i as u64,
                    format!("t/{}", i % 7).as_bytes(),
                    b"p",
                    &i.to_le_bytes(),
                )
                .unwrap();
            assert_eq!(t.seq(), i as u64 + 1);
            last = Some(t);
        }
        assert_eq!(last.unwrap().wait().unwrap(), 500);
        let r = s.get(42).unwrap().unwrap();
        assert_eq!(
            (r.seq, &r.topic[..], &r.payload[..]),
            (42, &b"t/6"[..], &41u32.to_le_bytes()[..])
        );
        assert!(s.info().blocks > 5);
    }
    let store = Store::open(dir.path()).unwrap();
    let s = store.stream("s", cfg()).unwrap();
    assert_eq!(s.info().msgs, 500);
    let r = s.get(500).unwrap().unwrap();
    assert_eq!(&r.payload[..], &499u32.to_le_bytes()[..]);
    let t = s.append(b"x", b"", b"y").unwrap();
    assert_eq!(t.wait().unwrap(), 501);
    let b = s
        .read_from(1, &FilterSet::new(["t/3", "x"]), 1000, usize::MAX)
        .unwrap();
    assert_eq!(b.records.len(), 72);
    assert!(
        b.records
            .iter()
            .all(|r| &r.topic[..] == b"t/3" || &r.topic[..] == b"x")
    );
    let st = s.topic_stats(b"t/3").unwrap().unwrap();
    assert_eq!((st.count, st.first_seq, st.last_seq), (71, 4, 494));
    assert_eq!(s.last_for_topic(b"t/3").unwrap().unwrap().seq, 494);
}

#[test]
fn lock_excludes_second_open() {
    let dir = tempfile::tempdir().unwrap();
    let a = Store::open(dir.path()).unwrap();
    assert!(matches!(
        Store::open(dir.path()),
        Err(StoreError::Locked(_))
    ));
    drop(a);
    Store::open(dir.path()).unwrap();
}

#[test]
fn batch_and_limits() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let limits = Limits {
        max_msgs_per_topic: Some(2),
        discard: Discard::New,
        ..Default::default()
    };
    let s = store.stream("s", StreamConfig { limits, ..cfg() }).unwrap();
    let rec = |t: &'static [u8]| NewRecord {
        topic: t,
        payload: b"v",
        ..Default::default()
    };
    let t = s.append_batch(&[rec(b"a"), rec(b"b"), rec(b"a")]).unwrap();
    assert_eq!((t.first_seq(), t.seq()), (1, 3));
    t.wait().unwrap();
    let t = s.append_batch(&[rec(b"c"), rec(b"a")]).unwrap();
    assert!(matches!(t.wait(), Err(StoreError::LimitReached { .. })));
    assert!(s.get(4).unwrap().is_none());
    assert!(s.get(5).unwrap().is_none());
    assert_eq!(s.append(b"b", b"", b"x").unwrap().wait().unwrap(), 6);
    assert_eq!(s.info().msgs, 4);
}

#[test]
fn discard_old_and_removed_log() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let limits = Limits {
        max_msgs: Some(10),
        ..Default::default()
    };
    let s = store.stream("s", StreamConfig { limits, ..cfg() }).unwrap();
    for i in 0..25u8 {
        drop(s.append(b"a", b"", &[i]).unwrap());
    }
    s.flush().unwrap();
    assert_eq!(s.info().msgs, 10);
    assert_eq!(s.info().first_seq, Some(16));
    let log = s.drain_removed();
    assert_eq!(log.ranges, vec![1..=15]);
}

#[test]
fn expiry_by_age_drops_whole_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let limits = Limits {
        max_age: Some(Duration::from_nanos(1000)),
        ..Default::default()
    };
    let s = store
        .stream(
            "s",
            StreamConfig {
                limits,
                expire_interval: Duration::from_secs(3600),
                ..cfg()
            },
        )
        .unwrap();
    for i in 0..1000u64 {
        drop(s.append_at(i * 10, b"a/b", b"", &[0u8; 40]).unwrap());
    }
    s.flush().unwrap();
    let blocks = s.info().blocks;
    // Cutoff at time 5000: records 1..=500 (times 0..4990) go.
    let r = s.expire(6000).unwrap();
    assert_eq!(r.ranges, vec![1..=500]);
    assert_eq!(r.records, 500);
    assert!(s.info().blocks < blocks);
    assert_eq!(s.info().first_seq, Some(501));
    assert_eq!(s.topic_stats(b"a/b").unwrap().unwrap().count, 500);
    drop(s);
    let s = store.stream("s", cfg()).unwrap();
    assert_eq!(s.info().first_seq, Some(501));
    assert_eq!(s.info().msgs, 500);
}

#[test]
fn sequences_never_reused_after_removal() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        let s = store.stream("s", cfg()).unwrap();
        for _ in 0..10 {
            drop(s.append(b"a", b"", b"x").unwrap());
        }
        s.flush().unwrap();
        s.purge(&FilterSet::all()).unwrap();
        assert_eq!(s.info().msgs, 0);
    }
    let store = Store::open(dir.path()).unwrap();
    let s = store.stream("s", cfg()).unwrap();
    assert_eq!(s.info().msgs, 0);
    assert_eq!(s.append(b"a", b"", b"x").unwrap().wait().unwrap(), 11);
}

#[test]
fn kv_restores_latest() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        let kv = store.kv("sessions", cfg()).unwrap();
        for i in 0..300u32 {
            drop(
                kv.put(format!("k{}", i % 10).as_bytes(), &i.to_le_bytes())
                    .unwrap(),
            );
        }
        kv.delete(b"k3").unwrap().wait().unwrap();
        assert_eq!(kv.get(b"k4").unwrap().unwrap(), &294u32.to_le_bytes()[..]);
        assert!(kv.get(b"k3").unwrap().is_none());
    }
    let store = Store::open(dir.path()).unwrap();
    let kv = store.kv("sessions", cfg()).unwrap();
    assert_eq!(kv.get(b"k4").unwrap().unwrap(), &294u32.to_le_bytes()[..]);
    assert!(kv.get(b"k3").unwrap().is_none());
    let all = kv.entries(&FilterSet::all()).unwrap();
    assert_eq!(all.len(), 9);
    kv.compact(100).unwrap();
    assert!(kv.stream().info().blocks <= 2);
    assert_eq!(kv.entries(&FilterSet::all()).unwrap().len(), 9);
    drop(kv);
    let kv = store.kv("sessions", cfg()).unwrap();
    assert_eq!(kv.entries(&FilterSet::all()).unwrap().len(), 9);
    assert_eq!(kv.get(b"k9").unwrap().unwrap(), &299u32.to_le_bytes()[..]);
}

#[test]
fn interval_and_never_policies_complete() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    for (name, sync) in [
        ("i", SyncPolicy::Interval(Duration::from_millis(5))),
        ("n", SyncPolicy::Never),
    ] {
        let s = store.stream(name, StreamConfig { sync, ..cfg() }).unwrap();
        let t: Vec<_> = (0..50)
            .map(|_| s.append(b"a", b"", b"x").unwrap())
            .collect();
        for (i, t) in t.into_iter().enumerate() {
            assert_eq!(t.wait().unwrap(), i as u64 + 1);
        }
    }
}

/// ARCHITECTURE.md §1: the store depends on no other crate of ours but the topic rules
/// (tern-topic, whose matcher serves its reads by filter: one implementation of the rule).
#[test]
fn store_depends_only_on_the_topic_rules() {
    let manifest =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")).unwrap();
    for line in manifest.lines() {
        let name = line.split(['=', '.']).next().unwrap_or("").trim();
        // Its own name: the package itself, and the dev-dependency on itself that turns the
        // `sim` feature on for its tests.
        if name == "name" || name == "tern-store" || name == "tern-topic" {
            continue;
        }
        assert!(
            !name.starts_with("tern-") && !name.starts_with("tern_"),
            "the store depends on {name}"
        );
    }
}

#[test]
fn filtered_reads_page_through_and_skip_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let s = store.stream("s", cfg()).unwrap();
    for i in 0..2000u32 {
        let topic = if i == 1500 {
            "rare/x".to_string()
        } else {
            format!("common/{}", i % 3)
        };
        drop(s.append(topic.as_bytes(), b"", &i.to_le_bytes()).unwrap());
    }
    s.flush().unwrap();
    let b = s
        .read_from(1, &FilterSet::new(["rare/#"]), 10, usize::MAX)
        .unwrap();
    assert_eq!(b.records.len(), 1);
    assert_eq!(b.records[0].seq, 1501);
    // Paging with a small page size sees every matching record exactly once.
    let mut from = 1;
    let mut seen = Vec::new();
    loop {
        let b = s
            .read_from(from, &FilterSet::new(["common/1"]), 7, usize::MAX)
            .unwrap();
        if b.records.is_empty() {
            break;
        }
        seen.extend(b.records.iter().map(|r| r.seq));
        from = b.next_seq;
    }
    let want: Vec<u64> = (0..2000u64)
        .filter(|i| *i != 1500 && i % 3 == 1)
        .map(|i| i + 1)
        .collect();
    assert_eq!(seen, want);
}

#[test]
fn evicted_block_indexes_reload_from_index_or_block() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let s = store
        .stream(
            "s",
            StreamConfig {
                index_cache_blocks: 1,
                ..cfg()
            },
        )
        .unwrap();
    for i in 0..600u32 {
        drop(
            s.append(format!("t/{}", i % 5).as_bytes(), b"", &i.to_le_bytes())
                .unwrap(),
        );
    }
    s.flush().unwrap();
    assert!(s.info().blocks > 4);
    let check = || {
        let all = s.read_from(1, &FilterSet::all(), 1000, usize::MAX).unwrap();
        assert_eq!(all.records.len(), 600);
        for (i, r) in all.records.iter().enumerate() {
            assert_eq!(&r.payload[..], &(i as u32).to_le_bytes()[..]);
        }
        assert_eq!(s.get(7).unwrap().unwrap().seq, 7);
        assert_eq!(s.topic_stats(b"t/2").unwrap().unwrap().first_seq, 3);
    };
    check();
    // Without index files, entries come back from scanning the blocks.
    for e in std::fs::read_dir(dir.path().join("streams/s")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "idx") {
            std::fs::remove_file(p).unwrap();
        }
    }
    check();
    s.delete(&[8, 9]).unwrap();
    assert!(s.get(8).unwrap().is_none());
    assert_eq!(s.info().msgs, 598);
}

#[test]
fn a_stream_opens_once_and_names_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let s = store.stream("a", cfg()).unwrap();
    assert!(matches!(
        store.stream("a", cfg()),
        Err(StoreError::AlreadyOpen(_))
    ));
    let s2 = s.clone();
    drop(s);
    assert!(matches!(
        store.stream("a", cfg()),
        Err(StoreError::AlreadyOpen(_))
    ));
    drop(s2);
    store.stream("a", cfg()).unwrap();
    for bad in ["", "../x", ".hidden", "a/b"] {
        assert!(
            matches!(store.stream(bad, cfg()), Err(StoreError::InvalidName(_))),
            "{bad}"
        );
    }
    assert_eq!(store.stream_names().unwrap(), vec!["a".to_string()]);
}

#[test]
fn rejected_groups_between_accepted_ones_leave_a_consistent_block() {
    // Records of one turn are written straight from the queue's buffer; a rejected group in
    // the middle of a turn must not shift the offsets of the records after it.
    let dir = tempfile::tempdir().unwrap();
    let cfg = || StreamConfig {
        limits: tern_store::Limits {
            max_msgs_per_topic: Some(1),
            discard: tern_store::Discard::New,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut kept = Vec::new();
    {
        let store = Store::open(dir.path()).unwrap();
        let s = store.stream("s", cfg()).unwrap();
        for round in 0..20u32 {
            let tickets: Vec<_> = (0..8u32)
                .map(|i| {
                    let topic = format!("t/{}", (round * 8 + i) / 2);
                    (
                        topic.clone(),
                        s.append(topic.as_bytes(), b"", &i.to_le_bytes()).unwrap(),
                    )
                })
                .collect();
            for (topic, t) in tickets {
                if let Ok(seq) = t.wait() {
                    kept.push((seq, topic));
                }
            }
        }
        assert_eq!(kept.len(), 80, "every second record is rejected");
        let page = s.read_from(1, &FilterSet::all(), 1000, usize::MAX).unwrap();
        let got: Vec<_> = page
            .records
            .iter()
            .map(|r| (r.seq, String::from_utf8(r.topic.to_vec()).unwrap()))
            .collect();
        assert_eq!(got, kept);
    }
    let store = Store::open(dir.path()).unwrap();
    let s = store
        .stream(
            "s",
            StreamConfig {
                verify_on_open: true,
                ..cfg()
            },
        )
        .unwrap();
    assert_eq!(s.recovery_report().truncated_bytes, 0);
    let page = s.read_from(1, &FilterSet::all(), 1000, usize::MAX).unwrap();
    assert_eq!(page.records.len(), 80);
}
