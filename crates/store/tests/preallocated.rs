//! Block files reserved to the block size (ARCHITECTURE §6): the active block's zeros past
//! its records are the end of the data, not damage; a torn tail before them is cut and the
//! space reserved again; sealed blocks are cut to their records; damage stays damage.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use tern_store::format::{self, BLOCK_HEADER_LEN, KIND_DATA};
use tern_store::{FilterSet, Store, StreamConfig};

const BLOCK_BYTES: u64 = 8192;

fn config() -> StreamConfig {
    StreamConfig {
        block_size_bytes: BLOCK_BYTES,
        ..Default::default()
    }
}

fn blocks(store_dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(store_dir.join("streams/s"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "blk"))
        .collect();
    v.sort();
    v
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().len()
}

/// Where a block's records end (its first undecodable offset).
fn data_end(block: &Path) -> usize {
    let raw = Bytes::from(std::fs::read(block).unwrap());
    let mut off = BLOCK_HEADER_LEN;
    while let Ok(r) = format::decode_record(&raw, off) {
        off += r.len;
    }
    off
}

/// A stream of `n` records of 100 bytes each, closed.
fn stream_with(dir: &Path, n: u32) {
    let store = Store::open(dir).unwrap();
    let s = store.stream("s", config()).unwrap();
    for i in 0..n {
        let mut p = vec![7u8; 100];
        p[..4].copy_from_slice(&i.to_le_bytes());
        s.append(b"t/x", b"", &p).unwrap().wait().unwrap();
    }
    s.close().unwrap();
}

fn served(dir: &Path) -> (Vec<u64>, tern_store::RecoveryReport) {
    let store = Store::open(dir).unwrap();
    let s = store.stream("s", config()).unwrap();
    let page = s
        .read_from(1, &FilterSet::all(), 10_000, usize::MAX)
        .unwrap();
    let seqs = page.records.iter().map(|r| r.seq).collect();
    (seqs, s.recovery_report().clone())
}

#[test]
fn the_active_block_is_reserved_and_sealed_blocks_are_cut_to_their_records() {
    let dir = tempfile::tempdir().unwrap();
    stream_with(dir.path(), 200);
    let blks = blocks(dir.path());
    assert!(blks.len() >= 3, "{blks:?}");
    let (active, sealed) = blks.split_last().unwrap();
    assert_eq!(file_len(active), BLOCK_BYTES);
    for b in sealed {
        assert_eq!(file_len(b), data_end(b) as u64, "{}", b.display());
    }
    let store = Store::open(dir.path()).unwrap();
    let s = store.stream("s", config()).unwrap();
    assert_eq!(s.recovery_report(), &Default::default());
    // Disk accounting counts what is allocated: the active block's whole reservation.
    let sealed_bytes: u64 = sealed.iter().map(|b| file_len(b)).sum();
    assert_eq!(s.info().disk_bytes, sealed_bytes + BLOCK_BYTES);
}

#[test]
fn a_stream_reserves_its_active_block_with_its_first_write_only() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let s = store.stream("s", config()).unwrap();
    let active = blocks(dir.path()).pop().unwrap();
    assert_eq!(file_len(&active), BLOCK_HEADER_LEN as u64);
    assert_eq!(s.info().disk_bytes, BLOCK_HEADER_LEN as u64);
    s.append(b"t/x", b"", b"first").unwrap().wait().unwrap();
    assert_eq!(file_len(&active), BLOCK_BYTES);
    assert_eq!(s.info().disk_bytes, BLOCK_BYTES);
}

#[test]
fn a_zero_tail_is_the_end_of_the_data_not_a_torn_record() {
    let dir = tempfile::tempdir().unwrap();
    stream_with(dir.path(), 10);
    let active = blocks(dir.path()).pop().unwrap();
    // Also a block of a file system that does not reserve, extended by a lost write's zeros.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&active)
        .unwrap();
    f.set_len(BLOCK_BYTES * 2).unwrap();
    let (seqs, report) = served(dir.path());
    assert_eq!(seqs, (1..=10).collect::<Vec<_>>());
    assert_eq!(report, Default::default());
}

