//! The per-connection encoder state of a session's writer ([`WriterState`]) and the buffers
//! of one batch ([`BatchBufs`]); the connection's socket writer over them is
//! `connection::outflow`.

use bytes::{Bytes, BytesMut};
use tern_wire::{
    Ack, Delivery, Packet, Properties, Protocol, PublishShape, QoS, ReasonCode, encode,
};
use tokio::time::Instant;

use super::Outgoing;
use crate::model::message::Message;
use crate::state::topic_alias::OutboundAliases;

/// Largest payload a single-subscriber delivery copies into the batch buffer; a larger one is
/// written from the payload's own buffer (one more part, no copy).
const INLINE_BODY_MAX_BYTES: usize = 512;

/// Per-connection encoder state of the writer.
#[derive(Debug)]
pub struct WriterState {
    pub(crate) protocol: Protocol,
    /// The client's Maximum Packet Size (v5), `u32::MAX` if it set none.
    pub(crate) max_packet_size_bytes: u32,
    pub(crate) aliases: OutboundAliases,
}

/// The buffers of the batch being built and written. `connection::outflow::Outflow` keeps them boxed only while a
/// batch is in progress: in every idle connection's task they would be 56 B of empty buffers.
#[derive(Debug, Default)]
pub struct BatchBufs {
    /// The batch buffer: heads, small single-subscriber packets and PUBRELs of the batch being
    /// built, not yet moved into `parts` ([`BatchBufs::flush`]).
    pub(super) head: BytesMut,
    /// The batch's parts, in order; while written, what the transport has not taken yet.
    pub(crate) parts: Vec<Bytes>,
}

impl BatchBufs {
    /// Moves what was written into the batch buffer so far into `parts`, as one part: called
    /// before a part from elsewhere is pushed (it keeps its place after them) and when the
    /// batch is complete. Between batches the buffer holds nothing.
    pub(super) fn flush(&mut self) {
        if !self.head.is_empty() {
            self.parts.push(self.head.split().freeze());
        }
    }

    /// The batch's parts, taken out (what a transport would write).
    #[cfg(test)]
    pub(crate) fn take_parts(&mut self) -> Vec<Bytes> {
        std::mem::take(&mut self.parts)
    }

    /// The batch's parts.
    #[cfg_attr(not(feature = "__internal"), allow(dead_code))] // only tests reach it (`__internal`)
    pub fn parts(&self) -> &[Bytes] {
        &self.parts
    }

    /// Forgets the batch's parts and keeps their list's room (as a busy writer does).
    #[cfg_attr(not(feature = "__internal"), allow(dead_code))] // only tests reach it (`__internal`)
    pub fn clear(&mut self) {
        self.parts.clear();
    }
}

impl WriterState {
    pub fn new(protocol: Protocol, max_packet_size_bytes: u32, topic_alias_maximum: u16) -> Self {
        WriterState {
            protocol,
            max_packet_size_bytes,
            aliases: OutboundAliases::new(topic_alias_maximum),
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
        let delivery = Delivery {
            qos: item.qos,
            dup: false,
            retain: item.retain,
            packet_id: 1,
            topic_alias: self.protocol.is_v5().then_some(1),
            send_topic: true,
            subscription_identifiers: self.subscription_ids(item),
        };
        let packet_len = match item.message.plain_shape(self.protocol) {
            Some(shape) => shape.packet_len(&delivery),
            None => match item.message.template(self.protocol, now) {
                Some(template) => template.packet_len(&delivery),
                None => return false,
            },
        };
        packet_len <= self.max_packet_size_bytes as usize
    }

    /// Appends the packet for `item` to the batch. False if it could not be encoded.
    pub(super) fn encode_publish(
        &mut self,
        item: &Outgoing,
        packet_id: u16,
        dup: bool,
        now: Instant,
        out: &mut BatchBufs,
    ) -> bool {
        if !item.message.fans_out() {
            if let Some(shape) = item.message.plain_shape(self.protocol) {
                let delivery = self.delivery(item, packet_id, dup);
                self.write_single(shape, &delivery, out);
                return true;
            }
        }
        let Some(template) = item.message.template(self.protocol, now).or_else(|| {
            // An expired in-flight resend still needs a packet: encode without expiry.
            let mut copy = Message::clone_for_resend(&item.message);
            copy.properties.message_expiry_interval_s = None;
            copy.template(self.protocol, now)
        }) else {
            return false;
        };
        let delivery = self.delivery(item, packet_id, dup);
        if delivery.qos == QoS::AtMostOnce
            && delivery.topic_alias.is_none()
            && delivery.subscription_identifiers.is_empty()
        {
            out.flush();
            out.parts.push(template.qos0_packet(item.retain));
            return true;
        }
        template.write_head(&delivery, &mut out.head);
        out.flush();
        out.parts.push(template.body().clone());
        true
    }

    /// The per-delivery fields of `item` (takes or assigns its topic alias).
    fn delivery<'a>(&mut self, item: &'a Outgoing, packet_id: u16, dup: bool) -> Delivery<'a> {
        let (topic_alias, send_topic) = if self.protocol.is_v5() {
            self.aliases.lookup(&item.message.topic)
        } else {
            (None, true)
        };
        Delivery {
            qos: item.qos,
            dup,
            retain: item.retain,
            packet_id,
            topic_alias,
            send_topic,
            subscription_identifiers: self.subscription_ids(item),
        }
    }

    /// A message for this subscriber alone: head and (small) payload go into the batch buffer,
    /// contiguous with the packets before and after it, without a template. The payload is
    /// copied once, as building a shared packet would; a large one is referenced instead.
    fn write_single(
        &mut self,
        shape: PublishShape<'_>,
        delivery: &Delivery<'_>,
        out: &mut BatchBufs,
    ) {
        shape.write_head(delivery, &mut out.head);
        let body = shape.body();
        if body.len() <= INLINE_BODY_MAX_BYTES {
            out.head.extend_from_slice(body);
        } else {
            out.flush();
            out.parts.push(body.clone());
        }
    }

    /// Writes a PUBREL into the batch buffer. False (logged) only on a programming error.
    pub(super) fn encode_pubrel(
        &mut self,
        packet_id: u16,
        reason: ReasonCode,
        out: &mut BatchBufs,
    ) -> bool {
        let packet = Packet::PubRel(Ack {
            packet_id,
            reason,
            properties: Properties::default(),
        });
        let start = out.head.len();
        match encode(&packet, self.protocol, &mut out.head) {
            Ok(()) => true,
            Err(error) => {
                tracing::error!(%error, ?packet, "cannot encode packet");
                // Only this packet's bytes: the ones before it are packets of the batch.
                out.head.truncate(start);
                false
            }
        }
    }
}

/// Encodes one control packet; `None` (logged) only on a programming error.
pub(crate) fn encode_packet(
    packet: &Packet,
    protocol: Protocol,
    scratch: &mut BytesMut,
) -> Option<Bytes> {
    match encode(packet, protocol, scratch) {
        Ok(()) => Some(scratch.split().freeze()),
        Err(error) => {
            tracing::error!(%error, ?packet, "cannot encode packet");
            scratch.clear();
            None
        }
    }
}
