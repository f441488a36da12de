//! The release gate of a session's outbound side: packets that may leave only once a store
//! write is durable, kept in the order they must leave (ARCHITECTURE §3, outbound QoS 2).
//!
//! Two kinds of packet wait here:
//! - the first PUBLISH of a QoS 2 delivery to a persistent session, until "(session, packet
//!   id) → message" is durable, so that after a crash the same message goes out under the same
//!   packet id (a subscriber that holds the id in its received set then recognises it);
//! - every PUBREL, until "PUBREL pending" is durable (so a restart resends PUBREL, never the
//!   PUBLISH). PUBRELs leave in the order their PUBRECs arrived ([MQTT-4.6.0-3]): a receiver
//!   that hands a message to its application at PUBREL otherwise sees messages out of order.
//!
//! Deliveries behind a held PUBLISH enter the gate too (QoS 0 included), so the subscriber
//! sees the publisher's order. The writer releases the front while its write is durable and
//! waits on the front's ticket otherwise ([`Gate::poll_front`]): one ordered queue per
//! session, no task per packet.
//!
//! # Invariants
//! - Entries leave only from the front, and only once their write is durable (or no write
//!   was issued for them): the release order is the push order.
//! - `deliveries` equals the number of `Publish` and `Qos0` entries.
//! - After a write failed (`failed`), nothing more is released: the stream refuses writes
//!   until restarted, and an unrecorded packet id must not go out.

use std::collections::VecDeque;
use std::task::{Context, Poll};

use tern_wire::ReasonCode;

use super::Outgoing;
use crate::model::Ticket;

/// QoS 0 deliveries that may wait in the gate behind a held PUBLISH; beyond it the session
/// queue keeps them (and its own limits apply).
pub(crate) const MAX_GATED_QOS0: usize = 256;

/// A packet waiting for its write.
#[derive(Debug)]
pub(crate) enum HeldPacket {
    /// The first PUBLISH of the in-flight delivery with this packet id.
    Publish { packet_id: u16 },
    /// A QoS 0 delivery queued behind a held PUBLISH.
    Qos0(Outgoing),
    /// PUBREL for an outbound QoS 2 exchange.
    PubRel { packet_id: u16, reason: ReasonCode },
}

#[derive(Debug)]
struct Held {
    /// `None` once durable, or if no write was issued for it.
    ticket: Option<Ticket>,
    packet: HeldPacket,
}

#[derive(Debug, Default)]
pub(crate) struct Gate {
    entries: VecDeque<Held>,
    deliveries: usize,
    qos0: usize,
    failed: bool,
}

impl Gate {
    /// An empty gate (what `Default` gives, usable in a `static`).
    pub(crate) const EMPTY: Gate = Gate {
        entries: VecDeque::new(),
        deliveries: 0,
        qos0: 0,
        failed: false,
    };

    /// Queues `packet` behind everything already held.
    pub(crate) fn push(&mut self, ticket: Option<Ticket>, packet: HeldPacket) {
        match packet {
            HeldPacket::Publish { .. } => self.deliveries += 1,
            HeldPacket::Qos0(_) => {
                self.deliveries += 1;
                self.qos0 += 1;
            }
            HeldPacket::PubRel { .. } => {}
        }
        #[cfg(feature = "inject")]
        if crate::inject::on(crate::inject::Bug::RandomPubrelOrder)
            && matches!(packet, HeldPacket::PubRel { .. })
        {
            // The injected bug: a PUBREL jumps ahead of some of the PUBRELs queued last.
            let behind = self
                .entries
                .iter()
                .rev()
                .take_while(|h| matches!(h.packet, HeldPacket::PubRel { .. }))
                .count();
            let jump = (crate::inject::random() % (behind as u64 + 1)) as usize;
            let at = self.entries.len() - jump;
            self.entries.insert(at, Held { ticket, packet });
            self.check();
            return;
        }
        self.entries.push_back(Held { ticket, packet });
        self.check();
    }

    /// True while a delivery waits here: later deliveries must queue behind it.
    pub(crate) fn holds_deliveries(&self) -> bool {
        self.deliveries > 0
    }

