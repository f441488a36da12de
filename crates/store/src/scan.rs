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
    let mut p = Parse::new(base_seq);
    let mut off = BLOCK_HEADER_LEN;
    let mut damage = None;
    let mut torn_high_seq = 0;
    while off < raw.len() {
        match format::decode_record(raw, off) {
            Ok(r) => {
                let len = r.len;
                if let Err(what) = p.take(r, off) {
                    damage = Some((off as u64, what));
                    break;
                }
                off += len;
            }
            Err(_) if all_zero(raw, off) => {
                // Reserved space never written (or whose writes were lost whole): the end
                // of the data, not damage.
                break;
            }
            Err(e) => {
                let what;
                (torn_high_seq, what) = torn_record(raw, off, p.prev_seq, e);
                damage = Some((off as u64, what));
                break;
            }
        }
    }
    p.finish(raw.len(), off, damage, torn_high_seq)
}

/// What a scan has taken so far.
struct Parse {
    base_seq: u64,
    topics: Vec<Bytes>,
    ids: HashMap<Bytes, u32>,
    entries: Vec<Entry>,
    deletes: Vec<(u64, u64)>,
    /// Where the batch still open started: its offset, and the entries and delete ranges
    /// taken before it.
    batch: Option<(usize, usize, usize)>,
    prev_seq: u64,
}

impl Parse {
    fn new(base_seq: u64) -> Parse {
        Parse {
            base_seq,
            topics: Vec::new(),
            ids: HashMap::new(),
            entries: Vec::new(),
            deletes: Vec::new(),
            batch: None,
            prev_seq: base_seq.saturating_sub(1),
        }
    }

    /// Takes the intact record found at `off`, or says why it is damage all the same.
    fn take(&mut self, r: format::RawRecord, off: usize) -> Result<(), String> {
        let ranges = r.delete_ranges();
        if r.seq > MAX_SEQ || ranges.iter().any(|&(_, hi)| hi > MAX_SEQ) {
            return Err(format!("sequence {} out of range", r.seq));
        }
        if r.kind != KIND_DATA {
            self.deletes.extend(ranges);
            return Ok(());
        }
        let first_at_base = self.entries.is_empty() && r.seq == self.base_seq;
        if r.seq <= self.prev_seq && !first_at_base || r.seq < self.base_seq {
            return Err(format!("sequence {} out of order", r.seq));
        }
        if r.flags & FLAG_BATCH_MORE != 0 && self.batch.is_none() {
            self.batch = Some((off, self.entries.len(), self.deletes.len()));
        }
        let topic = self.topic_id(&r.topic);
        self.entries.push(Entry {
            seq: r.seq,
            time_ns: r.time_ns,
            offset: off as u32,
            len: r.len as u32,
            topic,
            flags: u32::from(r.flags),
        });
        self.prev_seq = r.seq;
        if r.flags & FLAG_BATCH_MORE == 0 {
            self.batch = None;
        }
        Ok(())
    }

    fn topic_id(&mut self, topic: &Bytes) -> u32 {
        if let Some(&t) = self.ids.get(&topic[..]) {
            return t;
        }
        let t = self.topics.len() as u32;
        self.topics.push(topic.clone());
        self.ids.insert(topic.clone(), t);
        t
    }

    /// The scan's result, the scan having stopped at `off` of a `raw_len`-byte block.
    fn finish(
        mut self,
        raw_len: usize,
        off: usize,
        mut damage: Option<(u64, String)>,
        mut torn_high_seq: u64,
    ) -> Scan {
        if let Some((boff, n_entries, n_deletes)) = self.batch {
            // An unfinished batch: drop it whole.
            if let Some(e) = self.entries.last() {
                torn_high_seq = torn_high_seq.max(e.seq);
            }
            self.entries.truncate(n_entries);
            self.deletes.truncate(n_deletes);
            let what = damage
                .map(|d| d.1)
                .unwrap_or_else(|| "unfinished batch".into());
            damage = Some((boff as u64, what));
        }
        // Past the last record: the file's end, or where its zero tail starts.
        let valid_len = damage.as_ref().map_or(off.min(raw_len) as u64, |d| d.0);
        // Topics whose only records were dropped stay in the table with no entries; harmless.
        Scan {
            ix: IndexData {
                block_len: valid_len,
                topics: self.topics,
                entries: self.entries,
                deletes: self.deletes,
            },
            damage,
            torn_high_seq,
        }
    }
}

/// The record at `off` does not decode: how far its tail's sequences reach, and what is
/// wrong with it.
fn torn_record(raw: &Bytes, off: usize, prev_seq: u64, e: DecodeError) -> (u64, String) {
    let mut torn_high_seq = 0;
    if raw.len() >= off + format::RECORD_HEADER_LEN {
        let s = u64::from_le_bytes(raw[off + 20..off + 28].try_into().unwrap_or([0; 8]));
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
    (torn_high_seq, what)
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
