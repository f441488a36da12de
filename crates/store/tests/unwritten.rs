//! `StreamInfo::unwritten_bytes` and `disk_bytes_with_unwritten`: records appended and not
//! yet written (queued, or in a turn whose write is in progress) are counted until the
//! write lands in a block, a limit rejects them or a failure means they never will be. The
//! broker's disk budget measure adds them (ARCHITECTURE §6.1), since the blocks alone do
//! not show them.

use std::path::Path;
use std::time::Duration;

use tern_store::format::{BLOCK_HEADER_LEN, record_len};
use tern_store::sim::{SimConfig, SimDisk};
use tern_store::{Discard, Limits, Store, StreamConfig};

const BLOCK_BYTES: u64 = 8192;

fn config() -> StreamConfig {
    StreamConfig {
        block_size_bytes: BLOCK_BYTES,
        ..Default::default()
    }
}

/// One record of `payload_bytes` on topic `t`, as the stream frames it.
fn framed(payload_bytes: usize) -> u64 {
    record_len(1, 0, payload_bytes) as u64
}

fn disk(dir: &Path, cfg: SimConfig) -> (SimDisk, Store) {
    let disk = SimDisk::new(dir, 1, cfg);
    let store = Store::open_with_vfs(dir, disk.vfs()).unwrap();
    (disk, store)
}

#[test]
fn a_held_write_and_the_records_queued_behind_it_count_until_written() {
    let dir = tempfile::tempdir().unwrap();
    let (disk, store) = disk(dir.path(), SimConfig::default());
    let s = store.stream("s", config()).unwrap();
    let empty = s.info();
    assert_eq!(empty.disk_bytes, BLOCK_HEADER_LEN as u64);
    assert_eq!(empty.unwritten_bytes, 0);
    assert_eq!(empty.disk_bytes_with_unwritten, empty.disk_bytes);

    disk.hold_next_write_containing(dir.path(), b"HELD");
    let mut p = b"HELD".to_vec();
    p.resize(200, b'.');
    let held = s.append(b"t", b"", &p).unwrap();
    assert!(disk.wait_held(Duration::from_secs(10)), "not held");
    let queued: Vec<_> = (0..3)
        .map(|_| s.append(b"t", b"", &[1; 100]).unwrap())
        .collect();
    let info = s.info();
    let unwritten = framed(200) + framed(100) * 3;
    assert_eq!(info.unwritten_bytes, unwritten);
    // The block is not reserved before its first write: it grows by all of them.
    assert_eq!(info.disk_bytes, BLOCK_HEADER_LEN as u64);
    assert_eq!(info.disk_bytes_with_unwritten, info.disk_bytes + unwritten);

    disk.release();
    held.wait().unwrap();
    for t in queued {
        t.wait().unwrap();
    }
    let written = s.info();
    assert_eq!(written.unwritten_bytes, 0);
    assert_eq!(written.disk_bytes, BLOCK_BYTES);
    assert_eq!(written.disk_bytes_with_unwritten, BLOCK_BYTES);

    // Into the reserved block: only what passes its reservation adds.
    let records_end = BLOCK_HEADER_LEN as u64 + unwritten;
    disk.hold_next_write_containing(dir.path(), b"MORE");
    let mut p = b"MORE".to_vec();
    p.resize(1000, b'.');
    let first = s.append(b"t", b"", &p).unwrap();
    assert!(disk.wait_held(Duration::from_secs(10)), "not held");
    let queued: Vec<_> = (0..9).map(|_| s.append(b"t", b"", &p).unwrap()).collect();
    let info = s.info();
    assert_eq!(info.unwritten_bytes, framed(1000) * 10);
    assert_eq!(info.disk_bytes, BLOCK_BYTES);
    assert_eq!(
        info.disk_bytes_with_unwritten,
        records_end + framed(1000) * 10,
        "past the reservation by {}",
        records_end + framed(1000) * 10 - BLOCK_BYTES
    );
    disk.release();
    first.wait().unwrap();
    for t in queued {
        t.wait().unwrap();
    }
    assert_eq!(s.info().unwritten_bytes, 0);
}

#[test]
fn records_a_limit_rejects_are_no_longer_unwritten() {
    let dir = tempfile::tempdir().unwrap();
    let (_disk, store) = disk(dir.path(), SimConfig::default());
    let limits = Limits {
        max_msgs_per_topic: Some(1),
        discard: Discard::New,
        ..Default::default()
    };
    let s = store
        .stream("s", StreamConfig { limits, ..config() })
        .unwrap();
    s.append(b"t", b"", b"kept").unwrap().wait().unwrap();
    assert!(s.append(b"t", b"", b"refused").unwrap().wait().is_err());
    assert_eq!(s.info().unwritten_bytes, 0);
}

#[test]
fn records_a_failed_write_left_are_no_longer_unwritten() {
    let dir = tempfile::tempdir().unwrap();
    let (disk, store) = disk(dir.path(), SimConfig::default());
    let s = store.stream("s", config()).unwrap();
    disk.update_config(|c| c.write_error = 1.0);
    assert!(s.append(b"t", b"", b"lost").unwrap().wait().is_err());
    assert!(s.info().failed);
    // The writer takes what a failure left off the count at the end of its turn, after the
    // failure reached the waiters (a measure in between counts them a moment longer, which
    // only errs on the safe side): wait for that end, bounded.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while s.info().unwritten_bytes != 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(s.info().unwritten_bytes, 0);
}
