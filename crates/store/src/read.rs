//! Reads: by sequence, from a sequence on through topic filters, the newest record of a
//! topic, per-topic numbers, and the scrub that verifies sealed blocks. Entries are picked
//! under the state lock; the `pread`s and checksum checks happen after it is released.
//!
//! # Invariants
//! - Only records with `seq <= visible_seq` are served, and only after their checksum held.
//! - Damage found in a sealed block quarantines the block (its delete markers are written
//!   again first); damage in the active block is reported without moving anything.

use std::sync::Arc;

use bytes::Bytes;

use crate::error::{Result, StoreError};
use crate::filter::FilterSet;
use crate::format::{self, Entry};
use crate::queue::Op;
use crate::shared::lock;
use crate::state::{Corruption, ENTRY_DELETED};
use crate::stream::{MAX_SCAN_ENTRIES, ReadBatch, Record, Stream, TopicStats};
use crate::vfs::VFile;

/// Entries of one block to read after the state lock is released.
struct BlockRead {
    file: Arc<dyn VFile>,
    base: u64,
    sealed: bool,
    path: std::path::PathBuf,
    entries: Vec<Entry>,
}

impl BlockRead {
    fn of(b: &crate::state::Block, entries: Vec<Entry>) -> Self {
        BlockRead {
            file: b.file.clone(),
            base: b.base_seq,
            sealed: b.sealed,
            path: b.path.clone(),
            entries,
        }
    }
}

impl Stream {
    /// Whether record `seq` is gone: deleted, or in a block that was removed (or it was
    /// refused by a limit). A sequence the writer has not applied yet is not gone. Asked
    /// under the state lock, which the writer holds from reading the retention floor to its
    /// last removal below it: once a caller lowered the floor to `seq`
    /// ([`Stream::lower_retention_floor`]), an answer of `false` holds against every limit
    /// from then on (explicit removals excepted).
    pub fn is_removed(&self, seq: u64) -> Result<bool> {
        let mut st = lock(&self.sh().state);
        if let Some((bi, ei)) = st.locate(seq)? {
            return Ok(st.blocks[bi].entries[ei].flags & ENTRY_DELETED != 0);
        }
        // Records are applied in sequence order and a new active block starts above every
        // sequence applied before it: above the active block's newest record is unapplied.
        let active = st.active();
        let unapplied = seq >= active.base_seq && active.last_seq().is_none_or(|l| seq > l);
        Ok(!unapplied)
    }

    /// The record with this sequence, if it exists and is durable.
    pub fn get(&self, seq: u64) -> Result<Option<Record>> {
        let found = {
            let mut st = lock(&self.sh().state);
            if seq > st.visible_seq {
                return Ok(None);
            }
            let Some((bi, ei)) = st.locate(seq)? else {
                return Ok(None);
            };
            let b = &st.blocks[bi];
            let e = b.entries[ei];
            if e.flags & ENTRY_DELETED != 0 {
                return Ok(None);
            }
            BlockRead::of(b, vec![e])
        };
        let mut out = self.read_entries(&found)?;
        Ok(out.pop())
    }

