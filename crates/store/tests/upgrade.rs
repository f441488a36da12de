//! A data directory written by an older release opens in this one. Releases before session
//! 17 wrote every block index in the fixed-width layout (version 1); this one writes deltas
//! (version 2) and must still trust, not quarantine or rebuild, the version-1 files it finds.
//! The version-1 bytes are written here by hand from that layout, not by the crate's encoder,
//! so a change that stops this release reading them fails here.

use std::path::{Path, PathBuf};

use bytes::{BufMut, Bytes};
use tern_store::format::{self, INDEX_MAGIC, IndexData};
use tern_store::{FilterSet, Store, StreamConfig};

const RECORDS: u32 = 600;

fn config() -> StreamConfig {
    StreamConfig {
        // Small blocks: the records span several sealed blocks, each with its index.
        block_size_bytes: 4096,
        ..StreamConfig::default()
    }
}

fn index_files(store_dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(store_dir.join("streams/s"))
        .expect("stream directory")
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "idx"))
        .collect();
    v.sort();
    v
}

fn version_of(path: &Path) -> u32 {
    let raw = std::fs::read(path).expect("index file");
    u32::from_le_bytes(raw[8..12].try_into().expect("four bytes"))
}

/// The version-1 layout: magic, version, reserved, block length, the three counts, reserved,
/// the topics (u16 length + bytes), 32-byte entries, 16-byte delete ranges, CRC-32C.
fn encode_version_1(ix: &IndexData) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(INDEX_MAGIC);
    out.put_u32_le(1);
    out.put_u32_le(0);
    out.put_u64_le(ix.block_len);
    out.put_u32_le(ix.topics.len() as u32);
    out.put_u32_le(ix.entries.len() as u32);
    out.put_u32_le(ix.deletes.len() as u32);
    out.put_u32_le(0);
    for t in &ix.topics {
        out.put_u16_le(t.len() as u16);
        out.extend_from_slice(t);
    }
    for e in &ix.entries {
        out.put_u64_le(e.seq);
        out.put_u64_le(e.time_ns);
        out.put_u32_le(e.offset);
        out.put_u32_le(e.len);
        out.put_u32_le(e.topic);
        out.put_u32_le(e.flags);
    }
    for &(a, b) in &ix.deletes {
        out.put_u64_le(a);
        out.put_u64_le(b);
    }
    let crc = crc32c::crc32c(&out);
    out.put_u32_le(crc);
    out
}

fn topic_of(i: u32) -> Vec<u8> {
    format!("t/{}", i % 3).into_bytes()
}

/// Every record still there, in order, with its topic and payload; `t/1` alone by filter.
fn check_all(dir: &Path, expect: &[u32]) {
    let store = Store::open(dir).expect("open");
    let s = store.stream("s", config()).expect("stream");
    let page = s
        .read_from(1, &FilterSet::all(), 10_000, 16 << 20)
        .expect("read");
    let got: Vec<(Vec<u8>, u32)> = page
        .records
        .iter()
        .map(|r| {
            let n = u32::from_le_bytes(r.payload[..4].try_into().expect("payload"));
            (r.topic.to_vec(), n)
        })
        .collect();
    let want: Vec<(Vec<u8>, u32)> = expect.iter().map(|&i| (topic_of(i), i)).collect();
    assert_eq!(got, want);
    let ones = s
        .read_from(1, &FilterSet::new(["t/1"]), 10_000, 16 << 20)
        .expect("filtered read");
    assert_eq!(
        ones.records.len(),
        expect.iter().filter(|&&i| i % 3 == 1).count()
    );
    s.close().expect("close");
}

#[test]
fn version_1_indexes_are_trusted_and_new_blocks_get_version_2() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let s = store.stream("s", config()).expect("stream");
    for i in 0..RECORDS {
        let payload = [i.to_le_bytes().as_slice(), &[7u8; 40]].concat();
        s.append(&topic_of(i), b"", &payload)
            .expect("append")
            .wait()
            .expect("durable");
    }
    // A removed range, so that the indexes carry delete markers as well.
    s.remove_below(11).expect("remove");
    s.seal().expect("seal");
    s.close().expect("close");
    drop(store);

    // What an older release left: every index in version 1.
    let old = index_files(dir.path());
    assert!(old.len() >= 5, "only {} sealed blocks", old.len());
    for path in &old {
        let raw = Bytes::from(std::fs::read(path).expect("index"));
        let ix = format::decode_index(&raw).expect("this release's index decodes");
        std::fs::write(path, encode_version_1(&ix)).expect("rewrite");
        assert_eq!(version_of(path), 1);
    }

    let kept: Vec<u32> = (10..RECORDS).collect();
    check_all(dir.path(), &kept);
    // Trusted as they are: a distrusted index would have been rebuilt in version 2, and a
    // damaged block quarantined.
    for path in &old {
        assert_eq!(version_of(path), 1, "{} was rewritten", path.display());
    }
    assert!(!dir.path().join("streams/s/quarantine").exists());

    // New blocks sealed by this release beside the old ones: version 2, all read back.
    let store = Store::open(dir.path()).expect("reopen");
    let s = store.stream("s", config()).expect("stream");
    for i in RECORDS..RECORDS + 200 {
        let payload = [i.to_le_bytes().as_slice(), &[9u8; 40]].concat();
        s.append(&topic_of(i), b"", &payload)
            .expect("append")
            .wait()
            .expect("durable");
    }
    s.seal().expect("seal");
    s.close().expect("close");
    drop(store);
    let new: Vec<PathBuf> = index_files(dir.path())
        .into_iter()
        .filter(|p| !old.contains(p))
        .collect();
    assert!(!new.is_empty());
    assert!(new.iter().all(|p| version_of(p) == 2));
    let kept: Vec<u32> = (10..RECORDS + 200).collect();
    check_all(dir.path(), &kept);
}
