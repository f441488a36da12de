//! The subscriber's acknowledgements of the in-flight window: PUBACK and PUBCOMP end an
//! exchange, PUBREC moves a QoS 2 one on and holds its PUBREL in the gate until "PUBREL pending"
//! is durable (ARCHITECTURE §3).

use std::task::{Context, Poll};

use tern_wire::{QoS, ReasonCode};

use super::{HeldPacket, Inflight, Outbound, Phase};
use crate::model::Ticket;

impl Outbound {
    /// PUBACK from the subscriber. `None` for an unknown id (ignored, as the spec allows).
    pub fn on_puback(&mut self, packet_id: u16) -> Option<Inflight> {
        self.remove_inflight(packet_id, |e| {
            e.phase == Phase::AwaitingAck && e.item.qos == QoS::AtLeastOnce
        })
    }

    /// Queues a PUBREL behind the ones before it; it leaves once `ticket` (the durable "PUBREL
    /// pending", if one was written) completes. PUBRELs leave in PUBREC order [MQTT-4.6.0-3].
    pub(crate) fn hold_pubrel(
        &mut self,
        packet_id: u16,
        reason: ReasonCode,
        ticket: Option<Ticket>,
    ) {
        if let Some(entry) = self
            .queues
            .inflight_mut()
            .find(|e| e.packet_id == packet_id)
        {
            entry.held = true;
        }
        self.queues
            .push_gate(ticket, HeldPacket::PubRel { packet_id, reason });
    }

    /// Ready when the oldest write the gate waits for completed (the writer then runs a batch).
    pub fn poll_gate(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.queues.poll_gate(cx)
    }

    /// True while packets wait in the gate (or its failure is pending).
    pub(crate) fn gate_holds_packets(&self) -> bool {
        !self.queues.gate.is_empty()
    }

    /// True once a store write the gate waited for failed (the connection must close).
    pub(crate) fn gate_failed(&self) -> bool {
        self.queues.gate.failed()
    }

    /// PUBREC from the subscriber: true if the id was awaiting it (or already PUBREL pending:
    /// a duplicate PUBREC is answered with PUBREL again).
    pub fn on_pubrec(&mut self, packet_id: u16, accepted: bool) -> bool {
        let Some(index) =
            self.queues.inflight.iter().position(|e| {
                e.packet_id == packet_id && e.item.qos == QoS::ExactlyOnce && !e.held
            })
        else {
            return false;
        };
        if !accepted {
            // v5 PUBREC with a failure reason ends the exchange ([MQTT-4.3.3-4] note).
            if let Some(entry) = self.queues.remove_inflight(index) {
                self.packet_ids.release(entry.packet_id);
            }
            return true;
        }
        if let Some(entry) = self.queues.inflight_mut().nth(index) {
            entry.phase = Phase::PubRelPending;
            entry.needs_send = false;
        }
        true
    }

    /// The store position of the in-flight message `packet_id`, if it was stored.
    pub(crate) fn stored_ref(&self, packet_id: u16) -> Option<crate::model::StoreRef> {
        self.queues
            .inflight
            .iter()
            .find(|e| e.packet_id == packet_id)
            .and_then(|e| e.item.message.store_ref())
    }

    pub fn on_pubcomp(&mut self, packet_id: u16) -> Option<Inflight> {
        self.remove_inflight(packet_id, |e| e.phase == Phase::PubRelPending)
    }

    fn remove_inflight(
        &mut self,
        packet_id: u16,
        accept: impl Fn(&Inflight) -> bool,
    ) -> Option<Inflight> {
        let index = self
            .queues
            .inflight
            .iter()
            .position(|e| e.packet_id == packet_id && !e.held && accept(e))?;
        let entry = self.queues.remove_inflight(index)?;
        self.packet_ids.release(packet_id);
        Some(entry)
    }
}
