//! Start-up: rebuilds persistent sessions, their received sets, PUBREL-pending exchanges and
//! pending messages (cursor + filters) and the retained messages from the store, in the
//! broker's shape ([`Recovered`]). Damaged blocks met on the way are quarantined by the store,
//! reported, and stepped over.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use tern_store::{FilterSet, StoreError, Stream};
use tern_wire::QoS;

use super::codec::{self, SessionRecord};
use super::{
    DurableStore, RECOVERY_READ_BYTES, RECOVERY_READ_RECORDS, REL_PREFIX, RESET_PREFIX, RX_PREFIX,
    now_ns, outbound_key,
};
use crate::message::Message;
use crate::persist::{Recovered, StoreRef, StoredInflight, StoredSession};

/// Most damaged blocks one recovery read steps over.
const MAX_DAMAGED_BLOCKS_PER_READ: usize = 64;

/// `read_from` for recovery: a read that meets a damaged sealed block has it quarantined by
/// the store (reported in the log) and is retried, so everything undamaged is still served.
fn read_damage_tolerant(
    stream: &Stream,
    from: u64,
    filters: &FilterSet,
) -> Result<tern_store::ReadBatch, StoreError> {
    let mut damaged = 0;
    loop {
        match stream.read_from(from, filters, RECOVERY_READ_RECORDS, RECOVERY_READ_BYTES) {
            Err(StoreError::Corrupt {
                path,
                range,
                detail,
            }) if damaged < MAX_DAMAGED_BLOCKS_PER_READ => {
                damaged += 1;
                tracing::error!(
                    stream = stream.name(),
                    path = %path.display(),
                    ?range,
                    detail,
                    "damaged records skipped at start-up"
                );
            }
            other => return other,
        }
    }
}

