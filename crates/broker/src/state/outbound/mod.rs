//! The outbound side of a session: control packets, the ordered delivery queue, the in-flight
//! window, the release gate of packets that wait for a store write (`gate`), and the
//! connection's `Outflow` (`connection::outflow`) that drains them into the socket with vectored
//! writes; `writer` keeps the per-connection encoder state; `acks` takes the subscriber's PUBACK,
//! PUBREC and PUBCOMP.
//!
//! Publishers push [`Outgoing`] items under the session lock and wake the connection's task
//! ([`crate::state::session::ConnCtl::wake`]); its `Outflow` takes a batch under the same lock
//! ([`Outbound::fill_batch`], in `batch`), releases it and writes.
//!
//! # Invariants
//! - Control packets and deliveries leave in the order they were queued (a PINGRESP is a
//!   barrier), except that control packets overtake a head delivery that waits for the
//!   in-flight window: acks and PUBRELs never wait for the client's acks.
//! - Deliveries leave in queue order; a QoS>0 delivery that finds the window full stops the
//!   queue (QoS 0 behind it waits too), so the publisher's order is kept per subscriber.
//! - `inflight.len() <= window` except right after a reconnect with a smaller window, when
//!   all in-flight messages are still resent in their original order ([MQTT-4.4.0-1]).
//! - `queued_bytes` / `queued_reliable` / `queued_reliable_bytes` always equal the sums over
//!   `queue`; QoS 0 is refused past `outbound_queue_max_*` or while the broker-wide total is
//!   at `max_queued_bytes_total`, QoS>0 past `max_queued_messages` / `max_queued_bytes` drops
//!   the oldest QoS>0 (online or offline, also when a restored session is rebuilt).
//! - After every public method returns, the broker-wide total holds exactly this queue's
//!   `queued_bytes` for it (`sync_total`; `Drop` takes it back out).
//! - Packet ids in `inflight` are exactly those held by `packet_ids`: unique by construction
//!   (allocated, never derived), and a restored session reserves the ids it resends.
//! - An in-flight entry is `held` exactly while its next packet (first PUBLISH, or PUBREL)
//!   waits in the gate; held entries are never resent on reconnect (the gate sends them) and
//!   acks for them are ignored (the client cannot have seen them).
//!
//! # Full queues (ARCHITECTURE §2.7)
//! [`Outbound::push`] never blocks the publisher. Over `outbound_queue_max_bytes` /
//! `outbound_queue_max_messages`, QoS 0 to an online session is refused (counted in
//! `messages_dropped_queue_full`); QoS>0 is still queued for the session (bounded by
//! `max_queued_messages` / `max_queued_bytes`) and delivered as the subscriber catches up.
//! That QoS>0 branch could hand off to the durable store (for a persistent session the store
//! holds the message after its cursor), but not as things stand: the cursor is read at
//! start-up only, and the checkpoint moves it past whatever the session no longer holds
//! (ARCHITECTURE §6.1). A queue that stays over
//! the limit for `slow_subscriber_timeout_ms` reports [`PushResult::SlowSubscriber`] and the
//! router disconnects the subscriber (0x97, `slow_subscribers_disconnected`).

mod acks;
mod batch;
mod gate;
mod holds;
mod queues;
mod writer;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use tern_wire::QoS;
use tokio::time::Instant;

use crate::config::BrokerConfig;
use crate::metrics::QueuedTotals;
use crate::model::message::Message;
use crate::state::packet_ids::PacketIds;

pub use batch::BatchEnv;
pub(crate) use gate::{Gate, HeldPacket};
pub(crate) use queues::LazyQueues;
pub(crate) use writer::encode_packet;
pub use writer::{BatchBufs, WriterState};

/// Packets taken per batch: enough to amortise the syscall (64 → 256 took 1 pub → 1 sub QoS 0
/// from ~850k to ~1M msg/s), small enough to keep the session lock short (~10 µs).
pub(crate) const MAX_BATCH_PACKETS: usize = 256;
/// Queue capacity an empty queue may keep; beyond it the memory is returned.
const IDLE_QUEUE_CAPACITY: usize = 64;
/// Batch buffer reserved per batch: heads, and small packets written for one subscriber.
const HEAD_SCRATCH_BYTES: usize = 4096;
/// Bytes taken per batch: with large payloads the packet count alone would let one batch (which
/// is written to the end even when the connection is closing) grow to megabytes.
pub(crate) const MAX_BATCH_BYTES: usize = 256 * 1024;

