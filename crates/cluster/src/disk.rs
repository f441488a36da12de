//! The replicated disk: the [`Vfs`] the leader's broker opens its store on. Every change to
//! the store's files is made locally (in the leader's working copy, `live/`) and recorded, in
//! the order it was made; an `fsync` of a file or directory proposes everything recorded so
//! far through consensus and returns once a majority has committed it. So the store's own
//! rule, "a ticket completes after the fsync", becomes "after a majority has it on disk",
//! with no change to the store or the broker (ARCHITECTURE §8).
//!
//! # Invariants
//! - Operations are recorded under the same lock as the local change they describe, so the
//!   recorded order is the order the changes were made in (two writer threads cannot swap).
//! - `committed <= recorded`, both only grow; a sync returns `Ok` only once `committed`
//!   covers every operation recorded before the sync began.
//! - Once failed (a proposal failed, leadership was lost, or the engine stopped), the disk
//!   stays failed: no later operation is made or proposed, so the log never holds a later
//!   change without an earlier one (a gap that replicas could not recover from).
//! - The local copy is never fsynced: it is thrown away whenever this node stops leading,
//!   and the next leader starts from its replica, which holds exactly what was committed.

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use bytes::Bytes;
use tern_raft::{Consensus, Proposal, Role};
use tern_store::vfs::{RealVfs, SyncDone, VFile, Vfs};

use crate::limits::DiskLimits;
pub use crate::limits::{DiskStats, MAX_PENDING_BYTES, MAX_PROPOSALS_IN_FLIGHT};
use crate::ops::{Op, RelPath, for_each_nonzero_chunk};

/// Largest piece one write is recorded as (bigger writes are split): a proposal must fit
/// tern-raft's `MAX_PROPOSAL_BYTES`.
pub const MAX_WRITE_PIECE_BYTES: usize = 1 << 20;
/// Most bytes of operations in one proposal.
pub const MAX_BATCH_BYTES: usize = tern_raft::types::MAX_PROPOSAL_BYTES / 2;
const _: () = assert!(MAX_WRITE_PIECE_BYTES * 2 <= MAX_BATCH_BYTES);
/// Most operations in one proposal.
pub const MAX_BATCH_OPS: usize = 16_384;
const _: () = assert!(MAX_BATCH_OPS <= tern_raft::types::MAX_BATCH_OPS);

/// An operation waiting to be proposed; a write's data grows while later writes continue it.
enum PendingOp {
    Write {
        path: RelPath,
        offset: u64,
        data: Vec<u8>,
    },
    Other(Op),
}

impl PendingOp {
    /// What a pending write counts beyond its data.
    const HEADER_BYTES: usize = 64;

    fn size_bytes(&self) -> usize {
        match self {
            PendingOp::Write { data, .. } => Self::HEADER_BYTES + data.len(),
            PendingOp::Other(op) => op.size_bytes(),
        }
    }

    fn into_op(self) -> Op {
        match self {
            PendingOp::Write { path, offset, data } => Op::Write {
                path,
                offset,
                data: Bytes::from(data),
            },
            PendingOp::Other(op) => op,
        }
    }
}

#[derive(Default)]
struct State {
    /// Recorded, not yet taken by the proposer; each with the `recorded` count it covers.
    pending: VecDeque<(PendingOp, u64)>,
    pending_bytes: usize,
    /// Operations recorded since the disk opened.
    recorded: u64,
    /// Recorded operations a committed proposal covers.
    committed: u64,
    /// Proposals submitted (or about to be: the proposer holds a slot) and not committed.
    in_flight: usize,
    stats: DiskStats,
    failed: Option<String>,
    /// Started syncs (`VFile::start_sync`) to tell once the count they cover is committed.
    sync_done: Vec<(u64, SyncDone)>,
}

