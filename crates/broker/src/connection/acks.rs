//! Acknowledgements from the client for our outbound QoS>0 PUBLISHes.

use tern_wire::{Ack, ReasonCode};

use super::{Close, Conn};
use crate::state::outbound::Outbound;

impl Conn {
    pub(super) fn on_puback(&mut self, ack: Ack) -> Result<(), Close> {
        self.complete_outbound(ack, |out, id| out.on_puback(id).is_some())
    }

    pub(super) fn on_pubrec(&mut self, ack: Ack) -> Result<(), Close> {
        let accepted = ack.reason.is_success();
        {
            let mut state = self.session.state.lock();
            if state.conn_gen != self.conn_gen {
                return Ok(());
            }
            let stored = state.out.stored_ref(ack.packet_id);
            let known = state.out.on_pubrec(ack.packet_id, accepted);
            self.shared.changed_sessions.note(&self.session, &state);
            if !accepted {
                drop(state);
                if known {
                    // v5: a PUBREC with a failure reason ends the exchange (MQTT-4.3.3-4 note).
                    self.shared
                        .store
                        .exchanges
                        .outbound_completed(&self.session.client_id, ack.packet_id);
                }
                self.ctl.wake.notify();
                return Ok(());
            }
            let reason = if known || !self.protocol.is_v5() {
                ReasonCode::SUCCESS
            } else {
                ReasonCode::PACKET_IDENTIFIER_NOT_FOUND
            };
            // §3: PUBREL leaves once "PUBREL pending" is durable, and PUBRELs leave in the
            // order their PUBRECs arrived (MQTT-4.6.0-3): both through the session's gate,
            // with the write issued under the session lock so that the gate's order is the
            // write order.
            let ticket = if known {
                self.shared.store.exchanges.outbound_pubrel_pending(
                    &self.session.client_id,
                    ack.packet_id,
                    stored,
                )
            } else {
                None
            };
            state.out.hold_pubrel(ack.packet_id, reason, ticket);
        }
        self.ctl.wake.notify();
        Ok(())
    }

    pub(super) fn on_pubcomp(&mut self, ack: Ack) -> Result<(), Close> {
        self.complete_outbound(ack, |out, id| out.on_pubcomp(id).is_some())
    }

    /// The last acknowledgement of an outbound exchange (PUBACK, PUBCOMP): `done` ends it in
    /// the session's outbound window (false: not in flight, ignored); an ended exchange is
    /// completed in the store and the window reopens.
    fn complete_outbound(
        &mut self,
        ack: Ack,
        done: impl FnOnce(&mut Outbound, u16) -> bool,
    ) -> Result<(), Close> {
        let done = {
            let mut state = self.session.state.lock();
            if state.conn_gen != self.conn_gen {
                return Ok(());
            }
            let done = done(&mut state.out, ack.packet_id);
            self.shared.changed_sessions.note(&self.session, &state);
            done
        };
        if done {
            self.shared
                .store
                .exchanges
                .outbound_completed(&self.session.client_id, ack.packet_id);
            self.ctl.wake.notify(); // the window opened
        }
        Ok(())
    }
}
