//! The end of a connection: DISCONNECT from the client, then the shared close path (final
//! DISCONNECT from us for v5, will, session detach).

use std::time::Duration;

use tern_wire::{Disconnect, Packet, Properties, ReasonCode};
use tokio::task::JoinHandle;

use super::{Close, Conn};
use crate::outbound::encode_packet;
use crate::session::registry;
use crate::will;

/// How long the writer gets to flush and send the final DISCONNECT.
const WRITER_CLOSE_TIMEOUT_MS: u64 = 2_000;

impl Conn {
    pub(super) fn on_disconnect(&mut self, disconnect: Disconnect) -> Close {
        if let Some(expiry_s) = disconnect.properties.session_expiry_interval_s {
            if self.connect_expiry_zero && expiry_s != 0 {
                // MQTT-3.14.2-2: cannot turn a session that ends with the connection into a
                // persistent one.
                return Close::Protocol(ReasonCode::PROTOCOL_ERROR);
            }
            let granted = expiry_s.min(self.shared.config.max_session_expiry_interval_s);
            self.session.state.lock().expiry_interval_s = granted;
        }
        Close::ClientDisconnect {
            send_will: disconnect.reason == ReasonCode::DISCONNECT_WITH_WILL_MESSAGE,
        }
    }

    pub(super) async fn finish(mut self, close: Close, writer: JoinHandle<()>) {
        let final_reason = match close {
            Close::Protocol(reason) => Some(reason),
            Close::KeepAlive => Some(ReasonCode::KEEP_ALIVE_TIMEOUT),
            Close::Kicked(reason) if reason != ReasonCode::UNSPECIFIED_ERROR => Some(reason),
            Close::Shutdown => Some(ReasonCode::SERVER_SHUTTING_DOWN),
            _ => None,
        };
        let final_packet = final_reason
            .filter(|_| self.protocol.is_v5())
            .and_then(|reason| {
                let packet = Packet::Disconnect(Disconnect {
                    reason,
                    properties: Properties::default(),
                });
                encode_packet(&packet, self.protocol, &mut self.scratch)
            });
        self.ctl.close(final_packet);
        let abort = writer.abort_handle();
        if tokio::time::timeout(Duration::from_millis(WRITER_CLOSE_TIMEOUT_MS), writer)
            .await
            .is_err()
        {
            abort.abort();
        }
        let send_will = match close {
            Close::ClientDisconnect { send_will } => send_will,
            Close::Shutdown => false,
            Close::Lost | Close::Protocol(_) | Close::KeepAlive | Close::Kicked(_) => true,
        };
        if let Some(will) = self.will.take() {
            if send_will {
                will::trigger(&self.shared, &self.session, self.conn_gen, &will);
            }
        }
        registry::detach(&self.shared, &self.session, self.conn_gen);
    }
}
