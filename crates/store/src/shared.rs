//! State shared by a stream's handles, its writer (thread, or stepped) and its tickets.
//!
//! # Invariants
//! - Every sequence `<= durable_seq` has completed: it is durable under the sync policy, or
//!   it was rejected by a `Discard::New` limit (then `rejected` holds its error until its
//!   ticket reads or drops it).
//! - `durable_seq` only grows, and only the writer stores it (one turn at a time).
//! - Once `failed` is set it is never cleared; the stream must be reopened.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::Waker;

use crate::config::StreamConfig;
use crate::error::{Result, StoreError};
use crate::histogram::{BATCH_BOUNDS_RECORDS, FSYNC_BOUNDS_US, Histogram};
use crate::queue::Queue;
use crate::queue::Removed;
use crate::state::State;
use crate::vfs::Vfs;
use crate::wakers::WakerSet;

/// What `Shared` needs of a writer whose turns its callers run (stepped writers,
/// `Vfs::stepped_writers`). The writer holds an `Arc<Shared>` and sits above this module, so
/// it is handed down as this trait rather than named here.
pub(crate) trait SteppedWriter: Send {
    /// One turn if there is work, a due timer, or (`force_sync`) written data to sync.
    fn step(&mut self, force_sync: bool) -> bool;
    /// When the next timer fires (`Vfs::monotonic_ns`), if one is armed.
    fn next_timer_ns(&self) -> Option<u64>;
    /// The stream is closing: the rest of the queue written, the last sync, trash freed.
    fn close(self: Box<Self>);
}

/// Locks a mutex, taking the data even if another thread panicked while holding it: every
/// structure behind our mutexes is left consistent between statements that can panic.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Counters a stream keeps for monitoring (all since it was opened).
#[derive(Debug)]
pub(crate) struct Counters {
    /// `fdatasync` of block files, microseconds (the writer records, monitoring reads).
    pub fsync_us: Histogram,
    /// Records per group-commit turn that wrote records.
    pub batch_records: Histogram,
    pub records: AtomicU64,
    pub turns: AtomicU64,
    pub writes: AtomicU64,
    pub syncs: AtomicU64,
    pub bytes_written: AtomicU64,
    pub rolls: AtomicU64,
}

pub(crate) struct Shared {
    pub counters: Counters,
    pub name: String,
    pub dir: PathBuf,
    pub vfs: Arc<dyn Vfs>,
    pub config: StreamConfig,
    pub state: Mutex<State>,
    pub queue: Mutex<Queue>,
    /// The writer waits here for work.
    pub writer_cv: Condvar,
    /// Appenders wait here for queue space.
    pub space_cv: Condvar,
    pub durable_seq: AtomicU64,
    /// Highest sequence the writer has handled: written to the file (synced or not) or
    /// rejected. Only the writer stores it, at the end of a commit.
    pub written_seq: AtomicU64,
    /// Bytes of records appended and not yet written to a block (nor rejected by a limit):
    /// the queue's and those of the writer's turn in progress. Appenders add under the queue
    /// lock; the writer takes them off under the state lock, in the section that grows the
    /// block that now holds them, so `Stream::info` sees each byte in one place or the other.
    pub unwritten_bytes: AtomicU64,
    /// Retention limits never remove a record at or above this sequence (`u64::MAX`: no pin).
    pub retention_floor: AtomicU64,
    pub failed: AtomicBool,
    pub failure: Mutex<Option<String>>,
    /// The wakers of the tasks that polled a pending ticket, by sequence: every task that
    /// polls one record's tickets is kept (`wakers` module; finding 9).
    wakers: Mutex<WakerSet>,
    /// `wakers.len()`, read without the lock by the writer (no lock when nobody polls).
    waker_count: AtomicUsize,
    done_lock: Mutex<()>,
    done_cv: Condvar,
    blocked: AtomicUsize,
    rejected: Mutex<HashMap<u64, StoreError>>,
    rejected_count: AtomicUsize,
    /// Stepped writers (`Vfs::stepped_writers`): the writer lives here instead of on a
    /// thread, from the stream's open until its last handle is dropped (which takes it out,
    /// breaking the cycle through the writer's own `Arc<Shared>`). `None` in production.
    stepper: Option<Mutex<Option<Box<dyn SteppedWriter>>>>,
}

