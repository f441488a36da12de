//! The containers of a session's [`super::Outbound`], allocated only while they hold something.

use std::collections::VecDeque;

use bytes::Bytes;
use tokio::time::Instant;

use super::{Gate, Inflight, Outgoing};

/// The containers of an [`super::Outbound`] that an idle session has no use for.
#[derive(Debug)]
pub struct Queues {
    /// Control packets, each with the value of `pushed_total` when it was queued.
    pub control: VecDeque<(u64, Bytes)>,
    pub queue: VecDeque<Outgoing>,
    pub inflight: VecDeque<Inflight>,
    /// Packets waiting for a store write, in the order they must leave.
    pub(super) gate: Gate,
    /// Since when the queue is over its limits (the slow-subscriber clock); an empty queue
    /// is not.
    pub full_since: Option<Instant>,
}

impl Queues {
    const EMPTY: Queues = Queues {
        control: VecDeque::new(),
        queue: VecDeque::new(),
        inflight: VecDeque::new(),
        gate: Gate::EMPTY,
        full_since: None,
    };

    /// Nothing queued, in flight or held, and no failed gate to report.
    fn is_empty(&self) -> bool {
        self.control.is_empty()
            && self.queue.is_empty()
            && self.inflight.is_empty()
            && self.gate.is_empty()
            && !self.gate.failed()
    }
}

/// What empty queues read as: a session without allocated queues derefs to this.
static NO_QUEUES: Queues = Queues::EMPTY;

/// [`Queues`] behind a pointer that is null while they are empty: an idle session keeps 8
/// bytes instead of ~150 B of empty containers (ARCHITECTURE §6.2). Reading empty queues
/// allocates nothing; the first write allocates them, and [`LazyQueues::release_if_empty`]
/// (the writer going idle, a detach) frees them.
#[derive(Debug, Default)]
pub struct LazyQueues(Option<Box<Queues>>);

impl LazyQueues {
    /// Frees the queues if they hold nothing (their capacity goes with them).
    pub fn release_if_empty(&mut self) {
        if self.0.as_deref().is_some_and(Queues::is_empty) {
            self.0 = None;
        }
    }

    /// The queues, if allocated (changed without allocating them).
    pub fn allocated_mut(&mut self) -> Option<&mut Queues> {
        self.0.as_deref_mut()
    }

    /// The queues are allocated (tests of the release).
    #[cfg(test)]
    pub fn is_allocated(&self) -> bool {
        self.0.is_some()
    }
}

impl std::ops::Deref for LazyQueues {
    type Target = Queues;

    fn deref(&self) -> &Queues {
        self.0.as_deref().unwrap_or(&NO_QUEUES)
    }
}

impl std::ops::DerefMut for LazyQueues {
    fn deref_mut(&mut self) -> &mut Queues {
        self.0.get_or_insert_with(|| Box::new(Queues::EMPTY))
    }
}
