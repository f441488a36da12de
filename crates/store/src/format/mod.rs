//! On-disk formats: block header, records, delete markers and the sealed-block index.
//!
//! All integers are little-endian.
//!
//! **Block file** `<base_seq:020>.blk`: a 32-byte header, then records back to back.
//! ```text
//! 0  magic "TERNBLK1"   8  version u32 (=1)   12 header_len u32 (=32)
//! 16 base_seq u64 (first sequence this block may hold; never reused)
//! 24 reserved u32       28 crc32c of bytes 0..28
//! ```
//! **Record** (36-byte header + body):
//! ```text
//! 0  len u32          whole record, header included
//! 4  crc u32          crc32c over bytes 0..4 and 8..len, so every length field is covered
//! 8  kind u8          1 = data, 2 = delete marker
//! 9  flags u8         bit0 BATCH_MORE: the next record belongs to the same atomic batch
//!                     bit1 TOMBSTONE: a keyed-state delete
//! 10 topic_len u16    12 props_len u32    16 payload_len u32
//! 20 seq u64          28 time_ns u64
//! 36 topic, properties, payload
//! ```
//! A delete marker carries no topic or properties; its payload is a list of inclusive
//! `(first u64, last u64)` sequence ranges that are removed; its seq field is the stream's
//! highest assigned sequence when it was written (it does not consume a sequence).
//!
//! **Index file** `<base_seq:020>.idx`, written when a block is sealed and rebuildable from
//! it: the block's length, topic table, entries and delete ranges, checksummed. Its two
//! encodings (fixed-width version 1, delta-and-varint version 2) are in [`index`]. The index
//! is trusted only if its checksum holds and `block_len` equals the block's size.
//!
//! # Invariants
//! - A record is accepted only if `len` matches its three body lengths and the checksum holds.
//! - Records of one atomic batch are contiguous; all but the last carry BATCH_MORE, so a
//!   batch cut by a crash is recognised and dropped whole.
//! - Sequences, delete-range bounds and block bases stay at or below [`MAX_SEQ`]: the store
//!   could not assign that many in centuries, so a file claiming more is damaged, and
//!   believing it would make the next sequence overflow.

use bytes::{BufMut, Bytes};

mod index;

pub use index::{Entry, IndexData, decode_index, encode_index};

pub const BLOCK_MAGIC: &[u8; 8] = b"TERNBLK1";
pub const INDEX_MAGIC: &[u8; 8] = b"TERNIDX1";
pub const FORMAT_VERSION: u32 = 1;
pub const BLOCK_HEADER_LEN: usize = 32;
pub const RECORD_HEADER_LEN: usize = 36;

/// Highest sequence a file may show (see the invariants); 2^62.
pub(crate) const MAX_SEQ: u64 = 1 << 62;

pub const KIND_DATA: u8 = 1;
pub const KIND_DELETE: u8 = 2;
pub const FLAG_BATCH_MORE: u8 = 1;
pub const FLAG_TOMBSTONE: u8 = 2;

