//! Counting live tasks: the connection tasks of the accept loop, and the sockets lingering
//! after a close the broker started (`connection::linger`), so that their number is bounded
//! and a shutdown can wait for them.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;

/// The connection tasks of [`Broker::serve_listeners`] still alive (and, counted apart, the
/// lingering sockets of `connection::linger`).
#[derive(Default)]
pub(crate) struct LiveTasks {
    count: AtomicUsize,
    /// Notified when `count` drops to 0.
    ended: Notify,
}

impl LiveTasks {
    /// How many counted tasks are alive.
    pub(crate) fn alive(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// Resolves once no counted task is alive.
    pub(crate) async fn all_ended(&self) {
        loop {
            let ended = self.ended.notified();
            tokio::pin!(ended);
            // Registered before the check: a task ending in between still wakes this wait.
            ended.as_mut().enable();
            if self.count.load(Ordering::Acquire) == 0 {
                return;
            }
            ended.await;
        }
    }
}

/// Counts one task in [`LiveTasks`] while it lives (dropped with its future: also when the
/// task panics or is aborted).
pub(crate) struct LiveTask(Arc<LiveTasks>);

impl LiveTask {
    pub(crate) fn new(tasks: &Arc<LiveTasks>) -> LiveTask {
        tasks.count.fetch_add(1, Ordering::AcqRel);
        LiveTask(tasks.clone())
    }

    /// Counts one more task unless `limit` are alive.
    pub(crate) fn within(tasks: &Arc<LiveTasks>, limit: usize) -> Option<LiveTask> {
        tasks
            .count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|_| LiveTask(tasks.clone()))
    }
}

impl Drop for LiveTask {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.ended.notify_waiters();
        }
    }
}
