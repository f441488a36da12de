//! Crash tests: damage the active block at every byte of its last records (truncation and
//! bit flips) and check what recovery serves; kill a child process in the middle of group
//! commits and check that every completed ticket survived (which, the page cache surviving
//! SIGKILL, holds even when tickets complete before their fsync: `tests/power_loss/`
//! simulates power loss for that; the kill tests are in `crash/kill.rs`).

use std::path::{Path, PathBuf};

use bytes::Bytes;
use tern_store::format::{self, BLOCK_HEADER_LEN};
use tern_store::{FilterSet, NewRecord, Store, StreamConfig};

#[path = "crash/kill.rs"]
mod kill;

fn payload(seq: u64) -> Vec<u8> {
    let n = (seq % 37) as usize + 1;
    (0..n).map(|i| (seq as usize * 31 + i) as u8).collect()
}

/// Writes a stream and returns its single block file's bytes and the record boundaries.
fn make_block(batch_at_end: bool) -> (Vec<u8>, Vec<(u64, usize, usize)>) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let s = store.stream("s", StreamConfig::default()).unwrap();
    for seq in 1..=12u64 {
        s.append_at(seq, b"t/x", b"pr", &payload(seq))
            .unwrap()
            .wait()
            .unwrap();
    }
    if batch_at_end {
        let p: Vec<Vec<u8>> = (13..=15).map(payload).collect();
        let recs: Vec<NewRecord> = p
            .iter()
            .map(|p| NewRecord {
                topic: b"t/y",
                payload: p,
                time_ns: Some(13),
                ..Default::default()
            })
            .collect();
        s.append_batch(&recs).unwrap().wait().unwrap();
    }
    drop(s);
    drop(store);
    let mut raw = std::fs::read(block_path(dir.path())).unwrap();
    let b = Bytes::from(raw.clone());
    let mut off = BLOCK_HEADER_LEN;
    let mut recs = Vec::new();
    // The block is reserved to the block size: its records end where its zeros start.
    while let Ok(r) = format::decode_record(&b, off) {
        recs.push((r.seq, off, off + r.len));
        off += r.len;
    }
    assert!(raw[off..].iter().all(|&b| b == 0));
    raw.truncate(off);
    (raw, recs)
}

fn block_path(store_dir: &Path) -> PathBuf {
    let d = store_dir.join("streams/s");
    let mut blks: Vec<PathBuf> = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "blk"))
        .collect();
    blks.sort();
    blks.pop().unwrap()
}

/// Opens a store whose only block holds `bytes`, as a file of that length and as a reserved
/// one (zeros after them); returns the served records, which must be the same both ways,
/// and the lower of the two next sequences. (They may differ: a torn record header read
/// with zeros past the cut may show its sequence, which is then not reused.)
fn recover(bytes: &[u8]) -> (Vec<(u64, Vec<u8>)>, u64) {
    let mut reserved = bytes.to_vec();
    reserved.resize(bytes.len() + 16384, 0);
    let (got, next) = recover_file(bytes);
    let (got_reserved, next_reserved) = recover_file(&reserved);
    assert_eq!(
        got_reserved, got,
        "a zero tail changed what recovery serves"
    );
    (got, next.min(next_reserved))
}

fn recover_file(bytes: &[u8]) -> (Vec<(u64, Vec<u8>)>, u64) {
    let dir = tempfile::tempdir().unwrap();
    let sdir = dir.path().join("streams/s");
    std::fs::create_dir_all(&sdir).unwrap();
    std::fs::write(sdir.join(format!("{:020}.blk", 1)), bytes).unwrap();
    let store = Store::open(dir.path()).unwrap();
    let s = store.stream("s", StreamConfig::default()).unwrap();
    let got: Vec<(u64, Vec<u8>)> = s
        .read_from(0, &FilterSet::all(), 1000, usize::MAX)
        .unwrap()
        .records
        .into_iter()
        .map(|r| (r.seq, r.payload.to_vec()))
        .collect();
    // New appends work and never reuse a sequence that was served.
    let next = s.append(b"t/x", b"", b"after").unwrap().wait().unwrap();
    (got, next)
}

fn check(got: &[(u64, Vec<u8>)], intact_upto: u64, next: u64) {
    let want: Vec<(u64, Vec<u8>)> = (1..=intact_upto).map(|s| (s, payload(s))).collect();
    assert_eq!(got, &want[..]);
    assert!(next > intact_upto);
}

#[test]
fn truncation_at_every_offset_of_the_tail() {
    let (raw, recs) = make_block(false);
    let tail_start = recs[recs.len() - 4].1;
    for cut in tail_start..=raw.len() {
        let intact = recs
            .iter()
            .filter(|r| r.2 <= cut)
            .map(|r| r.0)
            .max()
            .unwrap_or(0);
        let (got, next) = recover(&raw[..cut]);
        check(&got, intact, next);
    }
}

