//! Tickets: the completion of one issued write. A ticket completes once what it covers is
//! durable (the store's sync policy; in a cluster, committed by a majority), or fails.
//!
//! A ticket means "durable up to position N" of one log: a `tern-store` ticket waits for its
//! stream's synced sequence to reach N, and [`Ticket::until`] for a [`DurableMark`] (a
//! replicated log's commit index, advanced as a majority acknowledges) to reach N.
//!
//! # Invariants
//! - A ticket reports its outcome once it is settled, and the same outcome ever after.
//! - A joined ticket ([`Ticket::join`]) completes when every part has, and fails as soon as one
//!   part fails; a part is dropped once it completed, so none is polled after its completion.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::sync::oneshot;

use crate::model::mark::DurableMark;

/// A write the store could not make durable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("store write failed: {0}")]
pub struct PersistError(pub String);

/// Completion of one issued write: a `tern-store` ticket (no allocation, no channel per
/// message), a channel (test stores), or an outcome known at once.
pub struct Ticket(TicketInner);

enum TicketInner {
    Store(tern_store::Ticket),
    Channel(oneshot::Receiver<Result<(), PersistError>>),
    Ready(Option<Result<(), PersistError>>),
    /// Durable once the mark reaches the position.
    Until(std::sync::Arc<DurableMark>, u64),
    /// Several writes (e.g. a retained PUBLISH: its message and its retained record); done
    /// when all are, failed as soon as one fails. A part is removed once it completed, so no
    /// part is polled after its completion.
    All(Vec<Ticket>),
}

/// The store's side of a channel [`Ticket`].
pub struct TicketCompleter(oneshot::Sender<Result<(), PersistError>>);

impl Ticket {
    /// A ticket completed through its [`TicketCompleter`] (test and wrapper stores).
    pub fn pair() -> (TicketCompleter, Ticket) {
        let (tx, rx) = oneshot::channel();
        (TicketCompleter(tx), Ticket(TicketInner::Channel(rx)))
    }

    /// Completes once `mark` reaches `position` (everything up to it is durable), or fails
    /// when the mark fails.
    pub fn until(mark: &std::sync::Arc<DurableMark>, position: u64) -> Ticket {
        Ticket(TicketInner::Until(mark.clone(), position))
    }

    pub(crate) fn from_store(ticket: tern_store::Ticket) -> Ticket {
        Ticket(TicketInner::Store(ticket))
    }

    /// A write that already failed (e.g. the stream refused it).
    pub(crate) fn failed(error: PersistError) -> Ticket {
        Ticket(TicketInner::Ready(Some(Err(error))))
    }

    /// The ticket of both writes: `None` if neither was issued, else one that completes when
    /// every issued write is durable (or one failed).
    pub(crate) fn join(a: Option<Ticket>, b: Option<Ticket>) -> Option<Ticket> {
        match (a, b) {
            (None, t) | (t, None) => t,
            (Some(Ticket(TicketInner::All(mut parts))), Some(b)) => {
                parts.push(b);
                Some(Ticket(TicketInner::All(parts)))
            }
            (Some(a), Some(b)) => Some(Ticket(TicketInner::All(vec![a, b]))),
        }
    }

    /// True for a write the store refused when it was issued ([`Ticket::failed`]): no record
    /// exists that a later step could wait for.
    pub(crate) fn is_refused(&self) -> bool {
        matches!(self.0, TicketInner::Ready(Some(Err(_))))
    }

    /// Waits for durability. A store that went away counts as a failed write.
    pub async fn wait(&mut self) -> Result<(), PersistError> {
        WaitTicket(self).await
    }

    /// Polls for durability in place (a ticket kept in shared state and awaited by whichever
    /// task currently serves it). Its outcome is reported once.
    pub(crate) fn poll_wait(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), PersistError>> {
        Pin::new(&mut WaitTicket(self)).poll(cx)
    }

