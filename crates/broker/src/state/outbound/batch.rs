//! One writer batch: control packets, resends after a reconnect, packets the gate released,
//! then new deliveries from the queue, up to [`MAX_BATCH_PACKETS`] / [`MAX_BATCH_BYTES`].

use bytes::Bytes;
use tern_wire::QoS;
use tokio::time::Instant;

use super::BatchBufs;
use super::{
    HEAD_SCRATCH_BYTES, HeldPacket, IDLE_QUEUE_CAPACITY, Inflight, MAX_BATCH_BYTES,
    MAX_BATCH_PACKETS, Outbound, Outgoing, Phase, WriterState,
};
use crate::config::BrokerConfig;
use crate::metrics::Metrics;
use crate::model::{ExchangeStore, OutboundSent, Ticket};

/// What a batch needs besides the session's own state.
pub struct BatchEnv<'a> {
    pub config: &'a BrokerConfig,
    pub metrics: &'a Metrics,
    /// Records outbound QoS 2 exchanges of persistent sessions (ARCHITECTURE §3).
    pub store: &'a dyn ExchangeStore,
    pub client_id: &'a str,
    /// The session outlives its connection: only then are its exchanges recorded.
    pub persistent: bool,
    pub now: Instant,
}

/// What happened to the queue's front delivery.
enum Front {
    /// Written, moved into the gate, or dropped: look at the next one.
    Taken,
    /// It must wait (window full, no packet id); control packets behind it may still go.
    Blocked,
    /// Nothing queued.
    Empty,
}

impl Outbound {
    /// Moves up to [`MAX_BATCH_PACKETS`] packets into `out`'s parts: shared packets and bodies as
    /// their own `Bytes`, everything written per delivery (heads, whole packets for one
    /// subscriber, PUBRELs) contiguous in the writer's batch buffer between them.
    pub fn fill_batch(
        &mut self,
        writer: &mut WriterState,
        env: &BatchEnv<'_>,
        out: &mut BatchBufs,
    ) {
        let mut packets = 0;
        // Deliveries taken from the queue, by QoS: counted once per batch (the counters are
        // shared by every connection).
        let mut sent_by_qos = [0u64; 3];
        let mut resends_done = false;
        let mut head_blocked = false;
        // Heads are a few bytes each: one allocation for the batch's heads, not one per head.
        if out.head.capacity() < HEAD_SCRATCH_BYTES / 4 {
            out.head.reserve(HEAD_SCRATCH_BYTES);
        }
        let mut counted_parts = out.parts.len();
        let mut batch_bytes = 0;
        while packets < MAX_BATCH_PACKETS {
            batch_bytes += out.parts[counted_parts..]
                .iter()
                .map(Bytes::len)
                .sum::<usize>();
            counted_parts = out.parts.len();
            // The batch buffer's bytes are not in `parts` until flushed.
            if batch_bytes + out.head.len() >= MAX_BATCH_BYTES {
                break;
            }
            // A control packet goes once the deliveries queued before it left, or at once when
            // the head delivery waits for the window (acks must never wait behind it).
            if let Some(&(mark, _)) = self.queues.control.front() {
                if mark <= self.removed_total || head_blocked {
                    if let Some((_, packet)) = self.queues.pop_control() {
                        out.flush();
                        out.parts.push(packet);
                        packets += 1;
                    }
                    continue;
                }
            }
            if !resends_done {
                resends_done = true;
                packets += self.resend(writer, env.now, out, MAX_BATCH_PACKETS - packets);
                continue;
            }
            if let Some(held) = self.queues.pop_gate_ready() {
                if self.release(held, writer, env.now, out) {
                    packets += 1;
                }
                continue;
            }
            let written_before = (out.parts.len(), out.head.len());
            match self.take_front(writer, env, out, &mut sent_by_qos) {
                Front::Taken => {
                    if written_before != (out.parts.len(), out.head.len()) {
                        packets += 1;
                    }
                }
                Front::Blocked => {
                    if self.queues.control.is_empty() || head_blocked {
                        break;
                    }
                    head_blocked = true;
                }
                Front::Empty => break,
            }
        }
        out.flush();
        self.after_batch(env, sent_by_qos, packets);
    }

