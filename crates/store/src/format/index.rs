//! The sealed-block index file: its two encodings, and the checks that make a damaged or
//! implausible one rebuilt from its block rather than believed.
//!
//! ```text
//! magic "TERNIDX1", version u32, reserved u32, block_len u64,
//! n_topics u32, n_entries u32, n_ranges u32, reserved u32,
//! topics (len u16 + bytes)*, entries*, delete ranges (first u64, last u64)*,
//! crc32c u32 of everything before it
//! ```
//! Entries, by version:
//! - **1** (fixed width, 32 B each): `seq u64, time u64, offset u32, len u32, topic u32,
//!   flags u32`.
//! - **2** (what the store writes; 8-12 B for a typical record): LEB128 varints of
//!   `seq - previous seq` (the first: `seq`), zigzag `time - previous time` (wrapping; the
//!   first against 0), `offset - end of the previous record` (the first: against the block
//!   header's end), `len`, `topic`, `flags`.
//!
//! Why two: the index travels whole when a block is sealed, and on the replicated disk of a
//! cluster that is a consensus round of ~0.9 MiB per 4 MiB block in version 1 (32 B for each
//! ~150 B record), the largest stall a publisher saw there. Version 2 carries the same
//! entries in a quarter to a third of the bytes. Version 1 files stay readable, and are still what
//! [`encode_index`] writes for entries a scan could not have produced (out of order or
//! overlapping, which only a hostile or buggy caller makes): deltas cannot express them, and
//! a reader then rejects the file as it would any such index.

use bytes::{BufMut, Bytes};

use super::{BLOCK_HEADER_LEN, FLAG_BATCH_MORE, FLAG_TOMBSTONE, INDEX_MAGIC, RECORD_HEADER_LEN};
use super::{MAX_ENCODED_RECORD, arr4, arr8};

/// Fixed-width entries.
const VERSION_FIXED: u32 = 1;
/// Delta-and-varint entries.
const VERSION_DELTA: u32 = 2;
/// Bytes of the fixed part before the topic table.
const HEADER_BYTES: usize = 40;
/// The longest LEB128 encoding of a `u64`.
const MAX_VARINT_BYTES: usize = 10;

/// One data record's place in its block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub seq: u64,
    pub time_ns: u64,
    pub offset: u32,
    pub len: u32,
    /// Index into the block's topic table.
    pub topic: u32,
    pub flags: u32,
}

/// Contents of an index file.
#[derive(Debug, Clone, Default)]
pub struct IndexData {
    pub block_len: u64,
    pub topics: Vec<Bytes>,
    pub entries: Vec<Entry>,
    pub deletes: Vec<(u64, u64)>,
}

/// Encodes an index: version 2 whenever its entries follow one another as a scan yields
/// them (always, for the store's own), else version 1 (see the module's text).
pub fn encode_index(ix: &IndexData) -> Vec<u8> {
    let version = if deltas_fit(&ix.entries) {
        VERSION_DELTA
    } else {
        VERSION_FIXED
    };
    encode_as(ix, version)
}

fn encode_as(ix: &IndexData, version: u32) -> Vec<u8> {
    debug_assert!(version == VERSION_FIXED || deltas_fit(&ix.entries));
    let per_entry = if version == VERSION_DELTA { 12 } else { 32 };
    let mut out =
        Vec::with_capacity(HEADER_BYTES + 8 + ix.entries.len() * per_entry + ix.deletes.len() * 16);
    out.extend_from_slice(INDEX_MAGIC);
    out.put_u32_le(version);
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
    if version == VERSION_DELTA {
        let mut prev = Prev::start();
        for e in &ix.entries {
            put_delta(&mut out, e, &prev);
            prev = Prev::after(e);
        }
    } else {
        ix.entries.iter().for_each(|e| put_fixed(&mut out, e));
    }
    for &(a, b) in &ix.deletes {
        out.put_u64_le(a);
        out.put_u64_le(b);
    }
    let crc = crc32c::crc32c(&out);
    out.put_u32_le(crc);
    out
}

/// Decodes an index file; `None` if it is damaged in any way (the caller rebuilds it):
/// besides the checksum, every entry must lie inside `block_len`, after the block header and
/// after the previous entry, with a record length the decoder accepts, a rising sequence and
/// only record flags (the other bits are the reader's own in-memory marks).
pub fn decode_index(buf: &Bytes) -> Option<IndexData> {
    if buf.len() < HEADER_BYTES + 4 || &buf[0..8] != INDEX_MAGIC {
        return None;
    }
    let body = &buf[..buf.len() - 4];
    let crc = u32::from_le_bytes(arr4(&buf[buf.len() - 4..]));
    if crc32c::crc32c(body) != crc {
        return None;
    }
    let mut r = Reader { b: body, at: 8 };
    let version = r.u32()?;
    let min_entry_bytes = match version {
        VERSION_FIXED => 32,
        VERSION_DELTA => 6,
        _ => return None,
    };
    r.u32()?;
    let block_len = r.u64()?;
    let n_topics = r.u32()? as usize;
    let n_entries = r.u32()? as usize;
    let n_ranges = r.u32()? as usize;
    r.u32()?;
    let mut topics = Vec::with_capacity(n_topics.min(body.len()));
    for _ in 0..n_topics {
        let l = r.u16()? as usize;
        let s = r.take(l)?;
        topics.push(buf.slice_ref(s));
    }
    let mut entries: Vec<Entry> = Vec::with_capacity(n_entries.min(body.len() / min_entry_bytes));
    let mut prev = Prev::start();
    for _ in 0..n_entries {
        let e = if version == VERSION_DELTA {
            r.delta(&prev)?
        } else {
            r.fixed()?
        };
        // Readers size buffers and spans from these fields, so an index whose checksum holds
        // but whose entries could not have come from a scan of its block is damaged too.
        if !plausible(&e, entries.last(), prev.end, block_len, topics.len()) {
            return None;
        }
        prev = Prev::after(&e);
        entries.push(e);
    }
    let mut deletes = Vec::with_capacity(n_ranges.min(body.len() / 16));
    for _ in 0..n_ranges {
        deletes.push((r.u64()?, r.u64()?));
    }
    if r.at != body.len() {
        return None;
    }
    Some(IndexData {
        block_len,
        topics,
        entries,
        deletes,
    })
}

