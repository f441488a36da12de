//! The per-connection ordered pipeline of inbound packet outcomes: PUBLISH, PUBREL, SUBSCRIBE
//! and UNSUBSCRIBE (ARCHITECTURE §2.5).
//!
//! Each entry is one inbound packet: its acknowledgement (PUBACK, PUBREC, PUBCOMP, or a SUBACK
//! / UNSUBACK encoded when the packet was handled), the store ticket if a write was issued for
//! it, and the message to deliver onward. Entries release their acknowledgement strictly in
//! arrival order once their writes are durable, so every acknowledgement of a connection
//! leaves in packet order; onward delivery also follows arrival order, and an entry that must
//! not be delivered before its write is durable (QoS 2, §3) holds back every delivery behind
//! it.
//!
//! A delivery may issue a write of its own when it is released: the release hook
//! ([`AckPipeline::on_release`]) applies a retained message and returns the ticket of its
//! retained record, which the entry's acknowledgement then waits for as well (§5).
//!
//! # Invariants
//! - `deliver_cursor <= entries.len()`; every entry before it has been delivered (or needed no
//!   delivery), and its release hook has run.
//! - Acks leave only from the front, only for delivered and durable entries, so acks are in
//!   packet order and never precede the delivery they confirm.
//! - An entry is durable iff it had no ticket or its ticket completed (ARCHITECTURE §4.3:
//!   whether to wait is decided by whether a write was issued, never by QoS). A ticket the
//!   release hook returns is joined to the entry's own, so an entry with an acknowledgement is
//!   durable only once both writes are.
//! - Entries that are part of an exchange counted against our Receive Maximum (`counted`) take
//!   no capacity: the caller bounds them (it disconnects a client that exceeds the maximum,
//!   `connection::publish`), so they must never make it stop reading before the client reaches
//!   that limit. The other entries (QoS 0, a retried PUBLISH, a PUBREL of an exchange not
//!   counted on this connection) are bounded by the caller too: it stops reading when
//!   [`AckPipeline::is_full`]. Hence `entries.len() <= receive maximum + capacity`.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use tern_wire::ReasonCode;

use crate::model::{PersistError, Ticket};

/// The acknowledgement an entry releases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AckKind {
    /// QoS 0 PUBLISH: nothing to send, but the entry still keeps the delivery order.
    None,
    PubAck,
    PubRec,
    PubComp,
    /// A SUBACK or UNSUBACK, encoded when its packet was handled (reason codes per filter).
    Encoded(Bytes),
}

/// Runs when an entry's delivery is released, in packet order, before the delivery is handed
/// out; returns the ticket of a write it issued (a retained message's record). Shared: the
/// broker has one for all its connections (a box per connection was a 32 B malloc chunk each).
pub(crate) type ReleaseHook<D> = Arc<dyn Fn(&D) -> Option<Ticket> + Send + Sync>;

/// One inbound packet's outcome.
#[derive(Debug)]
pub(crate) struct Entry<D> {
    pub(crate) packet_id: u16,
    pub(crate) kind: AckKind,
    pub(crate) reason: ReasonCode,
    pub(crate) ticket: Option<Ticket>,
    pub(crate) deliver: Option<D>,
    /// True for QoS 2 (§3): delivering before durability could duplicate after a crash.
    pub(crate) deliver_after_durable: bool,
    /// Part of an exchange counted against our Receive Maximum: takes no pipeline capacity,
    /// and its released acknowledgement says so (the caller ends the count on it).
    pub(crate) counted: bool,
}

/// What the pipeline lets go, in order.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Released<D> {
    Deliver(D),
    Ack {
        kind: AckKind,
        packet_id: u16,
        reason: ReasonCode,
        /// The entry's [`Entry::counted`].
        counted: bool,
    },
}

struct Slot<D> {
    entry: Entry<D>,
    durable: bool,
}

pub(crate) struct AckPipeline<D> {
    slots: VecDeque<Slot<D>>,
    deliver_cursor: usize,
    /// Room for entries that are not `counted`.
    capacity: usize,
    /// Entries in `slots` that are not `counted`.
    uncounted: usize,
    /// A write failed: nothing more is released and the connection closes without
    /// acknowledging, so that the client resends (the rule for store failures).
    failed: bool,
    on_release: Option<ReleaseHook<D>>,
}

impl<D> AckPipeline<D> {
    /// `capacity`: how many entries that are not `counted` may wait (the connection uses the
    /// Receive Maximum it advertises).
    pub(crate) fn new(capacity: usize) -> Self {
        AckPipeline {
            slots: VecDeque::new(),
            deliver_cursor: 0,
            capacity: capacity.max(1),
            uncounted: 0,
            failed: false,
            on_release: None,
        }
    }

    /// Sets the hook run as each delivery is released (see [`ReleaseHook`]). A ticket it
    /// returns holds the entry's acknowledgement until durable; for an entry without an
    /// acknowledgement (QoS 0) it is not waited for.
    pub(crate) fn on_release(mut self, hook: ReleaseHook<D>) -> Self {
        self.on_release = Some(hook);
        self
    }

    /// True once a store write failed (the connection must close without further acks).
    pub(crate) fn failed(&self) -> bool {
        self.failed
    }

