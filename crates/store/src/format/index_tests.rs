use bytes::{BufMut, Bytes};
use proptest::prelude::*;

use super::*;

fn entry(seq: u64, time_ns: u64, offset: u32, len: u32) -> Entry {
    Entry {
        seq,
        time_ns,
        offset,
        len,
        topic: 0,
        flags: 0,
    }
}

/// A block of `n` records of `len` bytes each, back to back, as the writer seals it.
fn typical(n: u64, len: u32) -> IndexData {
    let mut entries = Vec::new();
    let mut offset = BLOCK_HEADER_LEN as u32;
    for i in 0..n {
        entries.push(entry(
            1_000 + i,
            1_765_000_000_000_000_000 + i * 1_300,
            offset,
            len,
        ));
        offset += len;
    }
    IndexData {
        block_len: u64::from(offset),
        topics: vec![Bytes::from_static(b"bench/topic")],
        entries,
        deletes: vec![(3, 4)],
    }
}

fn same(a: &IndexData, b: &IndexData) -> bool {
    a.block_len == b.block_len
        && a.topics == b.topics
        && a.entries == b.entries
        && a.deletes == b.deletes
}

fn version_of(buf: &[u8]) -> u32 {
    u32::from_le_bytes(arr4(&buf[8..12]))
}

/// A body (from the magic on) with its checksum appended, as a writer would leave it.
fn sealed(mut body: Vec<u8>) -> Bytes {
    let crc = crc32c::crc32c(&body);
    body.put_u32_le(crc);
    Bytes::from(body)
}

/// The fixed header of an index with one topic, `n` entries and no ranges.
fn header(version: u32, block_len: u64, n_entries: u32) -> Vec<u8> {
    let mut b = INDEX_MAGIC.to_vec();
    for v in [version, 0] {
        b.put_u32_le(v);
    }
    b.put_u64_le(block_len);
    for v in [1, n_entries, 0, 0] {
        b.put_u32_le(v);
    }
    b.put_u16_le(1);
    b.push(b't');
    b
}

#[test]
fn index_roundtrip() {
    let ix = IndexData {
        block_len: 1234,
        topics: vec![Bytes::from_static(b"x"), Bytes::from_static(b"y/z")],
        entries: vec![Entry {
            seq: 1,
            time_ns: 2,
            offset: 32,
            len: 40,
            topic: 1,
            flags: 0,
        }],
        deletes: vec![(5, 9)],
    };
    let enc = Bytes::from(encode_index(&ix));
    assert_eq!(version_of(&enc), VERSION_DELTA);
    let d = decode_index(&enc).unwrap();
    assert!(same(&d, &ix));
    let mut bad = enc.to_vec();
    bad[20] ^= 1;
    assert!(decode_index(&Bytes::from(bad)).is_none());
}

#[test]
fn version_1_files_still_decode() {
    let ix = typical(500, 150);
    let v1 = Bytes::from(encode_as(&ix, VERSION_FIXED));
    assert_eq!(version_of(&v1), VERSION_FIXED);
    assert!(same(&decode_index(&v1).unwrap(), &ix));
}

/// Why version 2 exists: a sealed block's index is replicated whole in a cluster.
#[test]
fn deltas_take_at_most_a_third_of_the_fixed_width() {
    let ix = typical(25_000, 160);
    let (v1, v2) = (encode_as(&ix, VERSION_FIXED), encode_index(&ix));
    assert_eq!(version_of(&v2), VERSION_DELTA);
    assert!(
        v2.len() * 3 <= v1.len(),
        "{} bytes against {}",
        v2.len(),
        v1.len()
    );
    assert!(same(&decode_index(&Bytes::from(v2)).unwrap(), &ix));
}

#[test]
fn every_flipped_bit_and_every_cut_is_refused() {
    let enc = encode_index(&typical(4, 60));
    assert_eq!(version_of(&enc), VERSION_DELTA);
    for bit in 0..enc.len() * 8 {
        let mut w = enc.clone();
        w[bit / 8] ^= 1 << (bit % 8);
        assert!(decode_index(&Bytes::from(w)).is_none(), "bit {bit}");
    }
    for cut in 0..enc.len() {
        assert!(
            decode_index(&Bytes::from(enc[..cut].to_vec())).is_none(),
            "cut {cut}"
        );
    }
}

/// Entries no scan yields cannot be deltas: they are written fixed-width, and refused.
#[test]
fn out_of_order_entries_fall_back_to_version_1_and_are_refused() {
    let mut ix = typical(3, 60);
    ix.entries.swap(0, 1);
    let enc = encode_index(&ix);
    assert_eq!(version_of(&enc), VERSION_FIXED);
    assert!(decode_index(&Bytes::from(enc)).is_none());
}

