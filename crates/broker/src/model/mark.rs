//! A durable mark: how far a log is durable, as one position that only grows, and the tickets
//! waiting for it. This is what "a ticket means durable up to position N" looks like for a store
//! whose writes become durable in log order: a replicated log advances the mark to its commit
//! index (a majority has everything up to it on disk), a local log to its synced sequence, and
//! every ticket at or below the mark completes at once, whichever write it was issued for.
//!
//! # Invariants
//! - The durable position never goes back; once failed, the mark stays failed (a log that lost
//!   a write cannot promise the writes after it: as tern-store refuses every append after an
//!   I/O error until reopened).
//! - A waiter is woken once the mark reaches its position or fails; a waker is kept once per
//!   position and task (`Waker::will_wake`), so repeated polls do not grow the list, and the
//!   waiters are bounded by the tasks polling tickets (one per connection's pipeline front,
//!   plus the broker's own tasks).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use parking_lot::Mutex;

use crate::model::ticket::PersistError;

/// How far a log is durable; see the module doc.
#[derive(Default)]
pub struct DurableMark {
    state: Mutex<MarkState>,
}

#[derive(Default)]
struct MarkState {
    durable: u64,
    failed: Option<PersistError>,
    /// Tasks waiting for a position above `durable`, by position.
    waiters: BTreeMap<u64, Vec<Waker>>,
}

impl DurableMark {
    pub fn new() -> Arc<DurableMark> {
        Arc::new(DurableMark::default())
    }

    /// Everything up to `position` is durable: wakes the tickets at or below it. A position
    /// below the current one changes nothing (a late report of an older commit).
    pub fn advance(&self, position: u64) {
        let woken = {
            let mut state = self.state.lock();
            if position <= state.durable {
                return;
            }
            state.durable = position;
            let later = state.waiters.split_off(&(position + 1));
            std::mem::replace(&mut state.waiters, later)
        };
        // Woken outside the lock: a woken task may poll at once, on another thread.
        woken.into_values().flatten().for_each(Waker::wake);
    }

    /// The log lost a write: every ticket not yet complete fails, and so does every later one.
    pub fn fail(&self, error: PersistError) {
        let woken = {
            let mut state = self.state.lock();
            state.failed.get_or_insert(error);
            std::mem::take(&mut state.waiters)
        };
        woken.into_values().flatten().for_each(Waker::wake);
    }

    /// The durable position.
    pub fn durable(&self) -> u64 {
        self.state.lock().durable
    }

    /// The outcome for `position` if settled; otherwise `cx`'s waker waits for it.
    pub(crate) fn poll_at(
        &self,
        position: u64,
        cx: Option<&mut Context<'_>>,
    ) -> Poll<Result<(), PersistError>> {
        let mut state = self.state.lock();
        if position <= state.durable {
            return Poll::Ready(Ok(()));
        }
        if let Some(error) = &state.failed {
            return Poll::Ready(Err(error.clone()));
        }
        if let Some(cx) = cx {
            let wakers = state.waiters.entry(position).or_default();
            if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
                wakers.push(cx.waker().clone());
            }
        }
        Poll::Pending
    }

    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.state.lock().waiters.values().map(Vec::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ticket::Ticket;

    #[tokio::test]
    async fn a_ticket_completes_once_the_mark_reaches_its_position() {
        let mark = DurableMark::new();
        let mut at3 = Ticket::until(&mark, 3);
        let mut at5 = Ticket::until(&mark, 5);
        let mut at7 = Ticket::until(&mark, 7);
        assert_eq!(at3.try_result(), None);
        mark.advance(5);
        assert_eq!(at3.try_result(), Some(Ok(())));
        assert_eq!(at5.wait().await, Ok(()));
        assert_eq!(at7.try_result(), None, "7 is not durable yet");
        mark.advance(4);
        assert_eq!(mark.durable(), 5, "the mark never goes back");
        let waiter = tokio::spawn(async move { at7.wait().await });
        tokio::task::yield_now().await;
        mark.advance(9);
        assert_eq!(waiter.await.ok(), Some(Ok(())));
        assert_eq!(Ticket::until(&mark, 9).try_result(), Some(Ok(())));
    }

    #[tokio::test]
    async fn a_failed_mark_fails_every_open_and_later_ticket() {
        let mark = DurableMark::new();
        mark.advance(2);
        let mut open = Ticket::until(&mark, 4);
        let waiter = tokio::spawn(async move { open.wait().await });
        tokio::task::yield_now().await;
        mark.fail(PersistError("lost quorum".into()));
        let failed = Err(PersistError("lost quorum".into()));
        assert_eq!(waiter.await.ok(), Some(failed.clone()));
        assert_eq!(Ticket::until(&mark, 8).try_result(), Some(failed));
        assert_eq!(
            Ticket::until(&mark, 2).try_result(),
            Some(Ok(())),
            "was durable"
        );
    }

    #[tokio::test]
    async fn repeated_polls_of_one_task_keep_one_waker_and_two_tasks_both_wake() {
        let mark = DurableMark::new();
        let mut a = Ticket::until(&mark, 1);
        let mut b = Ticket::until(&mark, 1);
        struct Quiet;
        impl std::task::Wake for Quiet {
            fn wake(self: Arc<Self>) {}
        }
        let waker = Waker::from(Arc::new(Quiet));
        let mut cx = Context::from_waker(&waker);
        for _ in 0..3 {
            assert!(a.poll_wait(&mut cx).is_pending());
        }
        assert_eq!(mark.waiting(), 1);
        let other = tokio::spawn(async move { b.wait().await });
        tokio::task::yield_now().await;
        assert_eq!(
            mark.waiting(),
            2,
            "another task's waker is kept beside the first"
        );
        mark.advance(1);
        assert_eq!(other.await.ok(), Some(Ok(())));
        assert_eq!(mark.waiting(), 0);
    }
}
