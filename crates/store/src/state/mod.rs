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
//! - A block is removed only when it is the oldest one, or holds no live record while every
//!   older block is clean (holds no deleted record): so the delete markers inside it can only
//!   target records that are gone from disk already, or go in the same removal, where the
//!   writer makes the older blocks' removal durable before a marker-holding block's.
//! - `unsynced_deletes` lists exactly the entries flagged `ENTRY_DELETED` whose deletion is
//!   not durable yet; such a record is still the durable state, and `last_for_topic` serves
//!   it (a keyed-state read must not see a key vanish while its new value is being synced).
//! - A sealed block's entries are dropped from memory only while it is clean (`live ==
//!   n_entries`); then they equal its index file's, and `load` restores them exactly.

use std::collections::{HashMap, VecDeque};
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;

use crate::config::MAX_PENDING_REMOVED_RANGES;
use crate::error::{Result, StoreError};
use crate::filter::FilterSet;
use crate::format::{self, Entry, FLAG_TOMBSTONE, IndexData};
use crate::queue::{Removed, coalesce, push_merged, ranges_of};
use crate::vfs::{VFile, Vfs};

mod block;

pub(crate) use block::Block;

/// In-memory flag on `Entry::flags`; never written to disk.
pub(crate) const ENTRY_DELETED: u32 = 1 << 31;

// The names in a stream's directory: block files, their indexes, and `trash/`.

pub(crate) fn block_file_name(base_seq: u64) -> String {
    format!("{base_seq:020}.blk")
}

pub(crate) fn index_file_name(base_seq: u64) -> String {
    format!("{base_seq:020}.idx")
}

/// Where removed block files wait for the reaper thread to unlink them (recovery empties it).
pub(crate) const TRASH_DIR: &str = "trash";

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
    /// Adds `ranges`; one that continues the last range extends it. The log says which
    /// sequences went, not in how many writer passes, which depends on how appends fell into
    /// batches (`discard_old_and_removed_log` saw `[1..=5, 6..=15]` for `[1..=15]`). Removals
    /// come oldest first, so this keeps the log coalesced without sorting it on every push
    /// ([`push_merged`]: the rule `coalesce` sorts and applies).
    pub fn push(&mut self, ranges: &[RangeInclusive<u64>]) {
        for r in ranges {
            push_merged(&mut self.ranges, r.clone());
        }
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
    /// Sequences deleted in memory whose delete marker is written but not yet durable;
    /// emptied at every sync. Holds at most the deletions of one sync interval, each of
    /// an entry still in memory (a block with deleted entries is not evicted).
    pub unsynced_deletes: Vec<u64>,
    vfs: Arc<dyn Vfs>,
    /// Most sealed blocks whose entries stay in memory (clean ones beyond are dropped).
    cache_blocks: usize,
    tick: u64,
}

impl State {
    pub fn new(track_topic_seqs: bool, vfs: Arc<dyn Vfs>, cache_blocks: usize) -> Self {
        State {
            blocks: VecDeque::new(),
            topics: HashMap::new(),
            live: 0,
            live_bytes: 0,
            visible_seq: 0,
            track_topic_seqs,
            quarantined: Vec::new(),
            removed_log: RemovedLog::default(),
            unsynced_deletes: Vec::new(),
            vfs,
            cache_blocks: cache_blocks.max(1),
            tick: 0,
        }
    }

    pub fn active(&mut self) -> &mut Block {
        // The active block always exists (see invariants); `open` creates it first.
        let n = self.blocks.len();
        &mut self.blocks[n - 1]
    }

    /// Makes sure block `bi` has its entries in memory, dropping those of the least recently
    /// used clean sealed blocks beyond the cache budget.
    pub fn load(&mut self, bi: usize) -> Result<()> {
        self.tick += 1;
        let tick = self.tick;
        let b = &mut self.blocks[bi];
        b.last_use = tick;
        if b.loaded {
            return Ok(());
        }
        let ix = self
            .vfs
            .read_file(&b.index_path())
            .ok()
            .and_then(|buf| format::decode_index(&Bytes::from(buf)))
            .filter(|ix| {
                // Checksummed but about another version of the block: rebuild rather than
                // let a read blame (and quarantine) the block.
                ix.block_len == b.len
                    && ix.entries.len() == b.n_entries
                    && ix.entries.first().map(|e| e.seq) == b.first_seq()
                    && ix.entries.last().map(|e| e.seq) == b.last_seq()
            });
        let ix = match ix {
            Some(ix) => ix,
            None => {
                let mut raw = vec![0u8; b.len as usize];
                b.file
                    .read_exact_at(&mut raw, 0)
                    .map_err(|e| StoreError::io("read block", &b.path, &e))?;
                let sc = crate::scan::scan(&Bytes::from(raw), b.base_seq);
                if sc.damage.is_some() || sc.ix.entries.len() != b.n_entries {
                    let (first, last) = (
                        b.first_seq().unwrap_or(b.base_seq),
                        b.last_seq().unwrap_or(b.base_seq),
                    );
                    return Err(StoreError::Corrupt {
                        path: b.path.clone(),
                        range: first..=last,
                        detail: "block no longer matches what was indexed".into(),
                    });
                }
                sc.ix
            }
        };
        // Topic ids are the block's own; map through names in case the table order differs.
        let mut entries = ix.entries;
        for e in &mut entries {
            let name = &ix.topics[e.topic as usize];
            e.topic = match b.topic_ids.get(&name[..]) {
                Some(&id) => id,
                None => {
                    return Err(StoreError::Corrupt {
                        path: b.path.clone(),
                        range: e.seq..=e.seq,
                        detail: "index names a topic the block does not hold".into(),
                    });
                }
            };
        }
        b.entries = entries;
        b.loaded = true;
        b.first_live_hint = 0;
        self.evict(bi);
        Ok(())
    }

