//! The writer of one stream: group commit, block rolling (limits and removals in `limits`;
//! how its turns are driven, by a thread or stepped, in `drive`; block rewrites in `compact`).
//!
//! Each turn drains everything queued, applies it to the in-memory view under the state
//! lock, then, without the lock, issues **one** `pwrite` for the new bytes and one
//! `fdatasync` (policy `Always`), moves blocks that removals emptied into `trash/` (then one
//! directory fsync), and only then publishes the new durable sequence, which completes every
//! ticket up to it in order. A block roll splits a turn in two commits, and the roll's own
//! syncs run without the lock; compaction runs after the commit, also mostly unlocked. On a
//! file system whose syncs overlap (a replicated disk), a turn of plain appends starts its
//! sync and publishes it later, in order, while the next turns write (`pipeline`).
//!
//! # Invariants
//! - Records reach the file in sequence order; a batch never spans two blocks.
//! - The old block is synced before its successor's file is created, under every policy
//!   (`Never` included: one sync per block), so sealed blocks are durable before their index
//!   is written and a power loss can only cost the active block's unsynced tail.
//! - A new block's header is durable (file and directory entry) before any record is
//!   written to it, so a bad header is damage, never a torn creation. A roll reserves the
//!   new file to the block size first (durable with the header; the block recovery hands
//!   over is reserved by the first commit into it), and a sealed block is cut to its
//!   records before the sync that seals it: only the active block has zeros past its
//!   records, and the writer appends at the record end it tracks, never the file length.
//! - Deletions are applied in memory in the same turn as the delete marker that makes them
//!   durable is written, and removal replies are sent only after that marker is synced:
//!   op replies go out only with a commit that made everything written durable (under
//!   `Interval`, the first commit of a turn split by a roll does not), a seal's after its roll.
//! - After any write or sync error nothing more is written; `Shared::failed` is set, and the
//!   active block is cut back to what is known durable (see `fail`).

use std::collections::VecDeque;
use std::ops::{Range, RangeInclusive};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::SyncSender;
use std::time::Instant;

use crate::config::{Discard, SyncPolicy};
use crate::error::{Result, StoreError};
use crate::format::{self, BLOCK_HEADER_LEN, Entry, FLAG_BATCH_MORE, encode_delete};
use crate::queue::{Op, QueuedOp, Removed, coalesce, ranges_of};
use crate::shared::{Shared, lock};
use crate::state::{Block, State, TRASH_DIR, block_file_name};
use crate::vfs::{VFile, path_in};

mod compact;
mod drive;
mod io;
mod limits;
mod pipeline;
pub use pipeline::MAX_SYNCS_IN_FLIGHT;
mod snapshot;

/// Defects the simulator's sensitivity tests ask the store to have (see `crate::vfs::Bugs`).
/// Without the `sim` feature every switch is a constant `false`.
#[derive(Clone, Copy, Default)]
struct Injected {
    ack_before_fsync: bool,
    skip_sync_on_roll: bool,
    skip_dir_sync_on_roll: bool,
    ack_at_sync_start: bool,
}

impl Injected {
    #[cfg(feature = "sim")]
    fn of(sh: &Shared) -> Injected {
        let b = sh.vfs.injected_bugs();
        Injected {
            ack_before_fsync: b.ack_before_fsync,
            skip_sync_on_roll: b.skip_sync_on_roll,
            skip_dir_sync_on_roll: b.skip_dir_sync_on_roll,
            ack_at_sync_start: b.ack_at_sync_start,
        }
    }

    #[cfg(not(feature = "sim"))]
    #[inline(always)]
    fn of(_: &Shared) -> Injected {
        Injected::default()
    }
}

/// Blocks one automatic compaction rewrites at most (bounds the pause it causes).
const AUTO_COMPACT_BLOCKS: usize = 4;
/// Most ranges in one delete marker record (16 bytes each).
const MAX_RANGES_PER_MARKER: usize = 4096;

