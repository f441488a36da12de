//! Straightforward behaviour of streams, tickets, reads, limits and keyed state.

use std::time::Duration;

use tern_store::{
    Discard, FilterSet, Limits, NewRecord, Store, StoreError, StreamConfig, SyncPolicy,
};

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
fn tickets_are_futures() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let s = store.stream("s", cfg()).unwrap();
    let tickets: Vec<_> = (0..100)
        .map(|i| s.append(b"a", b"", &[i]).unwrap())
        .collect();
    // A minimal executor: park the thread until woken.
    struct W(std::thread::Thread);
    impl std::task::Wake for W {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(std::sync::Arc::new(W(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    for (i, mut t) in tickets.into_iter().enumerate() {
        loop {
            match std::pin::Pin::new(&mut t).poll(&mut cx) {
                std::task::Poll::Ready(r) => {
                    assert_eq!(r.unwrap(), i as u64 + 1);
                    break;
                }
                std::task::Poll::Pending => std::thread::park_timeout(Duration::from_millis(50)),
            }
        }
    }
}
use std::future::Future;

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
fn try_append_reports_a_full_queue_and_append_waits() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let s = store
        .stream(
            "s",
            StreamConfig {
                max_queue_bytes: 4096,
                ..cfg()
            },
        )
        .unwrap();
    let payload = [1u8; 1000];
    let mut full = 0;
    let mut tickets = Vec::new();
    for _ in 0..2000 {
        match s.try_append(b"t", b"", &payload) {
            Ok(t) => tickets.push(t),
            Err(StoreError::QueueFull { .. }) => full += 1,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(full > 0, "a 4 KiB queue never filled");
    // Blocking appends ride out the same pressure.
    for _ in 0..200 {
        tickets.push(s.append(b"t", b"", &payload).unwrap());
    }
    let n = tickets.len() as u64;
    let mut prev = 0;
    for t in tickets {
        let seq = t.wait().unwrap();
        assert!(seq > prev);
        prev = seq;
    }
    assert_eq!(s.info().msgs, n);
}

/// `wait_for_room` waits out a full queue without queueing anything: with no other appender,
/// the `try_append` after it finds room.
#[test]
fn wait_for_room_waits_for_a_full_queue_and_queues_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let s = store
        .stream(
            "s",
            StreamConfig {
                max_queue_bytes: 4096,
                ..cfg()
            },
        )
        .unwrap();
    let payload = [1u8; 1000];
    let record = [tern_store::NewRecord {
        topic: b"t",
        payload: &payload,
        ..Default::default()
    }];
    let mut tickets = Vec::new();
    let mut waited = 0;
    for _ in 0..2000 {
        let next = s.next_seq();
        match s.try_append_batch(&record) {
            Ok(t) => tickets.push(t),
            Err(StoreError::QueueFull { .. }) => {
                waited += 1;
                s.wait_for_room(&record).unwrap();
                assert_eq!(s.next_seq(), next, "waiting queued nothing");
                tickets.push(s.try_append_batch(&record).unwrap());
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(waited > 0, "a 4 KiB queue never filled");
    for t in tickets {
        t.wait().unwrap();
    }
    assert_eq!(s.info().msgs, 2000);
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
fn many_polled_tickets_all_complete_in_order() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let s = store.stream("s", cfg()).unwrap();
    struct Count(AtomicUsize);
    impl std::task::Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let woken = Arc::new(Count(AtomicUsize::new(0)));
    let waker = std::task::Waker::from(woken.clone());
    let mut cx = std::task::Context::from_waker(&waker);
    let mut tickets: Vec<Option<tern_store::Ticket>> = (0..1000)
        .map(|_| Some(s.append(b"a", b"", b"x").unwrap()))
        .collect();
    let mut done = Vec::new();
    while done.len() < 1000 {
        for i in 0..tickets.len() {
            if let Some(tk) = &mut tickets[i] {
                if let std::task::Poll::Ready(r) = std::pin::Pin::new(tk).poll(&mut cx) {
                    done.push(r.unwrap());
                    tickets[i] = None;
                    // Tickets complete in append order.
                    assert!(
                        tickets[..i]
                            .iter()
                            .all(|t| t.as_ref().is_none_or(|t| t.is_done()))
                    );
                }
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut sorted = done.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (1..=1000).collect::<Vec<u64>>());
}

/// The broker moves these across tokio tasks and threads.
#[test]
fn handles_are_send_and_sync() {
    fn check<T: Send + Sync + 'static>() {}
    check::<Store>();
    check::<tern_store::Stream>();
    check::<tern_store::KvStream>();
    check::<tern_store::Ticket>();
    check::<tern_store::Record>();
    check::<StoreError>();
}

/// Group commit: appends that wait together share writes and syncs.
#[test]
fn outstanding_appends_share_syncs() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let s = store.stream("s", StreamConfig::default()).unwrap();
    let before = s.metrics();
    let tickets: Vec<_> = (0..2000u32)
        .map(|i| s.append(b"t", b"", &i.to_le_bytes()).unwrap())
        .collect();
    for t in tickets {
        t.wait().unwrap();
    }
    let m = s.metrics();
    assert_eq!(m.records - before.records, 2000);
    let syncs = m.syncs - before.syncs;
    assert!((1..1000).contains(&syncs), "{syncs} syncs for 2000 appends");
    assert!(m.writes - before.writes <= syncs + 1);
}

/// Appenders, readers and removals at once: no deadlock, every read record is intact, and
/// what survives a reopen is exactly what the stream reported before it.
#[test]
fn concurrent_appends_reads_and_removals() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let config = StreamConfig {
        block_size_bytes: 8192,
        index_cache_blocks: 2,
        limits: Limits {
            max_msgs_per_topic: Some(50),
            ..Default::default()
        },
        ..Default::default()
    };
    let store = Store::open(dir.path()).unwrap();
    let s = store.stream("s", config.clone()).unwrap();
    let stop = AtomicBool::new(false);
    std::thread::scope(|sc| {
        for w in 0..4u32 {
            let s = s.clone();
            sc.spawn(move || {
                let mut last = None;
                for i in 0..400u32 {
                    let topic = format!("w{w}/t{}", i % 13);
                    let body = [w.to_le_bytes(), i.to_le_bytes()].concat();
                    last = Some(s.append(topic.as_bytes(), b"p", &body).unwrap());
                }
                last.unwrap().wait().unwrap();
            });
        }
        for _ in 0..2 {
            let s = s.clone();
            let stop = &stop;
            sc.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let b = s
                        .read_from(1, &FilterSet::new(["w1/#", "w2/+"]), 500, usize::MAX)
                        .unwrap();
                    for r in &b.records {
                        assert!(r.topic.starts_with(b"w1/") || r.topic.starts_with(b"w2/"));
                        assert_eq!(r.payload.len(), 8);
                        assert_eq!(&r.properties[..], b"p");
                    }
                }
            });
        }
        let s2 = s.clone();
        let stop2 = &stop;
        sc.spawn(move || {
            let mut n = 0u64;
            while !stop2.load(Ordering::Relaxed) {
                n += 1;
                s2.purge(&FilterSet::new(["w3/t0"])).unwrap();
                s2.remove_below(n * 20).unwrap();
                if n % 5 == 0 {
                    s2.compact(2).unwrap();
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        std::thread::sleep(Duration::from_millis(300));
        stop.store(true, Ordering::Relaxed);
    });
    s.flush().unwrap();
    let before: Vec<u64> = s
        .read_from(1, &FilterSet::all(), 100_000, usize::MAX)
        .unwrap()
        .records
        .iter()
        .map(|r| r.seq)
        .collect();
    assert_eq!(before.len() as u64, s.info().msgs);
    drop(s);
    let s = store.stream("s", config).unwrap();
    let after: Vec<u64> = s
        .read_from(1, &FilterSet::all(), 100_000, usize::MAX)
        .unwrap()
        .records
        .iter()
        .map(|r| r.seq)
        .collect();
    assert_eq!(before, after);
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
