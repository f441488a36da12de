//! Files a crash cannot produce but a disk fault, a bug of another version or a hand edit
//! can: checksums hold, contents lie. Recovery must neither panic nor serve wrong data.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use tern_store::format::{self, KIND_DATA};
use tern_store::{FilterSet, Store, StreamConfig};

fn stream_dir(store_dir: &Path) -> PathBuf {
    store_dir.join("streams/s")
}

fn files_with(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect();
    v.sort();
    v
}

/// A stream of 20 records in one sealed block (with its index) and an empty active block.
/// Appends each number as a record of `t/x` and waits for it.
fn append_numbers(s: &tern_store::Stream, numbers: impl Iterator<Item = u32>) {
    for i in numbers {
        s.append(b"t/x", b"", &i.to_le_bytes())
            .unwrap()
            .wait()
            .unwrap();
    }
}

fn sealed_stream(dir: &Path) {
    let store = Store::open(dir).unwrap();
    let s = store.stream("s", StreamConfig::default()).unwrap();
    append_numbers(&s, 0..20);
    s.seal().unwrap();
    s.close().unwrap();
}

/// Rewrites the sealed block's index through `edit`, with a valid checksum.
fn edit_index(dir: &Path, edit: impl FnOnce(&mut format::IndexData)) {
    let ix_path = files_with(&stream_dir(dir), "idx").remove(0);
    let mut ix = format::decode_index(&Bytes::from(std::fs::read(&ix_path).unwrap())).unwrap();
    edit(&mut ix);
    std::fs::write(&ix_path, format::encode_index(&ix)).unwrap();
}

fn all_payloads(dir: &Path) -> Vec<Vec<u8>> {
    let store = Store::open(dir).unwrap();
    let s = store.stream("s", StreamConfig::default()).unwrap();
    let page = s.read_from(1, &FilterSet::all(), 1000, 1 << 20).unwrap();
    for seq in 1..=20 {
        assert!(s.get(seq).unwrap().is_some(), "seq {seq}");
    }
    page.records.iter().map(|r| r.payload.to_vec()).collect()
}

fn expected() -> Vec<Vec<u8>> {
    (0..20u32).map(|i| i.to_le_bytes().to_vec()).collect()
}

#[test]
fn index_entry_past_the_block_is_not_trusted() {
    let dir = tempfile::tempdir().unwrap();
    sealed_stream(dir.path());
    edit_index(dir.path(), |ix| ix.entries[0].offset = ix.block_len as u32);
    assert_eq!(all_payloads(dir.path()), expected());
}

#[test]
fn index_entry_with_huge_length_is_not_trusted() {
    let dir = tempfile::tempdir().unwrap();
    sealed_stream(dir.path());
    edit_index(dir.path(), |ix| ix.entries[3].len = u32::MAX);
    assert_eq!(all_payloads(dir.path()), expected());
}

#[test]
fn index_entries_out_of_order_are_not_trusted() {
    let dir = tempfile::tempdir().unwrap();
    sealed_stream(dir.path());
    edit_index(dir.path(), |ix| ix.entries.swap(0, 19));
    assert_eq!(all_payloads(dir.path()), expected());
}

/// Appends `rec` (already encoded, checksum valid) to the newest block of a fresh stream.
fn stream_with_forged_tail(dir: &Path, rec: &[u8]) {
    let store = Store::open(dir).unwrap();
    let s = store.stream("s", StreamConfig::default()).unwrap();
    s.append(b"t/x", b"", b"real").unwrap().wait().unwrap();
    s.close().unwrap();
    drop(store);
    let blk = files_with(&stream_dir(dir), "blk").pop().unwrap();
    let mut raw = std::fs::read(&blk).unwrap();
    raw.extend_from_slice(rec);
    std::fs::write(&blk, raw).unwrap();
}

/// Reopens and appends: the new record must get the sequence after the real one.
fn next_append_seq(dir: &Path) -> u64 {
    let store = Store::open(dir).unwrap();
    let s = store.stream("s", StreamConfig::default()).unwrap();
    assert_eq!(
        s.get(1).unwrap().map(|r| r.payload.to_vec()),
        Some(b"real".to_vec())
    );
    s.append(b"t/x", b"", b"next").unwrap().wait().unwrap()
}