/// The longest queue whose sums `debug_assert_sums` recomputes (debug builds).
const SUM_CHECK_MAX_ITEMS: usize = 64;

/// One message on its way to one subscriber.
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub message: Arc<Message>,
    /// Already downgraded to the subscription's QoS.
    pub(crate) qos: QoS,
    pub(crate) retain: bool,
    pub(crate) subscription_ids: Vec<u32>,
    /// `$share/{group}/{filter}` if routed through a share group (for redistribution).
    pub(crate) share: Option<Arc<str>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// PUBLISH sent, waiting for PUBACK (QoS 1) or PUBREC (QoS 2).
    AwaitingAck,
    /// PUBREC received, PUBREL sent (or to send), waiting for PUBCOMP.
    PubRelPending,
}

#[derive(Debug)]
pub struct Inflight {
    pub packet_id: u16,
    pub(crate) item: Outgoing,
    pub(crate) phase: Phase,
    /// Set on reconnect: resend (PUBLISH with DUP=1, or PUBREL).
    pub(crate) needs_send: bool,
    /// Its next packet waits in the gate for a store write (see the module invariants).
    pub(crate) held: bool,
}

/// What happened to a pushed item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushResult {
    Queued,
    /// Refused (QoS 0 over the limits, or QoS 0 for an offline session).
    Dropped,
    /// QoS 0 refused: every session's queues together hold `max_queued_bytes_total`.
    DroppedMemoryLimit,
    /// Queued, but the oldest QoS>0 messages were dropped to make room
    /// (`max_queued_messages` / `max_queued_bytes`; `dropped_oldest` counts them).
    QueuedDroppedOldest,
    /// The queue has been full longer than the slow subscriber timeout.
    SlowSubscriber,
}

#[derive(Debug, Default)]
pub struct Outbound {
    /// Control packets, queued deliveries, the in-flight window and the gate: allocated while
    /// they hold something ([`LazyQueues`]).
    queues: LazyQueues,
    queued_bytes: usize,
    /// QoS>0 messages in `queue`: at most `max_queued_messages`, which config validation keeps
    /// within u32 (4 bytes beside `window` where 8 would grow every session's block).
    queued_reliable: u32,
    /// Of `queued_bytes`: the QoS>0 messages' (the measure of `max_queued_bytes`).
    queued_reliable_bytes: usize,
    /// Inline, not in the queues: its counter keeps ids rotating across idle periods.
    packet_ids: PacketIds,
    /// min(client Receive Maximum, max_inflight_messages) of the current connection (both
    /// u16 in the protocol and the config).
    pub(crate) window: u16,
    /// QoS>0 messages dropped because `max_queued_messages` was reached (for log pacing).
    pub(crate) dropped_oldest: u64,
    /// Deliveries ever pushed into / removed from `queue` (their difference is its length).
    pushed_total: u64,
    removed_total: u64,
    /// The broker-wide queued bytes and deliveries this queue counts into
    /// ([`Outbound::count_into`]).
    totals: Option<Arc<QueuedTotals>>,
    /// What this queue's share of `totals.bytes` is (`queued_bytes` as of the last sync).
    reported: usize,
    /// This queue's share of `totals.messages` (`queue.len()` as of the last sync).
    reported_messages: usize,
}

impl Drop for Outbound {
    fn drop(&mut self) {
        if let Some(totals) = &self.totals {
            totals.bytes.fetch_sub(self.reported, Ordering::Relaxed);
            totals
                .messages
                .fetch_sub(self.reported_messages, Ordering::Relaxed);
        }
    }
}

impl Outbound {
    /// Counts this queue's bytes (the broker-wide `max_queued_bytes_total` measure) and
    /// length (the queued deliveries) into `totals` from now on. Set once.
    pub fn count_into(&mut self, totals: Arc<QueuedTotals>) {
        if self.totals.is_none() {
            totals.bytes.fetch_add(self.queued_bytes, Ordering::Relaxed);
            self.reported = self.queued_bytes;
            let len = self.queues.queue.len();
            totals.messages.fetch_add(len, Ordering::Relaxed);
            self.reported_messages = len;
            self.totals = Some(totals);
        }
    }

