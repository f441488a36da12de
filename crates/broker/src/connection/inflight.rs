//! What a connection holds only while inbound packets are in flight: the ack pipeline, the
//! exchanges counted against our Receive Maximum, and the scratch list of released outcomes.
//!
//! An idle connection's task keeps its whole state inline (ARCHITECTURE §6.2), and tokio rounds
//! a task up to 128 B steps: these 136 B, empty between bursts, would be in every idle
//! connection. They are boxed while something is in flight and dropped at the loop's wait once
//! nothing is: one allocation per idle → busy transition, none per packet of a burst.
//!
//! # Invariants
//! - The box exists whenever the pipeline holds an entry, an exchange is counted, a released
//!   outcome waits to be flushed, or a write failed: [`InflightSlot::release_if_idle`] drops it
//!   only when none of these holds, so dropping it loses nothing.
//! - The read-only queries answer for an empty pipeline when there is no box, exactly as the
//!   box's freshly made pipeline would.

use std::sync::Arc;

use crate::engine::Shared;
use crate::model::message::Message;
use crate::state::ack_pipeline::{AckPipeline, Released};

use super::quota::InboundQuota;

/// The in-flight state itself.
pub(super) struct Inflight {
    pub(super) pipeline: AckPipeline<Arc<Message>>,
    /// Exchanges counted against our Receive Maximum.
    pub(super) quota: InboundQuota,
    /// Outcomes the pipeline released and the connection has not handled yet.
    pub(super) released: Vec<Released<Arc<Message>>>,
}

impl Inflight {
    fn new(shared: &Shared) -> Self {
        Inflight {
            pipeline: AckPipeline::new(usize::from(shared.config.receive_maximum))
                .on_release(shared.release_hook.clone()),
            quota: InboundQuota::default(),
            released: Vec::new(),
        }
    }

    fn is_idle(&self) -> bool {
        self.pipeline.is_empty()
            && !self.pipeline.failed()
            && self.quota.is_empty()
            && self.released.is_empty()
    }
}

/// [`Inflight`], boxed only while in use.
#[derive(Default)]
pub(super) struct InflightSlot(Option<Box<Inflight>>);

impl InflightSlot {
    /// The in-flight state, made if there is none.
    pub(super) fn get(&mut self, shared: &Shared) -> &mut Inflight {
        self.0
            .get_or_insert_with(|| Box::new(Inflight::new(shared)))
    }

    /// The in-flight state if there is one (nothing is allocated).
    pub(super) fn get_existing(&mut self) -> Option<&mut Inflight> {
        self.0.as_deref_mut()
    }

    /// Takes the box out (the close path works on it while `self` is borrowed elsewhere).
    pub(super) fn take(&mut self) -> Option<Box<Inflight>> {
        self.0.take()
    }

    /// Drops the box if it holds nothing (see the invariants).
    pub(super) fn release_if_idle(&mut self) {
        if self.0.as_ref().is_some_and(|inflight| inflight.is_idle()) {
            self.0 = None;
        }
    }

    /// The pipeline is full: stop reading ([`AckPipeline::is_full`]).
    pub(super) fn is_full(&self) -> bool {
        self.0.as_ref().is_some_and(|i| i.pipeline.is_full())
    }

    /// Some entry waits for its write ([`AckPipeline::has_pending_ticket`]).
    pub(super) fn has_pending_ticket(&self) -> bool {
        self.0
            .as_ref()
            .is_some_and(|i| i.pipeline.has_pending_ticket())
    }

    /// A store write failed ([`AckPipeline::failed`]).
    pub(super) fn failed(&self) -> bool {
        self.0.as_ref().is_some_and(|i| i.pipeline.failed())
    }

    /// The exchange of `packet_id` is counted against our Receive Maximum.
    pub(super) fn is_counted(&self, packet_id: u16) -> bool {
        self.0
            .as_ref()
            .is_some_and(|i| i.quota.is_counted(packet_id))
    }

    #[cfg(test)]
    pub(super) fn is_allocated(&self) -> bool {
        self.0.is_some()
    }
}

#[cfg(test)]
mod tests {
    use tern_wire::ReasonCode;

    use super::*;
    use crate::state::ack_pipeline::{AckKind, Entry};

    fn ack(packet_id: u16, kind: AckKind, counted: bool) -> Entry<Arc<Message>> {
        Entry {
            packet_id,
            kind,
            reason: ReasonCode::SUCCESS,
            ticket: None,
            deliver: None,
            deliver_after_durable: false,
            counted,
        }
    }

    /// What `Conn::flush_released` does with released acknowledgements, for the quota.
    fn handle_released(inflight: &mut Inflight) {
        for released in std::mem::take(&mut inflight.released) {
            if let Released::Ack {
                kind,
                packet_id,
                reason,
                ..
            } = released
            {
                inflight.quota.on_released(&kind, packet_id, reason);
            }
        }
    }

    #[test]
    fn boxed_while_in_flight_and_dropped_when_idle() {
        let broker = crate::Broker::new(crate::BrokerConfig::default()).unwrap();
        let shared = broker.shared();
        let mut slot = InflightSlot::default();
        assert!(!slot.is_allocated() && !slot.is_full() && !slot.is_counted(1));
        assert!(!slot.has_pending_ticket() && !slot.failed());
        slot.release_if_idle();
        assert!(!slot.is_allocated());

        // A QoS 2 exchange counted against the Receive Maximum: its PUBREC is released, and
        // the exchange stays counted until its PUBCOMP is.
        let inflight = slot.get(shared);
        assert_eq!(inflight.quota.admit(7, 10), Ok(true));
        inflight
            .pipeline
            .push(ack(7, AckKind::PubRec, true), &mut inflight.released);
        assert_eq!(inflight.released.len(), 1);
        slot.release_if_idle();
        assert!(slot.is_allocated(), "a released outcome not handled yet");
        let inflight = slot.get(shared);
        handle_released(inflight);
        slot.release_if_idle();
        assert!(
            slot.is_allocated() && slot.is_counted(7),
            "the exchange is still counted"
        );

        let inflight = slot.get(shared);
        inflight
            .pipeline
            .push(ack(7, AckKind::PubComp, true), &mut inflight.released);
        handle_released(inflight);
        slot.release_if_idle();
        assert!(!slot.is_allocated() && !slot.is_counted(7));
    }
}