struct Parsed<'a> {
    len: usize,
    flags: u8,
    seq: u64,
    time_ns: u64,
    topic: &'a [u8],
}

/// Reads the header of a record this process encoded itself (so already well-formed).
fn parse(b: &[u8], p: usize) -> Parsed<'_> {
    let u32at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
    let u64at = |o: usize| u64::from(u32at(o)) | (u64::from(u32at(o + 4)) << 32);
    let len = u32at(p) as usize;
    let topic_len = u16::from_le_bytes([b[p + 10], b[p + 11]]) as usize;
    Parsed {
        len,
        flags: b[p + 9],
        seq: u64at(p + 20),
        time_ns: u64at(p + 28),
        topic: &b[p + format::RECORD_HEADER_LEN..p + format::RECORD_HEADER_LEN + topic_len],
    }
}

pub(crate) struct Writer {
    sh: Arc<Shared>,
    active_file: Arc<dyn VFile>,
    active_len: u64,
    /// Length of the active block as of its last successful sync.
    synced_len: u64,
    /// A sync of the active block failed: what it did not write may never reach the disk.
    sync_failed: bool,
    /// Bytes of this turn still to write, in file order: either `staged_run`, a run of the
    /// inbox written straight from it (the common case: no copy), or `out`, never both.
    staged_run: Option<Range<usize>>,
    /// Copied bytes to write: records once the run was broken (a rejected group) and every
    /// delete marker.
    out: Vec<u8>,
    inbox: Vec<u8>,
    /// Bytes of this turn's inbox applied (staged or rejected) and, of those, taken off
    /// `Shared::unwritten_bytes` by a commit: a turn split by a roll commits in parts.
    inbox_applied: usize,
    inbox_accounted: usize,
    pending_deletes: Vec<u64>,
    /// Delete ranges to write again (markers of a quarantined block), as they are.
    pending_ranges: Vec<(u64, u64)>,
    auto_deleted: Vec<u64>,
    auto_ranges: Vec<RangeInclusive<u64>>,
    pub(crate) unlink: Vec<Block>,
    replies: Vec<(SyncSender<Result<Removed>>, Removed)>,
    /// Replies to `Seal` ops, sent once their roll is done.
    seal_replies: Vec<SyncSender<Result<Removed>>>,
    written_seq: u64,
    synced_seq: u64,
    /// When the active block was last synced (`Vfs::monotonic_ns`).
    last_sync_ns: u64,
    /// When the expiry timer fires next (`Vfs::monotonic_ns`).
    next_expiry_ns: Option<u64>,
    failed: bool,
    /// Bytes were written to the active file since its last sync.
    file_dirty: bool,
    /// The active block was reserved to the block size (or that was tried and refused).
    /// A block made by a roll is reserved at once; the one recovery hands over is reserved
    /// by the first commit into it, so that a stream that never writes holds no space.
    active_reserved: bool,
    /// Blocks the next compaction phase may rewrite, and who waits for it.
    compact_budget: usize,
    compact_replies: Vec<SyncSender<Result<Removed>>>,
    /// Snapshots asked for in this turn, taken after its commit (`snapshot` module).
    snapshots: Vec<(PathBuf, SyncSender<Result<Removed>>)>,
    /// Hands trash to the reaper thread; `None` with stepped writers, which unlink inline.
    reaper: Option<SyncSender<Vec<PathBuf>>>,
    reaper_thread: Option<std::thread::JoinHandle<()>>,
    /// Commits whose sync is still running, oldest first (`pipeline`).
    in_flight: VecDeque<pipeline::InFlight>,
    /// The file system runs no syncs side by side (`VFile::start_sync` said so once).
    overlap_refused: bool,
}

