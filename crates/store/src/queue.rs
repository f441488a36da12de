//! The bounded queue between appenders and a stream's writer thread.
//!
//! Appenders encode records straight into `buf` under the queue lock, so assigning the
//! sequence and fixing the order is one critical section with no syscall and, once the
//! buffer has grown, no allocation. The writer swaps the buffer out whole.
//!
//! # Invariants
//! - Records in `buf` are in sequence order, with no gaps, starting at `buf_first_seq`.
//! - Records of one batch are contiguous in `buf`.
//! - `ops[i].0` is the `buf` offset at which op `i` was queued; ops run after the records
//!   before that offset and before the ones after it.

use std::ops::RangeInclusive;
use std::sync::Condvar;
use std::sync::mpsc::SyncSender;

use crate::error::Result;
use crate::filter::FilterSet;

/// What a removal did: sequence ranges that no longer exist (ranges may also cover records
/// that were already gone), the number of records and bytes removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Removed {
    pub ranges: Vec<RangeInclusive<u64>>,
    pub records: u64,
    pub bytes: u64,
}

/// Sorts and merges overlapping or adjacent ranges.
pub(crate) fn coalesce(mut v: Vec<RangeInclusive<u64>>) -> Vec<RangeInclusive<u64>> {
    v.sort_by_key(|r| *r.start());
    let mut out: Vec<RangeInclusive<u64>> = Vec::with_capacity(v.len());
    for r in v {
        push_merged(&mut out, r);
    }
    out
}

/// Appends `r` to `out`, or extends `out`'s last range if `r` starts inside it or right after
/// it (the merge rule of [`coalesce`]; `out` stays coalesced when ranges come in ascending
/// order of their starts).
pub(crate) fn push_merged(out: &mut Vec<RangeInclusive<u64>>, r: RangeInclusive<u64>) {
    match out.last_mut() {
        Some(last) if *r.start() >= *last.start() && *r.start() <= last.end().saturating_add(1) => {
            if r.end() > last.end() {
                *last = *last.start()..=*r.end();
            }
        }
        _ => out.push(r),
    }
}

/// Ranges from a list of single sequences.
pub(crate) fn ranges_of(mut seqs: Vec<u64>) -> Vec<RangeInclusive<u64>> {
    seqs.sort_unstable();
    seqs.dedup();
    let mut out: Vec<RangeInclusive<u64>> = Vec::new();
    for s in seqs {
        match out.last_mut() {
            Some(r) if *r.end() + 1 == s => *r = *r.start()..=s,
            _ => out.push(s..=s),
        }
    }
    out
}

pub(crate) enum Op {
    /// Apply `max_age` as of `now_ns`.
    Expire { now_ns: u64 },
    /// Remove every record below `floor`.
    RemoveBelow { floor: u64 },
    /// Remove the leading sealed blocks whose records are all below `floor`.
    RemoveBlocksBelow { floor: u64 },
    /// Remove every record whose topic matches.
    Purge { filters: FilterSet },
    /// Remove single records.
    Delete { seqs: Vec<u64> },
    /// Rewrite sealed blocks that hold deleted records, oldest first, at most this many.
    Compact { max_blocks: usize },
    /// Completes once everything queued before it is durable.
    Flush,
    /// Writes delete markers again for these ranges: they were stored in a block that was
    /// quarantined, and without them records deleted earlier would come back on reopen.
    RewriteMarkers { ranges: Vec<(u64, u64)> },
    /// Seals the active block (if it holds records) and starts a new one.
    Seal,
    /// Writes a copy of the stream as of the end of this turn into `dest` (`writer::snapshot`).
    Snapshot { dest: std::path::PathBuf },
}

pub(crate) struct QueuedOp {
    pub op: Op,
    pub reply: SyncSender<Result<Removed>>,
}

pub(crate) struct Queue {
    pub buf: Vec<u8>,
    pub buf_first_seq: u64,
    pub records: usize,
    pub ops: Vec<(usize, QueuedOp)>,
    pub next_seq: u64,
    pub last_time_ns: u64,
    pub writer_waiting: bool,
    /// Live `DeferWakes` guards, and whether an append left the writer asleep for them
    /// (`wake` module).
    pub deferring: usize,
    pub wake_deferred: bool,
    pub appenders_waiting: usize,
    pub closed: bool,
}

impl Queue {
    pub fn new(next_seq: u64, last_time_ns: u64) -> Self {
        Queue {
            buf: Vec::new(),
            buf_first_seq: next_seq,
            records: 0,
            ops: Vec::new(),
            next_seq,
            last_time_ns,
            writer_waiting: false,
            deferring: 0,
            wake_deferred: false,
            appenders_waiting: 0,
            closed: false,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty() && self.ops.is_empty()
    }

    // The writer's wake-ups, under the queue lock (`writer_cv` is the condvar it sleeps on).
    // The rules of deferring them are in the `wake` module; they live here, below `Shared`,
    // because `Shared::wait` applies one of them too.

    /// Wakes the writer if it sleeps.
    pub fn wake_writer(&mut self, writer_cv: &Condvar) {
        if self.writer_waiting {
            self.writer_waiting = false;
            writer_cv.notify_one();
        }
    }

    /// After an append: wakes the writer unless a `DeferWakes` guard defers it.
    pub fn wake_after_append(&mut self, writer_cv: &Condvar) {
        if self.deferring > 0 {
            self.wake_deferred = true;
        } else {
            self.wake_writer(writer_cv);
        }
    }

    /// Before a thread blocks on a ticket: a wake its own guard deferred happens now.
    pub fn wake_if_deferred(&mut self, writer_cv: &Condvar) {
        if self.wake_deferred {
            self.wake_deferred = false;
            self.wake_writer(writer_cv);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coalescing() {
        assert_eq!(
            coalesce(vec![5..=6, 1..=2, 3..=3, 9..=9]),
            vec![1..=3, 5..=6, 9..=9]
        );
        assert_eq!(ranges_of(vec![4, 1, 2, 2, 7]), vec![1..=2, 4..=4, 7..=7]);
    }
}
