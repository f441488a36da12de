//! In-memory view of a stream: its blocks (with per-record entries and per-topic live counts)
//! and the stream-wide topic index. Readers and the writer share it behind one mutex.
//!
//! # Invariants
//! - `blocks` are ordered by `base_seq`; the last one is the active (unsealed) block, and
//!   there is always exactly one active block.
//! - Entries of a block are in strictly increasing sequence order, and times never decrease
//!   across the whole stream (appends clamp time to the previous record's).
//! - `Block::live`/`topic_live`, `State::live`/`live_bytes` and `topics[t].count` always agree
//!   with the entries not flagged `ENTRY_DELETED`.
//! - With per-topic limits, `topics[t].seqs` holds exactly the live sequences of `t`, ascending.
//! - A block is unlinked only when it is the oldest one or holds no live record and every
//!   older block was unlinked: so delete markers inside it can only target records that are
//!   gone from disk already.

use std::collections::{HashMap, VecDeque};
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;

use crate::config::MAX_PENDING_REMOVED_RANGES;
use crate::filter::FilterSet;
use crate::format::{Entry, IndexData};
use crate::queue::{Removed, coalesce, ranges_of};
use crate::vfs::VFile;

/// In-memory flag on `Entry::flags`; never written to disk.
pub(crate) const ENTRY_DELETED: u32 = 1 << 31;

pub(crate) fn block_file_name(base_seq: u64) -> String {
    format!("{base_seq:020}.blk")
}

pub(crate) fn index_file_name(base_seq: u64) -> String {
    format!("{base_seq:020}.idx")
}

pub(crate) struct Block {
    pub base_seq: u64,
    pub path: PathBuf,
    pub file: Arc<dyn VFile>,
    /// Bytes readers may read.
    pub len: u64,
    pub sealed: bool,
    pub topics: Vec<Bytes>,
    pub topic_ids: HashMap<Bytes, u32>,
    pub topic_live: Vec<u64>,
    pub entries: Vec<Entry>,
    /// Delete ranges whose markers are stored in this block.
    pub markers: Vec<(u64, u64)>,
    pub live: u64,
    pub live_bytes: u64,
    /// Every entry before this index is deleted.
    first_live_hint: usize,
}

impl Block {
    pub fn new(base_seq: u64, path: PathBuf, file: Arc<dyn VFile>, len: u64) -> Self {
        Block {
            base_seq,
            path,
            file,
            len,
            sealed: false,
            topics: Vec::new(),
            topic_ids: HashMap::new(),
            topic_live: Vec::new(),
            entries: Vec::new(),
            markers: Vec::new(),
            live: 0,
            live_bytes: 0,
            first_live_hint: 0,
        }
    }

    pub fn from_index(base_seq: u64, path: PathBuf, file: Arc<dyn VFile>, ix: IndexData) -> Self {
        let mut b = Block::new(base_seq, path, file, ix.block_len);
        b.topic_live = vec![0; ix.topics.len()];
        for (i, t) in ix.topics.iter().enumerate() {
            b.topic_ids.insert(t.clone(), i as u32);
        }
        b.topics = ix.topics;
        for e in &ix.entries {
            b.topic_live[e.topic as usize] += 1;
            b.live_bytes += e.len as u64;
        }
        b.live = ix.entries.len() as u64;
        b.entries = ix.entries;
        b.markers = ix.deletes;
        b
    }

    pub fn index_path(&self) -> PathBuf {
        self.path.with_extension("idx")
    }

    pub fn topic_id(&mut self, topic: &[u8]) -> u32 {
        if let Some(&id) = self.topic_ids.get(topic) {
            return id;
        }
        let id = self.topics.len() as u32;
        let t = Bytes::copy_from_slice(topic);
        self.topics.push(t.clone());
        self.topic_ids.insert(t, id);
        self.topic_live.push(0);
        id
    }

    /// Adds a live entry (its topic id must come from `topic_id`).
    pub fn push(&mut self, e: Entry) {
        self.topic_live[e.topic as usize] += 1;
        self.live += 1;
        self.live_bytes += e.len as u64;
        self.entries.push(e);
    }

    pub fn find(&self, seq: u64) -> Option<usize> {
        self.entries.binary_search_by_key(&seq, |e| e.seq).ok()
    }