/// Builds the broker's state from the store (see the module doc).
pub(super) fn recover(store: &DurableStore) -> Result<Recovered, StoreError> {
    let max_pending = store.limits.max_pending_per_session;
    let all = FilterSet::all();
    let mut records: HashMap<String, SessionRecord> = HashMap::new();
    for (key, value) in store.sessions.entries(&all)? {
        let Ok(client) = std::str::from_utf8(&key) else {
            continue;
        };
        match SessionRecord::decode(&value) {
            Some(r) => {
                records.insert(client.to_string(), r);
            }
            None => tracing::error!(client_id = client, "undecodable session record skipped"),
        }
    }
    // Sessions whose expiry ran out while the broker was down end now.
    let now_s = now_ns() / 1_000_000_000;
    records.retain(|client, r| {
        if r.closed_at_unix_s == 0 || r.expiry_interval_s == u32::MAX {
            return true;
        }
        let elapsed_s = now_s.saturating_sub(r.closed_at_unix_s);
        if elapsed_s >= u64::from(r.expiry_interval_s) {
            tracing::info!(
                client_id = client.as_str(),
                "session expired while the broker was down"
            );
            let _ = store.sessions.delete(client.as_bytes());
            let _ = store.cursors.delete(client.as_bytes());
            return false;
        }
        // The rest of the interval runs from the restart.
        r.expiry_interval_s -= elapsed_s as u32;
        true
    });
    let mut cursors: HashMap<String, HashMap<String, u64>> = HashMap::new();
    for (key, value) in store.cursors.entries(&all)? {
        if let (Ok(client), Some(pos)) =
            (std::str::from_utf8(&key), codec::decode_positions(&value))
        {
            cursors.insert(client.to_string(), pos.into_iter().collect());
        }
    }
    let name_index: HashMap<&str, u16> = store
        .slots
        .iter()
        .enumerate()
        .map(|(i, s)| (s.spec.name.as_str(), i as u16))
        .collect();
    // client → packet id → position of the PUBREL-pending message.
    let mut pubrel: HashMap<String, Vec<(u16, Option<StoreRef>)>> = HashMap::new();
    for (key, value) in store.outbound.entries(&all)? {
        if key.len() < 3 || key[key.len() - 3] != 0 {
            continue;
        }
        let (client, pi) = key.split_at(key.len() - 3);
        let Ok(client) = std::str::from_utf8(client) else {
            continue;
        };
        let packet_id = u16::from_be_bytes([pi[1], pi[2]]);
        if !records.contains_key(client) {
            // Left over from a session that ended (or expired while the broker was down).
            let _ = store.outbound.delete(&key);
            continue;
        }
        let position = codec::decode_positions(&value)
            .and_then(|p| p.into_iter().next())
            .and_then(|(name, seq)| {
                name_index
                    .get(name.as_str())
                    .map(|&stream| StoreRef { stream, seq })
            });
        pubrel
            .entry(client.to_string())
            .or_default()
            .push((packet_id, position));
        store
            .pubrel
            .lock()
            .entry(client.to_string())
            .or_default()
            .insert(packet_id, position);
    }

    // Inbound QoS 2 received sets from the control records of every stream, in order.
    let control = FilterSet::new(["$tern/#"]);
    let mut rx: HashMap<String, HashMap<u16, StoreRef>> = HashMap::new();
    for (index, slot) in store.slots.iter().enumerate() {
        let stream = index as u16;
        let last_seq = slot.stream.info().last_seq.unwrap_or(0);
        let mut from = 1;
        loop {
            let batch = read_damage_tolerant(&slot.stream, from, &control)?;
            for r in &batch.records {
                let Ok(topic) = std::str::from_utf8(&r.topic) else {
                    continue;
                };
                if let Some(client) = topic.strip_prefix(RX_PREFIX) {
                    let current = records.get(client).map(|r| r.incarnation);
                    if let Ok(bytes) = <[u8; 10]>::try_from(&r.payload[..]) {
                        let packet_id = u16::from_be_bytes([bytes[0], bytes[1]]);
                        let mut inc = [0u8; 8];
                        inc.copy_from_slice(&bytes[2..]);
                        if current == Some(u64::from_be_bytes(inc)) {
                            rx.entry(client.to_string())
                                .or_default()
                                .insert(packet_id, StoreRef { stream, seq: r.seq });
                        }
                    }
                } else if let Some(client) = topic.strip_prefix(REL_PREFIX) {
                    if let Ok(bytes) = <[u8; 8]>::try_from(&r.payload[..]) {
                        let rx_seq = u64::from_be_bytes(bytes);
                        if let Some(m) = rx.get_mut(client) {
                            m.retain(|_, p| !(p.stream == stream && p.seq == rx_seq));
                        }
                    }
                } else if let Some(client) = topic.strip_prefix(RESET_PREFIX) {
                    if let Some(m) = rx.get_mut(client) {
                        m.retain(|_, p| p.stream != stream);
                    }
                }
            }
            if batch.next_seq <= from || batch.next_seq > last_seq {
                break;
            }
            from = batch.next_seq;
        }
    }
    rx.retain(|client, _| records.contains_key(client));

    let now = now_ns();
    let mut sessions = Vec::with_capacity(records.len());
    for (client, record) in &records {
        let client_cursors = cursors.get(client);
        let mut pending_refs: HashSet<StoreRef> = HashSet::new();
        let mut pubrel_pending = Vec::new();
        let mut cursor_of = Vec::new();
        for slot in &store.slots {
            cursor_of.push(
                client_cursors
                    .and_then(|c| c.get(&slot.spec.name))
                    .copied()
                    .unwrap_or(1),
            );
        }
        for &(packet_id, position) in pubrel.get(client).map(Vec::as_slice).unwrap_or(&[]) {
            let stale = position.is_some_and(|p| {
                p.seq < cursor_of.get(usize::from(p.stream)).copied().unwrap_or(1)
            });
            if stale {
                let key = outbound_key(client, packet_id);
                if let Some(m) = store.pubrel.lock().get_mut(client.as_str()) {
                    m.remove(&packet_id);
                }
                let _ = store.outbound.delete(&key);
                continue;
            }
            if let Some(p) = position {
                pending_refs.insert(p);
            }
            pubrel_pending.push((packet_id, position));
        }
        let filters: Vec<&str> = record
            .subscriptions
            .iter()
            .map(|(f, _)| f.as_str())
            .filter(|f| !f.starts_with("$share/"))
            .collect();
        let mut pending: VecDeque<Message> = VecDeque::new();
        let mut dropped = 0u64;
        if !filters.is_empty() {
            let fs = FilterSet::new(filters.iter());
            for (index, slot) in store.slots.iter().enumerate() {
                let mut from = cursor_of[index];
                let last_seq = slot.stream.info().last_seq.unwrap_or(0);
                loop {
                    let batch = read_damage_tolerant(&slot.stream, from, &fs)?;
                    for r in batch.records {
                        if r.topic.starts_with(b"$tern/") || r.is_tombstone() {
                            continue;
                        }
                        let stored = StoreRef {
                            stream: index as u16,
                            seq: r.seq,
                        };
                        if pending_refs.contains(&stored) {
                            continue;
                        }
                        let age = Duration::from_nanos(now.saturating_sub(r.time_ns));
                        let Some(message) =
                            codec::decode_message(&r.topic, &r.properties, r.payload, age)
                        else {
                            tracing::error!(
                                seq = r.seq,
                                stream = slot.spec.name,
                                "undecodable message record skipped"
                            );
                            continue;
                        };
                        let _ = message.stored.set(stored);
                        pending.push_back(message);
                        if pending.len() > max_pending {
                            pending.pop_front();
                            dropped += 1;
                        }
                    }
                    if batch.next_seq <= from || batch.next_seq > last_seq {
                        break;
                    }
                    from = batch.next_seq;
                }
            }
        }
        if dropped > 0 {
            tracing::warn!(client_id = %client, dropped, "session queue limit: oldest stored messages dropped at start-up");
        }
        let client_rx = rx.remove(client).unwrap_or_default();
        let qos2_received: Vec<u16> = client_rx.keys().copied().collect();
        store.rx.lock().insert(client.clone(), client_rx);
        store.mirror.lock().insert(client.clone(), record.clone());
        store
            .written_cursors
            .lock()
            .insert(client.clone(), cursor_of.clone());
        sessions.push(session_from(
            client,
            record,
            qos2_received,
            pubrel_pending,
            pending,
            store.limits.max_inflight_per_session,
        ));
    }

    let mut retained = Vec::new();
    for (topic, value) in store.retained.entries(&all)? {
        match codec::decode_retained(&topic, &value) {
            Some(m) => retained.push(m),
            None => tracing::error!(topic = ?topic, "undecodable retained message skipped"),
        }
    }
    let pending: usize = sessions
        .iter()
        .map(|s| s.queued.len() + s.inflight.len())
        .sum();
    tracing::info!(
        sessions = sessions.len(),
        pending,
        retained = retained.len(),
        "state recovered from the store"
    );
    Ok(Recovered { sessions, retained })
}