#[test]
fn bit_flips_in_the_tail() {
    let (raw, recs) = make_block(false);
    let tail_start = recs[recs.len() - 3].1;
    for i in tail_start..raw.len() {
        let mut b = raw.clone();
        b[i] ^= 1 << (i % 8);
        let damaged = recs.iter().find(|r| r.1 <= i && i < r.2).unwrap().0;
        let (got, next) = recover(&b);
        check(&got, damaged - 1, next);
    }
}

#[test]
fn a_cut_batch_is_dropped_whole() {
    let (raw, recs) = make_block(true);
    let batch_start = recs.iter().find(|r| r.0 == 13).unwrap().1;
    for cut in batch_start..raw.len() {
        let (got, next) = recover(&raw[..cut]);
        check(&got, 12, next);
    }
    let (got, _) = recover(&raw);
    assert_eq!(got.len(), 15);
}

#[test]
fn corrupt_sealed_block_is_quarantined_and_the_rest_served() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StreamConfig {
        block_size_bytes: 4096,
        ..Default::default()
    };
    {
        let store = Store::open(dir.path()).unwrap();
        let s = store.stream("s", cfg.clone()).unwrap();
        for seq in 1..=300u64 {
            drop(s.append_at(seq, b"t", b"", &payload(seq)).unwrap());
        }
        s.flush().unwrap();
    }
    let sdir = dir.path().join("streams/s");
    let mut blks: Vec<PathBuf> = std::fs::read_dir(&sdir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "blk"))
        .collect();
    blks.sort();
    assert!(blks.len() >= 4);
    let victim = &blks[1];
    let mut b = std::fs::read(victim).unwrap();
    b[200] ^= 0x10;
    std::fs::write(victim, b).unwrap();
    let first_of_victim: u64 = victim
        .file_stem()
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let first_of_next: u64 = blks[2]
        .file_stem()
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    // Found on open with verification...
    {
        let store = Store::open(dir.path()).unwrap();
        let s = store
            .stream(
                "s",
                StreamConfig {
                    verify_on_open: true,
                    ..cfg.clone()
                },
            )
            .unwrap();
        let q = &s.recovery_report().quarantined;
        assert_eq!(q.len(), 1);
        assert_eq!(q[0].range, first_of_victim..=first_of_next - 1);
        let got: Vec<u64> = s
            .read_from(0, &FilterSet::all(), 1000, usize::MAX)
            .unwrap()
            .records
            .iter()
            .map(|r| r.seq)
            .collect();
        let want: Vec<u64> = (1..=300)
            .filter(|s| *s < first_of_victim || *s >= first_of_next)
            .collect();
        assert_eq!(got, want);
        assert!(
            victim
                .parent()
                .unwrap()
                .join("quarantine")
                .join(victim.file_name().unwrap())
                .exists()
        );
    }
}

#[test]
fn corruption_found_by_a_read_quarantines_the_block() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StreamConfig {
        block_size_bytes: 4096,
        ..Default::default()
    };
    let store = Store::open(dir.path()).unwrap();
    let s = store.stream("s", cfg).unwrap();
    for seq in 1..=300u64 {
        drop(s.append_at(seq, b"t", b"", &payload(seq)).unwrap());
    }
    s.flush().unwrap();
    let first = std::fs::read_dir(dir.path().join("streams/s"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "blk"))
        .min()
        .unwrap();
    let mut b = std::fs::read(&first).unwrap();
    b[BLOCK_HEADER_LEN + 37] ^= 1;
    std::fs::write(&first, b).unwrap();
    let err = s.get(1).unwrap_err();
    assert!(
        matches!(err, tern_store::StoreError::Corrupt { .. }),
        "{err}"
    );
    assert_eq!(s.info().quarantined.len(), 1);
    assert!(s.get(1).unwrap().is_none());
    assert!(s.get(300).unwrap().is_some());
}

#[test]
fn verify_scrubs_sealed_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StreamConfig {
        block_size_bytes: 4096,
        ..Default::default()
    };
    let store = Store::open(dir.path()).unwrap();
    let s = store.stream("s", cfg).unwrap();
    for seq in 1..=300u64 {
        drop(s.append_at(seq, b"t", b"", &payload(seq)).unwrap());
    }
    s.flush().unwrap();
    assert!(s.verify().unwrap().is_empty());
    let mut blks: Vec<PathBuf> = std::fs::read_dir(dir.path().join("streams/s"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "blk"))
        .collect();
    blks.sort();
    let mut b = std::fs::read(&blks[2]).unwrap();
    let at = b.len() - 3;
    b[at] ^= 0x80;
    std::fs::write(&blks[2], b).unwrap();
    let found = s.verify().unwrap();
    assert_eq!(found.len(), 1);
    let r = found[0].range.clone();
    for seq in 1..=300u64 {
        assert_eq!(
            s.get(seq).unwrap().is_some(),
            !r.contains(&seq),
            "seq {seq}"
        );
    }
}

