//! The containers of a session's [`super::Outbound`], allocated only while they hold something.

use std::collections::VecDeque;
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::time::Instant;

use super::{Gate, HeldPacket, Inflight, Outgoing};
use crate::model::Ticket;

/// The containers of an [`super::Outbound`] that an idle session has no use for.
#[derive(Debug)]
pub(crate) struct Queues {
    /// Control packets, each with the value of `pushed_total` when it was queued.
    pub(crate) control: VecDeque<(u64, Bytes)>,
    /// Its sums are kept in [`super::Outbound`] (module invariants): only `outbound` changes it.
    pub(super) queue: VecDeque<Outgoing>,
    pub(super) inflight: VecDeque<Inflight>,
    /// Packets waiting for a store write, in the order they must leave.
    pub(super) gate: Gate,
    /// Since when the queue is over its limits (the slow-subscriber clock); an empty queue
    /// is not.
    pub(crate) full_since: Option<Instant>,
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
/// bytes instead of ~150 B of empty containers (ARCHITECTURE §6.2). Reads (`Deref`: peek,
/// `len`, `is_empty`) and the methods that take (pop, remove, take) never allocate; only the
/// methods that add (`push_*`, [`LazyQueues::mark_full`]) do. There is no `DerefMut`: a
/// mutable access through it allocated empty queues, so every caller had to read first.
/// [`LazyQueues::release_if_empty`] (the writer going idle, a detach) frees them.
#[derive(Debug, Default)]
pub(crate) struct LazyQueues(Option<Box<Queues>>);

impl LazyQueues {
    /// Frees the queues if they hold nothing (their capacity goes with them).
    pub(crate) fn release_if_empty(&mut self) {
        if self.0.as_deref().is_some_and(Queues::is_empty) {
            self.0 = None;
        }
    }

    /// The queues, if allocated, for changes that add nothing (a clear, an edit in place).
    pub(crate) fn allocated_mut(&mut self) -> Option<&mut Queues> {
        self.0.as_deref_mut()
    }

    /// The queues, allocated if they are not: only for adding to them.
    fn for_push(&mut self) -> &mut Queues {
        self.0.get_or_insert_with(|| Box::new(Queues::EMPTY))
    }

    /// The queues are allocated (tests of the release).
    #[cfg(test)]
    pub(crate) fn is_allocated(&self) -> bool {
        self.0.is_some()
    }

    /// Queues a control packet at the back, marked with the deliveries pushed before it.
    pub(crate) fn push_control(&mut self, mark: u64, packet: Bytes) {
        self.for_push().control.push_back((mark, packet));
    }

    /// Queues a control packet ahead of everything.
    pub(crate) fn push_control_first(&mut self, packet: Bytes) {
        self.for_push().control.push_front((0, packet));
    }

    pub(crate) fn push_queued(&mut self, item: Outgoing) {
        self.for_push().queue.push_back(item);
    }

    /// Puts a delivery taken from the front back there.
    pub(crate) fn push_queued_front(&mut self, item: Outgoing) {
        self.for_push().queue.push_front(item);
    }

    pub(crate) fn push_inflight(&mut self, entry: Inflight) {
        self.for_push().inflight.push_back(entry);
    }

    pub(super) fn push_gate(&mut self, ticket: Option<Ticket>, packet: HeldPacket) {
        self.for_push().gate.push(ticket, packet);
    }

    /// Since when the queue is over its limits, from `now` if it was not: set as a push finds
    /// the queue full, so it allocates like one.
    pub(crate) fn mark_full(&mut self, now: Instant) -> Instant {
        *self.for_push().full_since.get_or_insert(now)
    }

    pub(crate) fn pop_control(&mut self) -> Option<(u64, Bytes)> {
        self.0.as_deref_mut()?.control.pop_front()
    }

    pub(crate) fn pop_queued(&mut self) -> Option<Outgoing> {
        self.0.as_deref_mut()?.queue.pop_front()
    }

    pub(super) fn pop_gate_ready(&mut self) -> Option<HeldPacket> {
        self.0.as_deref_mut()?.gate.pop_ready()
    }

    pub(crate) fn remove_queued(&mut self, index: usize) -> Option<Outgoing> {
        self.0.as_deref_mut()?.queue.remove(index)
    }

    pub(crate) fn remove_inflight(&mut self, index: usize) -> Option<Inflight> {
        self.0.as_deref_mut()?.inflight.remove(index)
    }

    /// Every queued delivery, leaving the queue empty (its capacity goes with them).
    pub(crate) fn take_queued(&mut self) -> VecDeque<Outgoing> {
        self.0
            .as_deref_mut()
            .map(|q| std::mem::take(&mut q.queue))
            .unwrap_or_default()
    }

    /// Every in-flight entry, leaving none.
    pub(crate) fn take_inflight(&mut self) -> VecDeque<Inflight> {
        self.0
            .as_deref_mut()
            .map(|q| std::mem::take(&mut q.inflight))
            .unwrap_or_default()
    }

    /// The in-flight entries, oldest first, to change in place.
    pub(crate) fn inflight_mut(&mut self) -> impl DoubleEndedIterator<Item = &mut Inflight> {
        self.0
            .as_deref_mut()
            .into_iter()
            .flat_map(|q| q.inflight.iter_mut())
    }

    /// Removes the held packets `drop_it` picks, returning their deliveries ([`Gate::remove`]).
    pub(super) fn remove_from_gate(
        &mut self,
        drop_it: impl FnMut(&HeldPacket) -> bool,
    ) -> Vec<Outgoing> {
        self.0
            .as_deref_mut()
            .map(|q| q.gate.remove(drop_it))
            .unwrap_or_default()
    }

    /// Ready when the oldest write the gate waits for completed; an empty gate never is.
    pub(super) fn poll_gate(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        match self.0.as_deref_mut() {
            Some(q) if !q.gate.is_empty() => q.gate.poll_front(cx),
            _ => Poll::Pending,
        }
    }
}

impl std::ops::Deref for LazyQueues {
    type Target = Queues;

    fn deref(&self) -> &Queues {
        self.0.as_deref().unwrap_or(&NO_QUEUES)
    }
}