    pub fn first_live(&mut self) -> Option<usize> {
        while self.first_live_hint < self.entries.len() {
            if self.entries[self.first_live_hint].flags & ENTRY_DELETED == 0 {
                return Some(self.first_live_hint);
            }
            self.first_live_hint += 1;
        }
        None
    }

    pub fn first_live_from(&self) -> usize {
        self.first_live_hint
    }

    pub fn last_seq(&self) -> Option<u64> {
        self.entries.last().map(|e| e.seq)
    }

    /// Index content for this block as written (deletion flags are not part of it).
    pub fn index_data(&self) -> IndexData {
        IndexData {
            block_len: self.len,
            topics: self.topics.clone(),
            entries: self
                .entries
                .iter()
                .map(|e| Entry {
                    flags: e.flags & !ENTRY_DELETED,
                    ..*e
                })
                .collect(),
            deletes: self.markers.clone(),
        }
    }

    /// Per topic id: does the topic match and still have live records here?
    pub fn matching_topics(&self, filters: &FilterSet) -> Vec<bool> {
        self.topics
            .iter()
            .zip(&self.topic_live)
            .map(|(t, &n)| n > 0 && filters.matches(t))
            .collect()
    }
}

/// Stream-wide live count of one topic.
#[derive(Debug, Default)]
pub(crate) struct TopicStat {
    pub count: u64,
    /// Live sequences, ascending; kept only when a per-topic limit needs them.
    pub seqs: VecDeque<u64>,
}

/// A sealed block found damaged and moved aside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corruption {
    /// Where the block now lies (in the stream's `quarantine/` directory).
    pub path: PathBuf,
    /// Sequences the block covered; none of them is served.
    pub range: RangeInclusive<u64>,
    pub detail: String,
}

/// Removals the writer made on its own (limits, timer expiry), waiting for `drain_removed`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RemovedLog {
    pub ranges: Vec<RangeInclusive<u64>>,
    /// True if more ranges came than `MAX_PENDING_REMOVED_RANGES`; some were merged, so a
    /// range may then also cover records that still exist.
    pub overflowed: bool,
}

impl RemovedLog {
    pub fn push(&mut self, ranges: &[RangeInclusive<u64>]) {
        if ranges.is_empty() {
            return;
        }
        self.ranges.extend(ranges.iter().cloned());
        if self.ranges.len() > MAX_PENDING_REMOVED_RANGES {
            self.ranges = coalesce(std::mem::take(&mut self.ranges));
            if self.ranges.len() > MAX_PENDING_REMOVED_RANGES {
                let lo = *self.ranges[0].start();
                let hi = self.ranges.iter().map(|r| *r.end()).max().unwrap_or(lo);
                self.ranges = vec![lo..=hi];
                self.overflowed = true;
            }
        }
    }
}

pub(crate) struct State {
    pub blocks: VecDeque<Block>,
    pub topics: HashMap<Bytes, TopicStat>,
    pub live: u64,
    pub live_bytes: u64,
    /// Highest sequence readers may see (durable under the sync policy).
    pub visible_seq: u64,
    pub track_topic_seqs: bool,
    pub quarantined: Vec<Corruption>,
    pub removed_log: RemovedLog,
}

impl State {
    pub fn new(track_topic_seqs: bool) -> Self {
        State {
            blocks: VecDeque::new(),
            topics: HashMap::new(),
            live: 0,
            live_bytes: 0,
            visible_seq: 0,
            track_topic_seqs,
            quarantined: Vec::new(),
            removed_log: RemovedLog::default(),
        }
    }

    pub fn active(&mut self) -> &mut Block {
        // The active block always exists (see invariants); `open` creates it first.
        let n = self.blocks.len();
        &mut self.blocks[n - 1]
    }

    /// Index of the block that would hold `seq`.
    pub fn block_pos(&self, seq: u64) -> Option<usize> {
        self.blocks
            .partition_point(|b| b.base_seq <= seq)
            .checked_sub(1)
    }

    pub fn locate(&self, seq: u64) -> Option<(usize, usize)> {
        let bi = self.block_pos(seq)?;
        let ei = self.blocks[bi].find(seq)?;
        Some((bi, ei))
    }

