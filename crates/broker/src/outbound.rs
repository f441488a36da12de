//! The outbound side of a session: control packets, the ordered delivery queue, the in-flight
//! window, and the writer task that drains them into the socket with vectored writes.
//!
//! Publishers push [`Outgoing`] items under the session lock and wake the writer
//! ([`crate::session::ConnCtl::wake`]); the writer takes a batch under the same lock
//! ([`Outbound::fill_batch`]), releases it and writes.
//!
//! # Invariants
//! - Control packets and deliveries leave in the order they were queued (a PINGRESP is a
//!   barrier), except that control packets overtake a head delivery that waits for the
//!   in-flight window: acks and PUBRELs never wait for the client's acks.
//! - Deliveries leave in queue order; a QoS>0 delivery that finds the window full stops the
//!   queue (QoS 0 behind it waits too), so the publisher's order is kept per subscriber.
//! - `inflight.len() <= window` except right after a reconnect with a smaller window, when
//!   all in-flight messages are still resent in their original order ([MQTT-4.4.0-1]).
//! - `queued_bytes` / `queued_reliable` always equal the sums over `queue`; QoS 0 is refused
//!   past `outbound_queue_max_*`, QoS>0 past `max_queued_messages` drops the oldest QoS>0.
//! - Packet ids in `inflight` are exactly those held by `packet_ids`.
//!
//! # Full queues (ARCHITECTURE §2.7)
//! [`Outbound::push`] never blocks the publisher. Over `outbound_queue_max_bytes` /
//! `outbound_queue_max_messages`, QoS 0 to an online session is refused (counted in
//! `messages_dropped_queue_full`); QoS>0 is still queued for the session (bounded by
//! `max_queued_messages`) and delivered as the subscriber catches up. That QoS>0 branch is the
//! hand-off point to the durable store: for a persistent session the over-limit item need not be
//! held in memory, the session's store cursor already describes it. A queue that stays over
//! the limit for `slow_subscriber_timeout_ms` reports [`PushResult::SlowSubscriber`] and the
//! router disconnects the subscriber (0x97, `slow_subscribers_disconnected`).

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
use tern_wire::{Ack, Delivery, Packet, Properties, Protocol, QoS, ReasonCode, encode};
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::time::Instant;

use crate::config::BrokerConfig;
use crate::message::Message;
use crate::metrics::Metrics;
use crate::packet_ids::PacketIds;
use crate::session::{ConnCtl, Session};
use crate::topic_alias::OutboundAliases;

/// Packets taken per batch: enough to amortise the syscall (64 → 256 took 1 pub → 1 sub QoS 0
/// from ~850k to ~1M msg/s), small enough to keep the session lock short (~10 µs).
pub const MAX_BATCH_PACKETS: usize = 256;
/// Queue capacity an empty queue may keep; beyond it the memory is returned.
const IDLE_QUEUE_CAPACITY: usize = 64;
/// Scratch reserved for the per-delivery heads of a batch.
const HEAD_SCRATCH_BYTES: usize = 4096;
/// Bytes taken per batch: with large payloads the packet count alone would let one batch (which
/// is written to the end even when the connection is closing) grow to megabytes.
pub const MAX_BATCH_BYTES: usize = 256 * 1024;
/// Slices per `write_vectored` call (IOV_MAX is far above this everywhere we run).
const MAX_IO_SLICES: usize = 512;

/// One message on its way to one subscriber.
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub message: Arc<Message>,
    /// Already downgraded to the subscription's QoS.
    pub qos: QoS,
    pub retain: bool,
    pub subscription_ids: Vec<u32>,
    /// `$share/{group}/{filter}` if routed through a share group (for redistribution).
    pub share: Option<Arc<str>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// PUBLISH sent, waiting for PUBACK (QoS 1) or PUBREC (QoS 2).
    AwaitingAck,
    /// PUBREC received, PUBREL sent (or to send), waiting for PUBCOMP.
    PubRelPending,
}

#[derive(Debug)]
pub struct Inflight {
    pub packet_id: u16,
    pub item: Outgoing,
    pub phase: Phase,
    /// Set on reconnect: resend (PUBLISH with DUP=1, or PUBREL).
    pub needs_send: bool,
}

