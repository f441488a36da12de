//! Tickets: completion handles for appends, usable from blocking and async code alike.
//!
//! A ticket is two words (a stream pointer and a sequence). Completion is one atomic load of
//! the stream's durable sequence; no allocation per ticket. As a `Future` it registers its
//! `Waker` with the stream, and the writer wakes it after the covering sync (with stepped
//! writers, in the `Store::step` that runs that turn).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::error::StoreError;
use crate::shared::Shared;

/// Completes when the append (or batch) it was returned for is durable under the stream's
/// sync policy. Output: the record's sequence (a batch's last), or the error that stopped it.
#[must_use = "a ticket tells when the record is durable"]
pub struct Ticket {
    shared: Arc<Shared>,
    first_seq: u64,
    seq: u64,
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket")
            .field("first_seq", &self.first_seq)
            .field("seq", &self.seq)
            .finish()
    }
}

impl Ticket {
    pub(crate) fn new(shared: Arc<Shared>, first_seq: u64, seq: u64) -> Self {
        Ticket {
            shared,
            first_seq,
            seq,
        }
    }

    /// The assigned sequence (for a batch: its last record's).
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// First sequence of a batch (equal to `seq()` for a single record).
    pub fn first_seq(&self) -> u64 {
        self.first_seq
    }

    /// Non-blocking: has the append completed (durably or with an error)?
    pub fn is_done(&self) -> bool {
        self.shared.outcome(self.seq, false).is_some()
    }

    /// Non-blocking: the outcome, if complete.
    pub fn try_result(&self) -> Option<Result<u64, StoreError>> {
        self.shared.outcome(self.seq, false)
    }

    /// Blocks the calling thread until the append completes.
    pub fn wait(self) -> Result<u64, StoreError> {
        self.shared.wait(self.seq)
    }
}

impl Future for Ticket {
    type Output = Result<u64, StoreError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Some(r) = self.shared.outcome(self.seq, true) {
            return Poll::Ready(r);
        }
        self.shared.register_waker(self.seq, cx.waker());
        // Re-check after registering: the writer may have completed us in between.
        match self.shared.outcome(self.seq, true) {
            Some(r) => Poll::Ready(r),
            None => Poll::Pending,
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.shared.forget_rejection(self.seq);
    }
}