    /// Brings the broker-wide totals up to date with `queued_bytes` and the queue's length
    /// (one atomic operation each, none when nothing changed: the writer calls it once per
    /// batch).
    pub(crate) fn sync_total(&mut self) {
        self.sync_bytes_total();
        self.sync_messages_total();
        self.debug_assert_sums();
    }

    /// The bytes total alone: a push must keep it exact (it is the `max_queued_bytes_total`
    /// limit), the message count is only reported.
    fn sync_bytes_total(&mut self) {
        if self.reported == self.queued_bytes {
            return;
        }
        if let Some(totals) = &self.totals {
            if self.queued_bytes > self.reported {
                totals
                    .bytes
                    .fetch_add(self.queued_bytes - self.reported, Ordering::Relaxed);
            } else {
                totals
                    .bytes
                    .fetch_sub(self.reported - self.queued_bytes, Ordering::Relaxed);
            }
        }
        self.reported = self.queued_bytes;
    }

    fn sync_messages_total(&mut self) {
        let len = self.queues.queue.len();
        if self.reported_messages == len {
            return;
        }
        if let Some(totals) = &self.totals {
            if len > self.reported_messages {
                totals
                    .messages
                    .fetch_add(len - self.reported_messages, Ordering::Relaxed);
            } else {
                totals
                    .messages
                    .fetch_sub(self.reported_messages - len, Ordering::Relaxed);
            }
        }
        self.reported_messages = len;
    }

    /// True while every session's queues together hold `max_queued_bytes_total` or more.
    fn over_total(&self, config: &BrokerConfig) -> bool {
        self.totals
            .as_ref()
            .is_some_and(|t| t.at_cap(config.max_queued_bytes_total))
    }

