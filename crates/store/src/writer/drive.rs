//! How writer turns are driven. Production: `run`, a thread per stream that sleeps until
//! records, ops or a timer are due and then runs a turn. Stepped writers
//! (`Vfs::stepped_writers`, a simulator's choice): no thread; whoever calls `step` runs one
//! turn on its own thread, so a simulator decides the order of every turn of every stream.
//! Both take work from the queue and run it through the same `turn_from_queue`.
//!
//! Timers (interval syncs, the expiry timer) read `Vfs::monotonic_ns`, so a simulated disk
//! can answer virtual time; with stepped writers a timer is "due" by that clock alone.

use std::sync::MutexGuard;
use std::time::Duration;

use super::*;
use crate::queue::Queue;
use crate::shared::SteppedWriter;

/// How `Shared` runs a stepped writer's turns without naming the writer (it sits below).
impl SteppedWriter for Writer {
    fn step(&mut self, force_sync: bool) -> bool {
        Writer::step(self, force_sync)
    }

    fn next_timer_ns(&self) -> Option<u64> {
        Writer::next_timer_ns(self)
    }

    fn close(self: Box<Self>) {
        Writer::close(*self)
    }
}

/// Fails the stream if a turn panics, so no ticket and no queued op waits forever.
struct FailOnPanic(Arc<Shared>);

impl Drop for FailOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.fail("the writer panicked".into());
            self.0.answer_queued_ops();
        }
    }
}

impl Writer {
    /// The writer thread: turns until the stream is closed and everything queued written.
    pub fn run(mut self) {
        let _guard = FailOnPanic(self.sh.clone());
        self.start();
        let sh = self.sh.clone();
        loop {
            // A sync in flight that is done completes its tickets before anything else.
            self.settle_done();
            let q = self.wait_for_work(&sh);
            if q.is_empty() && !q.closed && self.oldest_sync_done() {
                continue;
            }
            if self.turn_from_queue(q, false) {
                self.finish();
                return;
            }
        }
    }

    /// The first turn, before any queued work: limits may have been lowered since the
    /// stream was last open.
    pub fn start(&mut self) {
        self.turn(0, Vec::new(), vec![Op::Flush], false);
    }

    /// Stepped writers: runs one turn if records or ops are queued, a timer is due, or
    /// `force_sync` asks for a sync of what is written. Returns whether a turn ran.
    pub fn step(&mut self, force_sync: bool) -> bool {
        let _guard = FailOnPanic(self.sh.clone());
        let sh = self.sh.clone();
        let q = lock(&sh.queue);
        let unsynced = self.written_seq > self.synced_seq;
        if q.is_empty() && !(force_sync && unsynced) && !self.timer_due() {
            return false;
        }
        self.turn_from_queue(q, force_sync);
        true
    }

    /// Stepped writers: what the thread does once its stream is closed (the queue is
    /// marked closed first): the rest of the queue written, the last sync, trash freed.
    pub fn close(mut self) {
        let _guard = FailOnPanic(self.sh.clone());
        let sh = self.sh.clone();
        while !self.turn_from_queue(lock(&sh.queue), false) {}
        self.finish();
    }

    /// When the next timer fires (`Vfs::monotonic_ns`), if one is armed: a stepping
    /// simulator advances its clock to it when nothing else is left to do.
    pub fn next_timer_ns(&self) -> Option<u64> {
        let mut at = self.next_expiry_ns;
        if let SyncPolicy::Interval(iv) = self.sh.config.sync {
            if self.written_seq > self.synced_seq {
                let t = self.last_sync_ns.saturating_add(duration_ns(iv));
                at = Some(at.map_or(t, |x| x.min(t)));
            }
        }
        at
    }

    fn timer_due(&self) -> bool {
        // A failed writer refuses everything: its timers have nothing to do.
        !self.failed
            && self
                .next_timer_ns()
                .is_some_and(|at| self.sh.vfs.monotonic_ns() >= at)
    }

    /// Sleeps until something is queued, the stream is closed, a timer is due or the oldest
    /// sync in flight is done.
    fn wait_for_work<'a>(&self, sh: &'a Shared) -> MutexGuard<'a, Queue> {
        let mut q = lock(&sh.queue);
        let mut timed_out = false;
        while q.is_empty() && !q.closed && !timed_out && !self.oldest_sync_done() {
            q.writer_waiting = true;
            match self.next_timer_ns() {
                None => q = sh.writer_cv.wait(q).unwrap_or_else(|e| e.into_inner()),
                Some(at) => {
                    let left_ns = at.saturating_sub(sh.vfs.monotonic_ns());
                    let left = Duration::from_nanos(left_ns).max(Duration::from_micros(100));
                    let (g, t) = sh
                        .writer_cv
                        .wait_timeout(q, left)
                        .unwrap_or_else(|e| e.into_inner());
                    q = g;
                    timed_out = t.timed_out();
                }
            }
            q.writer_waiting = false;
        }
        q
    }

    /// Takes everything queued, adds what the timers ask for and runs it as one turn.
    /// Returns whether the stream is closed and nothing is left queued.
    fn turn_from_queue(&mut self, mut q: MutexGuard<'_, Queue>, force_sync: bool) -> bool {
        std::mem::swap(&mut q.buf, &mut self.inbox);
        let first_seq = q.buf_first_seq;
        q.buf_first_seq = q.next_seq;
        q.records = 0;
        let ops = std::mem::take(&mut q.ops);
        if q.appenders_waiting > 0 {
            self.sh.space_cv.notify_all();
        }
        let closed = q.closed;
        drop(q);
        let timer_ops = self.due_expiry();
        let force = force_sync || self.interval_due();
        self.turn(first_seq, ops, timer_ops, force);
        self.inbox.clear();
        closed && lock(&self.sh.queue).is_empty()
    }

    /// The last sync, and the reaper told to stop once it has freed what it was given.
    fn finish(&mut self) {
        self.final_sync();
        self.reaper = None;
        if let Some(j) = self.reaper_thread.take() {
            let _ = j.join();
        }
    }

    fn interval_due(&self) -> bool {
        match self.sh.config.sync {
            SyncPolicy::Interval(iv) => {
                self.sh.vfs.monotonic_ns().saturating_sub(self.last_sync_ns) >= duration_ns(iv)
            }
            _ => false,
        }
    }

    /// Housekeeping due on the timer: expiry by age, and compaction once deleted records
    /// take more room than live ones.
    fn due_expiry(&mut self) -> Vec<Op> {
        let mut ops = Vec::new();
        let Some(at) = self.next_expiry_ns else {
            return ops;
        };
        let now = self.sh.vfs.monotonic_ns();
        if now < at {
            return ops;
        }
        self.next_expiry_ns = Some(now.saturating_add(duration_ns(self.sh.config.expire_interval)));
        if self.sh.config.limits.max_age.is_some() {
            ops.push(Op::Expire {
                now_ns: self.sh.vfs.now_ns(),
            });
        }
        let st = lock(&self.sh.state);
        if super::compact::garbage_bytes(&st) > st.live_bytes.max(self.sh.config.block_size_bytes) {
            ops.push(Op::Compact {
                max_blocks: AUTO_COMPACT_BLOCKS,
            });
        }
        ops
    }
}
