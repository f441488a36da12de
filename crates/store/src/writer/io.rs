//! The writer's file I/O: a commit (one write, then the sync the policy asks for), a block
//! roll (the old block cut to its records and synced, the new one reserved to the block size
//! and its header durable before any record), and what a failed
//! write or sync leaves behind (nothing more written; the active block cut back to what is
//! known durable).

use super::*;

impl Writer {
    pub(super) fn refuse(&mut self, buf: &[u8], _first_seq: u64, ops: Vec<(usize, QueuedOp)>) {
        let _ = buf;
        for (_, q) in ops {
            let _ = q.reply.try_send(Err(self.sh.failed_error()));
        }
    }

    pub(super) fn fail(&mut self, e: StoreError) {
        self.failed = true;
        // Syncs still running are never settled: what they cover is cut back below.
        self.in_flight.clear();
        self.staged_run = None;
        self.out.clear();
        // After a failed write or sync the page cache may show data that is not on disk and,
        // after a failed fdatasync on Linux, never will be (the pages are marked clean, so
        // no later sync writes them). A reopen would serve it and build on it. Cut the
        // active block back to what is known durable: the cut records were never
        // acknowledged, except under `Never`, which keeps what was written whole unless a
        // sync failed (its records are then as good as lost in a power loss).
        let keep = if self.sh.config.sync == SyncPolicy::Never && !self.sync_failed {
            self.active_len
        } else {
            self.synced_len
        };
        if let Err(err) = self.active_file.set_len(keep) {
            tracing::error!(stream = %self.sh.name, error = %err,
                "could not cut the active block back to its durable length");
        }
        self.sh.fail(e.to_string());
        for (tx, _) in self.replies.drain(..) {
            let _ = tx.try_send(Err(self.sh.failed_error()));
        }
        for tx in self
            .compact_replies
            .drain(..)
            .chain(self.seal_replies.drain(..))
            .chain(self.snapshots.drain(..).map(|(_, tx)| tx))
        {
            let _ = tx.try_send(Err(self.sh.failed_error()));
        }
    }

    /// Seals the active block and starts a new one whose first sequence is `base_seq`.
    /// Runs after a commit and without the state lock, except for two short sections.
    /// The old block is synced before the new file exists, so a newer block is never
    /// found behind a torn one after a crash, and a sealed block is durable before its index
    /// (under `Never` too: otherwise write-back may persist an index and a block length
    /// whose data never reached the disk, and the first read would quarantine the whole
    /// block, records that had long been durable included). The new block's
    /// header is synced before its first record is written (under every policy: one small
    /// sync per block): otherwise write-back may persist records of the new block without
    /// its first page, and recovery would quarantine a block whose header reads as zeros.
    pub(super) fn roll(&mut self, base_seq: u64) -> Result<()> {
        // What is in flight belongs to the old block: settled while it is still active.
        self.settle_all()?;
        let sh = self.sh.clone();
        let (old_path, ix, ix_path) = {
            let mut st = lock(&sh.state);
            let act = st.active();
            act.sealed = true;
            act.reserved_bytes = 0;
            (
                act.path.clone(),
                format::encode_index(&act.index_data()),
                act.index_path(),
            )
        };
        sh.counters.rolls.fetch_add(1, Ordering::Relaxed);
        let bugs = Injected::of(&sh);
        // A sealed block is exactly its records: its reserved zeros go, in the sync below,
        // before the index that gives its length is written.
        self.active_file
            .set_len(self.active_len)
            .map_err(|e| StoreError::io("truncate", &old_path, &e))?;
        self.file_dirty = true;
        if !bugs.skip_sync_on_roll {
            sh.counters.syncs.fetch_add(1, Ordering::Relaxed);
            let sync_started = Instant::now();
            let synced = self.active_file.sync_data();
            let sync_us = u64::try_from(sync_started.elapsed().as_micros()).unwrap_or(u64::MAX);
            sh.counters.fsync_us.observe(sync_us);
            if let Err(e) = synced {
                self.sync_failed = true;
                return Err(StoreError::io("fdatasync", &old_path, &e));
            }
            self.file_dirty = false;
            self.synced_len = self.active_len;
        }
        if let Err(e) = sh.vfs.write_file(&ix_path, &ix) {
            // The index is a cache of the block; a missing one is rebuilt on open.
            tracing::warn!(stream = %sh.name, path = %ix_path.display(), error = %e, "could not write block index");
        }
        let path = path_in(&sh.dir, &block_file_name(base_seq));
        sh.counters.syncs.fetch_add(1, Ordering::Relaxed);
        let (file, reserved_bytes) =
            crate::recovery::open_new_block(&*sh.vfs, &path, base_seq, sh.config.block_size_bytes)?;
        if !bugs.skip_dir_sync_on_roll {
            sh.vfs
                .sync_dir(&sh.dir)
                .map_err(|e| StoreError::io("fsync directory", &sh.dir, &e))?;
        }
        let mut st = lock(&sh.state);
        let mut block = Block::new(base_seq, path, file.clone(), BLOCK_HEADER_LEN as u64);
        block.reserved_bytes = reserved_bytes;
        st.blocks.push_back(block);
        self.active_file = file;
        self.active_reserved = true;
        self.active_len = BLOCK_HEADER_LEN as u64;
        self.synced_len = self.active_len;
        self.file_dirty = false;
        let n = st.blocks.len();
        st.evict(n - 1);
        Ok(())
    }