    /// Records from `start_seq` on whose topic matches `filters`, at most `max_records` and
    /// about `max_bytes` (at least one record is returned if any matches). Blocks with no
    /// matching topic are skipped without being read.
    pub fn read_from(
        &self,
        start_seq: u64,
        filters: &FilterSet,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<ReadBatch> {
        let mut plan: Vec<BlockRead> = Vec::new();
        let mut next_seq;
        {
            let mut st = lock(&self.sh().state);
            next_seq = start_seq.max(st.blocks.front().map_or(1, |b| b.base_seq));
            let mut scanned = 0;
            let mut n = 0;
            let mut bytes = 0usize;
            let first_block = st.block_pos(start_seq).unwrap_or(0);
            let visible = st.visible_seq;
            'blocks: for bi in first_block..st.blocks.len() {
                if st.blocks[bi].live == 0 {
                    continue;
                }
                let b = &st.blocks[bi];
                let m = if filters.is_all() {
                    None
                } else {
                    Some(b.matching_topics(filters))
                };
                if m.as_ref().is_some_and(|m| !m.iter().any(|&x| x)) {
                    if let Some(s) = b.last_seq() {
                        next_seq = next_seq.max(s.min(visible) + 1);
                    }
                    continue;
                }
                st.load(bi)?;
                let b = &st.blocks[bi];
                let from = b
                    .entries
                    .partition_point(|e| e.seq < start_seq)
                    .max(b.first_live_from());
                let mut picked = Vec::new();
                for e in &b.entries[from..] {
                    if e.seq > visible
                        || n >= max_records
                        || (n > 0 && bytes >= max_bytes)
                        || scanned >= MAX_SCAN_ENTRIES
                    {
                        if !picked.is_empty() {
                            plan.push(BlockRead::of(b, picked));
                        }
                        break 'blocks;
                    }
                    scanned += 1;
                    next_seq = e.seq + 1;
                    if e.flags & ENTRY_DELETED != 0
                        || m.as_ref().is_some_and(|m| !m[e.topic as usize])
                    {
                        continue;
                    }
                    n += 1;
                    bytes += e.len as usize;
                    picked.push(*e);
                }
                if !picked.is_empty() {
                    plan.push(BlockRead::of(b, picked));
                }
            }
        }
        let mut records = Vec::new();
        for r in &plan {
            records.extend(self.read_entries(r)?);
        }
        Ok(ReadBatch { records, next_seq })
    }

    /// Reads and verifies entries of one block, with one `pread` when they lie close.
    fn read_entries(&self, r: &BlockRead) -> Result<Vec<Record>> {
        let BlockRead {
            file,
            base,
            sealed,
            path,
            entries,
        } = r;
        let (base, sealed) = (*base, *sealed);
        let (Some(first), Some(last)) = (entries.first(), entries.last()) else {
            return Ok(Vec::new());
        };
        let span_start = first.offset as u64;
        let span_len = (last.offset as u64 + last.len as u64 - span_start) as usize;
        let sum: usize = entries.iter().map(|e| e.len as usize).sum();
        let mut out = Vec::with_capacity(entries.len());
        let one_read = span_len <= 2 * sum + 64 * 1024;
        let span = if one_read {
            let mut buf = vec![0u8; span_len];
            file.read_exact_at(&mut buf, span_start)
                .map_err(|e| StoreError::io("read", path, &e))?;
            Some(Bytes::from(buf))
        } else {
            None
        };
        for e in entries {
            let (buf, off) = match &span {
                Some(s) => (s.clone(), (e.offset as u64 - span_start) as usize),
                None => {
                    let mut b = vec![0u8; e.len as usize];
                    file.read_exact_at(&mut b, e.offset as u64)
                        .map_err(|err| StoreError::io("read", path, &err))?;
                    (Bytes::from(b), 0)
                }
            };
            match format::decode_record(&buf, off) {
                Ok(r) if r.seq == e.seq && r.len == e.len as usize => out.push(Record::from_raw(r)),
                Ok(_) => {
                    return Err(self.corrupt(
                        base,
                        sealed,
                        e.seq,
                        "record does not match its index".into(),
                    ));
                }
                Err(d) => return Err(self.corrupt(base, sealed, e.seq, format!("{d:?}"))),
            }
        }
        Ok(out)
    }

    /// A read found damage: quarantine a sealed block, report it.
    fn corrupt(&self, base: u64, sealed: bool, seq: u64, detail: String) -> StoreError {
        let sh = self.sh();
        let mut st = lock(&sh.state);
        let Some(bi) = st.blocks.iter().position(|b| b.base_seq == base) else {
            return StoreError::Corrupt {
                path: sh.dir.clone(),
                range: seq..=seq,
                detail,
            };
        };
        let path = st.blocks[bi].path.clone();
        if !sealed || bi + 1 == st.blocks.len() {
            return StoreError::Corrupt {
                path,
                range: seq..=seq,
                detail,
            };
        }
        let end = st.blocks[bi + 1].base_seq - 1;
        let Some((b, _removed)) = st.remove_block(bi) else {
            return StoreError::Corrupt {
                path,
                range: seq..=seq,
                detail,
            };
        };
        if !b.markers.is_empty() {
            self.send_op(Op::RewriteMarkers {
                ranges: b.markers.clone(),
            });
        }
        match crate::recovery::quarantine_block(&*sh.vfs, &sh.dir, base, base..=end, detail.clone())
        {
            Ok(c) => {
                st.quarantined.push(c.clone());
                StoreError::Corrupt {
                    path: c.path,
                    range: c.range,
                    detail,
                }
            }
            Err(e) => e,
        }
    }

