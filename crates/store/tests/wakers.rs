//! Every task that polls a pending ticket is woken when its record completes (simulation
//! finding 9, issue 24 item 6).
//!
//! A record can have several tickets (`Stream::ticket_for`: a QoS 2 retry waiting for the
//! original's write, an admin barrier beside the record's own ticket), and one ticket can be
//! polled by one task and then by another (a session's ticket moving from a closing
//! connection to its successor). The store once kept one waker per sequence: the second
//! task's registration replaced the first task's waker, and that task slept forever.
//!
//! - `every_task_polling_one_record_is_woken`: two tickets of one record polled from two
//!   tasks, plus one ticket polled by a first task and then by a second, before the writer
//!   completes it (stepped writers: nothing completes until the step): every task is woken.
//! - `writer_threads_wake_every_task`: the same with a writer thread, the record held
//!   pending by an interval policy until `flush`.
//! - `repeated_polls_of_one_task_wake_it_once`: a task that polls its ticket many times is
//!   kept once (`Waker::will_wake`), not once per poll.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use tern_store::sim::{SimConfig, SimDisk};
use tern_store::{Store, Stream, StreamConfig, SyncPolicy, Ticket};

/// A task's waker that counts its wakes.
struct Count(AtomicUsize);

impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn task() -> (Arc<Count>, Waker) {
    let count = Arc::new(Count(AtomicUsize::new(0)));
    let waker = Waker::from(count.clone());
    (count, waker)
}

fn woken(count: &Count) -> usize {
    count.0.load(Ordering::SeqCst)
}

/// Polls `ticket` once from the task of `waker`.
fn poll(ticket: &mut Ticket, waker: &Waker) -> Poll<tern_store::Result<u64>> {
    Pin::new(ticket).poll(&mut Context::from_waker(waker))
}

fn stream(store: &Store, sync: SyncPolicy) -> Stream {
    store
        .stream(
            "s",
            StreamConfig {
                sync,
                ..Default::default()
            },
        )
        .expect("stream")
}

#[test]
fn every_task_polling_one_record_is_woken() {
    let dir = tempfile::tempdir().expect("tempdir");
    let disk = SimDisk::new(
        dir.path(),
        9,
        SimConfig {
            stepped_writers: true,
            ..SimConfig::default()
        },
    );
    let store = Store::open_with_vfs(dir.path(), disk.vfs()).expect("open");
    let s = stream(&store, SyncPolicy::Always);
    let mut own = s.append(b"t", b"", b"pubrel pending").expect("append");
    let mut second = s.ticket_for(own.seq());
    let (a, wa) = task();
    let (b, wb) = task();
    assert!(poll(&mut own, &wa).is_pending());
    assert!(poll(&mut second, &wb).is_pending());
    // One ticket moving from a closing connection's task to its successor's.
    let mut moved = s.append(b"t", b"", b"moved").expect("append");
    let (c, wc) = task();
    let (d, wd) = task();
    assert!(poll(&mut moved, &wc).is_pending());
    assert!(poll(&mut moved, &wd).is_pending());
    assert_eq!([woken(&a), woken(&b), woken(&c), woken(&d)], [0; 4]);
    assert!(store.step(), "the step writes and syncs both records");
    assert!(own.is_done() && moved.is_done());
    for (name, count) in [("a", &a), ("b", &b), ("c", &c), ("d", &d)] {
        assert!(woken(count) >= 1, "task {name} was never woken");
    }
    assert!(poll(&mut own, &wa).is_ready());
    assert!(poll(&mut second, &wb).is_ready());
    assert!(poll(&mut moved, &wd).is_ready());
}

#[test]
fn writer_threads_wake_every_task() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    // Written at once, durable only at the flush: the record stays pending while both
    // tasks poll, whatever the writer thread does meanwhile.
    let s = stream(&store, SyncPolicy::Interval(Duration::from_secs(3600)));
    let mut own = s.append(b"t", b"", b"pubrel pending").expect("append");
    let mut second = s.ticket_for(own.seq());
    let (a, wa) = task();
    let (b, wb) = task();
    assert!(poll(&mut own, &wa).is_pending());
    assert!(poll(&mut second, &wb).is_pending());
    s.flush().expect("flush");
    assert!(own.is_done());
    // The writer wakes before it answers the flush.
    assert!(woken(&a) >= 1, "the first task was never woken");
    assert!(woken(&b) >= 1, "the second task was never woken");
}

#[test]
fn repeated_polls_of_one_task_wake_it_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let disk = SimDisk::new(
        dir.path(),
        9,
        SimConfig {
            stepped_writers: true,
            ..SimConfig::default()
        },
    );
    let store = Store::open_with_vfs(dir.path(), disk.vfs()).expect("open");
    let s = stream(&store, SyncPolicy::Always);
    let mut t = s.append(b"t", b"", b"x").expect("append");
    let (a, wa) = task();
    for _ in 0..100 {
        assert!(poll(&mut t, &wa).is_pending());
    }
    assert!(store.step());
    assert_eq!(woken(&a), 1, "one wake per task, not per poll");
}