/// What happened to a pushed item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushResult {
    Queued,
    /// Refused (QoS 0 over the limits, or QoS 0 for an offline session).
    Dropped,
    /// Queued, but the oldest QoS>0 message was dropped to make room.
    QueuedDroppedOldest,
    /// The queue has been full longer than the slow subscriber timeout.
    SlowSubscriber,
}

#[derive(Debug, Default)]
pub struct Outbound {
    /// Control packets, each with the value of `pushed_total` when it was queued.
    pub control: VecDeque<(u64, Bytes)>,
    pub queue: VecDeque<Outgoing>,
    pub queued_bytes: usize,
    pub queued_reliable: usize,
    pub inflight: VecDeque<Inflight>,
    pub packet_ids: PacketIds,
    /// min(client Receive Maximum, max_inflight_messages) of the current connection.
    pub window: usize,
    pub full_since: Option<Instant>,
    /// QoS>0 messages dropped because `max_queued_messages` was reached (for log pacing).
    pub dropped_oldest: u64,
    /// Deliveries ever pushed into / removed from `queue` (their difference is its length).
    pub pushed_total: u64,
    pub removed_total: u64,
}

impl Outbound {
    pub fn push(
        &mut self,
        item: Outgoing,
        online: bool,
        config: &BrokerConfig,
        now: Instant,
    ) -> PushResult {
        let len = item.message.approx_len();
        let over = self.queued_bytes + len > config.outbound_queue_max_bytes
            || self.queue.len() >= config.outbound_queue_max_messages;
        let mut result = PushResult::Queued;
        if item.qos == QoS::AtMostOnce {
            if !online {
                return PushResult::Dropped;
            }
            if over {
                return self.note_full(config, now).unwrap_or(PushResult::Dropped);
            }
        } else {
            if self.queued_reliable >= config.max_queued_messages {
                if let Some(index) = self.queue.iter().position(|o| o.qos != QoS::AtMostOnce) {
                    if let Some(old) = self.queue.remove(index) {
                        self.account_removed(&old);
                    }
                }
                result = PushResult::QueuedDroppedOldest;
                self.dropped_oldest += 1;
            }
            if over && online {
                if let Some(slow) = self.note_full(config, now) {
                    result = slow;
                }
            }
        }
        self.queued_bytes += len;
        if item.qos != QoS::AtMostOnce {
            self.queued_reliable += 1;
        }
        self.pushed_total += 1;
        self.queue.push_back(item);
        result
    }

    /// Records that the queue is full; `Some(SlowSubscriber)` once it stayed full too long.
    fn note_full(&mut self, config: &BrokerConfig, now: Instant) -> Option<PushResult> {
        let since = *self.full_since.get_or_insert(now);
        (now.saturating_duration_since(since) >= config.slow_subscriber_timeout())
            .then_some(PushResult::SlowSubscriber)
    }

    fn account_removed(&mut self, item: &Outgoing) {
        self.removed_total += 1;
        self.queued_bytes = self.queued_bytes.saturating_sub(item.message.approx_len());
        if item.qos != QoS::AtMostOnce {
            self.queued_reliable = self.queued_reliable.saturating_sub(1);
        }
    }

    /// A new connection attached: forget the old connection's control packets, resend every
    /// in-flight message in order.
    pub fn attach(&mut self, window: usize) {
        self.control.clear();
        self.window = window.max(1);
        self.full_since = None;
        for entry in &mut self.inflight {
            entry.needs_send = true;
        }
    }

    /// The connection went away: QoS 0 is not kept for an offline session.
    pub fn detach(&mut self) {
        self.control.clear();
        self.full_since = None;
        let queue = std::mem::take(&mut self.queue);
        for item in queue {
            if item.qos == QoS::AtMostOnce {
                self.account_removed(&item);
            } else {
                self.queue.push_back(item);
            }
        }
    }