/// Checksummed but impossible: what a buggy writer could leave behind.
#[test]
fn checksummed_nonsense_in_version_2_is_refused() {
    let varint = |v: u64| {
        let mut b = Vec::new();
        put_varint(&mut b, v);
        b
    };
    let good = [
        varint(7),
        varint(0),
        varint(0),
        varint(60),
        varint(0),
        varint(0),
    ]
    .concat();
    let mut ok = header(VERSION_DELTA, 92, 1);
    ok.extend_from_slice(&good);
    assert!(decode_index(&sealed(ok)).is_some(), "the baseline decodes");
    let cases: [(&str, Vec<u8>); 6] = [
        ("an 11-byte varint", [vec![0x80; 10], vec![0]].concat()),
        (
            "a 10th varint byte over one bit",
            [vec![0xff; 9], vec![0x02]].concat(),
        ),
        (
            "an offset past u32",
            [varint(7), varint(0), varint(u64::from(u32::MAX))].concat(),
        ),
        (
            "a record shorter than its header",
            [varint(7), varint(0), varint(0), varint(8)].concat(),
        ),
        (
            "a topic not in the table",
            [varint(7), varint(0), varint(0), varint(60), varint(1)].concat(),
        ),
        (
            "a flag only the reader sets",
            [&good[..5], &varint(0x80)[..]].concat(),
        ),
    ];
    for (what, entry_bytes) in cases {
        let mut body = header(VERSION_DELTA, 92, 1);
        body.extend_from_slice(&entry_bytes);
        if entry_bytes.len() < good.len() {
            body.extend_from_slice(&good[entry_bytes.len()..]);
        }
        assert!(decode_index(&sealed(body)).is_none(), "{what}");
    }
    let mut second_at_same_seq = header(VERSION_DELTA, 152, 2);
    second_at_same_seq.extend_from_slice(&good);
    second_at_same_seq.extend_from_slice(
        &[
            varint(0),
            varint(0),
            varint(0),
            varint(60),
            varint(0),
            varint(0),
        ]
        .concat(),
    );
    assert!(
        decode_index(&sealed(second_at_same_seq)).is_none(),
        "a sequence that does not rise"
    );
}

fn any_entry() -> impl Strategy<Value = Entry> {
    (
        any::<u64>(),
        any::<u64>(),
        any::<u32>(),
        0u32..200,
        0u32..3,
        0u32..8,
    )
        .prop_map(|(seq, time_ns, offset, len, topic, flags)| Entry {
            seq,
            time_ns,
            offset,
            len,
            topic,
            flags,
        })
}

proptest! {
    /// Well-formed indexes of any times, gaps and lengths come back as they went in.
    #[test]
    fn well_formed_indexes_roundtrip_as_deltas(
        steps in prop::collection::vec((1u64..1 << 20, any::<u64>(), 0u32..5_000, 36u32..70_000, 0u32..2, 0u32..4), 0..200),
        first_seq in 0u64..1 << 61,
    ) {
        let mut entries = Vec::new();
        let (mut seq, mut end) = (first_seq, BLOCK_HEADER_LEN as u32);
        for (i, (dseq, time_ns, gap, len, topic, flags)) in steps.into_iter().enumerate() {
            seq += if i == 0 { 0 } else { dseq };
            let offset = end + gap;
            entries.push(Entry { seq, time_ns, offset, len, topic, flags });
            end = offset + len;
        }
        let ix = IndexData { block_len: u64::from(end) + 7, topics: vec![Bytes::from_static(b"a"), Bytes::from_static(b"b")], entries, deletes: vec![(1, 2)] };
        let enc = encode_index(&ix);
        prop_assert_eq!(version_of(&enc), VERSION_DELTA);
        prop_assert!(same(&decode_index(&Bytes::from(enc)).unwrap(), &ix));
    }

    /// Whatever a caller encodes, a reader gets exactly that back or nothing: never a
    /// different index.
    #[test]
    fn any_index_decodes_as_itself_or_not_at_all(
        entries in prop::collection::vec(any_entry(), 0..12),
        block_len in any::<u64>(),
    ) {
        let ix = IndexData { block_len, topics: vec![Bytes::from_static(b"a"), Bytes::from_static(b"b")], entries, deletes: vec![] };
        if let Some(d) = decode_index(&Bytes::from(encode_index(&ix))) {
            prop_assert!(same(&d, &ix));
        }
    }
}