    /// Counts a batch's deliveries (once per batch: the counters are shared by every
    /// connection), ends a "full since" once the queue is below its bounds again, and gives
    /// idle capacity back.
    fn after_batch(&mut self, env: &BatchEnv<'_>, sent_by_qos: [u64; 3], packets: usize) {
        for (counter, sent) in env.metrics.messages_sent_by_qos.iter().zip(sent_by_qos) {
            if sent > 0 {
                Metrics::add(counter, sent);
            }
        }
        if self.queued_bytes <= env.config.outbound_queue_max_bytes
            && self.queues.queue.len() < env.config.outbound_queue_max_messages
        {
            if let Some(queues) = self.queues.allocated_mut() {
                queues.full_since = None;
            }
        }
        self.release_idle_capacity(packets == 0);
        self.sync_total();
    }

    /// Takes the queue's front delivery: writes it, or moves it into the gate when its first
    /// PUBLISH must wait for a store write or something ahead of it waits there.
    fn take_front(
        &mut self,
        writer: &mut WriterState,
        env: &BatchEnv<'_>,
        out: &mut BatchBufs,
        sent_by_qos: &mut [u64; 3],
    ) -> Front {
        let Some(front) = self.queues.queue.front() else {
            return Front::Empty;
        };
        let qos = front.qos;
        if self.front_waits(qos) {
            return Front::Blocked;
        }
        let Some(item) = self.queues.pop_queued() else {
            return Front::Empty;
        };
        self.account_removed(&item);
        if item.message.is_expired(env.now) {
            Metrics::add(&env.metrics.messages_dropped, 1);
            Metrics::add(&env.metrics.messages_dropped_expired, 1);
            return Front::Taken;
        }
        if !writer.fits(&item, env.now) {
            // MQTT-3.1.2-25: too large for this client; for QoS>0 it counts as delivered.
            Metrics::add(&env.metrics.messages_dropped, 1);
            return Front::Taken;
        }
        if qos == QoS::AtMostOnce {
            sent_by_qos[0] += 1;
            if self.queues.gate.holds_deliveries() {
                self.queues.push_gate(None, HeldPacket::Qos0(item));
            } else {
                writer.encode_publish(&item, 0, false, env.now, out);
            }
            return Front::Taken;
        }
        let Some(packet_id) = self.packet_ids.allocate() else {
            // Every id is in flight (only possible with a window of 65,535): keep the order.
            self.requeue_front(item);
            return Front::Blocked;
        };
        let Ok(ticket) = self.record_exchange(env, &item, packet_id) else {
            return Front::Taken;
        };
        sent_by_qos[usize::from(qos as u8)] += 1;
        let held = ticket.is_some() || self.queues.gate.holds_deliveries();
        if held {
            self.queues
                .push_gate(ticket, HeldPacket::Publish { packet_id });
        } else {
            writer.encode_publish(&item, packet_id, false, env.now, out);
        }
        self.queues.push_inflight(Inflight {
            packet_id,
            item,
            phase: Phase::AwaitingAck,
            needs_send: false,
            held,
        });
        Front::Taken
    }

    /// True if the front delivery, at `qos`, must wait: the window is full (QoS>0), or QoS 0
    /// would pass the gate's bound on what it holds.
    fn front_waits(&self, qos: QoS) -> bool {
        if qos != QoS::AtMostOnce {
            return self.queues.inflight.len() >= usize::from(self.window);
        }
        self.queues.gate.holds_deliveries() && !self.queues.gate.has_room_for_qos0()
    }