    /// Reads every sealed block in full and checks every record's checksum (a scrub).
    /// Damaged blocks are quarantined and returned; the rest stays served. Costs one
    /// sequential read of the stream; meant for a low-priority background task.
    pub fn verify(&self) -> Result<Vec<Corruption>> {
        let sealed: Vec<(u64, u64, Arc<dyn VFile>, std::path::PathBuf)> = {
            let st = lock(&self.sh().state);
            let n = st.blocks.len().saturating_sub(1);
            st.blocks
                .iter()
                .take(n)
                .map(|b| (b.base_seq, b.len, b.file.clone(), b.path.clone()))
                .collect()
        };
        let mut found = Vec::new();
        for (base, len, file, path) in sealed {
            let mut raw = vec![0u8; len as usize];
            file.read_exact_at(&mut raw, 0)
                .map_err(|e| StoreError::io("read", &path, &e))?;
            let mut detail = format::decode_block_header(&raw)
                .err()
                .map(|e| format!("block header: {e}"));
            if detail.is_none() {
                let sc = crate::scan::scan(&Bytes::from(raw), base);
                detail = sc
                    .damage
                    .map(|(off, what)| format!("at offset {off}: {what}"));
            }
            if let Some(detail) = detail {
                if let StoreError::Corrupt {
                    path,
                    range,
                    detail,
                } = self.corrupt(base, true, base, detail)
                {
                    found.push(Corruption {
                        path,
                        range,
                        detail,
                    });
                }
            }
        }
        Ok(found)
    }

    /// Newest live record of a topic. While a newer record of the topic is not durable yet,
    /// the newest durable one, even if that newer record's limit already deleted it in
    /// memory (the deletion is not durable either): a key never reads as absent mid-update.
    pub fn last_for_topic(&self, topic: &[u8]) -> Result<Option<Record>> {
        let found = {
            let mut st = lock(&self.sh().state);
            let visible = st.visible_seq;
            match st.topic_bounds(topic)? {
                Some((_, last)) if last <= visible => {
                    drop(st);
                    return self.get(last);
                }
                Some((_, _)) => {
                    st.unsynced_deletes.sort_unstable();
                    let mut found = None;
                    for bi in (0..st.blocks.len()).rev() {
                        let Some(&tid) = st.blocks[bi].topic_ids.get(topic) else {
                            continue;
                        };
                        st.load(bi)?;
                        let b = &st.blocks[bi];
                        let durable = |e: &&Entry| {
                            e.topic == tid
                                && e.seq <= visible
                                && (e.flags & ENTRY_DELETED == 0
                                    || st.unsynced_deletes.binary_search(&e.seq).is_ok())
                        };
                        if let Some(e) = b.entries.iter().rev().find(durable) {
                            found = Some(BlockRead::of(b, vec![*e]));
                            break;
                        }
                    }
                    match found {
                        Some(r) => r,
                        None => return Ok(None),
                    }
                }
                None => return Ok(None),
            }
        };
        Ok(self.read_entries(&found)?.pop())
    }

    /// Count and first/last sequence of a topic's live records.
    pub fn topic_stats(&self, topic: &[u8]) -> Result<Option<TopicStats>> {
        let mut st = lock(&self.sh().state);
        let Some(count) = st.topics.get(topic).map(|t| t.count) else {
            return Ok(None);
        };
        Ok(st
            .topic_bounds(topic)?
            .map(|(first_seq, last_seq)| TopicStats {
                count,
                first_seq,
                last_seq,
            }))
    }
}
