//! The Receive Maximum we advertise, as the client's exchanges count against it
//! (MQTT-3.3.4-9; v5 §4.9).
//!
//! An exchange is counted from the arrival of its QoS>0 PUBLISH until we send the packet that
//! ends it for the client's send quota: PUBACK for QoS 1; PUBCOMP for QoS 2, or a PUBREC with a
//! reason >= 0x80. Each exchange counts once, whichever of its packets are in flight: the ack
//! pipeline (the PUBLISH until its PUBACK/PUBREC is sent, the PUBREL until its PUBCOMP is) and
//! the session's received set (between PUBREC and PUBREL) only hold its steps.
//!
//! # Invariants
//! - `ids` holds the packet ids of the exchanges counted on this connection, at most the
//!   Receive Maximum of them: a PUBLISH that would make one more is refused (0x93).
//! - A packet id is counted at most once: a retried PUBLISH of a counted id counts nothing.
//!   The quota is per connection, like the client's (§4.9: it is not kept across connections),
//!   so a QoS 2 exchange left over from an earlier connection counts only once its PUBLISH is
//!   resent on this one.
//! - An id leaves `ids` only when the pipeline releases the acknowledgement of a counted entry
//!   that ends its exchange ([`ends_exchange`]).

use crate::hash::Set;

use tern_wire::ReasonCode;

use crate::state::ack_pipeline::AckKind;

/// Capacity an empty set may keep.
const IDLE_CAPACITY: usize = 64;

#[derive(Debug, Default)]
pub(super) struct InboundQuota {
    ids: Set<u16>,
}

/// The client sent more than our Receive Maximum.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Exceeded;

impl InboundQuota {
    pub(super) fn is_counted(&self, packet_id: u16) -> bool {
        self.ids.contains(&packet_id)
    }

    /// Counts the exchange of a QoS>0 PUBLISH unless its id is counted already (a retry).
    /// Returns whether this PUBLISH started the count (its pipeline entry is then `counted`).
    pub(super) fn admit(&mut self, packet_id: u16, maximum: u16) -> Result<bool, Exceeded> {
        if self.ids.contains(&packet_id) {
            return Ok(false);
        }
        if self.ids.len() >= usize::from(maximum) {
            return Err(Exceeded);
        }
        self.ids.insert(packet_id);
        Ok(true)
    }

    /// The acknowledgement of a counted entry was released.
    pub(super) fn on_released(&mut self, kind: &AckKind, packet_id: u16, reason: ReasonCode) {
        if ends_exchange(kind, reason) {
            self.ids.remove(&packet_id);
            if self.ids.is_empty() && self.ids.capacity() > IDLE_CAPACITY {
                self.ids = Set::default();
            }
        }
    }

    /// No exchange is counted.
    pub(super) fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.ids.len()
    }
}

/// Whether sending this acknowledgement gives the client its quota back (v5 §4.9).
fn ends_exchange(kind: &AckKind, reason: ReasonCode) -> bool {
    match kind {
        AckKind::PubAck | AckKind::PubComp => true,
        AckKind::PubRec => !reason.is_success(),
        AckKind::None | AckKind::Encoded(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exactly_the_maximum_is_admitted() {
        let mut q = InboundQuota::default();
        assert_eq!(q.admit(1, 2), Ok(true));
        assert_eq!(q.admit(2, 2), Ok(true));
        assert_eq!(q.admit(3, 2), Err(Exceeded));
        // A retry of a counted id is not a new exchange, even at the maximum.
        assert_eq!(q.admit(1, 2), Ok(false));
        assert_eq!(q.len(), 2);
    }

    #[test]
    fn qos2_counts_until_pubcomp() {
        let mut q = InboundQuota::default();
        assert_eq!(q.admit(7, 1), Ok(true));
        q.on_released(&AckKind::PubRec, 7, ReasonCode::SUCCESS);
        assert!(q.is_counted(7));
        assert_eq!(q.admit(8, 1), Err(Exceeded));
        q.on_released(&AckKind::PubComp, 7, ReasonCode::SUCCESS);
        assert!(!q.is_counted(7));
        assert_eq!(q.admit(8, 1), Ok(true));
    }

    #[test]
    fn puback_and_failed_pubrec_end_the_exchange() {
        let mut q = InboundQuota::default();
        q.admit(1, 4).unwrap();
        q.admit(2, 4).unwrap();
        q.on_released(&AckKind::PubAck, 1, ReasonCode::SUCCESS);
        q.on_released(&AckKind::PubRec, 2, ReasonCode::PAYLOAD_FORMAT_INVALID);
        assert_eq!(q.len(), 0);
    }
}