    /// Takes every queued and unacknowledged (not yet PUBREC'd) message routed via a share
    /// group, for redelivery to another member.
    pub fn take_shared(&mut self) -> Vec<Outgoing> {
        let mut taken = Vec::new();
        let queue = std::mem::take(&mut self.queue);
        for item in queue {
            if item.share.is_some() {
                self.account_removed(&item);
                taken.push(item);
            } else {
                self.queue.push_back(item);
            }
        }
        let inflight = std::mem::take(&mut self.inflight);
        for entry in inflight {
            if entry.item.share.is_some() && entry.phase == Phase::AwaitingAck {
                self.packet_ids.release(entry.packet_id);
                taken.push(entry.item);
            } else {
                self.inflight.push_back(entry);
            }
        }
        taken
    }

    /// PUBACK from the subscriber. `None` for an unknown id (ignored, as the spec allows).
    pub fn on_puback(&mut self, packet_id: u16) -> Option<Inflight> {
        self.remove_inflight(packet_id, |e| {
            e.phase == Phase::AwaitingAck && e.item.qos == QoS::AtLeastOnce
        })
    }

    /// PUBREC from the subscriber: true if the id was awaiting it (or already PUBREL pending:
    /// a duplicate PUBREC is answered with PUBREL again).
    pub fn on_pubrec(&mut self, packet_id: u16, accepted: bool) -> bool {
        let Some(index) = self
            .inflight
            .iter()
            .position(|e| e.packet_id == packet_id && e.item.qos == QoS::ExactlyOnce)
        else {
            return false;
        };
        if !accepted {
            // v5 PUBREC with a failure reason ends the exchange ([MQTT-4.3.3-4] note).
            if let Some(entry) = self.inflight.remove(index) {
                self.packet_ids.release(entry.packet_id);
            }
            return true;
        }
        if let Some(entry) = self.inflight.get_mut(index) {
            entry.phase = Phase::PubRelPending;
            entry.needs_send = false;
        }
        true
    }

    /// The store position of the in-flight message `packet_id`, if it was stored.
    pub fn stored_ref(&self, packet_id: u16) -> Option<crate::persist::StoreRef> {
        self.inflight
            .iter()
            .find(|e| e.packet_id == packet_id)
            .and_then(|e| e.item.message.store_ref())
    }

    /// Drops queued (not in-flight) stored messages whose position retention removed from the
    /// store: the session skips ahead over the removed range once. Returns how many.
    pub fn drop_removed(&mut self, removed: &[(u16, std::ops::RangeInclusive<u64>)]) -> usize {
        let gone = |o: &Outgoing| {
            o.message.store_ref().is_some_and(|r| {
                removed
                    .iter()
                    .any(|(stream, range)| *stream == r.stream && range.contains(&r.seq))
            })
        };
        if !self.queue.iter().any(gone) {
            return 0;
        }
        let queue = std::mem::take(&mut self.queue);
        let mut dropped = 0;
        for item in queue {
            if gone(&item) {
                self.account_removed(&item);
                dropped += 1;
            } else {
                self.queue.push_back(item);
            }
        }
        dropped
    }

    /// Appends the store positions of every stored message this session still holds (in
    /// flight or queued) to `out`, for its durable cursor.
    pub fn held(&self, out: &mut crate::persist::HeldSeqs) {
        let refs = self
            .inflight
            .iter()
            .map(|e| &e.item)
            .chain(self.queue.iter())
            .filter_map(|o| o.message.store_ref());
        out.extend(refs.map(|r| (r.stream, r.seq)));
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
            .inflight
            .iter()
            .position(|e| e.packet_id == packet_id && accept(e))?;
        let entry = self.inflight.remove(index)?;
        self.packet_ids.release(packet_id);
        Some(entry)
    }

    /// Queues a control packet (ack, SUBACK, PINGRESP, PUBREL) behind every delivery already
    /// queued: a PINGRESP then works as a barrier for what was routed before the PINGREQ.
    pub fn push_control(&mut self, packet: Bytes) {
        self.control.push_back((self.pushed_total, packet));
    }

    /// Queues a control packet ahead of everything (CONNACK).
    pub fn push_control_first(&mut self, packet: Bytes) {
        self.control.push_front((0, packet));
    }