    /// Accounts a record just pushed to the active block.
    pub fn on_insert(&mut self, topic: &[u8], seq: u64, len: u64) {
        self.live += 1;
        self.live_bytes += len;
        let track = self.track_topic_seqs;
        let stat = match self.topics.get_mut(topic) {
            Some(s) => s,
            None => self
                .topics
                .entry(Bytes::copy_from_slice(topic))
                .or_default(),
        };
        stat.count += 1;
        if track {
            stat.seqs.push_back(seq);
        }
    }

    /// Deletes entry `ei` of block `bi`; returns its bytes if it was live.
    pub fn delete_at(&mut self, bi: usize, ei: usize) -> Option<u64> {
        let b = &mut self.blocks[bi];
        let e = &mut b.entries[ei];
        if e.flags & ENTRY_DELETED != 0 {
            return None;
        }
        e.flags |= ENTRY_DELETED;
        let (seq, len, tid) = (e.seq, e.len as u64, e.topic as usize);
        b.topic_live[tid] -= 1;
        b.live -= 1;
        b.live_bytes -= len;
        self.live -= 1;
        self.live_bytes -= len;
        let topic = &self.blocks[bi].topics[tid];
        if let Some(stat) = self.topics.get_mut(&topic[..]) {
            stat.count = stat.count.saturating_sub(1);
            if let Ok(i) = stat.seqs.binary_search(&seq) {
                stat.seqs.remove(i);
            }
            if stat.count == 0 {
                self.topics.remove(&topic[..]);
            }
        }
        Some(len)
    }

    pub fn delete_seq(&mut self, seq: u64) -> Option<u64> {
        let (bi, ei) = self.locate(seq)?;
        self.delete_at(bi, ei)
    }

    /// Deletes the oldest live record; returns (seq, bytes).
    pub fn delete_first_live(&mut self) -> Option<(u64, u64)> {
        for bi in 0..self.blocks.len() {
            if self.blocks[bi].live == 0 {
                continue;
            }
            let ei = self.blocks[bi].first_live()?;
            let seq = self.blocks[bi].entries[ei].seq;
            let bytes = self.delete_at(bi, ei)?;
            return Some((seq, bytes));
        }
        None
    }

    /// Removes the `n` oldest blocks from the view, subtracting their per-topic counts in one
    /// step per block. Returns the blocks (for unlinking) and what they still held.
    pub fn remove_front_blocks(&mut self, n: usize) -> (Vec<Block>, Removed) {
        let mut gone = Vec::with_capacity(n);
        let mut removed = Removed::default();
        for _ in 0..n.min(self.blocks.len()) {
            let (b, r) = self.remove_block(0);
            removed.records += r.records;
            removed.bytes += r.bytes;
            removed.ranges.extend(r.ranges);
            gone.push(b);
        }
        removed.ranges = coalesce(removed.ranges);
        (gone, removed)
    }

    /// Removes block `bi` from the view with its live records (one step per topic).
    pub fn remove_block(&mut self, bi: usize) -> (Block, Removed) {
        let mut removed = Removed::default();
        let b = match self.blocks.remove(bi) {
            Some(b) => b,
            None => unreachable!("remove_block({bi}) out of range"),
        };
        if b.live > 0 {
            let first = b.entries.first().map_or(b.base_seq, |e| e.seq);
            let last = b.last_seq().unwrap_or(b.base_seq);
            for (tid, &live) in b.topic_live.iter().enumerate() {
                if live == 0 {
                    continue;
                }
                let t = &b.topics[tid];
                if let Some(stat) = self.topics.get_mut(&t[..]) {
                    stat.count = stat.count.saturating_sub(live);
                    if stat.seqs.front().is_some_and(|&s| s >= first) {
                        while stat.seqs.front().is_some_and(|&s| s <= last) {
                            stat.seqs.pop_front();
                        }
                    } else if !stat.seqs.is_empty() {
                        stat.seqs.retain(|&s| s < first || s > last);
                    }
                    if stat.count == 0 {
                        self.topics.remove(&t[..]);
                    }
                }
            }
            self.live -= b.live;
            self.live_bytes -= b.live_bytes;
            removed.records = b.live;
            removed.bytes = b.live_bytes;
            removed.ranges.push(first..=last);
        }
        (b, removed)
    }