#[test]
fn a_torn_tail_before_the_zeros_is_cut_and_its_space_reserved_again() {
    let dir = tempfile::tempdir().unwrap();
    stream_with(dir.path(), 10);
    let active = blocks(dir.path()).pop().unwrap();
    let end = data_end(&active);
    // Record 11 written up to a power loss: its first 60 bytes, then zeros.
    let mut rec = Vec::new();
    format::encode_record(&mut rec, KIND_DATA, 0, 11, 1, b"t/x", b"", &[9u8; 300]);
    let torn = &rec[..60];
    let mut raw = std::fs::read(&active).unwrap();
    raw[end..end + torn.len()].copy_from_slice(torn);
    std::fs::write(&active, &raw).unwrap();

    let store = Store::open(dir.path()).unwrap();
    let s = store.stream("s", config()).unwrap();
    let report = s.recovery_report().clone();
    assert_eq!(report.truncated_bytes, torn.len() as u64, "{report:?}");
    assert_eq!(report.lost, Some(11..=11));
    assert_eq!(file_len(&active), end as u64, "cut to the last record");
    // Appends over the cut (shorter than the torn record) leave nothing behind them that a
    // later scan could misread, and the first one reserves the block again.
    assert_eq!(s.append(b"t/x", b"", b"new").unwrap().wait().unwrap(), 12);
    let raw = std::fs::read(&active).unwrap();
    assert_eq!(raw.len() as u64, BLOCK_BYTES, "reserved again");
    let new_end = data_end(&active);
    assert!(new_end > end && new_end < end + torn.len());
    assert!(
        raw[new_end..].iter().all(|&b| b == 0),
        "torn bytes left behind"
    );
    s.close().unwrap();
    drop(store);
    let (seqs, report) = served(dir.path());
    assert_eq!(seqs, (1..=10).chain([12]).collect::<Vec<_>>());
    assert_eq!(report, Default::default());
}

/// A stream whose first block is sealed with an intact index, and more blocks after it.
fn sealed_blocks(dir: &Path) -> PathBuf {
    stream_with(dir, 200);
    blocks(dir).remove(0)
}

#[test]
fn a_sealed_block_left_reserved_by_a_crash_is_cut_not_quarantined() {
    let dir = tempfile::tempdir().unwrap();
    let first = sealed_blocks(dir.path());
    let records_end = file_len(&first);
    // A crash after a roll's cut, before its sync made the cut durable.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&first)
        .unwrap();
    f.set_len(BLOCK_BYTES).unwrap();
    let (seqs, report) = served(dir.path());
    assert_eq!(seqs, (1..=200).collect::<Vec<_>>());
    assert_eq!(report.quarantined, vec![]);
    assert_eq!(report.indexes_rebuilt, 1);
    assert_eq!(file_len(&first), records_end);
    // Cut for good: the next open trusts the index again.
    assert_eq!(served(dir.path()).1, Default::default());
}

#[test]
fn damage_in_a_sealed_block_is_quarantined_even_with_zeros_after_it() {
    // A bad record followed by valid ones, and the last records lost to zeros (the index
    // says the block was longer).
    for lose_the_end in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let first = sealed_blocks(dir.path());
        let mut raw = std::fs::read(&first).unwrap();
        if lose_the_end {
            let n = raw.len();
            raw[n - 150..].fill(0);
        } else {
            raw[BLOCK_HEADER_LEN + 40] ^= 0x10;
        }
        raw.resize(BLOCK_BYTES as usize, 0);
        std::fs::write(&first, &raw).unwrap();
        let (seqs, report) = served(dir.path());
        assert_eq!(report.quarantined.len(), 1, "lose_the_end {lose_the_end}");
        assert!(!seqs.contains(&1));
        assert!(seqs.contains(&200));
    }
}