#[test]
fn record_claiming_a_sequence_near_the_top_is_damage() {
    let dir = tempfile::tempdir().unwrap();
    let mut rec = Vec::new();
    format::encode_record(
        &mut rec,
        KIND_DATA,
        0,
        u64::MAX - 1,
        1,
        b"t/x",
        b"",
        b"forged",
    );
    stream_with_forged_tail(dir.path(), &rec);
    assert_eq!(next_append_seq(dir.path()), 2);
}

#[test]
fn delete_marker_reaching_the_top_is_damage() {
    let dir = tempfile::tempdir().unwrap();
    let mut rec = Vec::new();
    format::encode_delete(&mut rec, 1, 1, &[(5, u64::MAX)]);
    stream_with_forged_tail(dir.path(), &rec);
    assert_eq!(next_append_seq(dir.path()), 2);
}

#[test]
fn index_marker_reaching_the_top_is_not_trusted() {
    let dir = tempfile::tempdir().unwrap();
    sealed_stream(dir.path());
    edit_index(dir.path(), |ix| ix.deletes.push((30, u64::MAX)));
    assert_eq!(all_payloads(dir.path()), expected());
    let store = Store::open(dir.path()).unwrap();
    let s = store.stream("s", StreamConfig::default()).unwrap();
    assert_eq!(s.append(b"t/x", b"", b"n").unwrap().wait().unwrap(), 21);
}

#[test]
fn index_entries_outside_their_block_are_not_trusted() {
    let dir = tempfile::tempdir().unwrap();
    sealed_stream(dir.path());
    edit_index(dir.path(), |ix| {
        for e in &mut ix.entries {
            e.seq += 1000;
        }
    });
    assert_eq!(all_payloads(dir.path()), expected());
}

#[test]
fn deletion_recorded_in_a_quarantined_block_survives_a_crash_before_it_is_rewritten() {
    use std::sync::Arc;
    use tern_store::vfs::FaultyVfs;
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        let s = store.stream("s", StreamConfig::default()).unwrap();
        append_numbers(&s, 1..=10);
        s.seal().unwrap();
        // The marker deleting 3 goes to the second block, which is damaged below.
        s.delete(&[3]).unwrap();
        append_numbers(&s, 11..=15);
        s.seal().unwrap();
        s.close().unwrap();
    }
    let second = files_with(&stream_dir(dir.path()), "blk").remove(1);
    let mut raw = std::fs::read(&second).unwrap();
    *raw.last_mut().unwrap() ^= 1;
    std::fs::write(&second, raw).unwrap();
    {
        // Recovery quarantines the second block; writing its marker again then fails, as a
        // crash right after the quarantine would leave it.
        let vfs = FaultyVfs::default();
        vfs.fail_write_after(0);
        let store = Store::open_with_vfs(dir.path(), Arc::new(vfs)).unwrap();
        let cfg = StreamConfig {
            verify_on_open: true,
            ..Default::default()
        };
        let s = store.stream("s", cfg).unwrap();
        assert_eq!(s.recovery_report().quarantined.len(), 1);
        assert!(s.get(3).unwrap().is_none());
        assert!(s.flush().is_err());
    }
    let store = Store::open(dir.path()).unwrap();
    let s = store.stream("s", StreamConfig::default()).unwrap();
    assert!(s.get(2).unwrap().is_some());
    assert!(s.get(3).unwrap().is_none(), "a deleted record came back");
}

#[test]
fn index_entry_with_unknown_flags_is_not_trusted() {
    let dir = tempfile::tempdir().unwrap();
    sealed_stream(dir.path());
    edit_index(dir.path(), |ix| ix.entries[5].flags |= 1 << 31);
    assert_eq!(all_payloads(dir.path()), expected());
}

#[test]
fn empty_active_block_with_an_unsynced_header_is_recreated_not_quarantined() {
    // A crash between a block's creation, its reservation, its header write and the sync of
    // both leaves it empty, a header's length of zeros, or its reserved length of zeros.
    let reserved = StreamConfig::default().block_size_bytes;
    for len in [0, 32, reserved] {
        let dir = tempfile::tempdir().unwrap();
        sealed_stream(dir.path());
        let active = files_with(&stream_dir(dir.path()), "blk").pop().unwrap();
        assert_eq!(std::fs::metadata(&active).unwrap().len(), reserved);
        std::fs::write(&active, vec![0u8; len as usize]).unwrap();
        let store = Store::open(dir.path()).unwrap();
        let s = store.stream("s", StreamConfig::default()).unwrap();
        assert_eq!(s.recovery_report().quarantined, vec![], "length {len}");
        assert_eq!(s.append(b"t/x", b"", b"n").unwrap().wait().unwrap(), 21);
        drop(s);
        drop(store);
        assert_eq!(all_payloads(dir.path()).len(), 21);
        assert_eq!(std::fs::metadata(&active).unwrap().len(), reserved);
    }
}