/// Delete markers stored in a block that gets quarantined are written again, so records
/// deleted earlier do not come back.
#[test]
fn markers_of_a_quarantined_block_are_kept() {
    for found_by_read in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let cfg = StreamConfig {
            block_size_bytes: 4096,
            ..Default::default()
        };
        let blocks = |d: &Path| {
            let mut v: Vec<PathBuf> = std::fs::read_dir(d.join("streams/s"))
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| p.extension().is_some_and(|e| e == "blk"))
                .collect();
            v.sort();
            v
        };
        let victim;
        {
            let store = Store::open(dir.path()).unwrap();
            let s = store.stream("s", cfg.clone()).unwrap();
            for seq in 1..=100u64 {
                drop(s.append_at(seq, b"t", b"", &payload(seq)).unwrap());
            }
            s.flush().unwrap();
            assert_eq!(s.delete(&[5]).unwrap().records, 1);
            victim = blocks(dir.path()).pop().unwrap();
            for seq in 101..=300u64 {
                drop(s.append_at(seq, b"t", b"", &payload(seq)).unwrap());
            }
            s.flush().unwrap();
        }
        assert!(
            victim != blocks(dir.path()).pop().unwrap(),
            "victim block was sealed"
        );
        let mut b = std::fs::read(&victim).unwrap();
        b[BLOCK_HEADER_LEN + 5] ^= 2;
        std::fs::write(&victim, b).unwrap();
        let victim_base: u64 = victim
            .file_stem()
            .unwrap()
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            let s = store
                .stream(
                    "s",
                    StreamConfig {
                        verify_on_open: !found_by_read,
                        ..cfg.clone()
                    },
                )
                .unwrap();
            if found_by_read {
                assert!(s.get(victim_base).is_err());
            }
            assert_eq!(s.info().quarantined.len(), 1);
            assert!(s.get(5).unwrap().is_none());
            s.flush().unwrap();
        }
        let store = Store::open(dir.path()).unwrap();
        let s = store.stream("s", cfg).unwrap();
        assert!(
            s.get(5).unwrap().is_none(),
            "deleted record came back (found_by_read={found_by_read})"
        );
        assert!(s.get(4).unwrap().is_some());
    }
}

/// Under `sync = never` blocks are sealed without a sync, so a crash may tear a sealed
/// block's tail: it is truncated like the active block's, not quarantined.
#[test]
fn torn_sealed_block_of_a_never_syncing_stream_is_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StreamConfig {
        block_size_bytes: 4096,
        sync: tern_store::SyncPolicy::Never,
        ..Default::default()
    };
    {
        let store = Store::open(dir.path()).unwrap();
        let s = store.stream("s", cfg.clone()).unwrap();
        for seq in 1..=300u64 {
            drop(s.append_at(seq, b"t", b"", &payload(seq)).unwrap());
        }
        s.flush().unwrap();
    }
    let mut blks: Vec<PathBuf> = std::fs::read_dir(dir.path().join("streams/s"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "blk"))
        .collect();
    blks.sort();
    let raw = std::fs::read(&blks[1]).unwrap();
    std::fs::write(&blks[1], &raw[..raw.len() - 7]).unwrap();
    let next_base: u64 = blks[2]
        .file_stem()
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let store = Store::open(dir.path()).unwrap();
    let s = store.stream("s", cfg).unwrap();
    assert!(s.recovery_report().quarantined.is_empty());
    assert_eq!(
        s.recovery_report().lost.as_ref().map(|r| *r.start()),
        Some(next_base - 1)
    );
    for seq in 1..=300u64 {
        let got = s.get(seq).unwrap().map(|r| r.payload.to_vec());
        assert_eq!(
            got,
            (seq != next_base - 1).then(|| payload(seq)),
            "seq {seq}"
        );
    }
}

#[test]
fn bad_header_of_the_active_block_never_reuses_sequences() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        let s = store.stream("s", StreamConfig::default()).unwrap();
        for seq in 1..=10u64 {
            drop(s.append_at(seq, b"t", b"", &payload(seq)).unwrap());
        }
        s.flush().unwrap();
    }
    let p = block_path(dir.path());
    let mut b = std::fs::read(&p).unwrap();
    b[3] ^= 0xff;
    std::fs::write(&p, b).unwrap();
    let store = Store::open(dir.path()).unwrap();
    let s = store.stream("s", StreamConfig::default()).unwrap();
    let q = &s.recovery_report().quarantined;
    assert_eq!(q.len(), 1);
    assert_eq!(q[0].range, 1..=10);
    assert_eq!(s.append(b"t", b"", b"x").unwrap().wait().unwrap(), 11);
}