    /// Moves up to [`MAX_BATCH_PACKETS`] packets into `parts` (each packet one or two `Bytes`).
    pub fn fill_batch(
        &mut self,
        writer: &mut WriterState,
        config: &BrokerConfig,
        metrics: &Metrics,
        now: Instant,
        parts: &mut Vec<Bytes>,
    ) {
        let mut packets = 0;
        // Counted once per batch: the counter is shared by every connection.
        let mut sent = 0;
        let mut resends_done = false;
        let mut head_blocked = false;
        // Heads are a few bytes each: one allocation for the batch's heads, not one per head.
        if writer.head.capacity() < HEAD_SCRATCH_BYTES / 4 {
            writer.head.reserve(HEAD_SCRATCH_BYTES);
        }
        let mut counted_parts = parts.len();
        let mut batch_bytes = 0;
        while packets < MAX_BATCH_PACKETS {
            batch_bytes += parts[counted_parts..].iter().map(Bytes::len).sum::<usize>();
            counted_parts = parts.len();
            if batch_bytes >= MAX_BATCH_BYTES {
                break;
            }
            // A control packet goes once the deliveries queued before it left, or at once when
            // the head delivery waits for the window (acks must never wait behind it).
            if let Some(&(mark, _)) = self.control.front() {
                if mark <= self.removed_total || head_blocked {
                    if let Some((_, packet)) = self.control.pop_front() {
                        parts.push(packet);
                        packets += 1;
                    }
                    continue;
                }
            }
            if !resends_done {
                resends_done = true;
                packets += self.resend(writer, now, parts, MAX_BATCH_PACKETS - packets);
                continue;
            }
            let Some(front) = self.queue.front() else {
                break;
            };
            if front.qos != QoS::AtMostOnce && self.inflight.len() >= self.window {
                if self.control.is_empty() {
                    break;
                }
                head_blocked = true;
                continue;
            }
            let Some(item) = self.queue.pop_front() else {
                break;
            };
            self.account_removed(&item);
            if item.message.is_expired(now) {
                Metrics::add(&metrics.messages_dropped, 1);
                continue;
            }
            if !writer.fits(&item, now) {
                // MQTT-3.1.2-25: too large for this client; for QoS>0 it counts as delivered.
                Metrics::add(&metrics.messages_dropped, 1);
                continue;
            }
            let packet_id = if item.qos == QoS::AtMostOnce {
                0
            } else {
                // A stored message always goes out under the id derived from its place in the
                // store, so a resend after a restart carries the id the subscriber saw. If
                // that id is still in flight, the queue waits (order is kept).
                let id = match item.message.store_ref() {
                    Some(stored) => {
                        let id = stored.packet_id();
                        self.packet_ids.take(id).then_some(id)
                    }
                    None => self.packet_ids.allocate(),
                };
                let Some(packet_id) = id else {
                    // The derived packet id is still in flight (or, without a store, all
                    // ids are): keep the message at the front.
                    self.queued_bytes += item.message.approx_len();
                    self.queued_reliable += 1;
                    self.removed_total -= 1;
                    self.queue.push_front(item);
                    // Control packets behind it (a PUBREL that frees the id, say) still go.
                    if self.control.is_empty() || head_blocked {
                        break;
                    }
                    head_blocked = true;
                    continue;
                };
                packet_id
            };
            if writer.encode_publish(&item, packet_id, false, now, parts) {
                packets += 1;
                sent += 1;
            }
            if item.qos != QoS::AtMostOnce {
                self.inflight.push_back(Inflight {
                    packet_id,
                    item,
                    phase: Phase::AwaitingAck,
                    needs_send: false,
                });
            }
        }
        if sent > 0 {
            Metrics::add(&metrics.messages_sent, sent);
        }
        if self.queued_bytes <= config.outbound_queue_max_bytes
            && self.queue.len() < config.outbound_queue_max_messages
        {
            self.full_since = None;
        }
        self.release_idle_capacity(packets == 0);
    }

