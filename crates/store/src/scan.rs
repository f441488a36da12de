//! Parsing one block's records: entries, topics and delete markers up to the first damage or
//! unfinished batch (or the zeros of reserved space), and how far a torn tail's sequences
//! reach. Recovery scans the blocks it opens with it; the in-memory view (`state`) and the
//! reader rescan a block whose index they cannot trust, so it sits below all three.

use std::collections::HashMap;

use bytes::Bytes;

use crate::format::{
    self, BLOCK_HEADER_LEN, DecodeError, Entry, FLAG_BATCH_MORE, IndexData, KIND_DATA, MAX_SEQ,
};

pub(crate) struct Scan {
    pub ix: IndexData,
    pub damage: Option<(u64, String)>,
    pub torn_high_seq: u64,
}

/// Parses a block's records; stops at the first damage or at an unfinished batch.
pub(crate) fn scan(raw: &Bytes, base_seq: u64) -> Scan {
    let mut topics: Vec<Bytes> = Vec::new();
    let mut ids: HashMap<Bytes, u32> = HashMap::new();
    let mut entries: Vec<Entry> = Vec::new();
    let mut deletes = Vec::new();
    let mut off = BLOCK_HEADER_LEN;
    let mut batch: Option<(usize, usize, usize)> = None;
    let mut damage = None;
    let mut torn_high_seq = 0;
    let mut prev_seq = base_seq.saturating_sub(1);
    while off < raw.len() {
        match format::decode_record(raw, off) {
            Ok(r) => {
                let ranges = r.delete_ranges();
                if r.seq > MAX_SEQ || ranges.iter().any(|&(_, hi)| hi > MAX_SEQ) {
                    damage = Some((off as u64, format!("sequence {} out of range", r.seq)));
                    break;
                }
                if r.kind == KIND_DATA {
                    if r.seq <= prev_seq && !(entries.is_empty() && r.seq == base_seq)
                        || r.seq < base_seq
                    {
                        damage = Some((off as u64, format!("sequence {} out of order", r.seq)));
                        break;
                    }
                    if r.flags & FLAG_BATCH_MORE != 0 && batch.is_none() {
                        batch = Some((off, entries.len(), deletes.len()));
                    }
                    let tid = match ids.get(&r.topic[..]) {
                        Some(&t) => t,
                        None => {
                            let t = topics.len() as u32;
                            topics.push(r.topic.clone());
                            ids.insert(r.topic.clone(), t);
                            t
                        }
                    };
                    entries.push(Entry {
                        seq: r.seq,
                        time_ns: r.time_ns,
                        offset: off as u32,
                        len: r.len as u32,
                        topic: tid,
                        flags: u32::from(r.flags),
                    });
                    prev_seq = r.seq;
                    if r.flags & FLAG_BATCH_MORE == 0 {
                        batch = None;
                    }
                } else {
                    deletes.extend(ranges);
                }
                off += r.len;
            }
            Err(_) if all_zero(raw, off) => {
                // Reserved space never written (or whose writes were lost whole): the end
                // of the data, not damage.
                break;
            }
            Err(e) => {
                if raw.len() >= off + format::RECORD_HEADER_LEN {
                    let s =
                        u64::from_le_bytes(raw[off + 20..off + 28].try_into().unwrap_or([0; 8]));
                    // An unverified header: believe it only if it is plausibly the next one.
                    if s > prev_seq && s < prev_seq.saturating_add(1 << 20) {
                        torn_high_seq = s;
                    }
                }
                torn_high_seq = torn_high_seq.max(high_seq_past(raw, off));
                let what = match e {
                    DecodeError::Truncated => "truncated record".to_string(),
                    DecodeError::Corrupt(d) => d,
                };
                damage = Some((off as u64, what));
                break;
            }
        }
    }
    if let Some((boff, n_entries, n_deletes)) = batch {
        // An unfinished batch: drop it whole.
        if let Some(e) = entries.last() {
            torn_high_seq = torn_high_seq.max(e.seq);
        }
        entries.truncate(n_entries);
        deletes.truncate(n_deletes);
        let what = damage
            .map(|d| d.1)
            .unwrap_or_else(|| "unfinished batch".into());
        damage = Some((boff as u64, what));
    }
    // Past the last record: the file's end, or where its zero tail starts.
    let valid_len = damage.as_ref().map_or(off.min(raw.len()) as u64, |d| d.0);
    // Topics whose only records were dropped stay in the table with no entries; harmless.
    Scan {
        ix: IndexData {
            block_len: valid_len,
            topics,
            entries,
            deletes,
        },
        damage,
        torn_high_seq,
    }
}

/// Highest sequence shown by the intact records that follow the damaged record at `off`
/// (skipped by its own length field when that is plausible). They are cut with the tail and
/// never served, but they prove their sequences were handed out (bit rot in the active block
/// is not a torn write): the next sequence must stay above them. A delete marker's sequence
/// field is the highest assigned when it was written, so markers count too.
fn high_seq_past(raw: &Bytes, off: usize) -> u64 {
    let Some(len) = raw.get(off..off + 4).and_then(|b| b.try_into().ok()) else {
        return 0;
    };
    let len = u32::from_le_bytes(len) as usize;
    if !(format::RECORD_HEADER_LEN..=format::MAX_ENCODED_RECORD).contains(&len) {
        return 0;
    }
    let mut high = 0;
    let mut at = off + len;
    while let Ok(r) = format::decode_record(raw, at) {
        if r.seq <= MAX_SEQ {
            high = high.max(r.seq);
        }
        at += r.len;
    }
    high
}

/// Whether every byte of `raw` from `from` on is zero (true past its end): space reserved
/// but never written, or written and lost whole.
pub(crate) fn all_zero(raw: &[u8], from: usize) -> bool {
    raw.get(from..).is_none_or(|t| t.iter().all(|&b| b == 0))
}
