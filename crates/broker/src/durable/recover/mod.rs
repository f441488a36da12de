//! Start-up: rebuilds persistent sessions, their received sets, outbound QoS 2 exchanges and
//! pending messages (cursor + filters), share-group queues (`super::shared`), wills still owed
//! (`super::wills`) and the retained messages from the store, in the broker's shape
//! ([`Recovered`]). Damaged blocks met on the way are quarantined by the store,
//! reported, and stepped over.

mod sessions;

use bytes::Bytes;
use tern_store::{FilterSet, StoreError, Stream};

use super::codec::{self, SessionRecord};
use super::{
    DurableStore, RECOVERY_READ_BYTES, RECOVERY_READ_RECORDS, REL_PREFIX, RESET_PREFIX, RX_PREFIX,
};
use crate::hash::Map;
use crate::model::{Recovered, StoreRef};

/// Most damaged blocks one recovery read steps over.
const MAX_DAMAGED_BLOCKS_PER_READ: usize = 64;

/// `read_from` for recovery: a read that meets a damaged sealed block has it quarantined by
/// the store (reported in the log) and is retried, so everything undamaged is still served.
pub(in crate::durable) fn read_damage_tolerant(
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
    let started = std::time::Instant::now();
    let all = FilterSet::all();
    // `tern.sessions` read once for all its key spaces.
    let mut state = super::keyspace::Keyspace::read_all(&store.sessions.kv, &all)?;
    let mut take = |prefix: u8| state.remove(&prefix).unwrap_or_default();
    let session_entries = take(store.sessions.prefix());
    let cursor_entries = take(store.cursors.prefix());
    let rx_start_entries = take(store.rx_start.prefix());
    let records = read_sessions(store, session_entries);
    let cursors = read_cursors(cursor_entries);
    // Inbound QoS 2 received sets from the control records of every stream, in order, from
    // the rx checkpoint on: below it every rx record was released (`reclaim` module).
    let rx_start_of = read_rx_starts(store, rx_start_entries);
    tracing::debug!(elapsed = ?started.elapsed(), "recovery: session records and cursors read");
    let (mut rx, control_read) = read_received_sets(store, &records, &rx_start_of)?;
    rx.retain(|client, _| records.contains_key(client));

    tracing::debug!(elapsed = ?started.elapsed(), control_read, "recovery: QoS 2 control records read");
    let mut exchanges = store.load_exchanges(&|client| records.contains_key(client), &mut state);
    let group_entries = state.remove(&store.groups.prefix()).unwrap_or_default();
    let groups =
        super::shared::recover_groups(store, &records, &cursors, &exchanges, group_entries)?;
    let will_entries = state.remove(&store.wills.prefix()).unwrap_or_default();
    let wills = super::wills::recover_wills(store, &records, will_entries)?;
    let mut inputs = Vec::with_capacity(records.len());
    for (client, record) in &records {
        let cursor_of = cursor_of(store, cursors.get(client));
        let mut client_exchanges = exchanges.remove(client).unwrap_or_default();
        // A share-group message in flight to this member may lie below the member's own
        // cursor (it was the group's while queued): only below its groups' cursors too is an
        // exchange stale. Found by the broker simulator (seed 60, docs/simulation.md).
        let stale_below = store.lowered_by_groups(
            record.subscriptions.iter().map(|(f, _)| f.as_str()),
            &cursor_of,
        );
        store.drop_stale(client, &mut client_exchanges, &stale_below);
        let client_rx = rx.remove(client).unwrap_or_default();
        inputs.push(sessions::SessionInput {
            client,
            record,
            cursor_of,
            exchanges: client_exchanges,
            qos2_received: client_rx.keys().copied().collect(),
        });
        store.rx.lock().insert(client.clone(), client_rx);
    }
    tracing::debug!(elapsed = ?started.elapsed(), "recovery: exchanges read");
    let sessions = sessions::rebuild_all(store, &inputs)?;
    tracing::debug!(elapsed = ?started.elapsed(), "recovery: sessions rebuilt");
    drop(state);
    keep_open_state(store, inputs);

    *store.reclaim.lock() = super::reclaim::ReclaimState::new(rx_start_of);
    store
        .control_records_read
        .store(control_read, std::sync::atomic::Ordering::Relaxed);
    // Sets the retention floors of the open state just rebuilt (the streams opened pinned).
    store.reclaim_step(true);

    tracing::debug!(elapsed = ?started.elapsed(), "recovery: sessions handed over");
    let retained = read_retained(store, &all)?;
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
    Ok(Recovered {
        sessions,
        retained,
        groups,
        wills,
    })
}

