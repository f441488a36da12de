//! Commits whose sync is still running (`VFile::start_sync`): on a file system whose syncs
//! overlap (a replicated disk: a sync is a consensus round, seconds of them can run side by
//! side), the writer writes its next batch while the last one commits, instead of holding
//! one sync per stream at a time.
//!
//! Only the plainest turn is pipelined: records appended to the active block under
//! `SyncPolicy::Always`, nothing else. Every other commit (ops and their replies, delete
//! markers, a roll, removals, compaction, snapshots, the last sync) first settles every sync
//! in flight and then runs as before, so the rules those depend on are unchanged.
//!
//! # Invariants
//! - Syncs settle in the order they started; settling one publishes the block length and
//!   sequence it covers, so `synced_len`, `synced_seq` and the durable sequence only grow,
//!   and no ticket completes before a sync covering its record returned `Ok`.
//! - At most `MAX_SYNCS_IN_FLIGHT` syncs are in flight: when that many are, the oldest
//!   settles (blocking) before the next starts.
//! - A failed sync fails the stream: `fail` cuts the active block back to the last settled
//!   length, which is before every record of the failed sync and of those behind it.

use super::*;
use std::sync::atomic::AtomicBool;

use crate::vfs::SyncInFlight;

/// Syncs one writer keeps running at once (a replicated disk runs up to its
/// `MAX_PROPOSALS_IN_FLIGHT` rounds side by side, for every stream together).
pub const MAX_SYNCS_IN_FLIGHT: usize = 4;

/// A commit whose sync was started and not yet settled.
pub(super) struct InFlight {
    sync: Box<dyn SyncInFlight>,
    /// Set (and the writer woken) once `sync.wait()` would no longer block.
    done: Arc<AtomicBool>,
    /// The active block's length and the last sequence written when the sync started.
    len: u64,
    written_seq: u64,
    started: Instant,
}

impl Writer {
    /// Whether this commit may leave its sync running: the turn appended records and did
    /// nothing whose reply or follow-up needs its sync first.
    pub(super) fn may_pipeline(&self) -> bool {
        !self.overlap_refused
            && self.sh.config.sync == SyncPolicy::Always
            && !self.sh.is_stepped()
            && !Injected::of(&self.sh).ack_before_fsync
            && self.active_reserved
            && self.replies.is_empty()
            && self.seal_replies.is_empty()
            && self.unlink.is_empty()
            && self.compact_budget == 0
            && self.snapshots.is_empty()
            && lock(&self.sh.state).unsynced_deletes.is_empty()
    }

    /// Starts the sync of what was just written, if the file can run it alongside the next
    /// turn; then settles the oldest syncs down to the limit. `false`: the file cannot, and
    /// the caller syncs as before.
    pub(super) fn start_pipelined_sync(&mut self) -> Result<bool> {
        while self.in_flight.len() >= MAX_SYNCS_IN_FLIGHT {
            self.settle_oldest()?;
        }
        let done = Arc::new(AtomicBool::new(false));
        let Some(sync) = self.active_file.start_sync(wake_writer(&self.sh, &done)) else {
            // The file system's answer for every file: not asked again (a real disk's
            // commits pay nothing for the pipeline after the first).
            self.overlap_refused = true;
            return Ok(false);
        };
        self.sh.counters.syncs.fetch_add(1, Ordering::Relaxed);
        self.file_dirty = false;
        self.in_flight.push_back(InFlight {
            sync,
            done,
            len: self.active_len,
            written_seq: self.written_seq,
            started: Instant::now(),
        });
        debug_assert!(self.in_flight.len() <= MAX_SYNCS_IN_FLIGHT);
        Ok(true)
    }

    /// The oldest sync in flight is done: settling it will not block.
    pub(super) fn oldest_sync_done(&self) -> bool {
        self.in_flight
            .front()
            .is_some_and(|f| f.done.load(Ordering::SeqCst))
    }

    /// Settles the oldest sync in flight if it is done; a failed one fails the stream.
    pub(super) fn settle_done(&mut self) {
        if self.oldest_sync_done()
            && let Err(e) = self.settle_oldest()
        {
            self.fail(e);
        }
    }

    /// The end of a commit that may be pipelined, its bytes written: starts their sync and
    /// does the accounting (publishing waits for the settle). `false`: the commit goes on as
    /// before, once every sync in flight has settled (it makes `synced_seq` the written one,
    /// true only then).
    pub(super) fn commit_pipelined(&mut self, sync_now: bool) -> Result<bool> {
        if sync_now && self.file_dirty && self.start_pipelined_sync()? {
            let applied = self.inbox_applied - self.inbox_accounted;
            self.inbox_accounted = self.inbox_applied;
            let sh = &self.sh;
            sh.unwritten_bytes
                .fetch_sub(applied as u64, Ordering::Relaxed);
            sh.written_seq.fetch_max(self.written_seq, Ordering::SeqCst);
            if Injected::of(sh).ack_at_sync_start {
                self.publish_unsynced();
            }
            return Ok(true);
        }
        self.settle_all()?;
        Ok(false)
    }

    /// The injected bugs `ack_before_fsync` and `ack_at_sync_start`: completes the tickets of
    /// everything written, before a sync made it durable. Never called otherwise.
    pub(super) fn publish_unsynced(&self) {
        lock(&self.sh.state).visible_seq = self.written_seq;
        self.sh.publish_durable(self.written_seq);
    }

    /// Waits for every sync in flight, publishing each.
    pub(super) fn settle_all(&mut self) -> Result<()> {
        while !self.in_flight.is_empty() {
            self.settle_oldest()?;
        }
        Ok(())
    }

    /// Waits for the oldest sync in flight; once it is durable, publishes what it covers.
    fn settle_oldest(&mut self) -> Result<()> {
        let Some(f) = self.in_flight.pop_front() else {
            return Ok(());
        };
        let sh = self.sh.clone();
        let synced = f.sync.wait();
        let sync_us = u64::try_from(f.started.elapsed().as_micros()).unwrap_or(u64::MAX);
        sh.counters.fsync_us.observe(sync_us);
        if let Err(e) = synced {
            self.sync_failed = true;
            let path = lock(&sh.state).active().path.clone();
            return Err(StoreError::io("fdatasync", path, &e));
        }
        debug_assert!(f.len >= self.synced_len && f.written_seq >= self.synced_seq);
        self.synced_len = f.len;
        self.synced_seq = f.written_seq;
        self.last_sync_ns = sh.vfs.monotonic_ns();
        {
            let mut st = lock(&sh.state);
            let act = st.active();
            act.len = act.len.max(f.len);
            st.visible_seq = st.visible_seq.max(self.synced_seq);
        }
        sh.publish_durable(self.synced_seq);
        Ok(())
    }
}

/// What a started sync calls when done: marks it and wakes the writer, which may be waiting
/// for work (`drive`). The flag is set before the queue lock is taken, and the writer reads
/// it under that lock before it sleeps, so the wake-up is never lost. Holds the stream
/// weakly: a sync the disk never finishes does not keep a closed stream alive.
fn wake_writer(sh: &Arc<Shared>, done: &Arc<AtomicBool>) -> crate::vfs::SyncDone {
    let (sh, done) = (Arc::downgrade(sh), done.clone());
    Box::new(move || {
        done.store(true, Ordering::SeqCst);
        if let Some(sh) = sh.upgrade() {
            let _q = lock(&sh.queue);
            sh.writer_cv.notify_all();
        }
    })
}
