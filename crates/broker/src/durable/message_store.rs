//! The persistence seam's traits implemented over the store: each call maps to the records of the
//! module doc's schema (inbound publishes and QoS 2 control records here; sessions, exchanges,
//! share groups, wills, reclamation in their modules).

use crate::hash::Map;
use crate::model::{Appended, QueueFull, WriterWakes};
use std::sync::atomic::Ordering;

use tern_store::NewRecord;
use tern_wire::{Protocol, QoS, SubscriptionOptions};

use super::*;

impl MessageLog for DurableStore {
    fn append_publish(
        &self,
        client_id: &str,
        message: &Message,
        qos2_packet_id: Option<u16>,
    ) -> Option<Appended> {
        match self.append_publish_with(client_id, message, qos2_packet_id, true) {
            Ok(appended) => appended,
            // A waiting append finds room, or fails otherwise: never seen.
            Err(QueueFull) => Some(Appended::unplaced(Ticket::failed(PersistError(
                QueueFull.to_string(),
            )))),
        }
    }

    fn try_append_publish(
        &self,
        client_id: &str,
        message: &Message,
        qos2_packet_id: Option<u16>,
    ) -> Result<Option<Appended>, QueueFull> {
        self.append_publish_with(client_id, message, qos2_packet_id, false)
    }

    fn wait_for_room(&self, client_id: &str, message: &Message, qos2: bool) {
        let Some((_, slot)) = self.writes(&message.topic, message.qos) else {
            return;
        };
        // The same records as the append (the rx record's payload is of fixed length), so the
        // same room: an error here (a failed stream) is the append's to report.
        let qos2 = qos2.then_some((0, 0));
        let _ = with_publish_records(client_id, message, qos2, |records| {
            slot.stream.wait_for_room(records)
        });
    }

    fn defer_writer_wakes(&self) -> WriterWakes {
        WriterWakes(self.slots.iter().map(|s| s.stream.defer_wakes()).collect())
    }

    fn message_released(&self, message: &Message) {
        if let Some(stored) = message.store_ref() {
            if let Some(slot) = self.slots.get(usize::from(stored.stream)) {
                slot.unrouted.lock().seqs.remove(&stored.seq);
            }
        }
    }

    fn qos2_retry(&self, client_id: &str, packet_id: u16) -> Option<Ticket> {
        let rx_ref = *self.rx.lock().get(client_id)?.get(&packet_id)?;
        let slot = self.slots.get(usize::from(rx_ref.stream))?;
        (slot.stream.durable_seq() < rx_ref.seq)
            .then(|| Ticket::from_store(slot.stream.ticket_for(rx_ref.seq)))
    }

    fn qos2_released(&self, client_id: &str, packet_id: u16) -> Option<Ticket> {
        // The rx lock is held across the append: the rx checkpoint relies on every released
        // rx record's `rel` being appended before it is computed (`reclaim` module).
        let mut rx = self.rx.lock();
        let rx_ref = rx.get_mut(client_id)?.remove(&packet_id)?;
        let slot = self.slots.get(usize::from(rx_ref.stream))?;
        let topic = format!("{REL_PREFIX}{client_id}");
        let result = slot
            .stream
            .append(topic.as_bytes(), &[], &rx_ref.seq.to_be_bytes());
        if result.is_err() {
            // Refused at once (a failed stream): nothing records the release, so the exchange
            // stays open here as it does on disk, and a retry is handled as a first PUBREL
            // again (`Conn::on_pubrel` puts the id back in the received set; finding 17).
            rx.entry(client_id.to_string())
                .or_default()
                .insert(packet_id, rx_ref);
        }
        drop(rx);
        Some(match result {
            Ok(ticket) => {
                let rel = (rx_ref.stream, ticket.seq());
                let mut releasing = self.releasing.lock();
                self.prune_releasing(&mut releasing);
                releasing.insert(rel, (client_fingerprint(client_id), packet_id));
                Ticket::from_store(ticket)
            }
            Err(error) => Ticket::failed(io_error(error)),
        })
    }