#[test]
fn reloaded_index_that_names_other_sequences_is_not_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let cfg = StreamConfig {
        block_size_bytes: 4096,
        index_cache_blocks: 1,
        ..Default::default()
    };
    let s = store.stream("s", cfg).unwrap();
    append_numbers(&s, 0..600);
    assert!(s.info().blocks > 4);
    // Evicted blocks reload their entries from these files: shift every sequence by one.
    for ix_path in files_with(&stream_dir(dir.path()), "idx") {
        let raw = Bytes::from(std::fs::read(&ix_path).unwrap());
        let mut ix = format::decode_index(&raw).unwrap();
        for e in &mut ix.entries {
            e.seq += 1;
        }
        std::fs::write(&ix_path, format::encode_index(&ix)).unwrap();
    }
    let all = s.read_from(1, &FilterSet::all(), 1000, usize::MAX).unwrap();
    let got: Vec<u32> = all
        .records
        .iter()
        .map(|r| u32::from_le_bytes(r.payload[..].try_into().unwrap()))
        .collect();
    assert_eq!(got, (0..600).collect::<Vec<u32>>());
    assert_eq!(s.info().quarantined, vec![]);
}

#[test]
fn bit_rot_mid_active_block_does_not_hand_out_sequences_again() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        let s = store.stream("s", StreamConfig::default()).unwrap();
        append_numbers(&s, 0..20);
        s.close().unwrap();
    }
    let active = files_with(&stream_dir(dir.path()), "blk").pop().unwrap();
    let mut raw = std::fs::read(&active).unwrap();
    let b = Bytes::from(raw.clone());
    // Flip a payload byte of the fifth record: its checksum fails, the length still holds.
    let mut off = format::BLOCK_HEADER_LEN;
    for _ in 0..4 {
        off += format::decode_record(&b, off).unwrap().len;
    }
    let fifth = format::decode_record(&b, off).unwrap();
    assert_eq!(fifth.seq, 5);
    raw[off + fifth.len - 1] ^= 0x40;
    std::fs::write(&active, raw).unwrap();

    let store = Store::open(dir.path()).unwrap();
    let s = store.stream("s", StreamConfig::default()).unwrap();
    assert_eq!(s.recovery_report().lost, Some(5..=20));
    let page = s.read_from(1, &FilterSet::all(), 100, usize::MAX).unwrap();
    assert_eq!(page.records.len(), 4);
    assert_eq!(s.append(b"t/x", b"", b"n").unwrap().wait().unwrap(), 21);
}

/// Two sealed blocks; the delete marker of 3 ends the second, which then loses that marker
/// by a cut at a record boundary: what is left scans as a clean block of ten records.
fn stream_with_cut_marker(dir: &Path) {
    let store = Store::open(dir).unwrap();
    let s = store.stream("s", StreamConfig::default()).unwrap();
    append_numbers(&s, 0..10);
    s.seal().unwrap();
    append_numbers(&s, 10..20);
    s.delete(&[3]).unwrap();
    s.seal().unwrap();
    s.close().unwrap();
    drop(store);
    let second = files_with(&stream_dir(dir), "blk").remove(1);
    let raw = std::fs::read(&second).unwrap();
    let b = Bytes::from(raw.clone());
    let mut off = format::BLOCK_HEADER_LEN;
    while format::decode_record(&b, off).unwrap().kind == KIND_DATA {
        off += format::decode_record(&b, off).unwrap().len;
    }
    std::fs::write(&second, &raw[..off]).unwrap();
}

#[test]
fn sealed_block_cut_at_a_record_boundary_is_damage_not_a_shorter_block() {
    for verify_on_open in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        stream_with_cut_marker(dir.path());
        let store = Store::open(dir.path()).unwrap();
        let cfg = StreamConfig {
            verify_on_open,
            ..Default::default()
        };
        let s = store.stream("s", cfg).unwrap();
        assert_eq!(
            s.info().quarantined.len(),
            1,
            "verify_on_open {verify_on_open}"
        );
        assert!(s.get(3).unwrap().is_none(), "a deleted record came back");
        assert!(s.get(2).unwrap().is_some());
    }
}