/// The session records (`s`+client), without those whose expiry ran out while the broker was
/// down (deleted now); the rest of an interval runs from the restart.
fn read_sessions(store: &DurableStore, entries: Vec<(Bytes, Bytes)>) -> Map<String, SessionRecord> {
    let mut records: Map<String, SessionRecord> = Map::default();
    for (key, value) in entries {
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
    let now_s = store.now_ns() / 1_000_000_000;
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
    records
}

/// The cursors (`c`+client): per client, per stream name, the sequence to replay from.
fn read_cursors(entries: Vec<(Bytes, Bytes)>) -> Map<String, Map<String, u64>> {
    let mut cursors: Map<String, Map<String, u64>> = Map::default();
    for (key, value) in entries {
        if let (Ok(client), Some(pos)) =
            (std::str::from_utf8(&key), codec::decode_positions(&value))
        {
            cursors.insert(client.to_string(), pos.into_iter().collect());
        }
    }
    cursors
}

/// Per stream (in the store's order), the rx checkpoint: below it every rx record was
/// released (`reclaim` module), so the control records are read from there.
fn read_rx_starts(store: &DurableStore, entries: Vec<(Bytes, Bytes)>) -> Vec<u64> {
    let mut rx_starts: Map<String, u64> = Map::default();
    for (key, value) in entries {
        if let (Ok(name), Some(seq)) = (
            std::str::from_utf8(&key),
            super::reclaim::decode_rx_start(&value),
        ) {
            rx_starts.insert(name.to_string(), seq);
        }
    }
    store
        .slots
        .iter()
        .map(|s| rx_starts.get(&s.spec.name).copied().unwrap_or(1))
        .collect()
}

/// Inbound QoS 2 received sets from the control records of every stream, in order, from the
/// rx checkpoints on: an `rx` record of the session's current incarnation opens an id, its
/// `rel` record closes it, a `reset` closes every id of the stream. Also how many control
/// records were read.
#[allow(clippy::type_complexity)]
fn read_received_sets(
    store: &DurableStore,
    records: &Map<String, SessionRecord>,
    rx_start_of: &[u64],
) -> Result<(Map<String, Map<u16, StoreRef>>, u64), StoreError> {
    let control = FilterSet::new([crate::model::topics::INTERNAL_FILTER]);
    let mut rx: Map<String, Map<u16, StoreRef>> = Map::default();
    let mut control_read = 0u64;
    for (index, slot) in store.slots.iter().enumerate() {
        let stream = index as u16;
        let last_seq = slot.stream.info().last_seq.unwrap_or(0);
        let mut from = rx_start_of[index];
        tracing::debug!(
            stream = slot.spec.name,
            from,
            "reading QoS 2 control records"
        );
        loop {
            let batch = read_damage_tolerant(&slot.stream, from, &control)?;
            control_read += batch.records.len() as u64;
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
    Ok((rx, control_read))
}

/// The retained messages (undecodable ones are logged and skipped).
fn read_retained(
    store: &DurableStore,
    all: &FilterSet,
) -> Result<Vec<crate::model::Message>, StoreError> {
    let mut retained = Vec::new();
    for (topic, value) in store.retained.entries(all)? {
        match codec::decode_retained(&topic, &value) {
            Some(m) => retained.push(m),
            None => tracing::error!(topic = ?topic, "undecodable retained message skipped"),
        }
    }
    Ok(retained)
}

/// A session's cursor per stream, in the store's order (1, the start, where none was written).
fn cursor_of(store: &DurableStore, cursors: Option<&Map<String, u64>>) -> Vec<u64> {
    store
        .slots
        .iter()
        .map(|slot| {
            cursors
                .and_then(|c| c.get(&slot.spec.name))
                .copied()
                .unwrap_or(1)
        })
        .collect()
}

/// What the store keeps of the rebuilt sessions from here on: their open exchanges, the
/// mirror of their records and the cursors as written.
fn keep_open_state(store: &DurableStore, inputs: Vec<sessions::SessionInput<'_>>) {
    for input in inputs {
        let client = input.client.to_string();
        store
            .exchanges
            .lock()
            .insert(client.clone(), input.exchanges);
        store
            .mirror
            .lock()
            .insert(client.clone(), input.record.clone());
        store.written_cursors.lock().insert(client, input.cursor_of);
    }
    store.cursors_changed();
}