    fn qos2_release_retry(&self, client_id: &str, packet_id: u16) -> Option<Ticket> {
        // The id left the received set when its first PUBREL appended the `rel` record (on
        // this connection, or on one whose close this connection's handshake waited for):
        // if that record is not durable yet, or failed, the PUBCOMP waits for it (a failed
        // one fails the ticket: no PUBCOMP, the client resends the PUBREL to the next boot).
        let who = (client_fingerprint(client_id), packet_id);
        let mut releasing = self.releasing.lock();
        self.prune_releasing(&mut releasing);
        let (&(stream, seq), _) = releasing.iter().rev().find(|(_, entry)| **entry == who)?;
        let slot = self.slots.get(usize::from(stream))?;
        // Its own `rel` record's ticket. (A first version waited on the stream's last record
        // and lost wakes while the store kept one waker per seq, finding 17; since finding
        // 9's fix every task waiting on a seq is woken.)
        Some(Ticket::from_store(slot.stream.ticket_for(seq)))
    }

    fn disk_budget_reached(&self, topic: &str, qos: QoS) -> bool {
        let Some(budget) = self.disk_budget else {
            return false;
        };
        if crate::inject::on(crate::inject::Bug::IgnoreDiskBudget) {
            return false;
        }
        self.disk_used.load(Ordering::Relaxed) >= budget && self.writes(topic, qos).is_some()
    }
}

impl SessionStore for DurableStore {
    fn session_opened(
        &self,
        client_id: &str,
        protocol: Protocol,
        expiry_interval_s: u32,
        fresh: bool,
    ) -> Option<Ticket> {
        let record = {
            let mut mirror = self.mirror.lock();
            if !mirror.contains_key(client_id) {
                // A new session pins everything until its cursor is written: the minimum of
                // the cursors falls.
                self.cursors_changed();
            }
            let record = mirror.entry(client_id.to_string()).or_default();
            if fresh {
                record.subscriptions.clear();
                record.incarnation = self.now_ns().max(record.incarnation + 1);
            }
            record.protocol_level = protocol.level();
            record.expiry_interval_s = expiry_interval_s;
            record.closed_at_unix_s = 0;
            record.clone()
        };
        if fresh {
            self.rx.lock().remove(client_id);
            self.reset_rx(client_id);
            let floors = self.floors();
            self.write_cursor(client_id, &floors);
            let mut written = self.written_cursors.lock();
            written.insert(client_id.to_string(), floors);
            self.cursors_changed();
        }
        // The `s` record goes after the cursor (the same stream) and the rx resets (a reset
        // lost with it leaves the old rx records void anyway: they carry the old
        // incarnation): its ticket covers the session's start.
        Some(self.put_session(client_id, &record))
    }

    fn session_closed(&self, client_id: &str, expiry_interval_s: u32) {
        let record = {
            let mut mirror = self.mirror.lock();
            let Some(record) = mirror.get_mut(client_id) else {
                return;
            };
            record.expiry_interval_s = expiry_interval_s;
            record.closed_at_unix_s = self.now_ns() / 1_000_000_000;
            record.clone()
        };
        drop(self.put_session(client_id, &record));
    }

    fn session_ended(&self, client_id: &str) {
        let had_rx = self
            .rx
            .lock()
            .remove(client_id)
            .is_some_and(|m| !m.is_empty());
        let persistent = {
            let mut mirror = self.mirror.lock();
            self.cursors_changed();
            mirror.remove(client_id).is_some()
        };
        if !persistent {
            return;
        }
        {
            let mut written = self.written_cursors.lock();
            written.remove(client_id);
            self.cursors_changed();
        }
        let _ = self.sessions.delete(client_id.as_bytes());
        let _ = self.cursors.delete(client_id.as_bytes());
        self.forget_exchanges(client_id);
        if had_rx {
            self.reset_rx(client_id);
        }
    }