    /// Writes the turn's bytes, syncs per policy, unlinks emptied blocks, publishes.
    /// `buf` is the turn's inbox, which the staged run indexes.
    pub(super) fn commit(&mut self, buf: &[u8], force_sync: bool) -> Result<()> {
        let sh = self.sh.clone();
        // Decided before the write: the first write into a block reserves it.
        let pipeline = !force_sync && self.may_pipeline();
        if !pipeline {
            self.settle_all()?;
        }
        let reserved_bytes = self.write_staged(buf)?;
        // Only error messages need the path: look it up then, not on every commit.
        let active_path = || lock(&sh.state).active().path.clone();
        let sync_now = match sh.config.sync {
            SyncPolicy::Always => true,
            SyncPolicy::Interval(_) => force_sync,
            SyncPolicy::Never => false,
        };
        if pipeline && self.commit_pipelined(sync_now)? {
            return Ok(());
        }
        if sync_now && self.file_dirty {
            if Injected::of(&sh).ack_before_fsync {
                self.publish_unsynced();
            }
            sh.counters.syncs.fetch_add(1, Ordering::Relaxed);
            let sync_started = Instant::now();
            let synced = self.active_file.sync_data();
            let sync_us = u64::try_from(sync_started.elapsed().as_micros()).unwrap_or(u64::MAX);
            sh.counters.fsync_us.observe(sync_us);
            if let Err(e) = synced {
                self.sync_failed = true;
                return Err(StoreError::io("fdatasync", active_path(), &e));
            }
            self.file_dirty = false;
            self.synced_len = self.active_len;
            self.last_sync_ns = sh.vfs.monotonic_ns();
        }
        let all_durable = sync_now || sh.config.sync == SyncPolicy::Never;
        if all_durable {
            self.synced_seq = self.written_seq;
        }
        if !self.unlink.is_empty() {
            self.remove_blocks()?;
        }
        {
            let mut st = lock(&sh.state);
            st.active().len = self.active_len;
            let applied = self.inbox_applied - self.inbox_accounted;
            self.inbox_accounted = self.inbox_applied;
            sh.unwritten_bytes
                .fetch_sub(applied as u64, Ordering::Relaxed);
            if let Some(r) = reserved_bytes {
                let act = st.active();
                act.reserved_bytes = act.reserved_bytes.max(r);
            }
            st.visible_seq = st.visible_seq.max(self.synced_seq);
            if all_durable {
                // Every delete marker written so far is durable now.
                st.unsynced_deletes.clear();
            }
        }
        sh.publish_durable(self.synced_seq);
        sh.written_seq.fetch_max(self.written_seq, Ordering::SeqCst);
        if all_durable {
            // Not before: a removal's reply promises its marker is durable.
            for (tx, removed) in self.replies.drain(..) {
                let _ = tx.try_send(Ok(removed));
            }
        }
        Ok(())
    }

    /// Writes the turn's staged bytes at the end of the active block (reserving the block
    /// first, once); returns what the reservation made the block, if it ran.
    fn write_staged(&mut self, buf: &[u8]) -> Result<Option<u64>> {
        let sh = self.sh.clone();
        // Only error messages need the path: look it up then, not on every commit.
        let active_path = || lock(&sh.state).active().path.clone();
        let run = self.staged_run.take();
        let data: &[u8] = match &run {
            Some(run) => &buf[run.clone()],
            None => &self.out,
        };
        let mut reserved_bytes = None;
        if !data.is_empty() && !self.active_reserved {
            // Once per block: the size change is durable with this commit's sync.
            self.active_reserved = true;
            let path = active_path();
            reserved_bytes = Some(crate::recovery::preallocate(
                &*self.active_file,
                &path,
                sh.config.block_size_bytes,
            ));
        }
        if !data.is_empty() {
            let len = data.len();
            let res = self.active_file.write_all_at(data, self.active_len);
            self.out.clear();
            res.map_err(|e| StoreError::io("write", active_path(), &e))?;
            self.active_len += len as u64;
            let c = &sh.counters;
            c.writes.fetch_add(1, Ordering::Relaxed);
            c.bytes_written.fetch_add(len as u64, Ordering::Relaxed);
            self.file_dirty = true;
        }
        Ok(reserved_bytes)
    }

    pub(super) fn final_sync(&mut self) {
        if self.failed || self.written_seq <= self.synced_seq {
            return;
        }
        if let Err(e) = self.commit(&[], true) {
            self.fail(e);
        }
    }
}
