//! The end of a connection: DISCONNECT from the client, then the shared close path (final
//! DISCONNECT from us for v5, will, session detach).

use std::time::Duration;

use tern_wire::{Disconnect, Packet, Properties, ReasonCode, Str, encoded_len};

use super::outflow::Outflow;
use super::{Close, Conn};
use crate::engine::Shared;
use crate::engine::registry;
use crate::engine::will;
use crate::metrics::Metrics;
use crate::state::outbound::encode_packet;
use crate::transport::TransportWrite;

/// How long the last writes get when there is no DISCONNECT to send.
const WRITER_CLOSE_TIMEOUT_MS: u64 = 2_000;
/// How long the last writes and our DISCONNECT get.
const WRITER_FINAL_PACKET_TIMEOUT_MS: u64 = 10_000;
/// How long a closing connection waits for its outstanding store writes.
const PIPELINE_DRAIN_TIMEOUT_MS: u64 = 5_000;

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

    /// The close path. True if the socket should linger (`linger`): the broker started the
    /// close and everything, its reason included, was written and the writing side shut down.
    pub(super) async fn finish<W: TransportWrite>(
        &mut self,
        close: Close,
        out: &mut Outflow<W>,
        io: &mut W::Io,
    ) -> bool {
        // Writes already issued still complete: deliver what they made durable (a QoS 2
        // message recorded as received must reach its subscribers, since the client's retry
        // will be answered as a duplicate), and acknowledge it, in packet order, in the
        // writer's last write (MQTT-3.3.4-1). Without the acks a 3.1.1 publisher refused at a
        // bound (closed: no negative PUBACK) resent what had been accepted on every
        // connection, each time followed by the next refused message: a livelock
        // (docs/simulation.md, finding 13).
        let last_acks = match self.inflight.take() {
            Some(inflight) => self.settle_in_flight(*inflight).await,
            None => Vec::new(),
        };
        // Everything this connection will ever route is out: the next connection of this
        // client, waiting in its handshake, may start (`close::await_predecessor`).
        self.ctl.set_routed();
        let final_packet = self.final_disconnect(close);
        // The control packets still queued for this connection (a CONNACK it never got to
        // write, MQTT-3.2.0-1; acks and SUBACKs before the last acks) go first; a takeover's
        // new connection owns the queue once it attached.
        let mut queued = self.take_queued_control();
        queued.extend(last_acks);
        let final_packet = ahead_of(queued, final_packet);
        let has_final_packet = final_packet.is_some();
        self.settle_will(close);
        // The session is released before the last writes: a client that does not read must
        // not hold the session (or its will) hostage.
        registry::detach(&self.shared, &self.session, self.conn_gen);
        Metrics::sub(&self.shared.metrics.clients_connected, 1);
        // Then what is queued and our DISCONNECT get time to leave (a slow subscriber may read
        // it seconds later), bounded so that a dead peer cannot keep the task alive.
        let timeout_ms = if has_final_packet {
            WRITER_FINAL_PACKET_TIMEOUT_MS
        } else {
            WRITER_CLOSE_TIMEOUT_MS
        };
        let closed = out.close(io, &self.shared.metrics, final_packet);
        let shut_down = tokio::time::timeout(Duration::from_millis(timeout_ms), closed).await;
        // The client ended it (DISCONNECT, end of stream) or our writes failed: nothing to
        // wait for.
        let broker_started = !matches!(
            close,
            Close::ClientDisconnect { .. }
                | Close::Lost
                | Close::Kicked(ReasonCode::UNSPECIFIED_ERROR)
        );
        broker_started && shut_down == Ok(true)
    }

    /// The DISCONNECT a v5 client gets for a close the broker started, encoded; `None` for a
    /// 3.1.1 client (no DISCONNECT from a server) or a close the client started.
    fn final_disconnect(&self, close: Close) -> Option<bytes::Bytes> {
        let reason = match close {
            Close::Protocol(reason) => reason,
            Close::KeepAlive => ReasonCode::KEEP_ALIVE_TIMEOUT,
            Close::Kicked(reason) if reason != ReasonCode::UNSPECIFIED_ERROR => reason,
            Close::Shutdown => ReasonCode::SERVER_SHUTTING_DOWN,
            _ => return None,
        };
        if !self.protocol.is_v5() {
            return None;
        }
        // A reason string is allowed on DISCONNECT whatever Request Problem Information says,
        // but never at the cost of the client's Maximum Packet Size.
        let mut packet = Packet::Disconnect(Disconnect {
            reason,
            properties: tern_wire::PropertyValues {
                reason_string: reason_string(reason).map(Str::from_static),
                ..tern_wire::PropertyValues::default()
            }
            .into(),
        });
        let too_big = encoded_len(&packet, self.protocol)
            .map_or(true, |len| len > self.client_max_packet_size_bytes as usize);
        if too_big {
            packet = Packet::Disconnect(Disconnect {
                reason,
                properties: Properties::default(),
            });
        }
        encode_packet(&packet, self.protocol, &mut bytes::BytesMut::new())
    }

    /// The control packets still queued for this connection, unless a takeover's connection
    /// owns the queue already.
    fn take_queued_control(&self) -> Vec<bytes::Bytes> {
        let mut state = self.session.state.lock();
        if state.conn_gen == self.conn_gen {
            state.out.take_control()
        } else {
            Vec::new()
        }
    }

    /// Publishes, cancels or keeps the will, as the way the connection ended says.
    fn settle_will(&mut self, close: Close) {
        let send_will = match close {
            Close::ClientDisconnect { send_will } => Some(send_will),
            // The server closes the connection: its will is still owed (v5 §3.1.2.5), but the
            // broker is going away. Its durable record stays as it is, "connection open", so
            // the next start publishes it as it does after a crash.
            Close::Shutdown => None,
            Close::Lost | Close::Protocol(_) | Close::KeepAlive | Close::Kicked(_) => Some(true),
        };
        let Some(will) = self.will.take() else {
            return;
        };
        match send_will {
            Some(true) => will::trigger(
                &self.shared,
                &self.session,
                self.conn_gen,
                &will,
                self.will_token,
            ),
            // MQTT-3.1.2-10: removed from the session state, durably.
            Some(false) => will::cancel(&self.shared, &self.session.client_id, self.will_token),
            None => {}
        }
    }
}