    /// ARCHITECTURE §3: the id of a stored QoS 2 message of a persistent session is recorded
    /// before its first PUBLISH, so a restarted broker resends it under the same id. `Ok`
    /// holds the write the PUBLISH waits for, if one was issued; `Err` means retention removed
    /// the message while it was queued: it is dropped before any PUBLISH (the checkpoint would
    /// have dropped it from the queue next) and its id is free again.
    fn record_exchange(
        &mut self,
        env: &BatchEnv<'_>,
        item: &Outgoing,
        packet_id: u16,
    ) -> Result<Option<Ticket>, ()> {
        let stored = match (item.qos, item.message.store_ref()) {
            (QoS::ExactlyOnce, Some(stored)) if env.persistent => stored,
            _ => return Ok(None),
        };
        match env.store.outbound_sent(env.client_id, packet_id, stored) {
            OutboundSent::Recorded(t) => Ok(Some(t)),
            OutboundSent::Untracked => Ok(None),
            OutboundSent::Removed => {
                self.packet_ids.release(packet_id);
                env.metrics.dropped_by_retention(1);
                Err(())
            }
        }
    }

    fn requeue_front(&mut self, item: Outgoing) {
        let len = item.message.approx_len();
        self.queued_bytes += len;
        if item.qos != QoS::AtMostOnce {
            self.queued_reliable += 1;
            self.queued_reliable_bytes += len;
        }
        self.removed_total -= 1;
        self.queues.push_queued_front(item);
    }

    /// Writes a packet the gate released. False if nothing was written (its exchange ended
    /// meanwhile).
    fn release(
        &mut self,
        held: HeldPacket,
        writer: &mut WriterState,
        now: Instant,
        out: &mut BatchBufs,
    ) -> bool {
        match held {
            HeldPacket::Qos0(item) => writer.encode_publish(&item, 0, false, now, out),
            HeldPacket::Publish { packet_id } => {
                // Held entries are at the back of `inflight`.
                let Some(entry) = self
                    .queues
                    .inflight_mut()
                    .rev()
                    .find(|e| e.packet_id == packet_id)
                else {
                    return false;
                };
                if !entry.held || entry.phase != Phase::AwaitingAck {
                    return false;
                }
                entry.held = false;
                writer.encode_publish(&entry.item, packet_id, false, now, out)
            }
            HeldPacket::PubRel { packet_id, reason } => {
                if let Some(entry) = self
                    .queues
                    .inflight_mut()
                    .find(|e| e.packet_id == packet_id)
                {
                    entry.held = false;
                }
                writer.encode_pubrel(packet_id, reason, out)
            }
        }
    }

    /// Resends in-flight messages marked on reconnect, in their original order: PUBLISH with
    /// DUP=1, or PUBREL once PUBREC was received ([MQTT-4.4.0-1]). Returns packets added.
    fn resend(
        &mut self,
        writer: &mut WriterState,
        now: Instant,
        out: &mut BatchBufs,
        budget: usize,
    ) -> usize {
        let mut packets = 0;
        for entry in self.queues.inflight_mut().filter(|e| e.needs_send) {
            if packets >= budget {
                break;
            }
            entry.needs_send = false;
            packets += 1;
            match entry.phase {
                Phase::PubRelPending => {
                    writer.encode_pubrel(entry.packet_id, tern_wire::ReasonCode::SUCCESS, out);
                }
                Phase::AwaitingAck => {
                    // An expired one still goes out: the exchange must finish and the client
                    // may already have seen it.
                    writer.encode_publish(&entry.item, entry.packet_id, true, now, out);
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
        self.packet_ids.shrink_if_idle();
        if idle {
            self.queues.release_if_empty();
        }
        let Some(queues) = self.queues.allocated_mut() else {
            return;
        };
        let keep = if idle { 0 } else { IDLE_QUEUE_CAPACITY };
        if queues.queue.is_empty() && queues.queue.capacity() > keep {
            queues.queue = std::collections::VecDeque::new();
        }
        if queues.control.is_empty() && queues.control.capacity() > keep {
            queues.control = std::collections::VecDeque::new();
        }
        if queues.inflight.is_empty() && queues.inflight.capacity() > keep {
            queues.inflight = std::collections::VecDeque::new();
        }
    }
}
