//! Deferred writer wakes: group commit for a caller that appends several records in a row.
//!
//! An append wakes an idle writer at once. A caller that appends a run of records (a broker
//! handling every PUBLISH of one socket read) then splits its group commit: the writer takes
//! the first record alone, and every other one waits for that `fdatasync` and then its own
//! (seen in session 5: the first QoS 2 PUBLISH of each read got a sync to itself, the rest
//! waited for a second). While a [`DeferWakes`] guard of the stream lives, appends leave the
//! writer asleep; dropping the last guard wakes it for everything queued meanwhile.
//!
//! Nothing waits longer than the guard's scope: the guard cannot be sent to another thread
//! (so a task cannot hold it across an `.await`), ops (flush, removals) and appenders that
//! find the queue full wake the writer themselves, and a blocking `Ticket::wait` wakes it
//! before it sleeps, so a thread that waits while holding a guard does not wait on itself.
//! With stepped writers (a simulator) there is no thread to wake and the guard does nothing.
//!
//! # Invariants
//! - `Queue::deferring` is the number of live guards of the stream.
//! - `Queue::wake_deferred` is set only while a guard lives, by an append that found the
//!   writer asleep (or busy) and did not wake it; the last guard's drop clears it and wakes
//!   the writer if it sleeps.

use std::marker::PhantomData;
use std::sync::Arc;

use crate::shared::{Shared, lock};

/// While it lives, appends to its stream do not wake the stream's writer (see the module doc).
#[must_use = "dropping the guard at once defers nothing"]
pub struct DeferWakes {
    sh: Arc<Shared>,
    /// Not `Send`: held across an `.await` it would keep the writer asleep.
    _not_send: PhantomData<*const ()>,
}

impl DeferWakes {
    pub(crate) fn new(sh: Arc<Shared>) -> Self {
        lock(&sh.queue).deferring += 1;
        DeferWakes {
            sh,
            _not_send: PhantomData,
        }
    }
}

impl Drop for DeferWakes {
    fn drop(&mut self) {
        let mut q = lock(&self.sh.queue);
        q.deferring -= 1;
        if q.deferring == 0 && q.wake_deferred {
            q.wake_deferred = false;
            q.wake_writer(&self.sh.writer_cv);
        }
    }
}
