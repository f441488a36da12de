//! The writer task of a connection and its per-connection encoder state.

use std::io;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tern_wire::{Ack, Delivery, Packet, Properties, Protocol, QoS, ReasonCode, encode};
use tokio::time::Instant;

use super::Outgoing;
use super::batch::BatchEnv;
use crate::message::Message;
use crate::metrics::Metrics;
use crate::persist::Ticket;
use crate::session::{ConnCtl, Session};
use crate::topic_alias::OutboundAliases;
use crate::transport::TransportWrite;

/// Per-connection encoder state of the writer.
#[derive(Debug)]
pub struct WriterState {
    pub protocol: Protocol,
    /// The client's Maximum Packet Size (v5), `u32::MAX` if it set none.
    pub max_packet_size_bytes: u32,
    pub aliases: OutboundAliases,
    pub(super) head: BytesMut,
}

impl WriterState {
    pub fn new(protocol: Protocol, max_packet_size_bytes: u32, topic_alias_maximum: u16) -> Self {
        WriterState {
            protocol,
            max_packet_size_bytes,
            aliases: OutboundAliases::new(topic_alias_maximum),
            head: BytesMut::new(),
        }
    }

    fn subscription_ids<'a>(&self, item: &'a Outgoing) -> &'a [u32] {
        if self.protocol.is_v5() {
            &item.subscription_ids
        } else {
            &[]
        }
    }

    /// Whether the largest form of this delivery fits the client's Maximum Packet Size.
    pub(super) fn fits(&self, item: &Outgoing, now: Instant) -> bool {
        if self.max_packet_size_bytes == u32::MAX {
            return true;
        }
        let Some(template) = item.message.template(self.protocol, now) else {
            return false;
        };
        let delivery = Delivery {
            qos: item.qos,
            dup: false,
            retain: item.retain,
            packet_id: 1,
            topic_alias: self.protocol.is_v5().then_some(1),
            send_topic: true,
            subscription_identifiers: self.subscription_ids(item),
        };
        template.packet_len(&delivery) <= self.max_packet_size_bytes as usize
    }

    /// Appends the packet for `item` to `parts`. False if it could not be encoded.
    pub(super) fn encode_publish(
        &mut self,
        item: &Outgoing,
        packet_id: u16,
        dup: bool,
        now: Instant,
        parts: &mut Vec<Bytes>,
    ) -> bool {
        let Some(template) = item.message.template(self.protocol, now).or_else(|| {
            // An expired in-flight resend still needs a packet: encode without expiry.
            let mut copy = Message::clone_for_resend(&item.message);
            copy.properties.message_expiry_interval_s = None;
            copy.template(self.protocol, now)
        }) else {
            return false;
        };
        let (topic_alias, send_topic) = if self.protocol.is_v5() {
            self.aliases.lookup(&item.message.topic)
        } else {
            (None, true)
        };
        let subscription_identifiers = self.subscription_ids(item);
        if item.qos == QoS::AtMostOnce
            && topic_alias.is_none()
            && subscription_identifiers.is_empty()
        {
            parts.push(template.qos0_packet(item.retain));
            return true;
        }
        let delivery = Delivery {
            qos: item.qos,
            dup,
            retain: item.retain,
            packet_id,
            topic_alias,
            send_topic,
            subscription_identifiers,
        };
        template.write_head(&delivery, &mut self.head);
        parts.push(self.head.split().freeze());
        parts.push(template.body().clone());
        true
    }

    pub(super) fn encode_pubrel(&mut self, packet_id: u16, reason: ReasonCode) -> Option<Bytes> {
        let packet = Packet::PubRel(Ack {
            packet_id,
            reason,
            properties: Properties::default(),
        });
        encode_packet(&packet, self.protocol, &mut self.head)
    }
}