    /// Empties the pipeline, returning the deliveries that were never released (their writes
    /// did not complete in time or failed): the caller tells the store they are given up.
    pub(crate) fn abandon(&mut self) -> Vec<D> {
        self.deliver_cursor = 0;
        self.uncounted = 0;
        self.slots
            .drain(..)
            .filter_map(|slot| slot.entry.deliver)
            .collect()
    }

    /// The connection is closing: waits for every outstanding write and releases what becomes
    /// durable, so that a QoS 2 message already recorded as received is still delivered
    /// (the client's retry will be answered as a duplicate). Stops at a failed write.
    pub(crate) async fn drain(&mut self, out: &mut Vec<Released<D>>) {
        while self.has_pending_ticket() && !self.failed {
            self.wait_front(out).await;
        }
    }

    /// When true, the connection stops reading (backpressure, never drop). Only entries that
    /// are not `counted` fill the pipeline.
    pub(crate) fn is_full(&self) -> bool {
        self.uncounted >= self.capacity
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Adds an entry and appends whatever can now be released to `out`.
    pub(crate) fn push(&mut self, entry: Entry<D>, out: &mut Vec<Released<D>>) {
        let durable = entry.ticket.is_none();
        if !entry.counted {
            self.uncounted += 1;
        }
        self.slots.push_back(Slot { entry, durable });
        self.advance(out);
    }

    /// True while some entry waits for its write.
    pub(crate) fn has_pending_ticket(&self) -> bool {
        self.slots.iter().any(|s| !s.durable)
    }

    /// Waits for the oldest outstanding write; then releases what it can. Cancel-safe: if the
    /// future is dropped, the ticket stays in place and is awaited again next time.
    pub(crate) async fn wait_front(&mut self, out: &mut Vec<Released<D>>) {
        poll_fn(|cx| self.poll_front(cx, out)).await
    }

    /// [`AckPipeline::wait_front`] as a poll: the connection's loop waits for it without a
    /// future of its own (every idle connection would keep one).
    pub(crate) fn poll_front(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut Vec<Released<D>>,
    ) -> Poll<()> {
        let Some(slot) = self.slots.iter_mut().find(|s| !s.durable) else {
            return Poll::Ready(());
        };
        let result = match slot.entry.ticket.as_mut() {
            Some(ticket) => ready!(ticket.poll_wait(cx)),
            None => Ok(()),
        };
        if !Self::settle(slot, result) {
            self.failed = true;
            return Poll::Ready(());
        }
        // Later tickets usually completed in the same group commit. Tickets of different
        // streams may complete out of order: every completed one is settled, the front decides.
        for slot in self.slots.iter_mut().filter(|s| !s.durable) {
            if let Some(result) = slot.entry.ticket.as_mut().and_then(Ticket::try_result) {
                if !Self::settle(slot, result) {
                    // What precedes the failed write and is durable is still released
                    // (delivered, acknowledged in order): dropped, it would be durable yet
                    // never routed, and the publisher's retry, finding it durable, would be
                    // acknowledged without a delivery (docs/simulation.md finding 10).
                    self.advance(out);
                    self.failed = true;
                    return Poll::Ready(());
                }
            }
        }
        self.advance(out);
        Poll::Ready(())
    }

    /// False if the write failed.
    fn settle(slot: &mut Slot<D>, result: Result<(), PersistError>) -> bool {
        slot.entry.ticket = None;
        match result {
            Ok(()) => {
                slot.durable = true;
                true
            }
            Err(error) => {
                tracing::error!(%error, packet_id = slot.entry.packet_id, "store write failed; closing the connection without acknowledging");
                false
            }
        }
    }

    fn advance(&mut self, out: &mut Vec<Released<D>>) {
        if self.failed {
            return;
        }
        while let Some(slot) = self.slots.get_mut(self.deliver_cursor) {
            if slot.entry.deliver_after_durable && !slot.durable {
                break;
            }
            if let Some(message) = slot.entry.deliver.take() {
                if let Some(hook) = self.on_release.as_ref() {
                    let ticket = hook(&message);
                    if ticket.is_some() && slot.entry.kind != AckKind::None {
                        slot.entry.ticket = Ticket::join(slot.entry.ticket.take(), ticket);
                        slot.durable = false;
                    }
                }
                out.push(Released::Deliver(message));
            }
            self.deliver_cursor += 1;
        }
        while self.deliver_cursor > 0 && self.slots.front().is_some_and(|s| s.durable) {
            let Some(slot) = self.slots.pop_front() else {
                break;
            };
            self.deliver_cursor -= 1;
            if !slot.entry.counted {
                self.uncounted -= 1;
            }
            if slot.entry.kind != AckKind::None {
                out.push(Released::Ack {
                    kind: slot.entry.kind,
                    packet_id: slot.entry.packet_id,
                    reason: slot.entry.reason,
                    counted: slot.entry.counted,
                });
            }
        }
        // A burst (a slow store) must not leave an idle connection holding its high-water
        // mark of pipeline memory.
        if self.slots.is_empty() && self.slots.capacity() > IDLE_CAPACITY {
            self.slots = VecDeque::new();
        }
    }
}

/// Capacity an empty pipeline may keep.
const IDLE_CAPACITY: usize = 16;

#[cfg(test)]
mod tests;