    /// Drops entries of clean sealed blocks beyond the budget, least recently used first.
    pub fn evict(&mut self, keep: usize) {
        let loaded = self.blocks.iter().filter(|b| b.sealed && b.loaded).count();
        let mut over = loaded.saturating_sub(self.cache_blocks);
        while over > 0 {
            let victim = self
                .blocks
                .iter()
                .enumerate()
                .filter(|(i, b)| *i != keep && b.evictable())
                .min_by_key(|(_, b)| b.last_use)
                .map(|(i, _)| i);
            let Some(v) = victim else { break };
            let b = &mut self.blocks[v];
            b.entries = Vec::new();
            b.loaded = false;
            over -= 1;
        }
    }

    /// Index of the block that would hold `seq`.
    pub fn block_pos(&self, seq: u64) -> Option<usize> {
        self.blocks
            .partition_point(|b| b.base_seq <= seq)
            .checked_sub(1)
    }

    pub fn locate(&mut self, seq: u64) -> Result<Option<(usize, usize)>> {
        let Some(bi) = self.block_pos(seq) else {
            return Ok(None);
        };
        let b = &self.blocks[bi];
        if b.first_seq().is_none_or(|f| seq < f) || b.last_seq().is_none_or(|l| seq > l) {
            return Ok(None);
        }
        self.load(bi)?;
        Ok(self.blocks[bi].find(seq).map(|ei| (bi, ei)))
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

    /// Deletes entry `ei` of block `bi` (which must be loaded); returns its bytes if it
    /// was live.
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

    pub fn delete_seq(&mut self, seq: u64) -> Result<Option<u64>> {
        Ok(match self.locate(seq)? {
            Some((bi, ei)) => self.delete_at(bi, ei),
            None => None,
        })
    }

    /// Deletes the oldest live record; returns (seq, bytes).
    /// Only a record below `below` is deleted.
    pub fn delete_first_live(&mut self, below: u64) -> Result<Option<(u64, u64)>> {
        for bi in 0..self.blocks.len() {
            if self.blocks[bi].live == 0 {
                continue;
            }
            self.load(bi)?;
            let Some(ei) = self.blocks[bi].first_live() else {
                continue;
            };
            let seq = self.blocks[bi].entries[ei].seq;
            if seq >= below {
                return Ok(None);
            }
            let Some(bytes) = self.delete_at(bi, ei) else {
                continue;
            };
            return Ok(Some((seq, bytes)));
        }
        Ok(None)
    }

    /// Number of leading sealed blocks whose newest record is below `floor` (judged without
    /// loading their entries).
    pub fn sealed_blocks_below(&self, floor: u64) -> usize {
        let sealed = self.blocks.len().saturating_sub(1);
        let mut n = 0;
        while n < sealed {
            match self.blocks[n].last_entry_summary() {
                Some(e) if e.seq >= floor => break,
                _ => n += 1,
            }
        }
        n
    }

    /// Removes the `n` oldest blocks from the view, subtracting their per-topic counts in one
    /// step per block. Returns the blocks (for unlinking) and what they still held.
    pub fn remove_front_blocks(&mut self, n: usize) -> (Vec<Block>, Removed) {
        let mut gone = Vec::with_capacity(n);
        let mut removed = Removed::default();
        for _ in 0..n.min(self.blocks.len()) {
            let Some((b, r)) = self.remove_block(0) else {
                break;
            };
            removed.records += r.records;
            removed.bytes += r.bytes;
            removed.ranges.extend(r.ranges);
            gone.push(b);
        }
        removed.ranges = coalesce(removed.ranges);
        (gone, removed)
    }

    /// Removes block `bi` from the view with its live records (one step per topic).
    pub fn remove_block(&mut self, bi: usize) -> Option<(Block, Removed)> {
        let mut removed = Removed::default();
        let b = self.blocks.remove(bi)?;
        if b.live > 0 {
            let first = b.first_seq().unwrap_or(b.base_seq);
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
        Some((b, removed))
    }

    /// Removes the leading records for which `pred` holds (`pred` must be monotonic along the
    /// stream: true, then false). Whole sealed blocks go in one step each, judged by their
    /// newest record without loading their entries; only the boundary block is walked record
    /// by record. Returns the blocks to unlink, the removal, and the single sequences
    /// deleted in the boundary block (they need a delete marker).
    pub fn remove_prefix(
        &mut self,
        pred: impl Fn(&Entry) -> bool,
    ) -> Result<(Vec<Block>, Removed, Vec<u64>)> {
        let sealed = self.blocks.len().saturating_sub(1);
        let mut whole = 0;
        while whole < sealed {
            match self.blocks[whole].last_entry_summary() {
                Some(e) if !pred(&e) => break,
                _ => whole += 1,
            }
        }
        let (gone, mut removed) = self.remove_front_blocks(whole);
        let mut seqs = Vec::new();
        if !self.blocks.is_empty() && self.blocks[0].live > 0 {
            self.load(0)?;
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
        Ok((gone, removed, seqs))
    }

    /// Deletes every live record whose topic matches; returns the sequences and bytes.
    pub fn purge(&mut self, filters: &FilterSet) -> Result<(Vec<u64>, u64)> {
        let mut seqs = Vec::new();
        let mut bytes = 0;
        for bi in 0..self.blocks.len() {
            let m = self.blocks[bi].matching_topics(filters);
            if !m.iter().any(|&x| x) {
                continue;
            }
            self.load(bi)?;
            let start = self.blocks[bi].first_live_from();
            for ei in start..self.blocks[bi].entries.len() {
                let e = self.blocks[bi].entries[ei];
                if e.flags & ENTRY_DELETED == 0 && m[e.topic as usize] {
                    bytes += self.delete_at(bi, ei).unwrap_or(0);
                    seqs.push(e.seq);
                }
            }
        }
        Ok((seqs, bytes))
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
    pub fn topic_bounds(&mut self, topic: &[u8]) -> Result<Option<(u64, u64)>> {
        let Some(stat) = self.topics.get(topic) else {
            return Ok(None);
        };
        if let (Some(&a), Some(&b)) = (stat.seqs.front(), stat.seqs.back()) {
            return Ok(Some((a, b)));
        }
        let n = self.blocks.len();
        let Some(first) = self.find_topic(topic, 0..n, false)? else {
            return Ok(None);
        };
        let last = self.find_topic(topic, (0..n).rev(), true)?.unwrap_or(first);
        Ok(Some((first, last)))
    }

    /// First (or with `newest`, last) live record of `topic` in the blocks `order` visits,
    /// loading only blocks whose topic table says they hold one.
    pub fn find_topic(
        &mut self,
        topic: &[u8],
        order: impl Iterator<Item = usize>,
        newest: bool,
    ) -> Result<Option<u64>> {
        for bi in order {
            let b = &self.blocks[bi];
            let Some(&tid) = b.topic_ids.get(topic) else {
                continue;
            };
            if b.topic_live[tid as usize] == 0 {
                continue;
            }
            self.load(bi)?;
            let b = &self.blocks[bi];
            let ok = |e: &&Entry| e.topic == tid && e.flags & ENTRY_DELETED == 0;
            let found = if newest {
                b.entries.iter().rev().find(ok).map(|e| e.seq)
            } else {
                b.entries[b.first_live_from()..]
                    .iter()
                    .find(ok)
                    .map(|e| e.seq)
            };
            if found.is_some() {
                return Ok(found);
            }
        }
        Ok(None)
    }

    /// Oldest and newest live sequence of the stream. Needs no I/O: a block whose entries
    /// are not in memory is clean, so its cached first and last sequences are live.
    pub fn bounds(&mut self) -> Option<(u64, u64)> {
        let fi = self.blocks.iter().position(|b| b.live > 0)?;
        let li = self.blocks.iter().rposition(|b| b.live > 0)?;
        let first = if self.blocks[fi].loaded {
            let b = &mut self.blocks[fi];
            b.first_live().map(|ei| b.entries[ei].seq)
        } else {
            self.blocks[fi].first_seq()
        };
        let b = &self.blocks[li];
        let last = if b.loaded {
            b.entries
                .iter()
                .rev()
                .find(|e| e.flags & ENTRY_DELETED == 0)
                .map(|e| e.seq)
        } else {
            b.last_seq()
        };
        first.zip(last)
    }
}

#[cfg(test)]
mod removed_log_tests {
    use super::RemovedLog;

    #[test]
    fn removals_in_two_passes_read_as_one_range() {
        let mut log = RemovedLog::default();
        log.push(&[1..=5]);
        log.push(&[6..=15]);
        log.push(&[20..=21, 22..=22]);
        log.push(&[]);
        assert_eq!(log.ranges, vec![1..=15, 20..=22]);
        assert!(!log.overflowed);
    }
}