#[test]
fn compaction_leaves_no_index_longer_than_its_block() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        let s = store.stream("s", StreamConfig::default()).unwrap();
        append_numbers(&s, 0..20);
        s.seal().unwrap();
        s.delete(&[4, 5]).unwrap();
        s.compact(8).unwrap();
        s.close().unwrap();
    }
    let first = files_with(&stream_dir(dir.path()), "blk").remove(0);
    let len = std::fs::metadata(&first).unwrap().len();
    let ix = std::fs::read(first.with_extension("idx")).unwrap();
    let ix = format::decode_index(&Bytes::from(ix)).unwrap();
    assert_eq!(ix.block_len, len);
    assert_eq!(ix.entries.len(), 18);
    let store = Store::open(dir.path()).unwrap();
    let s = store.stream("s", StreamConfig::default()).unwrap();
    assert_eq!(s.info().quarantined, vec![]);
    assert_eq!(s.info().msgs, 18);
}

#[test]
fn compaction_whose_index_write_fails_leaves_no_stale_index() {
    use std::sync::Arc;
    use tern_store::vfs::FaultyVfs;
    let dir = tempfile::tempdir().unwrap();
    {
        let vfs = FaultyVfs::default();
        let store = Store::open_with_vfs(dir.path(), Arc::new(vfs.clone())).unwrap();
        let s = store.stream("s", StreamConfig::default()).unwrap();
        append_numbers(&s, 0..20);
        s.seal().unwrap();
        s.delete(&[4, 5]).unwrap();
        // The rewritten block is written; writing its index fails.
        vfs.fail_write_after(1);
        s.compact(8).unwrap();
        s.close().unwrap();
    }
    let store = Store::open(dir.path()).unwrap();
    let s = store.stream("s", StreamConfig::default()).unwrap();
    assert_eq!(s.info().quarantined, vec![]);
    assert_eq!(s.info().msgs, 18);
    assert!(s.get(4).unwrap().is_none());
    assert!(s.get(6).unwrap().is_some());
}

#[test]
fn block_file_longer_than_any_offset_is_quarantined_unread() {
    let dir = tempfile::tempdir().unwrap();
    sealed_stream(dir.path());
    // A sparse file: no disk space used, but reading it would take 4 GiB of memory.
    let first = files_with(&stream_dir(dir.path()), "blk").remove(0);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&first)
        .unwrap();
    f.set_len(u64::from(u32::MAX) + 1).unwrap();
    drop(f);
    let store = Store::open(dir.path()).unwrap();
    let cfg = StreamConfig {
        verify_on_open: true,
        ..Default::default()
    };
    let s = store.stream("s", cfg).unwrap();
    assert_eq!(s.info().quarantined.len(), 1);
    assert_eq!(s.append(b"t/x", b"", b"n").unwrap().wait().unwrap(), 21);
}

/// Two writers in one directory (a broker left running while its data directory was removed
/// and another started on the same path) leave blocks whose records reach past the next
/// block's base. Reads would skip records and compaction would drop live keyed values; the
/// stream refuses to open instead, naming the cause.
#[test]
fn blocks_whose_records_overlap_refuse_to_open() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        let s = store.stream("s", StreamConfig::default()).unwrap();
        append_numbers(&s, 0..10);
        s.seal().unwrap();
        append_numbers(&s, 10..20);
        s.seal().unwrap();
        s.close().unwrap();
    }
    let sd = stream_dir(dir.path());
    let blocks = files_with(&sd, "blk");
    assert!(blocks.len() >= 2, "{blocks:?}");
    // The second block's records under a base 3 below its own: a block between the first
    // and the second that holds the second's sequences.
    let second = std::fs::read(&blocks[1]).unwrap();
    let base: u64 = blocks[1]
        .file_stem()
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let forged_base = base - 3;
    let mut forged = format::encode_block_header(forged_base).to_vec();
    forged.extend_from_slice(&second[format::BLOCK_HEADER_LEN..]);
    std::fs::write(sd.join(format!("{forged_base:020}.blk")), forged).unwrap();
    let store = Store::open(dir.path()).unwrap();
    let error = store
        .stream("s", StreamConfig::default())
        .expect_err("overlapping blocks must not open");
    let text = error.to_string();
    assert!(text.contains("two processes"), "{text}");
}