/// The one rule for an entry a scan of a `block_len`-byte block could have produced, after
/// `prev` (which ended at `min_offset`).
fn plausible(
    e: &Entry,
    prev: Option<&Entry>,
    min_offset: u64,
    block_len: u64,
    n_topics: usize,
) -> bool {
    let end = u64::from(e.offset) + u64::from(e.len);
    (e.topic as usize) < n_topics
        && (RECORD_HEADER_LEN..=MAX_ENCODED_RECORD).contains(&(e.len as usize))
        && u64::from(e.offset) >= min_offset
        && end <= block_len
        && prev.is_none_or(|p| p.seq < e.seq)
        && e.flags & !u32::from(FLAG_BATCH_MORE | FLAG_TOMBSTONE) == 0
}

/// Whether every entry can be written as deltas from the one before it.
fn deltas_fit(entries: &[Entry]) -> bool {
    let mut prev = Prev::start();
    for (i, e) in entries.iter().enumerate() {
        if u64::from(e.offset) < prev.end || (i > 0 && e.seq <= prev.seq) {
            return false;
        }
        prev = Prev::after(e);
    }
    true
}

/// What the next entry's deltas are taken against.
struct Prev {
    seq: u64,
    time_ns: u64,
    /// Where the previous record ended (the first: the block header's end).
    end: u64,
}

impl Prev {
    fn start() -> Self {
        Prev {
            seq: 0,
            time_ns: 0,
            end: BLOCK_HEADER_LEN as u64,
        }
    }
    fn after(e: &Entry) -> Self {
        Prev {
            seq: e.seq,
            time_ns: e.time_ns,
            end: u64::from(e.offset) + u64::from(e.len),
        }
    }
}

fn put_fixed(out: &mut Vec<u8>, e: &Entry) {
    out.put_u64_le(e.seq);
    out.put_u64_le(e.time_ns);
    out.put_u32_le(e.offset);
    out.put_u32_le(e.len);
    out.put_u32_le(e.topic);
    out.put_u32_le(e.flags);
}

/// Only for entries [`deltas_fit`] accepted: the sequence and offset deltas are not negative.
fn put_delta(out: &mut Vec<u8>, e: &Entry, prev: &Prev) {
    debug_assert!(
        u64::from(e.offset) >= prev.end,
        "offset before the previous record's end"
    );
    put_varint(out, e.seq.wrapping_sub(prev.seq));
    put_varint(out, zigzag(e.time_ns.wrapping_sub(prev.time_ns) as i64));
    put_varint(out, u64::from(e.offset) - prev.end);
    put_varint(out, u64::from(e.len));
    put_varint(out, u64::from(e.topic));
    put_varint(out, u64::from(e.flags));
}

#[inline]
fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn zigzag(d: i64) -> u64 {
    ((d << 1) ^ (d >> 63)) as u64
}

fn unzigzag(u: u64) -> i64 {
    ((u >> 1) as i64) ^ -((u & 1) as i64)
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let s = self.b.get(self.at..end)?;
        self.at = end;
        Some(s)
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|s| u16::from_le_bytes([s[0], s[1]]))
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4).map(|s| u32::from_le_bytes(arr4(s)))
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8).map(|s| u64::from_le_bytes(arr8(s)))
    }
    /// A LEB128 `u64`: `None` past the end, or for more than 64 bits.
    #[inline]
    fn varint(&mut self) -> Option<u64> {
        // Most fields of a typical entry fit in one or two bytes.
        match self.b.get(self.at..) {
            Some([a, ..]) if *a < 0x80 => {
                self.at += 1;
                return Some(u64::from(*a));
            }
            Some([a, b, ..]) if *b < 0x80 => {
                self.at += 2;
                return Some(u64::from(a & 0x7f) | u64::from(*b) << 7);
            }
            _ => {}
        }
        let mut v = 0u64;
        for i in 0..MAX_VARINT_BYTES {
            let byte = *self.b.get(self.at)?;
            self.at += 1;
            let bits = u64::from(byte & 0x7f);
            if i == MAX_VARINT_BYTES - 1 && bits > 1 {
                return None;
            }
            v |= bits << (7 * i);
            if byte & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }
    fn varint_u32(&mut self) -> Option<u32> {
        u32::try_from(self.varint()?).ok()
    }
    fn fixed(&mut self) -> Option<Entry> {
        Some(Entry {
            seq: self.u64()?,
            time_ns: self.u64()?,
            offset: self.u32()?,
            len: self.u32()?,
            topic: self.u32()?,
            flags: self.u32()?,
        })
    }
    fn delta(&mut self, prev: &Prev) -> Option<Entry> {
        let seq = prev.seq.checked_add(self.varint()?)?;
        let time_ns = prev.time_ns.wrapping_add(unzigzag(self.varint()?) as u64);
        let offset = u32::try_from(prev.end.checked_add(self.varint()?)?).ok()?;
        Some(Entry {
            seq,
            time_ns,
            offset,
            len: self.varint_u32()?,
            topic: self.varint_u32()?,
            flags: self.varint_u32()?,
        })
    }
}

#[cfg(test)]
#[path = "index_tests.rs"]
mod tests;