/// Encodes one control packet; `None` (logged) only on a programming error.
pub fn encode_packet(packet: &Packet, protocol: Protocol, scratch: &mut BytesMut) -> Option<Bytes> {
    match encode(packet, protocol, scratch) {
        Ok(()) => Some(scratch.split().freeze()),
        Err(error) => {
            tracing::error!(%error, ?packet, "cannot encode packet");
            scratch.clear();
            None
        }
    }
}

/// The writer task of one connection. Ends when the connection closes (after sending the
/// final packet, if any), when the socket fails, or when the session moved to another
/// connection and this one is closing. Nothing is written before `connack_after` (the
/// session's and the will's records) is durable: the CONNACK is the first packet queued; if
/// that write failed, the connection closes without it.
pub async fn run_writer<W: TransportWrite>(
    shared: Arc<crate::broker::Shared>,
    session: Arc<Session>,
    ctl: Arc<ConnCtl>,
    conn_gen: u64,
    mut socket: W,
    mut writer: WriterState,
    connack_after: Option<Ticket>,
) {
    if let Some(mut ticket) = connack_after {
        if let Err(error) = ticket.wait().await {
            tracing::error!(%error, client_id = %session.client_id, "session state not written; closing the connection without CONNACK");
            ctl.kick(ReasonCode::UNSPECIFIED_ERROR);
            let _ = socket.shutdown().await;
            return;
        }
    }
    let mut parts: Vec<Bytes> = Vec::new();
    loop {
        let mut gate_failed = false;
        if !ctl.is_closing() {
            let mut state = session.state.lock();
            if state.conn_gen == conn_gen && !state.ended {
                let env = BatchEnv {
                    config: &shared.config,
                    metrics: &shared.metrics,
                    store: &*shared.store,
                    client_id: &session.client_id,
                    persistent: state.expiry_interval_s > 0,
                    now: Instant::now(),
                };
                state.out.fill_batch(&mut writer, &env, &mut parts);
                gate_failed = state.out.gate_failed();
            }
        }
        if gate_failed && parts.is_empty() {
            // A write the session's packets waited for failed: nothing more can leave safely.
            ctl.kick(ReasonCode::UNSPECIFIED_ERROR);
        }
        if parts.is_empty() {
            if ctl.is_closing() {
                if let Some(packet) = ctl.take_final_packet() {
                    parts.push(packet);
                    let _ = write_all(&mut socket, &mut parts, &shared.metrics).await;
                }
                let _ = socket.shutdown().await;
                return;
            }
            // Idle: keep no encoder scratch space, nor a part list (the one that carried the
            // CONNACK cost every idle connection 128 B).
            writer.head = BytesMut::new();
            parts = Vec::new();
            // Woken by new data, or by the store write the gate's front waits for.
            let gate = std::future::poll_fn(|cx| {
                let mut state = session.state.lock();
                if state.conn_gen == conn_gen && !state.ended {
                    state.out.poll_gate(cx)
                } else {
                    std::task::Poll::Pending
                }
            });
            tokio::select! {
                biased;
                _ = ctl.wake.notified() => {}
                _ = gate => {}
            }
            continue;
        }
        if let Err(error) = write_all(&mut socket, &mut parts, &shared.metrics).await {
            tracing::debug!(%error, "write failed; closing connection");
            ctl.kick(ReasonCode::UNSPECIFIED_ERROR);
            return;
        }
        ctl.drained.notify_one();
    }
}

/// Writes the batch. Its bytes are counted before the write, which keeps the count out of the
/// writer's future (every idle connection holds that future at its largest); a failed write
/// ends the connection anyway.
fn write_all<'a, W: TransportWrite>(
    socket: &'a mut W,
    parts: &'a mut Vec<Bytes>,
    metrics: &Metrics,
) -> impl std::future::Future<Output = io::Result<()>> + Send + 'a {
    let bytes: usize = parts.iter().map(Bytes::len).sum();
    Metrics::add(&metrics.bytes_sent, bytes as u64);
    socket.write_parts(parts)
}
