//! `Stream::snapshot`: a copy of a live stream (sealed blocks linked, the active block copied)
//! opens as a stream holding exactly what was appended before the call, whatever is appended
//! after it, including while appends go on from another thread.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tern_store::{FilterSet, Store, Stream, StreamConfig};

/// Small blocks so that a few hundred records span several sealed blocks.
const BLOCK_SIZE_BYTES: u64 = 4 * 1024;
/// Records the concurrent appender writes at most.
const MAX_CONCURRENT_RECORDS: u64 = 5_000;

fn config() -> StreamConfig {
    StreamConfig {
        block_size_bytes: BLOCK_SIZE_BYTES,
        ..StreamConfig::default()
    }
}

fn all(stream: &Stream) -> Vec<(u64, Vec<u8>)> {
    let batch = stream
        .read_from(1, &FilterSet::all(), usize::MAX, usize::MAX)
        .expect("read");
    batch
        .records
        .iter()
        .map(|r| (r.seq, r.payload.to_vec()))
        .collect()
}

#[test]
fn a_snapshot_opens_as_the_stream_at_that_moment() {
    let live_dir = tempfile::tempdir().unwrap();
    let live = Store::open(live_dir.path()).unwrap();
    let s = live.stream("s", config()).unwrap();
    for i in 0..300u32 {
        // The flush below waits for them all.
        drop(
            s.append(b"t/a", b"", format!("payload {i:05}").as_bytes())
                .unwrap(),
        );
    }
    s.flush().unwrap();
    assert!(s.info().blocks > 3, "several sealed blocks");
    let before = all(&s);
    let copy_root = live_dir.path().join("backup");
    s.snapshot(&copy_root.join("streams").join("s")).unwrap();
    for i in 0..50u32 {
        s.append(b"t/a", b"", format!("after {i}").as_bytes())
            .unwrap()
            .wait()
            .unwrap();
    }
    let copy = Store::open(&copy_root).unwrap();
    let restored = copy.stream("s", config()).unwrap();
    assert_eq!(all(&restored), before);
    // The copy is a stream of its own: it goes on from the next sequence.
    let t = restored.append(b"t/a", b"", b"next").unwrap();
    assert_eq!(t.seq(), 301);
    // The live stream was not touched by the copy.
    assert_eq!(all(&s).len(), 350);
}

#[test]
fn a_snapshot_under_concurrent_appends_is_a_prefix_without_holes() {
    let live_dir = tempfile::tempdir().unwrap();
    let live = Store::open(live_dir.path()).unwrap();
    let s = live.stream("s", config()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (s, stop) = (s.clone(), stop.clone());
        std::thread::spawn(move || {
            // Bounded: enough to keep appending across the snapshot, few enough to reopen fast.
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) && i < MAX_CONCURRENT_RECORDS {
                drop(s.append(b"t/x", b"", &i.to_le_bytes()).unwrap());
                i += 1;
            }
        })
    };
    while s.info().blocks < 4 {
        std::thread::yield_now();
    }
    let acknowledged = s.durable_seq();
    let copy_root = live_dir.path().join("backup");
    s.snapshot(&copy_root.join("streams").join("s")).unwrap();
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let copy = Store::open(&copy_root).unwrap();
    let restored = copy.stream("s", config()).unwrap();
    let records = all(&restored);
    assert!(
        records.len() as u64 >= acknowledged,
        "durable before the call: in the copy"
    );
    for (n, (seq, payload)) in records.iter().enumerate() {
        assert_eq!(*seq, n as u64 + 1, "no hole");
        assert_eq!(
            payload,
            &(n as u64).to_le_bytes(),
            "the record written at that seq"
        );
    }
}
