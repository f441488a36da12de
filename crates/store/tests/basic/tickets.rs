//! Tickets (futures, polled or waited, completing in order, sharing syncs), the write queue
//! (full, waited for) and handles used from several threads at once. A module of `basic.rs`'s
//! test binary.

use std::time::Duration;

use tern_store::{FilterSet, Limits, Store, StoreError, StreamConfig};

use super::cfg;

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