/// One buffer for the writer's last write: the control packets still queued (acks above
/// all), then the final DISCONNECT if there is one.
fn ahead_of(mut packets: Vec<bytes::Bytes>, last: Option<bytes::Bytes>) -> Option<bytes::Bytes> {
    packets.extend(last);
    match packets.len() {
        0 => None,
        1 => packets.pop(),
        _ => Some(packets.concat().into()),
    }
}

/// How long a new connection waits for its client's previous connection to route what its
/// close path releases: that path waits up to `PIPELINE_DRAIN_TIMEOUT_MS` for its writes, and
/// a kicked read loop ends at its next poll.
const PREDECESSOR_ROUTED_TIMEOUT_MS: u64 = PIPELINE_DRAIN_TIMEOUT_MS + 1_000;

/// The takeover of MQTT-3.1.4-3, ahead of the attach: closes the client's live connection (v5:
/// DISCONNECT 0x8E) and waits until its close path has routed the deliveries its pending writes
/// release (QoS 2 messages recorded as received before the client dropped the connection).
/// Without the wait the new connection's messages overtook them: first deliveries out of
/// per-publisher order (MQTT-4.6.0-6), and an older retained value applied after a newer one
/// (docs/simulation.md finding 3).
pub(super) async fn await_predecessor(shared: &Shared, client_id: &str) {
    let Some(session) = shared.sessions.get(client_id) else {
        return;
    };
    let Some(ctl) = session.state.lock().conn.clone() else {
        return;
    };
    ctl.kick(ReasonCode::SESSION_TAKEN_OVER);
    let wait = Duration::from_millis(PREDECESSOR_ROUTED_TIMEOUT_MS);
    if tokio::time::timeout(wait, ctl.routed()).await.is_err() {
        tracing::warn!(
            client_id,
            "the previous connection did not close in time; taking over"
        );
    }
}

/// Human-readable text for the reasons we disconnect with.
fn reason_string(reason: ReasonCode) -> Option<&'static str> {
    Some(match reason {
        ReasonCode::MALFORMED_PACKET => "malformed packet",
        ReasonCode::PROTOCOL_ERROR => "protocol error",
        ReasonCode::SERVER_SHUTTING_DOWN => "server shutting down",
        ReasonCode::KEEP_ALIVE_TIMEOUT => "keep alive timeout",
        ReasonCode::SESSION_TAKEN_OVER => "session taken over by another connection",
        ReasonCode::TOPIC_NAME_INVALID => "topic name invalid",
        ReasonCode::RECEIVE_MAXIMUM_EXCEEDED => "receive maximum exceeded",
        ReasonCode::TOPIC_ALIAS_INVALID => "topic alias invalid",
        ReasonCode::PACKET_TOO_LARGE => "packet too large",
        ReasonCode::QUOTA_EXCEEDED => "outbound queue full for too long",
        ReasonCode::PAYLOAD_FORMAT_INVALID => "payload is not UTF-8",
        ReasonCode::ADMINISTRATIVE_ACTION => "administrative action",
        _ => return None,
    })
}

impl Conn {
    /// The close's part for the packets still in flight: waits (bounded) for the writes
    /// issued, then delivers and acknowledges what they made durable, in packet order, and
    /// gives up the rest. Returns the acknowledgements for the last write.
    async fn settle_in_flight(
        &mut self,
        mut inflight: super::inflight::Inflight,
    ) -> Vec<bytes::Bytes> {
        let super::inflight::Inflight {
            pipeline, released, ..
        } = &mut inflight;
        let drained = tokio::time::timeout(
            Duration::from_millis(PIPELINE_DRAIN_TIMEOUT_MS),
            pipeline.drain(released),
        )
        .await;
        if drained.is_err() {
            tracing::warn!(client_id = %self.session.client_id, "store writes did not complete in time at close");
        }
        // The acks go in the writer's last write, not in the session's queue: that one is
        // cleared by `registry::detach` below before the writer runs again, and a closing
        // writer sends nothing but its final packet. Only the acks released here: acks queued
        // earlier, still waiting behind the queue's deliveries, are dropped as before (sending
        // them too turned seed 676 of 1,000 into first deliveries out of order, not
        // understood yet; docs/simulation.md, finding 13).
        let mut last_acks: Vec<bytes::Bytes> = Vec::new();
        let released = std::mem::take(released);
        super::encode_acks(
            &released,
            self.protocol,
            &mut bytes::BytesMut::new(),
            |ack| last_acks.push(ack),
        );
        for item in released {
            if let crate::state::ack_pipeline::Released::Deliver(message) = item {
                // Retained records were applied by the pipeline's release hook.
                crate::engine::route::route_released(&self.shared, message);
            }
        }
        // What never became durable is not delivered; the store must not wait for it either
        // (it would hold every persistent session's cursor back).
        for message in pipeline.abandon() {
            self.shared.store.messages.message_released(&message);
        }
        last_acks
    }
}