pub fn encode_block_header(base_seq: u64) -> [u8; BLOCK_HEADER_LEN] {
    let mut h = [0u8; BLOCK_HEADER_LEN];
    h[0..8].copy_from_slice(BLOCK_MAGIC);
    h[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&(BLOCK_HEADER_LEN as u32).to_le_bytes());
    h[16..24].copy_from_slice(&base_seq.to_le_bytes());
    let crc = crc32c::crc32c(&h[0..28]);
    h[28..32].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Returns the block's base sequence, or a description of what is wrong.
pub fn decode_block_header(h: &[u8]) -> Result<u64, String> {
    if h.len() < BLOCK_HEADER_LEN {
        return Err(format!("header of {} bytes", h.len()));
    }
    if &h[0..8] != BLOCK_MAGIC {
        return Err("bad magic".into());
    }
    let crc = u32::from_le_bytes(arr4(&h[28..32]));
    if crc32c::crc32c(&h[0..28]) != crc {
        return Err("header checksum mismatch".into());
    }
    let version = u32::from_le_bytes(arr4(&h[8..12]));
    if version != FORMAT_VERSION {
        return Err(format!("unsupported version {version}"));
    }
    Ok(u64::from_le_bytes(arr8(&h[16..24])))
}

/// Size of a data record with these body lengths.
pub fn record_len(topic: usize, props: usize, payload: usize) -> usize {
    RECORD_HEADER_LEN + topic + props + payload
}

/// Appends one encoded record to `out`. Lengths must already be checked against the limits.
#[allow(clippy::too_many_arguments)]
pub fn encode_record(
    out: &mut Vec<u8>,
    kind: u8,
    flags: u8,
    seq: u64,
    time_ns: u64,
    topic: &[u8],
    props: &[u8],
    payload: &[u8],
) {
    let start = out.len();
    let len = record_len(topic.len(), props.len(), payload.len());
    out.reserve(len);
    out.put_u32_le(len as u32);
    out.put_u32_le(0);
    out.put_u8(kind);
    out.put_u8(flags);
    out.put_u16_le(topic.len() as u16);
    out.put_u32_le(props.len() as u32);
    out.put_u32_le(payload.len() as u32);
    out.put_u64_le(seq);
    out.put_u64_le(time_ns);
    out.extend_from_slice(topic);
    out.extend_from_slice(props);
    out.extend_from_slice(payload);
    let crc = record_crc(&out[start..start + len]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// Appends a delete marker for `ranges` to `out`.
pub fn encode_delete(out: &mut Vec<u8>, high_seq: u64, time_ns: u64, ranges: &[(u64, u64)]) {
    let mut body = Vec::with_capacity(ranges.len() * 16);
    for &(a, b) in ranges {
        body.put_u64_le(a);
        body.put_u64_le(b);
    }
    encode_record(out, KIND_DELETE, 0, high_seq, time_ns, &[], &[], &body);
}

fn record_crc(rec: &[u8]) -> u32 {
    let c = crc32c::crc32c(&rec[0..4]);
    crc32c::crc32c_append(c, &rec[8..])
}

/// A record parsed out of a block buffer; the byte fields are slices of that buffer.
#[derive(Debug, Clone)]
pub struct RawRecord {
    pub len: usize,
    pub kind: u8,
    pub flags: u8,
    pub seq: u64,
    pub time_ns: u64,
    pub topic: Bytes,
    pub props: Bytes,
    pub payload: Bytes,
}

impl RawRecord {
    /// Delete ranges of a marker record (empty for data records or malformed bodies).
    pub fn delete_ranges(&self) -> Vec<(u64, u64)> {
        if self.kind != KIND_DELETE {
            return Vec::new();
        }
        self.payload
            .chunks_exact(16)
            .map(|c| {
                (
                    u64::from_le_bytes(arr8(&c[0..8])),
                    u64::from_le_bytes(arr8(&c[8..16])),
                )
            })
            .collect()
    }
}

/// Why a record could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// Fewer bytes remain than the record claims (a torn write at the tail).
    Truncated,
    /// The bytes are there but wrong.
    Corrupt(String),
}

/// Decodes the record starting at `off` of `buf`.
pub fn decode_record(buf: &Bytes, off: usize) -> Result<RawRecord, DecodeError> {
    let rest = buf.len().saturating_sub(off);
    if rest < RECORD_HEADER_LEN {
        return Err(DecodeError::Truncated);
    }
    let h = &buf[off..off + RECORD_HEADER_LEN];
    let len = u32::from_le_bytes(arr4(&h[0..4])) as usize;
    if !(RECORD_HEADER_LEN..=MAX_ENCODED_RECORD).contains(&len) {
        return Err(DecodeError::Corrupt(format!("record length {len}")));
    }
    if rest < len {
        return Err(DecodeError::Truncated);
    }
    let rec = &buf[off..off + len];
    let crc = u32::from_le_bytes(arr4(&h[4..8]));
    if record_crc(rec) != crc {
        return Err(DecodeError::Corrupt("record checksum mismatch".into()));
    }
    let kind = h[8];
    let flags = h[9];
    let topic_len = u16::from_le_bytes([h[10], h[11]]) as usize;
    let props_len = u32::from_le_bytes(arr4(&h[12..16])) as usize;
    let payload_len = u32::from_le_bytes(arr4(&h[16..20])) as usize;
    if record_len(topic_len, props_len, payload_len) != len {
        return Err(DecodeError::Corrupt("record lengths disagree".into()));
    }
    if kind != KIND_DATA && kind != KIND_DELETE {
        return Err(DecodeError::Corrupt(format!("record kind {kind}")));
    }
    let seq = u64::from_le_bytes(arr8(&h[20..28]));
    let time_ns = u64::from_le_bytes(arr8(&h[28..36]));
    let t0 = off + RECORD_HEADER_LEN;
    let p0 = t0 + topic_len;
    let b0 = p0 + props_len;
    Ok(RawRecord {
        len,
        kind,
        flags,
        seq,
        time_ns,
        topic: buf.slice(t0..p0),
        props: buf.slice(p0..b0),
        payload: buf.slice(b0..off + len),
    })
}

/// Largest encoded record accepted by the decoder.
pub const MAX_ENCODED_RECORD: usize = crate::config::MAX_RECORD_BYTES;

fn arr4(s: &[u8]) -> [u8; 4] {
    [s[0], s[1], s[2], s[3]]
}

fn arr8(s: &[u8]) -> [u8; 8] {
    [s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_roundtrip_and_every_bit_matters() {
        let mut v = Vec::new();
        encode_record(&mut v, KIND_DATA, 0, 7, 99, b"a/b", b"pp", b"payload");
        let b = Bytes::from(v.clone());
        let r = decode_record(&b, 0).unwrap();
        assert_eq!(
            (r.seq, r.time_ns, &r.topic[..], &r.props[..], &r.payload[..]),
            (7, 99, &b"a/b"[..], &b"pp"[..], &b"payload"[..])
        );
        for bit in 0..v.len() * 8 {
            let mut w = v.clone();
            w[bit / 8] ^= 1 << (bit % 8);
            assert!(decode_record(&Bytes::from(w), 0).is_err(), "bit {bit}");
        }
        for cut in 0..v.len() {
            assert!(decode_record(&Bytes::from(v[..cut].to_vec()), 0).is_err());
        }
    }

    #[test]
    fn header_roundtrip() {
        let h = encode_block_header(42);
        assert_eq!(decode_block_header(&h), Ok(42));
        let mut b = h;
        b[17] ^= 4;
        assert!(decode_block_header(&b).is_err());
    }
}