    /// Removes the leading records for which `pred` holds (`pred` must be monotonic along the
    /// stream: true, then false). Whole sealed blocks go in one step each; only the boundary
    /// block is walked record by record. Returns the blocks to unlink, the removal, and the
    /// single sequences deleted in the boundary block (they need a delete marker).
    pub fn remove_prefix(
        &mut self,
        pred: impl Fn(&Entry) -> bool,
    ) -> (Vec<Block>, Removed, Vec<u64>) {
        let sealed = self.blocks.len().saturating_sub(1);
        let mut whole = 0;
        while whole < sealed {
            match self.blocks[whole].entries.last() {
                Some(e) if !pred(e) => break,
                _ => whole += 1,
            }
        }
        let (gone, mut removed) = self.remove_front_blocks(whole);
        let mut seqs = Vec::new();
        if !self.blocks.is_empty() {
            let start = self.blocks[0].first_live_from();
            let n = self.blocks[0].entries.len();
            for ei in start..n {
                let e = self.blocks[0].entries[ei];
                if !pred(&e) {
                    break;
                }
                if let Some(bytes) = self.delete_at(0, ei) {
                    removed.records += 1;
                    removed.bytes += bytes;
                    seqs.push(e.seq);
                }
            }
        }
        let mut tail = ranges_of(seqs.clone());
        removed.ranges.append(&mut tail);
        removed.ranges = coalesce(removed.ranges);
        (gone, removed, seqs)
    }

    /// Deletes every live record whose topic matches; returns the sequences.
    pub fn purge(&mut self, filters: &FilterSet) -> Vec<u64> {
        let mut seqs = Vec::new();
        for bi in 0..self.blocks.len() {
            let m = self.blocks[bi].matching_topics(filters);
            if !m.iter().any(|&x| x) {
                continue;
            }
            let start = self.blocks[bi].first_live_from();
            for ei in start..self.blocks[bi].entries.len() {
                let e = self.blocks[bi].entries[ei];
                if e.flags & ENTRY_DELETED == 0 && m[e.topic as usize] {
                    self.delete_at(bi, ei);
                    seqs.push(e.seq);
                }
            }
        }
        seqs
    }

    /// Takes sealed blocks off the front while they hold no live record.
    pub fn take_dead_front(&mut self) -> Vec<Block> {
        let mut out = Vec::new();
        while self.blocks.len() > 1 && self.blocks[0].live == 0 {
            if let Some(b) = self.blocks.pop_front() {
                out.push(b);
            }
        }
        out
    }

    /// Oldest and newest live sequence of a topic.
    pub fn topic_bounds(&self, topic: &[u8]) -> Option<(u64, u64)> {
        let stat = self.topics.get(topic)?;
        if let (Some(&a), Some(&b)) = (stat.seqs.front(), stat.seqs.back()) {
            return Some((a, b));
        }
        let first = self
            .blocks
            .iter()
            .find_map(|b| scan_topic(b, topic, false))?;
        let last = self
            .blocks
            .iter()
            .rev()
            .find_map(|b| scan_topic(b, topic, true))?;
        Some((first, last))
    }

    /// Oldest and newest live sequence of the stream.
    pub fn bounds(&self) -> Option<(u64, u64)> {
        let first = self.blocks.iter().filter(|b| b.live > 0).find_map(|b| {
            b.entries[b.first_live_from()..]
                .iter()
                .find(|e| e.flags & ENTRY_DELETED == 0)
                .map(|e| e.seq)
        })?;
        let last = self
            .blocks
            .iter()
            .rev()
            .filter(|b| b.live > 0)
            .find_map(|b| {
                b.entries
                    .iter()
                    .rev()
                    .find(|e| e.flags & ENTRY_DELETED == 0)
                    .map(|e| e.seq)
            })?;
        Some((first, last))
    }
}

fn scan_topic(b: &Block, topic: &[u8], newest: bool) -> Option<u64> {
    let &tid = b.topic_ids.get(topic)?;
    if b.topic_live[tid as usize] == 0 {
        return None;
    }
    let ok = |e: &&Entry| e.topic == tid && e.flags & ENTRY_DELETED == 0;
    if newest {
        b.entries.iter().rev().find(ok).map(|e| e.seq)
    } else {
        b.entries[b.first_live_from()..]
            .iter()
            .find(ok)
            .map(|e| e.seq)
    }
}