/// A duration in ns, saturating (a timer centuries away never fires).
fn duration_ns(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Removal batches the reaper may have queued before the writer unlinks inline.
const MAX_REAPER_BACKLOG: usize = 64;

impl Writer {
    pub fn new(
        sh: Arc<Shared>,
        active_file: Arc<dyn VFile>,
        active_len: u64,
        written_seq: u64,
        reemit: Vec<(u64, u64)>,
    ) -> Self {
        let now = sh.vfs.monotonic_ns();
        let next_expiry_ns = Some(now.saturating_add(duration_ns(sh.config.expire_interval)));
        let (reaper, reaper_thread) = if sh.vfs.stepped_writers() {
            (None, None)
        } else {
            let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<PathBuf>>(MAX_REAPER_BACKLOG);
            let vfs = sh.vfs.clone();
            let thread = std::thread::Builder::new()
                .name(format!("tern-reap-{}", sh.name))
                .spawn(move || {
                    for batch in rx {
                        for p in batch {
                            let _ = vfs.remove_file(&p);
                        }
                    }
                })
                .ok();
            (Some(tx), thread)
        };
        Writer {
            sh,
            reaper,
            reaper_thread,
            active_file,
            active_len,
            // Recovery synced the active block.
            synced_len: active_len,
            sync_failed: false,
            staged_run: None,
            out: Vec::new(),
            inbox: Vec::new(),
            inbox_applied: 0,
            inbox_accounted: 0,
            pending_deletes: Vec::new(),
            pending_ranges: reemit,
            auto_deleted: Vec::new(),
            auto_ranges: Vec::new(),
            unlink: Vec::new(),
            replies: Vec::new(),
            seal_replies: Vec::new(),
            written_seq,
            synced_seq: written_seq,
            last_sync_ns: now,
            next_expiry_ns,
            failed: false,
            // Recovery synced the active block.
            file_dirty: false,
            active_reserved: false,
            compact_budget: 0,
            compact_replies: Vec::new(),
            snapshots: Vec::new(),
            in_flight: VecDeque::new(),
            overlap_refused: false,
        }
    }

    /// One group commit: apply queued records and ops, write, sync, publish, reply.
    fn turn(
        &mut self,
        first_seq: u64,
        ops: Vec<(usize, QueuedOp)>,
        internal: Vec<Op>,
        force_sync: bool,
    ) {
        let buf = std::mem::take(&mut self.inbox);
        self.inbox_applied = 0;
        self.inbox_accounted = 0;
        self.run_turn(&buf, first_seq, ops, internal, force_sync);
        // What a failure left unwritten is never written.
        let never_written = buf.len() - self.inbox_accounted;
        self.sh
            .unwritten_bytes
            .fetch_sub(never_written as u64, Ordering::Relaxed);
        self.inbox = buf;
    }

    fn run_turn(
        &mut self,
        buf: &[u8],
        first_seq: u64,
        ops: Vec<(usize, QueuedOp)>,
        internal: Vec<Op>,
        force_sync: bool,
    ) {
        if self.failed {
            self.refuse(buf, first_seq, ops);
            return;
        }
        let has_ops = !ops.is_empty() || !internal.is_empty();
        self.sh.counters.turns.fetch_add(1, Ordering::Relaxed);
        // Only this thread adds to `records`: the difference is this turn's batch.
        let records_before = self.sh.counters.records.load(Ordering::Relaxed);
        let mut ops: VecDeque<(usize, QueuedOp)> = ops.into();
        let mut internal = internal;
        let mut pos = 0;
        // A block roll splits the turn: what went to the old block is committed, the roll's
        // syncs run without the state lock, then the rest of the turn goes on.
        let res = loop {
            let applied = self.apply(buf, &mut pos, &mut ops, &mut internal);
            self.inbox_applied = pos;
            match applied {
                Ok(None) => break Ok(()),
                Ok(Some(base_seq)) => {
                    if let Err(e) = self.commit(buf, false).and_then(|()| self.roll(base_seq)) {
                        break Err(e);
                    }
                    let sealed = self
                        .seal_replies
                        .drain(..)
                        .map(|tx| (tx, Removed::default()));
                    self.replies.extend(sealed);
                }
                Err(e) => break Err(e),
            }
        };
        let res = res.and_then(|()| self.commit(buf, has_ops || force_sync));
        let batch = self.sh.counters.records.load(Ordering::Relaxed) - records_before;
        if batch > 0 {
            self.sh.counters.batch_records.observe(batch);
        }
        if let Err(e) = res {
            self.fail(e);
            return;
        }
        if self.compact_budget > 0 {
            // A turn that compacts did not pipeline its commit (`may_pipeline`).
            debug_assert!(self.in_flight.is_empty());
            let budget = std::mem::take(&mut self.compact_budget);
            let res = compact::compact(self, budget).and_then(|()| {
                if self.unlink.is_empty() {
                    Ok(())
                } else {
                    self.remove_blocks()
                }
            });
            match res {
                Ok(()) => {
                    for tx in self.compact_replies.drain(..) {
                        let _ = tx.try_send(Ok(Removed::default()));
                    }
                }
                Err(e) => self.fail(e),
            }
        }
        if !self.snapshots.is_empty() && !self.failed {
            self.run_snapshots();
        }
    }

    /// Applies queued records and ops from `pos` on. Returns the base sequence of a new
    /// block when the next record group does not fit the active block: the caller then
    /// commits, rolls, and calls again.
    fn apply(
        &mut self,
        buf: &[u8],
        pos: &mut usize,
        ops: &mut VecDeque<(usize, QueuedOp)>,
        internal: &mut Vec<Op>,
    ) -> Result<Option<u64>> {
        let sh = self.sh.clone();
        let mut st = lock(&sh.state);
        let mut roll = None;
        loop {
            let end = ops.front().map_or(buf.len(), |(off, _)| *off);
            if let Some(base) = self.apply_records(&mut st, buf, pos, end)? {
                roll = Some(base);
                break;
            }
            let Some((_, q)) = ops.pop_front() else { break };
            match q.op {
                Op::Compact { max_blocks } => {
                    self.compact_budget = self.compact_budget.max(max_blocks);
                    self.compact_replies.push(q.reply);
                }
                Op::Snapshot { dest } => self.snapshots.push((dest, q.reply)),
                Op::Seal => {
                    if st.active().entries.is_empty() {
                        self.replies.push((q.reply, Removed::default()));
                    } else {
                        self.seal_replies.push(q.reply);
                        let base = st.active().last_seq().unwrap_or(0).max(self.written_seq) + 1;
                        roll = Some(base);
                        break;
                    }
                }
                op => {
                    let removed = self.run_op(&mut st, op)?;
                    self.replies.push((q.reply, removed));
                }
            }
        }
        if roll.is_none() {
            for op in internal.drain(..) {
                let removed = self.run_op(&mut st, op)?;
                self.auto_ranges.extend(removed.ranges);
                self.enforce_limits(&mut st)?;
            }
        }
        if !self.auto_deleted.is_empty() {
            let seqs = std::mem::take(&mut self.auto_deleted);
            self.auto_ranges.extend(ranges_of(seqs));
        }
        if !self.auto_ranges.is_empty() {
            let r = coalesce(std::mem::take(&mut self.auto_ranges));
            st.removed_log.push(&r);
        }
        if !self.pending_deletes.is_empty() || !self.pending_ranges.is_empty() {
            st.unsynced_deletes.extend_from_slice(&self.pending_deletes);
            let mut ranges = ranges_of(std::mem::take(&mut self.pending_deletes));
            ranges.extend(self.pending_ranges.drain(..).map(|(a, z)| a..=z));
            let ranges: Vec<(u64, u64)> = coalesce(ranges)
                .into_iter()
                .map(|r| (*r.start(), *r.end()))
                .collect();
            let high = self.written_seq;
            // Markers follow the records staged before them.
            self.unstage_run(buf);
            for chunk in ranges.chunks(MAX_RANGES_PER_MARKER) {
                encode_delete(&mut self.out, high, sh.vfs.now_ns(), chunk);
                st.active().markers.extend_from_slice(chunk);
            }
        }
        let dead = st.take_dead_front();
        self.unlink.extend(dead);
        Ok(roll)
    }

    /// Applies the records in `buf[*pos..end]`, advancing `pos` past each group applied.
    /// Stops with the group's first sequence if it needs a new block.
    fn apply_records(
        &mut self,
        st: &mut State,
        buf: &[u8],
        pos: &mut usize,
        end: usize,
    ) -> Result<Option<u64>> {
        let sh = self.sh.clone();
        let cfg = &sh.config;
        let bytes = &buf[..end];
        let mut p = *pos;
        while p < bytes.len() {
            let mut q = p;
            let mut n = 0u64;
            let mut last_seq;
            loop {
                let r = parse(bytes, q);
                q += r.len;
                n += 1;
                last_seq = r.seq;
                if r.flags & FLAG_BATCH_MORE == 0 || q >= bytes.len() {
                    break;
                }
            }
            let group = &bytes[p..q];
            if let Some(limit) = self.rejects(st, group, n) {
                self.sh.reject(
                    last_seq,
                    StoreError::LimitReached {
                        stream: self.sh.name.clone(),
                        limit,
                    },
                );
                // A marker over the rejected sequences keeps them from being reused after
                // a restart (the records themselves were never written).
                self.pending_deletes.extend(parse(bytes, p).seq..=last_seq);
                self.written_seq = last_seq;
                p = q;
                *pos = p;
                continue;
            }
            let first_seq = parse(bytes, p).seq;
            let has_entries = !st.active().entries.is_empty();
            if has_entries
                && self.active_len + (self.staged_len() + group.len()) as u64 > cfg.block_size_bytes
            {
                return Ok(Some(first_seq));
            }
            let mut o = p;
            while o < q {
                let r = parse(bytes, o);
                let offset = self.active_len + self.staged_len() as u64;
                let act = st.active();
                let tid = act.topic_id(r.topic);
                sh.counters.records.fetch_add(1, Ordering::Relaxed);
                act.push(Entry {
                    seq: r.seq,
                    time_ns: r.time_ns,
                    offset: offset as u32,
                    len: r.len as u32,
                    topic: tid,
                    flags: u32::from(r.flags),
                });
                st.on_insert(r.topic, r.seq, r.len as u64);
                self.stage(bytes, o..o + r.len);
                if let (Some(max), Discard::Old) =
                    (cfg.limits.per_topic_max(r.topic), cfg.limits.discard)
                {
                    self.trim_topic(st, r.topic, max)?;
                }
                o += r.len;
            }
            self.written_seq = last_seq;
            if cfg.limits.discard == Discard::Old {
                self.trim_stream(st)?;
            }
            p = q;
            *pos = p;
        }
        Ok(None)
    }

    /// Bytes staged for the next write.
    fn staged_len(&self) -> usize {
        self.staged_run.as_ref().map_or(0, ExactSizeIterator::len) + self.out.len()
    }

    /// Stages `buf[range]` (the next bytes in file order) for the next write: records of a
    /// turn are contiguous in the inbox, so the run just grows and no byte is copied until
    /// something breaks it.
    fn stage(&mut self, buf: &[u8], range: Range<usize>) {
        match &mut self.staged_run {
            Some(run) if run.end == range.start => run.end = range.end,
            None if self.out.is_empty() => self.staged_run = Some(range),
            _ => {
                self.unstage_run(buf);
                self.out.extend_from_slice(&buf[range]);
            }
        }
    }

    /// Copies the staged run into `out`, so that what follows can be appended there.
    fn unstage_run(&mut self, buf: &[u8]) {
        if let Some(run) = self.staged_run.take() {
            self.out.extend_from_slice(&buf[run]);
        }
    }

    pub(crate) fn sh(&self) -> &Arc<Shared> {
        &self.sh
    }
}