    /// True if another QoS 0 delivery may wait here.
    pub(crate) fn has_room_for_qos0(&self) -> bool {
        self.qos0 < MAX_GATED_QOS0
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// True once a write failed: nothing is released any more.
    pub(crate) fn failed(&self) -> bool {
        self.failed
    }

    /// The front packet, if its write is durable (or none was issued).
    pub(crate) fn pop_ready(&mut self) -> Option<HeldPacket> {
        if self.failed {
            return None;
        }
        let front = self.entries.front_mut()?;
        if let Some(ticket) = front.ticket.as_mut() {
            match ticket.try_result() {
                None => return None,
                Some(Ok(())) => front.ticket = None,
                Some(Err(error)) => {
                    tracing::error!(%error, "outbound state write failed; holding the session's packets");
                    self.failed = true;
                    return None;
                }
            }
        }
        let held = self.entries.pop_front()?;
        self.forget(&held.packet);
        self.check();
        Some(held.packet)
    }

    /// Ready once the front entry's write completed (the writer then releases it); pending
    /// while it is outstanding or while nothing is held (the caller waits on other events).
    pub(crate) fn poll_front(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.failed {
            return Poll::Pending;
        }
        let Some(front) = self.entries.front_mut() else {
            return Poll::Pending;
        };
        let Some(ticket) = front.ticket.as_mut() else {
            return Poll::Ready(());
        };
        // A ticket's outcome is read once: it is settled here, not read again by `pop_ready`.
        match ticket.poll_wait(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(())) => {
                front.ticket = None;
                Poll::Ready(())
            }
            Poll::Ready(Err(error)) => {
                tracing::error!(%error, "outbound state write failed; holding the session's packets");
                self.failed = true;
                Poll::Ready(())
            }
        }
    }

    /// Removes the held entries `drop_it` selects (a leaving share-group member, a detached
    /// session's QoS 0), returning the QoS 0 deliveries among them.
    pub(crate) fn remove(&mut self, mut drop_it: impl FnMut(&HeldPacket) -> bool) -> Vec<Outgoing> {
        let mut taken = Vec::new();
        let entries = std::mem::take(&mut self.entries);
        for held in entries {
            if drop_it(&held.packet) {
                self.forget(&held.packet);
                if let HeldPacket::Qos0(item) = held.packet {
                    taken.push(item);
                }
            } else {
                self.entries.push_back(held);
            }
        }
        self.check();
        taken
    }

    /// The QoS 0 deliveries waiting here.
    pub(crate) fn qos0_items(&self) -> impl Iterator<Item = &Outgoing> {
        self.entries.iter().filter_map(|h| match &h.packet {
            HeldPacket::Qos0(item) => Some(item),
            _ => None,
        })
    }

    fn forget(&mut self, packet: &HeldPacket) {
        match packet {
            HeldPacket::Publish { .. } => self.deliveries -= 1,
            HeldPacket::Qos0(_) => {
                self.deliveries -= 1;
                self.qos0 -= 1;
            }
            HeldPacket::PubRel { .. } => {}
        }
    }

    fn check(&self) {
        debug_assert_eq!(
            self.deliveries,
            self.entries
                .iter()
                .filter(|h| !matches!(h.packet, HeldPacket::PubRel { .. }))
                .count()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::PersistError;

    #[tokio::test]
    async fn releases_in_push_order_only_when_the_front_is_durable() {
        let mut gate = Gate::default();
        let (first_done, first) = Ticket::pair();
        let (second_done, second) = Ticket::pair();
        gate.push(Some(first), HeldPacket::Publish { packet_id: 1 });
        gate.push(
            Some(second),
            HeldPacket::PubRel {
                packet_id: 2,
                reason: ReasonCode::SUCCESS,
            },
        );
        gate.push(None, HeldPacket::Publish { packet_id: 3 });
        assert!(gate.holds_deliveries());
        // The second write completes first: nothing leaves while the first is outstanding.
        second_done.complete(Ok(()));
        assert!(gate.pop_ready().is_none());
        first_done.complete(Ok(()));
        let order: Vec<u16> = std::iter::from_fn(|| gate.pop_ready())
            .map(|p| match p {
                HeldPacket::Publish { packet_id } | HeldPacket::PubRel { packet_id, .. } => {
                    packet_id
                }
                HeldPacket::Qos0(_) => 0,
            })
            .collect();
        assert_eq!(order, vec![1, 2, 3]);
        assert!(!gate.holds_deliveries());
        assert!(gate.is_empty());
    }

    #[tokio::test]
    async fn a_failed_write_releases_nothing_more() {
        let mut gate = Gate::default();
        let (done, ticket) = Ticket::pair();
        gate.push(Some(ticket), HeldPacket::Publish { packet_id: 1 });
        gate.push(None, HeldPacket::Publish { packet_id: 2 });
        done.complete(Err(PersistError("disk full".into())));
        assert!(gate.pop_ready().is_none());
        assert!(gate.failed());
        assert!(gate.pop_ready().is_none());
    }
}