impl Shared {
    pub fn new(
        name: String,
        dir: PathBuf,
        vfs: Arc<dyn Vfs>,
        config: StreamConfig,
        state: State,
        queue: Queue,
        durable_seq: u64,
    ) -> Self {
        let vfs_stepped = vfs.stepped_writers();
        let retention_floor = if config.start_pinned { 0 } else { u64::MAX };
        Shared {
            counters: Counters {
                fsync_us: Histogram::new(FSYNC_BOUNDS_US),
                batch_records: Histogram::new(BATCH_BOUNDS_RECORDS),
                records: AtomicU64::new(0),
                turns: AtomicU64::new(0),
                writes: AtomicU64::new(0),
                syncs: AtomicU64::new(0),
                bytes_written: AtomicU64::new(0),
                rolls: AtomicU64::new(0),
            },
            name,
            dir,
            vfs,
            config,
            state: Mutex::new(state),
            queue: Mutex::new(queue),
            writer_cv: Condvar::new(),
            space_cv: Condvar::new(),
            durable_seq: AtomicU64::new(durable_seq),
            written_seq: AtomicU64::new(durable_seq),
            unwritten_bytes: AtomicU64::new(0),
            retention_floor: AtomicU64::new(retention_floor),
            failed: AtomicBool::new(false),
            failure: Mutex::new(None),
            wakers: Mutex::new(WakerSet::default()),
            waker_count: AtomicUsize::new(0),
            done_lock: Mutex::new(()),
            done_cv: Condvar::new(),
            blocked: AtomicUsize::new(0),
            rejected: Mutex::new(HashMap::new()),
            rejected_count: AtomicUsize::new(0),
            stepper: vfs_stepped.then(|| Mutex::new(None)),
        }
    }

    pub fn failed_error(&self) -> StoreError {
        StoreError::Failed {
            stream: self.name.clone(),
            cause: lock(&self.failure)
                .clone()
                .unwrap_or_else(|| "unknown".into()),
        }
    }

    /// Marks the stream failed and wakes everyone waiting on a ticket.
    pub fn fail(&self, cause: String) {
        tracing::error!(stream = %self.name, %cause, "stream refuses writes until reopened");
        {
            let mut f = lock(&self.failure);
            if f.is_none() {
                *f = Some(cause);
            }
        }
        self.failed.store(true, Ordering::SeqCst);
        self.wake_all();
        self.space_cv.notify_all();
    }

    /// Answers every op still queued with the stream's failure. For a writer thread that
    /// died (it panicked): nobody else would take them, and their callers wait for the reply.
    /// `Stream::op` checks the failure under the queue lock before it queues, so no op is
    /// queued after this runs on a failed stream.
    pub fn answer_queued_ops(&self) {
        debug_assert!(self.failed.load(Ordering::SeqCst));
        let ops = std::mem::take(&mut lock(&self.queue).ops);
        for (_, queued) in ops {
            let _ = queued.reply.try_send(Err(self.failed_error()));
        }
    }

    /// Completion state of `seq`: `None` while pending.
    pub fn outcome(&self, seq: u64, consume: bool) -> Option<Result<u64, StoreError>> {
        if self.durable_seq.load(Ordering::SeqCst) >= seq {
            if self.rejected_count.load(Ordering::SeqCst) > 0 {
                let mut r = lock(&self.rejected);
                let hit = if consume {
                    r.remove(&seq)
                } else {
                    r.get(&seq).cloned()
                };
                if let Some(e) = hit {
                    if consume {
                        self.rejected_count.fetch_sub(1, Ordering::SeqCst);
                    }
                    return Some(Err(e));
                }
            }
            return Some(Ok(seq));
        }
        if self.failed.load(Ordering::SeqCst) {
            return Some(Err(self.failed_error()));
        }
        None
    }

