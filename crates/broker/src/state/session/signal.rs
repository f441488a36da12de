//! [`Signal`]: a wake-up for one task that can be polled without a future of its own.
//!
//! The connection task waits for several things at once (its socket, its outbound queue, a
//! kick). A `tokio::sync::Notify` is waited for through a `Notified` future that must live in
//! the task's state across the wait: every idle connection would keep one per reason. A
//! `Signal` keeps the waker on its own side instead, so waiting costs the task nothing.
//!
//! # Invariants
//! - A [`Signal::notify`] after the last [`Signal::poll`] that returned `Ready` makes the next
//!   `poll` return `Ready` (nothing is lost between a poll and the waker's registration).
//! - Only one task polls a signal (the last waker registered is the one woken).

use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};

use parking_lot::Mutex;

#[derive(Debug, Default)]
pub(crate) struct Signal {
    set: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

impl Signal {
    /// Sets the signal and wakes the task that polled it. A signal already set is not woken
    /// again: the hot path (a delivery to a subscriber with deliveries pending) is one atomic.
    pub(crate) fn notify(&self) {
        if !self.set.swap(true, Ordering::AcqRel) {
            let waker = self.waker.lock().take();
            if let Some(waker) = waker {
                waker.wake();
            }
        }
    }

    /// `Ready` (and cleared) if set since the last `Ready`; else registers `cx`'s waker.
    pub(crate) fn poll(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.set.swap(false, Ordering::AcqRel) {
            return Poll::Ready(());
        }
        {
            let mut waker = self.waker.lock();
            match &mut *waker {
                Some(old) if old.will_wake(cx.waker()) => {}
                slot => *slot = Some(cx.waker().clone()),
            }
        }
        // A notify between the check and the registration found no waker: look again.
        if self.set.swap(false, Ordering::AcqRel) {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;
    use std::sync::Arc;

    use super::*;

    #[tokio::test]
    async fn a_notify_before_the_poll_is_kept() {
        let signal = Signal::default();
        signal.notify();
        signal.notify();
        poll_fn(|cx| signal.poll(cx)).await;
        // Both notifies were consumed by that one poll.
        let pending = poll_fn(|cx| Poll::Ready(signal.poll(cx))).await;
        assert!(pending.is_pending());
    }

    #[tokio::test]
    async fn a_notify_wakes_the_waiting_task() {
        let signal = Arc::new(Signal::default());
        let waiter = tokio::spawn({
            let signal = signal.clone();
            async move { poll_fn(|cx| signal.poll(cx)).await }
        });
        tokio::task::yield_now().await;
        signal.notify();
        waiter.await.unwrap();
    }
}