/// The delivery QoS of `message` for a session with these subscriptions (the highest of the
/// matching non-shared ones), or `None` if none matches.
fn delivery_qos(record: &SessionRecord, client_id: &str, message: &Message) -> Option<QoS> {
    record
        .subscriptions
        .iter()
        .filter(|(filter, sub)| {
            !filter.starts_with("$share/")
                && tern_store::topic_matches(filter.as_bytes(), message.topic.as_bytes())
                && !(sub.options.no_local && message.publisher.as_deref() == Some(client_id))
        })
        .map(|(_, sub)| message.qos.min(sub.options.qos))
        .max()
}

/// A recovered session in the broker's shape. Its first pending messages go back in flight
/// under their derived packet ids (resent with DUP=1: they may have been sent before the
/// crash [MQTT-4.4.0-1]); once one cannot, the rest are queued, so order is kept.
fn session_from(
    client: &str,
    record: &SessionRecord,
    qos2_received: Vec<u16>,
    pubrel_pending: Vec<(u16, Option<StoreRef>)>,
    pending: VecDeque<Message>,
    max_inflight: usize,
) -> StoredSession {
    let mut used: HashSet<u16> = pubrel_pending.iter().map(|&(pi, _)| pi).collect();
    let mut inflight: Vec<StoredInflight> = pubrel_pending
        .into_iter()
        .map(|(packet_id, position)| {
            // Only the position matters (the session holds it, so its cursor stays below
            // until PUBCOMP); the PUBLISH itself is never sent again.
            let message = Message::new(
                tern_wire::Str::from_static("$tern/pubrel"),
                bytes::Bytes::new(),
                QoS::ExactlyOnce,
                false,
                tern_wire::Properties::default(),
                None,
                tokio::time::Instant::now(),
            );
            if let Some(position) = position {
                let _ = message.stored.set(position);
            }
            StoredInflight {
                packet_id,
                message,
                qos: QoS::ExactlyOnce,
                pubrel_pending: true,
            }
        })
        .collect();
    let mut queued = Vec::new();
    for message in pending {
        let Some(qos) = delivery_qos(record, client, &message) else {
            continue;
        };
        if queued.is_empty() && qos != QoS::AtMostOnce && inflight.len() < max_inflight {
            if let Some(packet_id) = message.store_ref().map(StoreRef::packet_id) {
                if used.insert(packet_id) {
                    inflight.push(StoredInflight {
                        packet_id,
                        message,
                        qos,
                        pubrel_pending: false,
                    });
                    continue;
                }
            }
        }
        queued.push((message, qos));
    }
    StoredSession {
        client_id: client.to_string(),
        protocol: record.protocol(),
        expiry_interval_s: record.expiry_interval_s,
        subscriptions: record
            .subscriptions
            .iter()
            .map(|(f, sub)| (f.clone(), sub.options, sub.subscription_id))
            .collect(),
        qos2_received,
        inflight,
        queued,
    }
}