    /// `Some` once the write finished (or failed).
    pub(crate) fn try_result(&mut self) -> Option<Result<(), PersistError>> {
        match &mut self.0 {
            TicketInner::Store(t) => t
                .try_result()
                .map(|r| r.map(drop).map_err(|e| PersistError(e.to_string()))),
            TicketInner::Channel(rx) => match rx.try_recv() {
                Ok(result) => Some(result),
                Err(oneshot::error::TryRecvError::Empty) => None,
                Err(oneshot::error::TryRecvError::Closed) => Some(Err(dropped())),
            },
            TicketInner::Ready(r) => Some(r.clone().unwrap_or(Ok(()))),
            TicketInner::Until(mark, position) => match mark.poll_at(*position, None) {
                Poll::Ready(outcome) => Some(outcome),
                Poll::Pending => None,
            },
            TicketInner::All(parts) => {
                let mut failed = None;
                parts.retain_mut(|part| match part.try_result() {
                    Some(Ok(())) => false,
                    Some(Err(error)) => {
                        failed.get_or_insert(error);
                        false
                    }
                    None => true,
                });
                let outcome = match failed {
                    Some(error) => Err(error),
                    None if parts.is_empty() => Ok(()),
                    None => return None,
                };
                // Settled for good: a later call answers the same.
                self.0 = TicketInner::Ready(Some(outcome.clone()));
                Some(outcome)
            }
        }
    }
}

fn dropped() -> PersistError {
    PersistError("store dropped the ticket".into())
}

struct WaitTicket<'a>(&'a mut Ticket);

impl Future for WaitTicket<'_> {
    type Output = Result<(), PersistError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.0.0 {
            TicketInner::Store(t) => Pin::new(t)
                .poll(cx)
                .map(|r| r.map(drop).map_err(|e| PersistError(e.to_string()))),
            TicketInner::Channel(rx) => Pin::new(rx)
                .poll(cx)
                .map(|r| r.unwrap_or_else(|_| Err(dropped()))),
            TicketInner::Ready(r) => Poll::Ready(r.clone().unwrap_or(Ok(()))),
            TicketInner::Until(mark, position) => mark.poll_at(*position, Some(cx)),
            TicketInner::All(parts) => {
                let mut failed = None;
                parts.retain_mut(|part| match Pin::new(&mut WaitTicket(part)).poll(cx) {
                    Poll::Ready(Ok(())) => false,
                    Poll::Ready(Err(error)) => {
                        failed.get_or_insert(error);
                        false
                    }
                    Poll::Pending => true,
                });
                let outcome = match failed {
                    Some(error) => Err(error),
                    None if parts.is_empty() => Ok(()),
                    None => return Poll::Pending,
                };
                self.0.0 = TicketInner::Ready(Some(outcome.clone()));
                Poll::Ready(outcome)
            }
        }
    }
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            TicketInner::Store(t) => write!(f, "Ticket({})", t.seq()),
            TicketInner::Until(_, position) => write!(f, "Ticket(until {position})"),
            TicketInner::All(parts) => f.debug_tuple("Ticket").field(parts).finish(),
            _ => f.write_str("Ticket"),
        }
    }
}

impl TicketCompleter {
    pub fn complete(self, result: Result<(), PersistError>) {
        // The waiter may have gone away with its connection; nothing to tell then.
        let _ = self.0.send(result);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn joined_ticket_completes_when_all_parts_did() {
        assert!(Ticket::join(None, None).is_none());
        let (a_done, a) = Ticket::pair();
        let (b_done, b) = Ticket::pair();
        let (c_done, c) = Ticket::pair();
        let mut t = Ticket::join(Ticket::join(Some(a), Some(b)), Some(c)).unwrap();
        assert!(t.try_result().is_none());
        b_done.complete(Ok(()));
        a_done.complete(Ok(()));
        assert!(t.try_result().is_none(), "c is still out");
        c_done.complete(Ok(()));
        assert_eq!(t.wait().await, Ok(()));
        assert_eq!(t.try_result(), Some(Ok(())), "settled for good");
    }

    #[tokio::test]
    async fn joined_ticket_fails_when_one_part_fails() {
        let (a_done, a) = Ticket::pair();
        let (_b_done, b) = Ticket::pair();
        let mut t = Ticket::join(Some(a), Some(b)).unwrap();
        a_done.complete(Err(PersistError("disk".into())));
        assert_eq!(t.wait().await, Err(PersistError("disk".into())));
        assert_eq!(t.try_result(), Some(Err(PersistError("disk".into()))));
    }
}
