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

use bytes::Bytes;
use tern_wire::ReasonCode;

use crate::persist::{PersistError, Ticket};

/// The acknowledgement an entry releases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AckKind {
    /// QoS 0 PUBLISH: nothing to send, but the entry still keeps the delivery order.
    None,
    PubAck,
    PubRec,
    PubComp,
    /// A SUBACK or UNSUBACK, encoded when its packet was handled (reason codes per filter).
    Encoded(Bytes),
}

/// Runs when an entry's delivery is released, in packet order, before the delivery is handed
/// out; returns the ticket of a write it issued (a retained message's record).
pub type ReleaseHook<D> = Box<dyn FnMut(&D) -> Option<Ticket> + Send>;

/// One inbound packet's outcome.
#[derive(Debug)]
pub struct Entry<D> {
    pub packet_id: u16,
    pub kind: AckKind,
    pub reason: ReasonCode,
    pub ticket: Option<Ticket>,
    pub deliver: Option<D>,
    /// True for QoS 2 (§3): delivering before durability could duplicate after a crash.
    pub deliver_after_durable: bool,
    /// Part of an exchange counted against our Receive Maximum: takes no pipeline capacity,
    /// and its released acknowledgement says so (the caller ends the count on it).
    pub counted: bool,
}

/// What the pipeline lets go, in order.
#[derive(Debug, PartialEq, Eq)]
pub enum Released<D> {
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

pub struct AckPipeline<D> {
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
    pub fn new(capacity: usize) -> Self {
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
    pub fn on_release(mut self, hook: ReleaseHook<D>) -> Self {
        self.on_release = Some(hook);
        self
    }

    /// True once a store write failed (the connection must close without further acks).
    pub fn failed(&self) -> bool {
        self.failed
    }

    /// Empties the pipeline, returning the deliveries that were never released (their writes
    /// did not complete in time or failed): the caller tells the store they are given up.
    pub fn abandon(&mut self) -> Vec<D> {
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
    pub async fn drain(&mut self, out: &mut Vec<Released<D>>) {
        while self.has_pending_ticket() && !self.failed {
            self.wait_front(out).await;
        }
    }

    /// When true, the connection stops reading (backpressure, never drop). Only entries that
    /// are not `counted` fill the pipeline.
    pub fn is_full(&self) -> bool {
        self.uncounted >= self.capacity
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Adds an entry and appends whatever can now be released to `out`.
    pub fn push(&mut self, entry: Entry<D>, out: &mut Vec<Released<D>>) {
        let durable = entry.ticket.is_none();
        if !entry.counted {
            self.uncounted += 1;
        }
        self.slots.push_back(Slot { entry, durable });
        self.advance(out);
    }

    /// True while some entry waits for its write.
    pub fn has_pending_ticket(&self) -> bool {
        self.slots.iter().any(|s| !s.durable)
    }

    /// Waits for the oldest outstanding write; then releases what it can. Cancel-safe: if the
    /// future is dropped, the ticket stays in place and is awaited again next time.
    pub async fn wait_front(&mut self, out: &mut Vec<Released<D>>) {
        let Some(slot) = self.slots.iter_mut().find(|s| !s.durable) else {
            return;
        };
        let result = match slot.entry.ticket.as_mut() {
            Some(ticket) => ticket.wait().await,
            None => Ok(()),
        };
        if !Self::settle(slot, result) {
            self.failed = true;
            return;
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
                    return;
                }
            }
        }
        self.advance(out);
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
                if let Some(hook) = self.on_release.as_mut() {
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
mod tests {
    use super::*;
    use crate::persist::TicketCompleter;

    fn entry(
        packet_id: u16,
        kind: AckKind,
        deliver: &'static str,
        ticket: Option<Ticket>,
        after_durable: bool,
    ) -> Entry<&'static str> {
        Entry {
            counted: counts(&kind),
            packet_id,
            kind,
            reason: ReasonCode::SUCCESS,
            ticket,
            deliver: Some(deliver),
            deliver_after_durable: after_durable,
        }
    }

    /// What the connection counts in these tests: every QoS>0 PUBLISH.
    fn counts(kind: &AckKind) -> bool {
        matches!(kind, AckKind::PubAck | AckKind::PubRec)
    }

    fn ack(kind: AckKind, packet_id: u16) -> Released<&'static str> {
        Released::Ack {
            counted: counts(&kind),
            kind,
            packet_id,
            reason: ReasonCode::SUCCESS,
        }
    }

    fn ticket() -> (TicketCompleter, Option<Ticket>) {
        let (c, t) = Ticket::pair();
        (c, Some(t))
    }

    #[test]
    fn no_write_means_immediate_release() {
        let mut p = AckPipeline::new(8);
        let mut out = Vec::new();
        p.push(entry(1, AckKind::PubAck, "a", None, false), &mut out);
        p.push(entry(0, AckKind::None, "b", None, false), &mut out);
        assert_eq!(
            out,
            vec![
                Released::Deliver("a"),
                ack(AckKind::PubAck, 1),
                Released::Deliver("b")
            ]
        );
        assert!(p.is_empty());
    }

    #[tokio::test]
    async fn qos2_holds_back_later_deliveries_even_qos0_until_durable() {
        let mut p = AckPipeline::new(8);
        let mut out = Vec::new();
        let (done, t) = ticket();
        p.push(entry(1, AckKind::PubRec, "q2", t, true), &mut out);
        p.push(entry(0, AckKind::None, "q0", None, false), &mut out);
        p.push(entry(2, AckKind::PubAck, "q1", None, false), &mut out);
        assert!(
            out.is_empty(),
            "nothing may pass the undurable QoS 2 message"
        );
        done.complete(Ok(()));
        p.wait_front(&mut out).await;
        assert_eq!(
            out,
            vec![
                Released::Deliver("q2"),
                Released::Deliver("q0"),
                Released::Deliver("q1"),
                ack(AckKind::PubRec, 1),
                ack(AckKind::PubAck, 2),
            ]
        );
    }

    /// Simulator finding 10 (docs/simulation.md): the front and the next write completed in
    /// the turn whose later write failed. The durable entries ahead of the failure are still
    /// delivered and acknowledged; nothing from the failed one on.
    #[tokio::test]
    async fn durable_entries_before_a_failed_write_are_released() {
        let mut p = AckPipeline::new(8);
        let mut out = Vec::new();
        let (first, t1) = ticket();
        let (second, t2) = ticket();
        let (third, t3) = ticket();
        p.push(entry(1, AckKind::PubRec, "a", t1, true), &mut out);
        p.push(entry(2, AckKind::PubRec, "b", t2, true), &mut out);
        p.push(entry(3, AckKind::PubRec, "c", t3, true), &mut out);
        first.complete(Ok(()));
        second.complete(Ok(()));
        third.complete(Err(PersistError("EIO".into())));
        p.wait_front(&mut out).await;
        assert_eq!(
            out,
            vec![
                Released::Deliver("a"),
                Released::Deliver("b"),
                ack(AckKind::PubRec, 1),
                ack(AckKind::PubRec, 2),
            ]
        );
        assert!(p.failed());
    }

    #[tokio::test]
    async fn qos1_with_write_delivers_at_once_but_acks_wait_in_order() {
        let mut p = AckPipeline::new(8);
        let mut out = Vec::new();
        let (done, t) = ticket();
        p.push(entry(1, AckKind::PubAck, "a", t, false), &mut out);
        // The second needed no write (e.g. durability policy "never") yet must not overtake.
        p.push(entry(2, AckKind::PubAck, "b", None, false), &mut out);
        assert_eq!(out, vec![Released::Deliver("a"), Released::Deliver("b")]);
        out.clear();
        assert_eq!(p.len(), 2);
        done.complete(Ok(()));
        p.wait_front(&mut out).await;
        assert_eq!(out, vec![ack(AckKind::PubAck, 1), ack(AckKind::PubAck, 2)]);
    }

    #[tokio::test]
    async fn failed_write_is_neither_acked_nor_delivered() {
        let mut p = AckPipeline::new(8);
        let mut out = Vec::new();
        let (done, t) = ticket();
        p.push(entry(7, AckKind::PubRec, "lost", t, true), &mut out);
        p.push(entry(8, AckKind::PubAck, "after", None, false), &mut out);
        done.complete(Err(PersistError("disk".into())));
        p.wait_front(&mut out).await;
        assert!(p.failed());
        assert!(out.is_empty(), "{out:?}");
    }

    #[test]
    fn abandon_returns_what_was_never_released() {
        let mut p = AckPipeline::new(8);
        let mut out = Vec::new();
        let (_pending, t) = ticket();
        p.push(entry(1, AckKind::PubAck, "sent", None, false), &mut out);
        p.push(entry(2, AckKind::PubRec, "held", t, true), &mut out);
        p.push(entry(0, AckKind::None, "behind", None, false), &mut out);
        assert_eq!(
            out,
            vec![Released::Deliver("sent"), ack(AckKind::PubAck, 1)]
        );
        assert_eq!(p.abandon(), vec!["held", "behind"]);
        assert!(p.is_empty() && !p.is_full());
    }

    #[tokio::test]
    async fn late_then_early_tickets_release_in_packet_order() {
        let mut p = AckPipeline::new(8);
        let mut out = Vec::new();
        let (late, t1) = ticket();
        let (early, t2) = ticket();
        p.push(entry(1, AckKind::PubRec, "one", t1, true), &mut out);
        p.push(entry(2, AckKind::PubRec, "two", t2, true), &mut out);
        early.complete(Ok(()));
        assert!(out.is_empty());
        late.complete(Ok(()));
        p.wait_front(&mut out).await;
        assert_eq!(
            out,
            vec![
                Released::Deliver("one"),
                Released::Deliver("two"),
                ack(AckKind::PubRec, 1),
                ack(AckKind::PubRec, 2),
            ]
        );
    }

    #[tokio::test]
    async fn encoded_ack_waits_for_its_ticket_in_packet_order() {
        let mut p = AckPipeline::new(8);
        let mut out = Vec::new();
        let (done, t) = ticket();
        let suback = AckKind::Encoded(Bytes::from_static(&[0x90, 3, 0, 5, 1]));
        p.push(
            Entry {
                packet_id: 5,
                kind: suback.clone(),
                reason: ReasonCode::SUCCESS,
                ticket: t,
                deliver: None,
                deliver_after_durable: false,
                counted: false,
            },
            &mut out,
        );
        p.push(entry(6, AckKind::PubAck, "m", None, false), &mut out);
        assert_eq!(out, vec![Released::Deliver("m")], "delivery is not held");
        out.clear();
        done.complete(Ok(()));
        p.wait_front(&mut out).await;
        assert_eq!(out, vec![ack(suback, 5), ack(AckKind::PubAck, 6)]);
    }

    #[tokio::test]
    async fn release_hook_ticket_holds_the_ack_not_the_delivery() {
        let hooked: std::sync::Arc<parking_lot::Mutex<Vec<TicketCompleter>>> = Default::default();
        let held = hooked.clone();
        let mut p = AckPipeline::new(8).on_release(Box::new(move |d: &&'static str| {
            if !d.starts_with("retained") {
                return None;
            }
            let (done, t) = Ticket::pair();
            held.lock().push(done);
            Some(t)
        }));
        let mut out = Vec::new();
        let (own, t) = ticket();
        p.push(entry(1, AckKind::PubAck, "retained-1", t, false), &mut out);
        p.push(entry(0, AckKind::None, "retained-0", None, false), &mut out);
        p.push(entry(2, AckKind::PubAck, "plain", None, false), &mut out);
        assert_eq!(
            out,
            vec![
                Released::Deliver("retained-1"),
                Released::Deliver("retained-0"),
                Released::Deliver("plain")
            ]
        );
        out.clear();
        let mut hooks: Vec<TicketCompleter> = hooked.lock().drain(..).collect();
        assert_eq!(hooks.len(), 2, "the hook ran once per delivery");
        own.complete(Ok(()));
        // The QoS 0 entry's hook ticket is not waited for (no ack); the retained one is.
        drop(hooks.pop());
        assert!(p.has_pending_ticket());
        tokio::task::yield_now().await;
        assert!(out.is_empty());
        hooks.pop().unwrap().complete(Ok(()));
        p.wait_front(&mut out).await;
        assert_eq!(out, vec![ack(AckKind::PubAck, 1), ack(AckKind::PubAck, 2)]);
        assert!(p.is_empty());
    }

    #[tokio::test]
    async fn release_hook_ticket_of_a_qos2_entry_is_waited_for_after_its_own() {
        let hooked: std::sync::Arc<parking_lot::Mutex<Vec<TicketCompleter>>> = Default::default();
        let held = hooked.clone();
        let mut p = AckPipeline::new(8).on_release(Box::new(move |_: &&'static str| {
            let (done, t) = Ticket::pair();
            held.lock().push(done);
            Some(t)
        }));
        let mut out = Vec::new();
        let (own, t) = ticket();
        p.push(entry(1, AckKind::PubRec, "q2", t, true), &mut out);
        assert!(
            out.is_empty() && hooked.lock().is_empty(),
            "not released yet"
        );
        own.complete(Ok(()));
        p.wait_front(&mut out).await;
        assert_eq!(out, vec![Released::Deliver("q2")], "delivered, ack held");
        out.clear();
        let hook = hooked.lock().pop().expect("hook ran at release");
        hook.complete(Err(PersistError("disk".into())));
        p.wait_front(&mut out).await;
        assert!(p.failed() && out.is_empty(), "{out:?}");
    }