/// The started syncs now done (all of them once failed), to call without the lock.
fn take_done(st: &mut State) -> Vec<SyncDone> {
    if st.sync_done.is_empty() {
        return Vec::new(); // most commits: nobody started a sync (no allocation)
    }
    let (committed, failed) = (st.committed, st.failed.is_some());
    let (done, waiting) = std::mem::take(&mut st.sync_done)
        .into_iter()
        .partition(|(target, _)| failed || *target <= committed);
    st.sync_done = waiting;
    done.into_iter().map(|(_, d)| d).collect()
}

struct Inner {
    root: PathBuf,
    limits: DiskLimits,
    state: Mutex<State>,
    /// Signalled when `committed` moves (a proposal's slot frees up), room frees up, or the
    /// disk fails.
    progress: Condvar,
    /// Signalled when there is something to propose, or the disk fails.
    work: Condvar,
    /// The proposer thread, until [`ReplicatedDisk::join_proposer`] takes it.
    proposer: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Becomes `true` when the disk fails: the committer stops waiting for commits then.
    failed_tx: tokio::sync::watch::Sender<bool>,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Records `op` as it is (a rename's copy, a create, a length...).
fn push(st: &mut State, op: PendingOp) {
    st.recorded += 1;
    st.pending_bytes += op.size_bytes();
    let recorded = st.recorded;
    st.pending.push_back((op, recorded));
}

/// Records a write of `data` at `offset`, merged into the last operation when that is a
/// write it continues: a stream appends records one after another, and one operation per
/// record would cost a header each. The bytes are copied once, into the pending write.
fn push_write(st: &mut State, path: &RelPath, offset: u64, data: &[u8]) {
    st.recorded += 1;
    let recorded = st.recorded;
    st.pending_bytes += data.len();
    if let Some((
        PendingOp::Write {
            path: p,
            offset: o,
            data: d,
        },
        upto,
    )) = st.pending.back_mut()
        && p == path
        && *o + d.len() as u64 == offset
        && d.len() + data.len() <= MAX_WRITE_PIECE_BYTES
    {
        d.extend_from_slice(data);
        *upto = recorded;
        return;
    }
    st.pending_bytes += PendingOp::HEADER_BYTES;
    let op = PendingOp::Write {
        path: path.clone(),
        offset,
        data: data.to_vec(),
    };
    st.pending.push_back((op, recorded));
}

fn failed_error(reason: &str) -> io::Error {
    io::Error::other(format!("replicated disk failed: {reason}"))
}

impl Inner {
    fn rel(&self, path: &Path) -> io::Result<RelPath> {
        RelPath::under(&self.root, path).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is outside the replicated root", path.display()),
            )
        })
    }

    /// Makes a change locally with `change` and records `op` for it, in one step under the
    /// lock; waits first for room among the pending operations.
    fn change<T>(&self, op: PendingOp, change: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        self.change_then(|| change().map(|out| (out, vec![op])))
    }

    /// The state, once there is room among the pending operations (back-pressure on the
    /// writers while proposals lag); an error once the disk has failed.
    fn room(&self) -> io::Result<MutexGuard<'_, State>> {
        let mut st = lock(&self.state);
        let mut waited = false;
        loop {
            if let Some(reason) = &st.failed {
                return Err(failed_error(reason));
            }
            if st.pending_bytes < self.limits.pending_bytes {
                return Ok(st);
            }
            if !waited {
                st.stats.writer_waits += 1;
                waited = true;
            }
            st = self.progress.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// [`Inner::change`] for a change whose operations are known only once it is made.
    fn change_then<T>(
        &self,
        change: impl FnOnce() -> io::Result<(T, Vec<PendingOp>)>,
    ) -> io::Result<T> {
        let mut st = self.room()?;
        let (out, ops) = change()?;
        for op in ops {
            push(&mut st, op);
        }
        drop(st);
        self.work.notify_one();
        Ok(out)
    }

    /// The operations that make `to` a copy of the file now at `path` (the local rename or
    /// link already made): a create, its non-zero chunks, its length.
    fn copy_ops(&self, path: &Path, to: &RelPath) -> io::Result<Vec<PendingOp>> {
        let file = RealVfs.open_rw(path, false)?;
        let len = file.file_len()?;
        let mut ops = vec![PendingOp::Other(Op::Create(to.clone()))];
        let read = |buf: &mut [u8], at| file.read_exact_at(buf, at);
        for_each_nonzero_chunk(len, MAX_WRITE_PIECE_BYTES, read, |at, bytes| {
            ops.push(PendingOp::Write {
                path: to.clone(),
                offset: at,
                data: bytes.to_vec(),
            });
            Ok(())
        })?;
        ops.push(PendingOp::Other(Op::SetLen {
            path: to.clone(),
            len,
        }));
        Ok(ops)
    }

    fn write(&self, path: &RelPath, file: &dyn VFile, buf: &[u8], offset: u64) -> io::Result<()> {
        // Large writes are recorded in pieces, each made and recorded together.
        let mut done = 0usize;
        loop {
            let end = (done + MAX_WRITE_PIECE_BYTES).min(buf.len());
            let piece = &buf[done..end];
            let at = offset + done as u64;
            // Made and recorded under one lock, as every change.
            let mut st = self.room()?;
            file.write_all_at(piece, at)?;
            push_write(&mut st, path, at, piece);
            drop(st);
            self.work.notify_one();
            done = end;
            if done >= buf.len() {
                return Ok(());
            }
        }
    }

    /// Returns once every operation recorded before the call is committed.
    fn sync(&self) -> io::Result<()> {
        let target = lock(&self.state).recorded;
        self.wait_committed(target)
    }

    /// Returns once the first `target` recorded operations are committed, or the disk failed
    /// (then never `Ok`: a failed disk commits nothing more).
    fn wait_committed(&self, target: u64) -> io::Result<()> {
        let mut st = lock(&self.state);
        loop {
            if st.committed >= target {
                return Ok(());
            }
            if let Some(reason) = &st.failed {
                return Err(failed_error(reason));
            }
            st = self.progress.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn fail(&self, reason: &str) {
        let mut st = lock(&self.state);
        if st.failed.is_none() {
            st.failed = Some(reason.to_string());
        }
        let done = take_done(&mut st);
        drop(st);
        self.failed_tx.send_replace(true);
        self.progress.notify_all();
        self.work.notify_all();
        done.into_iter().for_each(|d| d());
    }

    /// Waits for operations and takes one proposal's worth: the encoded operations and the
    /// `recorded` count they cover. `None` once failed.
    fn take(&self) -> Option<Result<(Vec<Bytes>, u64), String>> {
        let mut st = lock(&self.state);
        while st.pending.is_empty() && st.failed.is_none() {
            st = self.work.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        if st.failed.is_some() {
            return None;
        }
        let (mut ops, mut bytes, mut upto) = (Vec::new(), 0usize, st.committed);
        while let Some((op, _)) = st.pending.front() {
            let size = op.size_bytes();
            if !ops.is_empty() && (bytes + size > MAX_BATCH_BYTES || ops.len() >= MAX_BATCH_OPS) {
                break;
            }
            let Some((op, covers)) = st.pending.pop_front() else {
                break;
            };
            st.pending_bytes -= size;
            bytes += size;
            upto = covers;
            match op.into_op().encode() {
                Ok(b) => ops.push(b),
                Err(e) => return Some(Err(format!("encoding an operation: {e}"))),
            }
        }
        drop(st);
        // Room was freed for writers waiting on the pending limit.
        self.progress.notify_all();
        Some(Ok((ops, upto)))
    }

    /// Waits until fewer than [`DiskLimits::proposals_in_flight`] proposals are in flight, and
    /// takes a slot for the next one; `false` once failed.
    fn slot(&self) -> bool {
        let mut st = lock(&self.state);
        let mut waited = false;
        while st.in_flight >= self.limits.proposals_in_flight && st.failed.is_none() {
            if !waited {
                st.stats.proposer_waits += 1;
                waited = true;
            }
            st = self.progress.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        if st.failed.is_some() {
            return false;
        }
        st.in_flight += 1;
        true
    }

    /// A proposal covering the operations recorded up to `upto` committed: its slot frees up.
    fn committed(&self, upto: u64) {
        let mut st = lock(&self.state);
        debug_assert!(upto >= st.committed && upto <= st.recorded);
        debug_assert!(st.in_flight > 0 && st.in_flight <= self.limits.proposals_in_flight);
        st.committed = st.committed.max(upto);
        st.in_flight = st.in_flight.saturating_sub(1);
        let done = take_done(&mut st);
        drop(st);
        self.progress.notify_all();
        done.into_iter().for_each(|d| d());
    }

    /// The operations recorded so far, and `done` called once they are committed or the disk
    /// failed (at once if that is so already).
    fn on_committed(&self, done: SyncDone) -> u64 {
        let mut st = lock(&self.state);
        let target = st.recorded;
        if st.committed >= target || st.failed.is_some() {
            drop(st);
            done();
        } else {
            // Bounded: each stream writer keeps at most its few syncs in flight.
            st.sync_done.push((target, done));
        }
        target
    }
}

/// The leader's store disk; see the module documentation. Cheap to clone.
#[derive(Clone)]
pub struct ReplicatedDisk {
    inner: Arc<Inner>,
}

impl fmt::Debug for ReplicatedDisk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplicatedDisk")
            .field("root", &self.inner.root)
            .finish()
    }
}

impl ReplicatedDisk {
    /// A disk over the files below `root`, proposing through `consensus` while this node
    /// leads in `term`. The proposer runs on a thread of its own (writers block in `fsync`
    /// on theirs), driving the proposals on `runtime`.
    pub fn start<C: Consensus + 'static>(
        root: PathBuf,
        consensus: Arc<C>,
        term: u64,
        runtime: tokio::runtime::Handle,
    ) -> io::Result<ReplicatedDisk> {
        ReplicatedDisk::start_limited(root, consensus, term, runtime, DiskLimits::default())
    }

    /// [`ReplicatedDisk::start`] with `limits` instead of the constants.
    pub(crate) fn start_limited<C: Consensus + 'static>(
        root: PathBuf,
        consensus: Arc<C>,
        term: u64,
        runtime: tokio::runtime::Handle,
        limits: DiskLimits,
    ) -> io::Result<ReplicatedDisk> {
        debug_assert!(limits.pending_bytes > 0 && limits.proposals_in_flight > 0);
        let inner = Arc::new(Inner {
            root,
            limits,
            state: Mutex::new(State::default()),
            progress: Condvar::new(),
            work: Condvar::new(),
            proposer: Mutex::new(None),
            failed_tx: tokio::sync::watch::channel(false).0,
        });
        let proposer = inner.clone();
        let thread = std::thread::Builder::new()
            .name("tern-propose".into())
            .spawn(move || propose_loop(&proposer, consensus.as_ref(), term, &runtime))?;
        *inner.proposer.lock().unwrap_or_else(|e| e.into_inner()) = Some(thread);
        Ok(ReplicatedDisk { inner })
    }

    /// Stops the disk for good: later changes and syncs fail, waiting syncs return an error.
    pub fn fail(&self, reason: &str) {
        self.inner.fail(reason);
    }

    /// After [`ReplicatedDisk::fail`]: waits (blocking) until the proposer has stopped, so
    /// that no proposal of this disk can enter the log after this returns (a submission in
    /// progress is waited for; a submitted proposal is already ahead of anything proposed
    /// later, and its commit is not: it may never come). Call it from a blocking thread.
    pub fn join_proposer(&self) {
        debug_assert!(self.failure().is_some(), "join_proposer before fail");
        let thread = self
            .inner
            .proposer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }

    /// How often its limits held the writers and the proposer back.
    pub fn stats(&self) -> DiskStats {
        lock(&self.inner.state).stats
    }

    /// Why the disk failed, if it has.
    pub fn failure(&self) -> Option<String> {
        lock(&self.inner.state).failed.clone()
    }
}