    fn session_subscribed(
        &self,
        client_id: &str,
        filter: &str,
        options: SubscriptionOptions,
        subscription_id: Option<u32>,
    ) -> Option<Ticket> {
        let record = {
            let mut mirror = self.mirror.lock();
            let record = mirror.get_mut(client_id)?;
            let sub = SubRecord {
                options,
                subscription_id,
            };
            match record.subscriptions.iter_mut().find(|(f, _)| f == filter) {
                Some(existing) => existing.1 = sub,
                None => record.subscriptions.push((filter.to_string(), sub)),
            }
            record.clone()
        };
        // Before the session record, in the same stream: SUBACK's write covers both.
        self.group_joined(filter);
        Some(self.put_session(client_id, &record))
    }

    fn session_unsubscribed(&self, client_id: &str, filter: &str) -> Option<Ticket> {
        let record = {
            let mut mirror = self.mirror.lock();
            let record = mirror.get_mut(client_id)?;
            record.subscriptions.retain(|(f, _)| f != filter);
            record.clone()
        };
        Some(self.put_session(client_id, &record))
    }

    fn state_barrier(&self) -> Option<Ticket> {
        self.admin_state_barrier()
    }
}

impl ExchangeStore for DurableStore {
    fn outbound_sent(&self, client_id: &str, packet_id: u16, stored: StoreRef) -> OutboundSent {
        self.record_sent(client_id, packet_id, stored)
    }

    fn outbound_pubrel_pending(
        &self,
        client_id: &str,
        packet_id: u16,
        stored: Option<StoreRef>,
    ) -> Option<Ticket> {
        self.record_pubrel(client_id, packet_id, stored)
    }

    fn outbound_completed(&self, client_id: &str, packet_id: u16) {
        self.record_completed(client_id, packet_id);
    }
}

impl RetainedStore for DurableStore {
    fn retained_changed(&self, topic: &str, message: Option<&Message>) -> Option<Ticket> {
        let result = match message {
            Some(m) => self
                .retained
                .put(topic.as_bytes(), &codec::encode_retained(m)),
            None => self.retained.delete(topic.as_bytes()),
        };
        Some(match result {
            Ok(ticket) => Ticket::from_store(ticket),
            Err(error) => {
                tracing::error!(%error, topic, "cannot write retained message");
                Ticket::failed(io_error(error))
            }
        })
    }
}

impl WillStore for DurableStore {
    fn will_set(&self, client_id: &str, will: Option<(&Message, u32)>) -> (u64, Option<Ticket>) {
        self.set_will(client_id, will)
    }

    fn will_delayed(&self, client_id: &str, token: u64) {
        self.delay_will(client_id, token);
    }

    fn will_cleared(&self, client_id: &str, token: u64) -> Option<Ticket> {
        self.clear_will(client_id, token)
    }
}

impl CursorStore for DurableStore {
    fn removed_ranges(&self) -> Vec<(u16, std::ops::RangeInclusive<u64>)> {
        let mut out = Vec::new();
        for (index, slot) in self.slots.iter().enumerate() {
            let log = slot.stream.drain_removed();
            if log.ranges.is_empty() {
                continue;
            }
            let records: u64 = log.ranges.iter().map(|r| r.end() - r.start() + 1).sum();
            tracing::info!(
                stream = slot.spec.name,
                ranges = log.ranges.len(),
                first = log.ranges.first().map(|r| *r.start()),
                last = log.ranges.last().map(|r| *r.end()),
                records,
                overflowed = log.overflowed,
                "retention removed records"
            );
            out.extend(log.ranges.into_iter().map(|r| (index as u16, r)));
        }
        out
    }

    fn checkpoint_floors(&self) -> Vec<u64> {
        self.floors()
    }

