//! What a stream reports about itself: per-topic counts, the writer's counters and
//! histograms, and a snapshot of its numbers ([`StreamInfo`]). Reads and appends are in
//! `read.rs` and `stream/mod.rs`.

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;

use super::Stream;
use crate::shared::lock;
use crate::state::Corruption;

/// Live records of one topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicStats {
    pub count: u64,
    pub first_seq: u64,
    pub last_seq: u64,
}

/// What a stream's writer has done since the stream was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamMetrics {
    /// Records written (rejected ones not counted).
    pub records: u64,
    /// Group-commit turns of the writer.
    pub turns: u64,
    /// `pwrite` calls for record data.
    pub writes: u64,
    /// `fdatasync` calls on block files.
    pub syncs: u64,
    pub bytes_written: u64,
    /// Blocks sealed.
    pub rolls: u64,
}

/// A snapshot of a stream's numbers.
#[derive(Debug, Clone)]
pub struct StreamInfo {
    pub msgs: u64,
    /// Bytes of the live records.
    pub bytes: u64,
    /// Bytes of its block files (live and deleted records, delete markers), as allocated: the
    /// active block counts its whole reserved length (`block_size_bytes`) once written to.
    /// What the stream holds on disk, index files and removed blocks not yet freed aside.
    pub disk_bytes: u64,
    /// Bytes of records appended and not yet written to a block: queued, or in the writer's
    /// turn in progress (a held or slow write). `disk_bytes` does not show them yet.
    pub unwritten_bytes: u64,
    /// `disk_bytes` as it will be once those are written: the active block grown by them
    /// where they do not fit its reservation. A block roll they cause reserves up to one
    /// `block_size_bytes` more, which this does not foresee.
    pub disk_bytes_with_unwritten: u64,
    /// Oldest and newest live sequence (None when empty).
    pub first_seq: Option<u64>,
    pub last_seq: Option<u64>,
    /// Highest sequence that is durable (every ticket up to it has completed).
    pub durable_seq: u64,
    /// Highest sequence the writer has handled: written to the file, synced or not (or
    /// rejected by a limit). `written_seq - durable_seq` is the unsynced backlog.
    pub written_seq: u64,
    pub blocks: usize,
    pub topics: usize,
    pub failed: bool,
    pub quarantined: Vec<Corruption>,
}

impl Stream {
    /// Live counts of every topic.
    pub fn topic_counts(&self) -> Vec<(Bytes, u64)> {
        let st = lock(&self.sh().state);
        st.topics
            .iter()
            .map(|(t, s)| (t.clone(), s.count))
            .collect()
    }

    /// Counters of the writer's work (e.g. records per sync shows group commit at work).
    pub fn metrics(&self) -> StreamMetrics {
        let c = &self.sh().counters;
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StreamMetrics {
            records: r(&c.records),
            turns: r(&c.turns),
            writes: r(&c.writes),
            syncs: r(&c.syncs),
            bytes_written: r(&c.bytes_written),
            rolls: r(&c.rolls),
        }
    }

    /// Operations (removals, truncations) queued for the writer and not taken yet: each
    /// caller of one waits for the writer's reply.
    pub fn queued_ops(&self) -> usize {
        lock(&self.sh().queue).ops.len()
    }

    /// The writer's fsync latency and group-commit batch size histograms (lock-free reads).
    pub fn histograms(&self) -> crate::histogram::StreamHistograms {
        let c = &self.sh().counters;
        crate::histogram::StreamHistograms {
            fsync_us: c.fsync_us.snapshot(),
            batch_records: c.batch_records.snapshot(),
        }
    }

    pub fn info(&self) -> StreamInfo {
        let sh = self.sh();
        let mut st = lock(&sh.state);
        let bounds = st.bounds();
        let disk_bytes = st.blocks.iter().map(|b| b.len.max(b.reserved_bytes)).sum();
        // Read under the state lock: the writer moves bytes from this count into a block's
        // length in one section under it.
        let unwritten_bytes = sh.unwritten_bytes.load(Ordering::Relaxed);
        let growth_bytes = st.blocks.back().map_or(unwritten_bytes, |active| {
            (active.len + unwritten_bytes).saturating_sub(active.len.max(active.reserved_bytes))
        });
        StreamInfo {
            msgs: st.live,
            bytes: st.live_bytes,
            disk_bytes,
            unwritten_bytes,
            disk_bytes_with_unwritten: disk_bytes + growth_bytes,
            first_seq: bounds.map(|b| b.0),
            last_seq: bounds.map(|b| b.1),
            durable_seq: sh.durable_seq.load(Ordering::SeqCst),
            written_seq: sh.written_seq.load(Ordering::SeqCst),
            blocks: st.blocks.len(),
            topics: st.topics.len(),
            failed: sh.failed.load(Ordering::SeqCst),
            quarantined: st.quarantined.clone(),
        }
    }
}