/// The proposer: submits what was recorded, in order, with at most
/// [`DiskLimits::proposals_in_flight`] batches uncommitted (a slot is taken before the batch:
/// each one gathers whatever was recorded while the ones before it were in flight, the group
/// commit of the single node, one level up, pipelined); each only while this node still
/// leads in `term`. The committer, a task on `runtime`, waits for them in order, moves
/// `committed` and frees their slots. (A task, not a thread: a proposal is answered on the
/// runtime, by the Raft state machine's task, and a thread waiting for it was one more thread
/// woken on every commit.)
fn propose_loop<C: Consensus>(
    inner: &Arc<Inner>,
    consensus: &C,
    term: u64,
    runtime: &tokio::runtime::Handle,
) {
    // The loop ends only once the disk failed; this covers a panic (a `block_on` on a
    // runtime that is gone), which would otherwise leave the syncs waiting.
    let _fail_when_done = FailWhenDone(inner.clone(), "the replicated disk's proposer stopped");
    // Never full: a proposal is sent only with a slot, and at most that many are taken.
    let in_flight = inner.limits.proposals_in_flight;
    let (tx, rx) = tokio::sync::mpsc::channel::<(Proposal, u64)>(in_flight);
    // The guard goes into the task's future as an argument, so it fails the disk even if
    // the runtime drops the task before its first poll (seen: a test's runtime dropped right
    // after the first submission left the sync waiting, about 1 run in 8 of the crate's tests
    // in parallel).
    let guard = FailWhenDone(inner.clone(), "the replicated disk's committer stopped");
    let committing = runtime.spawn(commit_loop(guard, inner.clone(), rx));
    while inner.slot()
        && let Some(taken) = inner.take()
    {
        let (ops, upto) = match taken {
            Ok(t) => t,
            Err(reason) => {
                inner.fail(&reason);
                break;
            }
        };
        let status = consensus.status();
        if status.role != Role::Leader || status.term != term {
            inner.fail(&format!("no longer the leader of term {term}"));
            break;
        }
        if lock(&inner.state).failed.is_some() {
            break; // a batch before this one failed: none after it may enter the log
        }
        match runtime.block_on(consensus.submit(ops)) {
            Ok(proposal) => {
                if tx.try_send((proposal, upto)).is_err() {
                    break; // the committer stopped on a failure (the channel has room)
                }
            }
            Err(e) => {
                inner.fail(&format!("proposal failed: {e}"));
                break;
            }
        }
    }
    drop(tx);
    let _ = runtime.block_on(committing);
}