    pub fn forget_rejection(&self, seq: u64) {
        if self.rejected_count.load(Ordering::SeqCst) > 0
            && lock(&self.rejected).remove(&seq).is_some()
        {
            self.rejected_count.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Called by the writer before it publishes `durable_seq` past `seq`.
    pub fn reject(&self, seq: u64, err: StoreError) {
        lock(&self.rejected).insert(seq, err);
        self.rejected_count.fetch_add(1, Ordering::SeqCst);
    }

    /// Keeps `waker` to be woken when `seq` completes, beside the wakers of any other task
    /// waiting on it. At the bound (`MAX_WAKERS_PER_STREAM`) every waker held is woken at
    /// once: their tasks poll again, and re-register if still pending.
    pub fn register_waker(&self, seq: u64, waker: &Waker) {
        let evicted = {
            let mut w = lock(&self.wakers);
            let evicted = w.register(seq, waker);
            self.waker_count.store(w.len(), Ordering::SeqCst);
            evicted
        };
        if let Some(early) = evicted {
            early.wake();
        }
    }

    /// Publishes a new durable sequence and wakes the tickets it completes.
    pub fn publish_durable(&self, seq: u64) {
        self.durable_seq.fetch_max(seq, Ordering::SeqCst);
        if self.waker_count.load(Ordering::SeqCst) > 0 {
            let ready = {
                let mut w = lock(&self.wakers);
                let ready = w.take_through(seq);
                self.waker_count.store(w.len(), Ordering::SeqCst);
                ready
            };
            ready.wake();
        }
        if self.blocked.load(Ordering::SeqCst) > 0 {
            let _g = lock(&self.done_lock);
            self.done_cv.notify_all();
        }
    }

    fn wake_all(&self) {
        let all = {
            let mut w = lock(&self.wakers);
            self.waker_count.store(0, Ordering::SeqCst);
            std::mem::take(&mut *w)
        };
        all.wake();
        let _g = lock(&self.done_lock);
        self.done_cv.notify_all();
    }

    /// Blocks until `seq` completes. With stepped writers it runs writer turns on this
    /// thread instead of sleeping, syncing at once what would wait for an interval timer.
    pub fn wait(&self, seq: u64) -> Result<u64, StoreError> {
        if let Some(r) = self.outcome(seq, true) {
            return r;
        }
        if self.stepper.is_some() {
            return self.drive_until(|| self.outcome(seq, true), seq)?;
        }
        // This thread may hold a `DeferWakes` guard of the stream: not a wait on itself.
        lock(&self.queue).wake_if_deferred(&self.writer_cv);
        self.blocked.fetch_add(1, Ordering::SeqCst);
        let mut g = lock(&self.done_lock);
        let r = loop {
            if let Some(r) = self.outcome(seq, true) {
                break r;
            }
            g = self.done_cv.wait(g).unwrap_or_else(|e| e.into_inner());
        };
        drop(g);
        self.blocked.fetch_sub(1, Ordering::SeqCst);
        r
    }

    /// Whether this stream's writer is stepped by its callers rather than a thread.
    pub fn is_stepped(&self) -> bool {
        self.stepper.is_some()
    }

    /// Stepped writers: hands the stream's writer over (at open).
    pub fn install_stepper(&self, w: Box<dyn SteppedWriter>) {
        if let Some(m) = &self.stepper {
            *lock(m) = Some(w);
        }
    }

    /// Stepped writers: takes the writer out (the last handle is going).
    pub fn take_stepper(&self) -> Option<Box<dyn SteppedWriter>> {
        self.stepper.as_ref().and_then(|m| lock(m).take())
    }

    /// Stepped writers: one writer turn on this thread, if there is work, a due timer, or
    /// (`force_sync`) written data to sync. False without a stepped writer, or once closed.
    pub fn step(&self, force_sync: bool) -> bool {
        let Some(m) = &self.stepper else { return false };
        lock(m).as_mut().is_some_and(|w| w.step(force_sync))
    }

    /// Stepped writers: when the next timer of this stream fires (`Vfs::monotonic_ns`).
    pub fn next_timer_ns(&self) -> Option<u64> {
        let m = self.stepper.as_ref()?;
        lock(m).as_ref().and_then(|w| w.next_timer_ns())
    }

    /// Waits for the writer's reply to an op (with stepped writers, running turns on this
    /// thread until it comes; `waits_for` names the op's place in the stream for errors).
    pub fn reply(&self, rx: &Receiver<Result<Removed>>, waits_for: u64) -> Result<Removed> {
        if self.stepper.is_none() {
            return rx
                .recv()
                .map_err(|_| StoreError::Closed(self.name.clone()))?;
        }
        self.drive_until(
            || match rx.try_recv() {
                Ok(r) => Some(r),
                Err(TryRecvError::Empty) => None,
                Err(TryRecvError::Disconnected) => Some(Err(StoreError::Closed(self.name.clone()))),
            },
            waits_for,
        )?
    }

    /// Stepped writers: runs turns on this thread until `done` answers. A turn is forced to
    /// sync when nothing else is left (what waits for an interval sync, whose timer only a
    /// simulator's clock can move). Fails with `Stalled` when no turn can help (`seq`, for
    /// the error, is what the caller waits for), `Closed` once the writer is gone.
    pub fn drive_until<T>(
        &self,
        mut done: impl FnMut() -> Option<T>,
        seq: u64,
    ) -> Result<T, StoreError> {
        loop {
            if let Some(r) = done() {
                return Ok(r);
            }
            if self.step(false) || self.step(true) {
                continue;
            }
            if let Some(r) = done() {
                return Ok(r);
            }
            if self.stepper.as_ref().is_some_and(|m| lock(m).is_none()) {
                return Err(StoreError::Closed(self.name.clone()));
            }
            return Err(StoreError::Stalled {
                stream: self.name.clone(),
                seq,
            });
        }
    }
}