    #[test]
    fn full_at_capacity_of_uncounted_entries() {
        let mut p = AckPipeline::new(2);
        let mut out = Vec::new();
        let (_d1, t1) = ticket();
        p.push(entry(1, AckKind::PubRec, "held", t1, true), &mut out);
        p.push(entry(0, AckKind::None, "a", None, false), &mut out);
        assert!(!p.is_full());
        p.push(entry(0, AckKind::None, "b", None, false), &mut out);
        assert!(p.is_full());
        assert!(p.has_pending_ticket());
    }

    /// Counted entries are bounded by the Receive Maximum check, not by the pipeline: however
    /// many wait for their writes, the connection keeps reading (it must see the PUBLISH that
    /// exceeds the maximum, and the PUBRELs that end exchanges).
    #[test]
    fn counted_entries_never_fill_the_pipeline() {
        let mut p = AckPipeline::new(2);
        let mut out = Vec::new();
        let mut completers = Vec::new();
        for id in 1..=10 {
            let (done, t) = ticket();
            completers.push(done);
            p.push(entry(id, AckKind::PubAck, "m", t, false), &mut out);
        }
        let (done, t) = ticket();
        completers.push(done);
        p.push(
            Entry {
                packet_id: 1,
                kind: AckKind::PubComp,
                reason: ReasonCode::SUCCESS,
                ticket: t,
                deliver: None,
                deliver_after_durable: false,
                counted: true,
            },
            &mut out,
        );
        assert_eq!(p.len(), 11);
        assert!(!p.is_full());
    }

    #[tokio::test]
    async fn released_acks_carry_the_counted_flag() {
        let mut p = AckPipeline::new(4);
        let mut out = Vec::new();
        let (done, t) = ticket();
        p.push(entry(1, AckKind::PubAck, "a", t, false), &mut out);
        p.push(
            Entry {
                packet_id: 1,
                kind: AckKind::PubRec,
                reason: ReasonCode::SUCCESS,
                ticket: None,
                deliver: None,
                deliver_after_durable: false,
                counted: false,
            },
            &mut out,
        );
        assert!(!p.is_full());
        done.complete(Ok(()));
        p.wait_front(&mut out).await;
        assert_eq!(
            out,
            vec![
                Released::Deliver("a"),
                ack(AckKind::PubAck, 1),
                Released::Ack {
                    kind: AckKind::PubRec,
                    packet_id: 1,
                    reason: ReasonCode::SUCCESS,
                    counted: false
                },
            ]
        );
        assert!(p.is_empty());
    }
}