    fn refresh_disk_usage(&self) {
        if self.disk_budget.is_some() {
            self.disk_used
                .store(self.message_disk_bytes_with_unwritten(), Ordering::Relaxed);
        }
    }

    fn reclaim(&self) {
        self.reclaim_step(false);
    }

    fn persistent_sessions(&self) -> Vec<std::sync::Arc<str>> {
        self.mirror
            .lock()
            .keys()
            .map(|k| k.as_str().into())
            .collect()
    }

    fn checkpoint(&self, client_id: &str, floors: &[u64], held: &HeldSeqs) -> bool {
        if !self.mirror.lock().contains_key(client_id) {
            return false;
        }
        let mut cursor = floors.to_vec();
        for &(stream, seq) in held {
            if let Some(c) = cursor.get_mut(usize::from(stream)) {
                *c = (*c).min(seq);
            }
        }
        {
            // The write is issued under the lock: reclamation reads the cursors and then the
            // state stream's last sequence under it, so every cursor it sees is covered by
            // the durability it waits for (`reclaim`).
            let mut written = self.written_cursors.lock();
            if written.get(client_id) == Some(&cursor) {
                return false;
            }
            if let Some(old) = written.get(client_id) {
                // Cursor safety says a cursor never moves back: a message below it was done.
                // One that does shows a held message below the last cursor (a bug upstream).
                if old.iter().zip(&cursor).any(|(o, n)| n < o) {
                    tracing::warn!(client_id, ?old, new = ?cursor, ?floors, "session cursor moved back");
                }
            }
            written.insert(client_id.to_string(), cursor.clone());
            self.cursors_changed();
            self.write_cursor(client_id, &cursor);
        }
        self.clear_passed(client_id, &self.done_floor(client_id, &cursor));
        true
    }

    fn durable_groups(&self) -> Vec<std::sync::Arc<str>> {
        self.durable_group_list()
    }

    fn checkpoint_group(&self, share: &str, floors: &[u64], held: &HeldSeqs) -> bool {
        self.checkpoint_group_cursor(share, floors, held)
    }

    fn group_ended(&self, share: &str) {
        self.group_gone(share);
    }
}

impl StoreAdmin for DurableStore {
    fn stream_stats(&self) -> Vec<crate::model::StreamStats> {
        self.admin_stream_stats()
    }

    fn purge_stream(&self, name: &str) -> Result<u64, crate::model::ActionError> {
        self.admin_purge(name)
    }

    fn backup(&self, label: &str) -> Result<std::path::PathBuf, crate::model::ActionError> {
        self.admin_backup(label)
    }

    fn disk_usage(&self) -> Option<(u64, u64)> {
        let budget = self.disk_budget?;
        Some((self.disk_used.load(Ordering::Relaxed), budget))
    }
}

impl Recovery for DurableStore {
    fn recover(&self) -> Recovered {
        match recover::recover(self) {
            Ok(r) => r,
            Err(error) => {
                tracing::error!(%error, "cannot read the store's state; starting without it");
                Recovered::default()
            }
        }
    }
}

impl DurableStore {
    /// Forgets the `rel` records now durable: no retry needs to wait for them. Each stream's
    /// entries are in seq order, so this removes from the front: amortized O(log n) per entry.
    fn prune_releasing(&self, releasing: &mut std::collections::BTreeMap<(u16, u64), (u64, u16)>) {
        for (index, slot) in self.slots.iter().enumerate() {
            let stream = index as u16;
            let durable = slot.stream.durable_seq();
            while let Some((&(s, seq), _)) = releasing.range((stream, 0)..).next() {
                if s != stream || seq > durable {
                    break;
                }
                releasing.remove(&(s, seq));
            }
        }
    }
}

/// A fingerprint of a client id for [`DurableStore`]'s `releasing` map (a collision only
/// makes a PUBREL retry wait for another client's record). `DefaultHasher::new()` has fixed
/// keys: the same in every run, as the simulator wants.
fn client_fingerprint(client_id: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    client_id.hash(&mut h);
    h.finish()
}