/// Fails the disk (with its reason) when the committer or the proposer ends, however it
/// ends: cancelled with its runtime (a process shutting down, a test's runtime dropped) or
/// panicking, the writers waiting in `sync` would otherwise wait for a commit nobody will
/// tell them of. (Each ends on its own only once the disk has failed, and `fail` keeps the
/// first reason.)
struct FailWhenDone(Arc<Inner>, &'static str);

impl Drop for FailWhenDone {
    fn drop(&mut self) {
        self.0.fail(self.1);
    }
}

async fn commit_loop(
    _fail_when_done: FailWhenDone,
    inner: Arc<Inner>,
    mut rx: tokio::sync::mpsc::Receiver<(Proposal, u64)>,
) {
    let mut failed = inner.failed_tx.subscribe();
    while let Some((proposal, upto)) = rx.recv().await {
        // Once the disk failed nobody waits for a commit (its syncs fail), and the proposal
        // may never commit: a leader cut off from its followers keeps it pending until a new
        // leader's term reaches it. Stopping the engine must not wait for that.
        let outcome = tokio::select! {
            r = proposal => Some(r),
            _ = failed.wait_for(|f| *f) => None,
        };
        match outcome {
            Some(Ok(_)) => inner.committed(upto),
            Some(Err(e)) => return inner.fail(&format!("proposal failed: {e}")),
            None => return,
        }
    }
}

mod vfs;

#[cfg(test)]
#[path = "disk_replica_tests.rs"]
mod replica_tests;
#[cfg(test)]
#[path = "disk_tests.rs"]
mod tests;