    /// Resends in-flight messages marked on reconnect, in their original order: PUBLISH with
    /// DUP=1, or PUBREL once PUBREC was received ([MQTT-4.4.0-1]). Returns packets added.
    fn resend(
        &mut self,
        writer: &mut WriterState,
        now: Instant,
        parts: &mut Vec<Bytes>,
        budget: usize,
    ) -> usize {
        let mut packets = 0;
        for entry in self.inflight.iter_mut().filter(|e| e.needs_send) {
            if packets >= budget {
                break;
            }
            entry.needs_send = false;
            packets += 1;
            match entry.phase {
                Phase::PubRelPending => {
                    if let Some(bytes) = writer.encode_pubrel(entry.packet_id) {
                        parts.push(bytes);
                    }
                }
                Phase::AwaitingAck => {
                    // An expired one still goes out: the exchange must finish and the client
                    // may already have seen it.
                    let item = entry.item.clone();
                    writer.encode_publish(&item, entry.packet_id, true, now, parts);
                }
            }
        }
        packets
    }

    /// A burst must not leave an idle session holding its high-water mark of queue memory.
    /// When the writer is about to go idle (`idle`: this batch took nothing), empty queues give
    /// up all their memory: the CONNACK alone left ~160 B of control queue on every idle
    /// connection (measured with heaptrack at 4,000 connections).
    fn release_idle_capacity(&mut self, idle: bool) {
        let keep = if idle { 0 } else { IDLE_QUEUE_CAPACITY };
        if self.queue.is_empty() && self.queue.capacity() > keep {
            self.queue = VecDeque::new();
        }
        if self.control.is_empty() && self.control.capacity() > keep {
            self.control = VecDeque::new();
        }
        if self.inflight.is_empty() && self.inflight.capacity() > keep {
            self.inflight = VecDeque::new();
        }
        self.packet_ids.shrink_if_idle();
    }
}

/// Per-connection encoder state of the writer.
#[derive(Debug)]
pub struct WriterState {
    pub protocol: Protocol,
    /// The client's Maximum Packet Size (v5), `u32::MAX` if it set none.
    pub max_packet_size_bytes: u32,
    pub aliases: OutboundAliases,
    head: BytesMut,
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
    fn fits(&self, item: &Outgoing, now: Instant) -> bool {
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
    fn encode_publish(
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

    fn encode_pubrel(&mut self, packet_id: u16) -> Option<Bytes> {
        let packet = Packet::PubRel(Ack {
            packet_id,
            reason: ReasonCode::SUCCESS,
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
/// connection and this one is closing.
pub async fn run_writer(
    shared: Arc<crate::broker::Shared>,
    session: Arc<Session>,
    ctl: Arc<ConnCtl>,
    conn_gen: u64,
    mut socket: OwnedWriteHalf,
    mut writer: WriterState,
) {
    let mut parts: Vec<Bytes> = Vec::new();
    loop {
        if !ctl.is_closing() {
            let mut state = session.state.lock();
            if state.conn_gen == conn_gen && !state.ended {
                state.out.fill_batch(
                    &mut writer,
                    &shared.config,
                    &shared.metrics,
                    Instant::now(),
                    &mut parts,
                );
            }
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
            ctl.wake.notified().await;
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

async fn write_all(
    socket: &mut OwnedWriteHalf,
    parts: &mut Vec<Bytes>,
    metrics: &Metrics,
) -> io::Result<()> {
    let mut first = 0;
    while first < parts.len() {
        let end = parts.len().min(first + MAX_IO_SLICES);
        let slices: Vec<IoSlice<'_>> = parts[first..end].iter().map(|b| IoSlice::new(b)).collect();
        let mut written = socket.write_vectored(&slices).await?;
        drop(slices);
        if written == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        Metrics::add(&metrics.bytes_sent, written as u64);
        while written > 0 {
            let Some(part) = parts.get_mut(first) else {
                break;
            };
            if written >= part.len() {
                written -= part.len();
                first += 1;
            } else {
                part.advance(written);
                written = 0;
            }
        }
        while parts.get(first).is_some_and(|p| p.is_empty()) {
            first += 1;
        }
    }
    parts.clear();
    Ok(())
}

#[cfg(test)]
mod tests;