impl DurableStore {
    /// [`MessageLog::append_publish`], waiting for room in the writer queue or not (`wait`).
    /// The unrouted lock is held across the append (see the module invariants).
    fn append_publish_with(
        &self,
        client_id: &str,
        message: &Message,
        qos2_packet_id: Option<u16>,
        wait: bool,
    ) -> Result<Option<Appended>, QueueFull> {
        let Some((index, slot)) = self.writes(&message.topic, message.qos) else {
            return Ok(None);
        };
        let incarnation = match qos2_packet_id {
            Some(_) => self
                .mirror
                .lock()
                .get(client_id)
                .map_or(0, |r| r.incarnation),
            None => 0,
        };
        let qos2 = qos2_packet_id.map(|packet_id| (packet_id, incarnation));
        let mut meta_len = 0;
        let mut unrouted = slot.unrouted.lock();
        let result = with_publish_records(client_id, message, qos2, |records| {
            meta_len = records.first().map_or(0, |r| r.properties.len());
            if wait {
                slot.stream.append_batch(records)
            } else {
                slot.stream.try_append_batch(records)
            }
        });
        let ticket = match result {
            Ok(ticket) => ticket,
            Err(StoreError::QueueFull { .. }) => return Err(QueueFull),
            Err(error) => {
                drop(unrouted);
                return Ok(Some(Appended::unplaced(Ticket::failed(io_error(error)))));
            }
        };
        if self.disk_budget.is_some() {
            let estimate = (message.topic.len() + meta_len + message.payload.len()) as u64
                + RECORD_OVERHEAD_ESTIMATE * (1 + u64::from(qos2_packet_id.is_some()));
            self.disk_used.fetch_add(estimate, Ordering::Relaxed);
        }
        let seq = ticket.first_seq();
        unrouted.seqs.insert(seq);
        unrouted.next_seq = ticket.seq() + 1;
        drop(unrouted);
        let stream = index as u16;
        if let Some(packet_id) = qos2_packet_id {
            let rx_ref = StoreRef {
                stream,
                seq: ticket.seq(),
            };
            let mut rx = self.rx.lock();
            match rx.get_mut(client_id) {
                Some(m) => {
                    m.insert(packet_id, rx_ref);
                }
                None => {
                    rx.insert(client_id.to_string(), Map::from_iter([(packet_id, rx_ref)]));
                }
            }
            // Under the rx lock (see `reclaim`): limits never remove an open rx record.
            self.pin(rx_ref);
        }
        Ok(Some(Appended::at(
            StoreRef { stream, seq },
            Ticket::from_store(ticket),
        )))
    }
}

/// Calls `f` with the records of a stored PUBLISH: the message, and with `qos2` (packet id,
/// session incarnation) its "(session, pi) received" record in the same batch.
fn with_publish_records<R>(
    client_id: &str,
    message: &Message,
    qos2: Option<(u16, u64)>,
    f: impl FnOnce(&[NewRecord<'_>]) -> R,
) -> R {
    let mut meta = codec::Meta::new();
    codec::encode_meta(message, &mut meta);
    let record = NewRecord {
        topic: message.topic.as_bytes(),
        properties: &meta,
        payload: &message.payload,
        time_ns: None,
    };
    match qos2 {
        Some((packet_id, incarnation)) => {
            let rx_topic = format!("{RX_PREFIX}{client_id}");
            let mut pi = [0u8; 10];
            pi[..2].copy_from_slice(&packet_id.to_be_bytes());
            pi[2..].copy_from_slice(&incarnation.to_be_bytes());
            f(&[
                record,
                NewRecord {
                    topic: rx_topic.as_bytes(),
                    payload: &pi,
                    ..NewRecord::default()
                },
            ])
        }
        None => f(&[record]),
    }
}