    pub fn push(
        &mut self,
        item: Outgoing,
        online: bool,
        config: &BrokerConfig,
        now: Instant,
    ) -> PushResult {
        let len = item.message.approx_len();
        let over = self.queued_bytes + len > config.outbound_queue_max_bytes
            || self.queues.queue.len() >= config.outbound_queue_max_messages;
        let mut result = PushResult::Queued;
        if item.qos == QoS::AtMostOnce {
            if !online {
                return PushResult::Dropped;
            }
            if self.over_total(config) {
                return PushResult::DroppedMemoryLimit;
            }
            if over {
                return self.note_full(config, now).unwrap_or(PushResult::Dropped);
            }
        } else {
            // The session's own bounds: drop the oldest QoS>0 messages until this one fits
            // (a message larger than `max_queued_bytes` is kept alone).
            while self.queued_reliable > 0
                && (self.queued_reliable as usize >= config.max_queued_messages
                    || self.queued_reliable_bytes + len > config.max_queued_bytes)
            {
                let Some(index) = self
                    .queues
                    .queue
                    .iter()
                    .position(|o| o.qos != QoS::AtMostOnce)
                else {
                    break;
                };
                if let Some(old) = self.queues.remove_queued(index) {
                    self.account_removed(&old);
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
            self.queued_reliable_bytes += len;
        }
        self.pushed_total += 1;
        self.queues.push_queued(item);
        self.sync_bytes_total();
        // The queued-messages gauge of an online session is brought up to date by its
        // writer's next batch, which this push wakes: no second broker-wide atomic per
        // delivery on the hot path.
        if !online {
            self.sync_messages_total();
        }
        self.debug_assert_sums();
        result
    }

    /// Records that the queue is full; `Some(SlowSubscriber)` once it stayed full too long.
    fn note_full(&mut self, config: &BrokerConfig, now: Instant) -> Option<PushResult> {
        let since = self.queues.mark_full(now);
        (now.saturating_duration_since(since) >= config.slow_subscriber_timeout())
            .then_some(PushResult::SlowSubscriber)
    }

    /// Deliveries queued (beyond the in-flight window).
    pub(crate) fn queued_len(&self) -> usize {
        self.queues.queue.len()
    }

    /// The queued deliveries, oldest first (read-only: the sums of the module invariants
    /// are kept by the methods that change the queue).
    #[cfg_attr(not(feature = "__internal"), allow(dead_code))] // only tests reach it (`__internal`)
    pub fn queued(&self) -> impl Iterator<Item = &Outgoing> {
        self.queues.queue.iter()
    }

    /// Deliveries in the in-flight window (sent, not yet acknowledged), oldest first.
    #[cfg_attr(not(feature = "__internal"), allow(dead_code))] // only tests reach it (`__internal`)
    pub fn inflight(&self) -> impl Iterator<Item = &Inflight> {
        self.queues.inflight.iter()
    }

    /// The size of the in-flight window's content.
    pub(crate) fn inflight_len(&self) -> usize {
        self.queues.inflight.len()
    }

    /// Control packets waiting for the writer.
    pub(crate) fn control_len(&self) -> usize {
        self.queues.control.len()
    }

    /// Puts a restored in-flight delivery back into the window, its packet id reserved (the
    /// ids in `inflight` are exactly those `packet_ids` holds).
    pub(crate) fn restore_inflight(&mut self, entry: Inflight) {
        self.packet_ids.reserve(entry.packet_id);
        self.queues.push_inflight(entry);
    }

    /// Deliveries ever pushed into the queue (the checkpoint's watermark).
    pub(crate) fn pushed_total(&self) -> u64 {
        self.pushed_total
    }

    /// Deliveries ever removed from the queue (the checkpoint's watermark).
    pub(crate) fn removed_total(&self) -> u64 {
        self.removed_total
    }

    /// The module invariants' sums and mirror, recomputed from the queue: `queued_bytes`,
    /// `queued_reliable` and `queued_reliable_bytes` are its sums, `pushed_total -
    /// removed_total` its length. Debug builds only, and only for queues of at most
    /// `SUM_CHECK_MAX_ITEMS` deliveries, so that a long backlog in a test does not turn every
    /// push into a scan of it.
    fn debug_assert_sums(&self) {
        if !cfg!(debug_assertions) || self.queues.queue.len() > SUM_CHECK_MAX_ITEMS {
            return;
        }
        let (mut bytes, mut reliable, mut reliable_bytes) = (0usize, 0u32, 0usize);
        for item in &self.queues.queue {
            let len = item.message.approx_len();
            bytes += len;
            if item.qos != QoS::AtMostOnce {
                reliable += 1;
                reliable_bytes += len;
            }
        }
        debug_assert_eq!(
            self.queued_bytes, bytes,
            "queued_bytes: the sum over the queue"
        );
        debug_assert_eq!(
            self.queued_reliable, reliable,
            "queued_reliable: QoS>0 in the queue"
        );
        debug_assert_eq!(
            self.queued_reliable_bytes, reliable_bytes,
            "queued_reliable_bytes: the QoS>0 sum over the queue"
        );
        debug_assert_eq!(
            self.pushed_total - self.removed_total,
            self.queues.queue.len() as u64,
            "pushed_total - removed_total: the queue's length"
        );
    }

    fn account_removed(&mut self, item: &Outgoing) {
        self.removed_total += 1;
        let len = item.message.approx_len();
        self.queued_bytes = self.queued_bytes.saturating_sub(len);
        if item.qos != QoS::AtMostOnce {
            self.queued_reliable = self.queued_reliable.saturating_sub(1);
            self.queued_reliable_bytes = self.queued_reliable_bytes.saturating_sub(len);
        }
    }

    /// A new connection attached: forget the old connection's control packets, resend every
    /// in-flight message in order.
    pub fn attach(&mut self, window: u16) {
        self.window = window.max(1);
        let Some(queues) = self.queues.allocated_mut() else {
            return;
        };
        queues.full_since = None;
        queues.control.clear();
        for entry in &mut queues.inflight {
            // A held packet was never sent: the gate sends it once its write is durable.
            entry.needs_send = !entry.held;
        }
    }

    /// The connection went away: QoS 0 is not kept for an offline session.
    pub fn detach(&mut self) {
        if let Some(queues) = self.queues.allocated_mut() {
            queues.control.clear();
            queues.full_since = None;
        }
        for item in self.queues.take_queued() {
            if item.qos == QoS::AtMostOnce {
                self.account_removed(&item);
            } else {
                self.queues.push_queued(item);
            }
        }
        self.queues
            .remove_from_gate(|p| matches!(p, HeldPacket::Qos0(_)));
        self.queues.release_if_empty();
        self.sync_total();
    }

    /// Takes every queued message and every QoS 1 message in flight that was routed via a
    /// share group, for another member or the group (`session::groups`). QoS 2 in flight stays:
    /// its delivery is completed to this member when it reconnects [MQTT-4.8.2-4].
    pub fn take_shared(&mut self) -> Vec<Outgoing> {
        let mut taken = Vec::new();
        for item in self.queues.take_queued() {
            if item.share.is_some() {
                self.account_removed(&item);
                taken.push(item);
            } else {
                self.queues.push_queued(item);
            }
        }
        let inflight = self.queues.take_inflight();
        let mut unsent = Vec::new();
        for entry in inflight {
            if entry.item.share.is_some()
                && entry.phase == Phase::AwaitingAck
                && entry.item.qos == QoS::AtLeastOnce
            {
                self.packet_ids.release(entry.packet_id);
                if entry.held {
                    unsent.push(entry.packet_id);
                }
                taken.push(entry.item);
            } else {
                self.queues.push_inflight(entry);
            }
        }
        taken.extend(self.queues.remove_from_gate(|p| match p {
            HeldPacket::Publish { packet_id } => unsent.contains(packet_id),
            HeldPacket::Qos0(item) => item.share.is_some(),
            HeldPacket::PubRel { .. } => false,
        }));
        self.queues.release_if_empty();
        self.sync_total();
        taken
    }

    /// Removes and returns the first queued delivery.
    pub fn pop_front(&mut self) -> Option<Outgoing> {
        let item = self.queues.pop_queued()?;
        self.account_removed(&item);
        Some(item)
    }

    /// Queues a control packet (ack, SUBACK, PINGRESP, PUBREL) behind every delivery already
    /// queued: a PINGRESP then works as a barrier for what was routed before the PINGREQ.
    pub(crate) fn push_control(&mut self, packet: Bytes) {
        self.queues.push_control(self.pushed_total, packet);
    }

    /// Takes the control packets still queued that may leave now (the CONNACK, acks, SUBACKs),
    /// in order, up to the first that waits behind deliveries not yet sent (a PINGRESP is a
    /// barrier, and at the close those deliveries stay queued): the close path writes them
    /// ahead of its DISCONNECT instead of dropping them with the connection (MQTT-3.2.0-1: the
    /// CONNACK is the first packet the client gets, even when it is closed right away).
    pub(crate) fn take_control(&mut self) -> Vec<Bytes> {
        let removed_total = self.removed_total;
        let Some(queues) = self.queues.allocated_mut() else {
            return Vec::new();
        };
        let ready = queues
            .control
            .iter()
            .take_while(|(mark, _)| *mark <= removed_total)
            .count();
        queues
            .control
            .drain(..ready)
            .map(|(_, packet)| packet)
            .collect()
    }

    /// Queues a control packet ahead of everything (CONNACK).
    pub(crate) fn push_control_first(&mut self, packet: Bytes) {
        self.queues.push_control_first(packet);
    }
}

/// A queued copy of a stored QoS 2 message at `seq` of stream 0, delivered at `qos` (tests).
#[cfg(test)]
pub(crate) fn stored_item(payload: &'static [u8], qos: QoS, seq: u64) -> Outgoing {
    let message = crate::model::message::Message::new(
        tern_wire::Str::from_static("t"),
        bytes::Bytes::from_static(payload),
        QoS::ExactlyOnce,
        false,
        tern_wire::Properties::default(),
        None,
        Instant::now(),
    );
    message.mark_stored(crate::model::StoreRef { stream: 0, seq });
    Outgoing {
        message: Arc::new(message),
        qos,
        retain: false,
        subscription_ids: Vec::new(),
        share: None,
    }
}

#[cfg(test)]
mod gate_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod totals_tests;
