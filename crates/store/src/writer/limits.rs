//! The writer's limits and removals: what `Discard::New` refuses, trimming per topic and per
//! stream (never below the retention floor), removal ops, and moving emptied blocks to
//! `trash/` at a cost per block.

use super::*;

impl Writer {
    /// The limit a group would break under `Discard::New`, if any.
    pub(super) fn rejects(&self, st: &State, group: &[u8], n: u64) -> Option<&'static str> {
        let l = &self.sh.config.limits;
        if l.discard != Discard::New {
            return None;
        }
        if l.max_msgs.is_some_and(|m| st.live + n > m) {
            return Some("max_msgs");
        }
        if l.max_bytes
            .is_some_and(|m| st.live_bytes + group.len() as u64 > m)
        {
            return Some("max_bytes");
        }
        if l.max_msgs_per_topic.is_some() {
            let mut o = 0;
            let mut seen: Vec<&[u8]> = Vec::new();
            while o < group.len() {
                let r = parse(group, o);
                let Some(m) = l.per_topic_max(r.topic) else {
                    o += r.len;
                    continue;
                };
                let before = st.topics.get(r.topic).map_or(0, |s| s.count);
                let in_group = seen.iter().filter(|t| **t == r.topic).count() as u64;
                if before + in_group + 1 > m {
                    return Some("max_msgs_per_topic");
                }
                seen.push(r.topic);
                o += r.len;
            }
        }
        None
    }

    /// The retention floor: limits never remove a record at or above it.
    pub(super) fn pin(&self) -> u64 {
        self.sh.retention_floor.load(Ordering::SeqCst)
    }

    pub(super) fn trim_topic(&mut self, st: &mut State, topic: &[u8], max: u64) -> Result<()> {
        let pin = self.pin();
        loop {
            let oldest = match st.topics.get(topic) {
                Some(s) if s.count > max => s.seqs.front().copied().filter(|&s| s < pin),
                _ => None,
            };
            let Some(seq) = oldest else { break };
            if st.delete_seq(seq)?.is_none() {
                break;
            }
            self.pending_deletes.push(seq);
            self.auto_deleted.push(seq);
        }
        Ok(())
    }

    pub(super) fn trim_stream(&mut self, st: &mut State) -> Result<()> {
        let l = &self.sh.config.limits;
        let (max_msgs, max_bytes) = (
            l.max_msgs.unwrap_or(u64::MAX),
            l.max_bytes.unwrap_or(u64::MAX),
        );
        let pin = self.pin();
        while st.live > max_msgs || st.live_bytes > max_bytes {
            let Some((seq, _)) = st.delete_first_live(pin)? else {
                break;
            };
            self.pending_deletes.push(seq);
            self.auto_deleted.push(seq);
        }
        Ok(())
    }

    /// Applies every discard-old limit to what is already stored (after open).
    pub(super) fn enforce_limits(&mut self, st: &mut State) -> Result<()> {
        let l = self.sh.config.limits.clone();
        if l.discard != Discard::Old {
            return Ok(());
        }
        if let Some(max) = l.max_msgs_per_topic {
            let over: Vec<bytes::Bytes> = st
                .topics
                .iter()
                .filter(|(t, s)| s.count > max && l.per_topic_max(t).is_some())
                .map(|(t, _)| t.clone())
                .collect();
            for t in over {
                self.trim_topic(st, &t, max)?;
            }
        }
        self.trim_stream(st)
    }

    pub(super) fn run_op(&mut self, st: &mut State, op: Op) -> Result<Removed> {
        match op {
            // Handled by `apply` (`Snapshot` after the turn's commit).
            Op::Flush | Op::Snapshot { .. } => Ok(Removed::default()),
            Op::RewriteMarkers { ranges } => {
                self.pending_ranges.extend(ranges);
                Ok(Removed::default())
            }
            // Handled by `apply`, which rolls outside the state lock.
            Op::Seal => Ok(Removed::default()),
            Op::Expire { now_ns } => {
                let Some(age) = self.sh.config.limits.max_age else {
                    return Ok(Removed::default());
                };
                let cutoff = now_ns.saturating_sub(age.as_nanos() as u64);
                let pin = self.pin();
                self.remove_prefix(st, |e| e.time_ns < cutoff && e.seq < pin)
            }
            Op::RemoveBelow { floor } => self.remove_prefix(st, |e| e.seq < floor),
            Op::RemoveBlocksBelow { floor } => {
                let n = st.sealed_blocks_below(floor);
                let (gone, removed) = st.remove_front_blocks(n);
                self.unlink.extend(gone);
                Ok(removed)
            }
            Op::Purge { filters } => {
                let (seqs, bytes) = st.purge(&filters)?;
                Ok(self.deleted(seqs, st, bytes))
            }
            Op::Delete { seqs } => {
                let mut done = Vec::new();
                let mut bytes = 0;
                for s in seqs {
                    if let Some(b) = st.delete_seq(s)? {
                        bytes += b;
                        done.push(s);
                    }
                }
                Ok(self.deleted(done, st, bytes))
            }
            Op::Compact { max_blocks } => {
                // Runs after the turn's commit, outside the state lock (see `compact`).
                self.compact_budget = self.compact_budget.max(max_blocks);
                Ok(Removed::default())
            }
        }
    }

    pub(super) fn deleted(&mut self, seqs: Vec<u64>, _st: &mut State, bytes: u64) -> Removed {
        self.pending_deletes.extend_from_slice(&seqs);
        Removed {
            records: seqs.len() as u64,
            bytes,
            ranges: ranges_of(seqs),
        }
    }

    pub(super) fn remove_prefix(
        &mut self,
        st: &mut State,
        pred: impl Fn(&Entry) -> bool,
    ) -> Result<Removed> {
        let (gone, removed, seqs) = st.remove_prefix(pred)?;
        self.unlink.extend(gone);
        self.pending_deletes.extend(seqs);
        Ok(removed)
    }

    /// Makes the removal of emptied blocks durable at a cost per block, not per byte: each
    /// block file and its index are moved into `trash/` (`Vfs::discard`: a rename on a real
    /// disk, metadata changes; on a replicated disk only the removal is replicated) and the
    /// directory fsynced; freeing the data, which costs the kernel time in proportion to
    /// the file size, is left to the reaper thread (done inline by stepped writers), which
    /// touches nothing but `trash/` (so the stream directory changes only in the writer's
    /// turns). Recovery empties `trash/`.
    /// Blocks go oldest first, and a block holding delete markers only once the removals
    /// before it are durable (one more directory fsync then).
    pub(crate) fn remove_blocks(&mut self) -> Result<()> {
        let sh = self.sh.clone();
        let trash = sh.dir.join(TRASH_DIR);
        sh.vfs
            .create_dir_all(&trash)
            .map_err(|e| StoreError::io("create trash dir", &trash, &e))?;
        let mut reap = Vec::with_capacity(2 * self.unlink.len());
        let mut blocks = std::mem::take(&mut self.unlink);
        blocks.sort_by_key(|b| b.base_seq);
        let mut renamed = false;
        for b in blocks {
            let Some(name) = b.path.file_name() else {
                continue;
            };
            if renamed && !b.markers.is_empty() {
                // Its delete markers may target records of the blocks renamed above (that is
                // what lets it go): those renames must be durable before this one, since a
                // power loss may keep any subset of a directory's unsynced changes.
                sh.vfs
                    .sync_dir(&sh.dir)
                    .map_err(|e| StoreError::io("fsync directory", &sh.dir, &e))?;
            }
            renamed = true;
            let to = trash.join(name);
            match sh.vfs.discard(&b.path, &to) {
                Ok(()) => reap.push(to),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(StoreError::io("rename block to trash", &b.path, &e)),
            }
            // A leftover index without its block is removed on open.
            let ix = b.index_path();
            if let Some(name) = ix.file_name() {
                let to = trash.join(name);
                if sh.vfs.discard(&ix, &to).is_ok() {
                    reap.push(to);
                }
            }
        }
        sh.vfs
            .sync_dir(&sh.dir)
            .map_err(|e| StoreError::io("fsync directory", &sh.dir, &e))?;
        let inline = match &self.reaper {
            Some(reaper) => match reaper.try_send(reap) {
                Ok(()) => Vec::new(),
                // The reaper is behind (or gone): free the space here rather than queue
                // without bound.
                Err(
                    std::sync::mpsc::TrySendError::Full(paths)
                    | std::sync::mpsc::TrySendError::Disconnected(paths),
                ) => paths,
            },
            // Stepped writers: no thread, so the unlinks happen in this turn, in its order.
            None => reap,
        };
        for p in inline {
            let _ = sh.vfs.remove_file(&p);
        }
        Ok(())
    }
}
