//! Acknowledgements from the client for our outbound QoS>0 PUBLISHes.

use tern_wire::{Ack, Packet, Properties, ReasonCode};

use super::{Close, Conn};

impl Conn {
    pub(super) fn on_puback(&mut self, ack: Ack) -> Result<(), Close> {
        let done = {
            let mut state = self.session.state.lock();
            if state.conn_gen != self.conn_gen {
                return Ok(());
            }
            state.out.on_puback(ack.packet_id).is_some()
        };
        if done {
            self.shared
                .store
                .outbound_completed(&self.client_id, ack.packet_id);
            self.ctl.wake.notify_one(); // the window opened
        }
        Ok(())
    }

    pub(super) fn on_pubrec(&mut self, ack: Ack) -> Result<(), Close> {
        let accepted = ack.reason.is_success();
        let known = {
            let mut state = self.session.state.lock();
            if state.conn_gen != self.conn_gen {
                return Ok(());
            }
            let stored = state.out.stored_ref(ack.packet_id);
            (state.out.on_pubrec(ack.packet_id, accepted), stored)
        };
        let (known, stored) = known;
        if !accepted {
            self.ctl.wake.notify_one();
            return Ok(());
        }
        let reason = if known || !self.protocol.is_v5() {
            ReasonCode::SUCCESS
        } else {
            ReasonCode::PACKET_IDENTIFIER_NOT_FOUND
        };
        let pubrel = Packet::PubRel(Ack {
            packet_id: ack.packet_id,
            reason,
            properties: Properties::default(),
        });
        let ticket = if known {
            self.shared
                .store
                .outbound_pubrel_pending(&self.client_id, ack.packet_id, stored)
        } else {
            None
        };
        match ticket {
            None => self.send(&pubrel),
            Some(mut ticket) => {
                // §3: PUBREL only once "PUBREL pending" is durable.
                let session = self.session.clone();
                let ctl = self.ctl.clone();
                let conn_gen = self.conn_gen;
                let protocol = self.protocol;
                tokio::spawn(async move {
                    if ticket.wait().await.is_err() {
                        return;
                    }
                    let mut scratch = bytes::BytesMut::new();
                    let Some(bytes) =
                        crate::outbound::encode_packet(&pubrel, protocol, &mut scratch)
                    else {
                        return;
                    };
                    let mut state = session.state.lock();
                    if state.conn_gen == conn_gen && !state.ended {
                        state.out.push_control(bytes);
                        ctl.wake.notify_one();
                    }
                });
            }
        }
        Ok(())
    }

    pub(super) fn on_pubcomp(&mut self, ack: Ack) -> Result<(), Close> {
        let done = {
            let mut state = self.session.state.lock();
            if state.conn_gen != self.conn_gen {
                return Ok(());
            }
            state.out.on_pubcomp(ack.packet_id).is_some()
        };
        if done {
            self.shared
                .store
                .outbound_completed(&self.client_id, ack.packet_id);
            self.ctl.wake.notify_one();
        }
        Ok(())
    }
}
