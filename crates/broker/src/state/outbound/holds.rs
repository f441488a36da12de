//! What a session's outbound state holds of the stored messages: listed for its durable cursor
//! (`held`), and dropped where retention removed them or a rule forbids them
//! (`drop_removed`, `drop_queued_where`).

use tern_wire::QoS;

use super::{Outbound, Outgoing};

/// What retention's removal of ranges did to one queue ([`Outbound::drop_removed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Removed {
    /// Queued deliveries dropped: the queue skips the removed range.
    pub dropped: usize,
    /// QoS 1 deliveries in flight whose record went: resent from memory while the broker
    /// runs, not after a restart.
    pub(crate) inflight_exposed: usize,
}

impl Outbound {
    /// Drops queued (not in-flight) stored messages whose position retention removed from the
    /// store: the session skips ahead over the removed range once. In-flight messages stay
    /// (they are resent from memory, MQTT-4.4.0-1); the QoS 1 ones among them are counted as
    /// exposed: no record pins them (a QoS 2 exchange's does), so a restart before their
    /// PUBACK cannot resend them (ARCHITECTURE §5, "Retention").
    pub fn drop_removed(&mut self, removed: &[(u16, std::ops::RangeInclusive<u64>)]) -> Removed {
        let gone = |o: &Outgoing| {
            o.message.store_ref().is_some_and(|r| {
                removed
                    .iter()
                    .any(|(stream, range)| *stream == r.stream && range.contains(&r.seq))
            })
        };
        let inflight_exposed = self
            .queues
            .inflight
            .iter()
            .filter(|e| e.item.qos == QoS::AtLeastOnce && gone(&e.item))
            .count();
        Removed {
            dropped: self.drop_queued_where(gone),
            inflight_exposed,
        }
    }

    /// Drops the queued (not in-flight) deliveries `drop` picks, keeping the others in order
    /// and the sums exact. Returns how many went.
    pub(crate) fn drop_queued_where(&mut self, mut drop: impl FnMut(&Outgoing) -> bool) -> usize {
        if !self.queues.queue.iter().any(&mut drop) {
            return 0;
        }
        let mut dropped = 0;
        for item in self.queues.take_queued() {
            if drop(&item) {
                self.account_removed(&item);
                dropped += 1;
            } else {
                self.queues.push_queued(item);
            }
        }
        self.queues.release_if_empty();
        self.sync_total();
        dropped
    }

    /// Appends the store positions of every stored message this session still holds (in
    /// flight or queued) to `out`, for its durable cursor.
    pub(crate) fn held(&self, out: &mut crate::model::HeldSeqs) {
        self.held_where(out, |_| true);
    }

    /// Like [`Outbound::held`], for the messages routed via the share group `share` only.
    pub(crate) fn held_share(&self, share: &str, out: &mut crate::model::HeldSeqs) {
        self.held_where(out, |o| o.share.as_deref() == Some(share));
    }

    /// What [`Outbound::held`] lists, of the deliveries `pick` takes: in flight, held in the
    /// gate (QoS 0) and queued.
    fn held_where(&self, out: &mut crate::model::HeldSeqs, pick: impl Fn(&Outgoing) -> bool) {
        let refs = self
            .queues
            .inflight
            .iter()
            .map(|e| &e.item)
            .chain(self.queues.gate.qos0_items())
            .chain(self.queues.queue.iter())
            .filter(|o| pick(o))
            .filter_map(|o| o.message.store_ref());
        out.extend(refs.map(|r| (r.stream, r.seq)));
    }
}
