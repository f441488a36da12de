//! `Stream::defer_wakes`: a run of appends goes into one group commit (src/wake.rs).

use std::sync::mpsc;
use std::time::Duration;

use tern_store::{Store, StreamConfig, SyncPolicy};

fn cfg() -> StreamConfig {
    StreamConfig {
        sync: SyncPolicy::Always,
        ..Default::default()
    }
}

/// Without the guard the writer, asleep, wakes at the first append and syncs it alone; the
/// records appended after it wait for a second sync.
#[test]
fn appends_under_a_guard_share_one_commit() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let s = store.stream("s", cfg()).unwrap();
    s.append(b"t", b"", b"warm up").unwrap().wait().unwrap();
    // Lets the writer go back to sleep (it is not yet, right after publishing the sync).
    std::thread::sleep(Duration::from_millis(50));
    let before = s.metrics();
    let guard = s.defer_wakes();
    let first = s.append(b"t", b"", b"1").unwrap();
    // An awake writer would take the first record alone meanwhile.
    std::thread::sleep(Duration::from_millis(50));
    assert!(!first.is_done(), "the writer was woken under the guard");
    let mut last = None;
    for i in 2..=10u8 {
        last = Some(s.append(b"t", b"", &[i]).unwrap());
    }
    drop(guard);
    last.unwrap().wait().unwrap();
    assert!(first.is_done());
    let after = s.metrics();
    assert_eq!(after.records - before.records, 10);
    assert_eq!(after.turns - before.turns, 1);
    assert_eq!(after.syncs - before.syncs, 1);
}

/// A thread that blocks on a ticket while it holds a guard wakes the writer itself.
#[test]
fn blocking_wait_under_a_guard_does_not_wait_on_itself() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = mpsc::channel();
    let path = dir.path().to_path_buf();
    std::thread::spawn(move || {
        let store = Store::open(&path).unwrap();
        let s = store.stream("s", cfg()).unwrap();
        let outer = s.defer_wakes();
        let inner = s.defer_wakes();
        let seq = s.append(b"t", b"", b"x").unwrap().wait();
        drop((inner, outer));
        // The guards are gone: appends wake the writer again.
        let next = s.append(b"t", b"", b"y").unwrap().wait();
        let _ = tx.send((seq.ok(), next.ok()));
    });
    let got = rx.recv_timeout(Duration::from_secs(60));
    assert_eq!(got, Ok((Some(1), Some(2))), "a wait under a guard hung");
}
