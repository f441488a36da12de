//! Share-group queues on disk (MQTT 5 §4.8.2; [`crate::engine::groups`] in memory): a group's
//! queue is a cursor plus the group's filter, like a persistent session's.
//!
//! - `g` ++ `$share/{group}/{filter}` (key space of `tern.sessions`) → per message stream, the
//!   sequence below which every record the group's filter matches was done
//!   ([`codec::encode_positions`]). Written when the first persistent session joins the group
//!   (in the same stream, before the session record its SUBACK waits for: the group's cursor
//!   starts at the floors of that moment), then by the checkpointer from what the group's queue
//!   and its members hold of the group's messages; deleted when the group loses its last
//!   member.
//! - At start-up, a group some persistent session is still a member of gets the records after
//!   its cursor that its filter matches, minus those that a member's outbound QoS 2 exchange
//!   covers (in flight: the member resends them under their packet ids; completed: `d`
//!   markers), as its queue; they go to members as they connect. A `g` record without a member
//!   session is deleted (logged); a group with members but no record (never checkpointed)
//!   starts from the lowest of its members' cursors.
//!
//! # Invariants
//! - Group cursor safety is the session cursor's: floors first, then what the group holds.
//! - A member's `d` marker (a completed QoS 2 exchange) is cleared only once the cursors of
//!   the member **and** of each of its groups passed it, and group cursors are written before
//!   the members' in a checkpoint pass: a completed shared QoS 2 message is never replayed to
//!   the group.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tern_store::{FilterSet, StoreError};

use super::DurableStore;
use super::codec::{self, SessionRecord};
use super::exchanges::ClientExchanges;
use super::recover::read_damage_tolerant;
use crate::hash::{Map, Set};
use crate::model::message::Message;
use crate::model::{HeldSeqs, StoreRef, StoredGroup};

fn is_share(filter: &str) -> bool {
    filter.starts_with(tern_topic::SHARE_PREFIX)
}

impl DurableStore {
    fn write_group_cursor(&self, share: &str, cursor: &[u64]) {
        if let Err(error) = self
            .groups
            .put(share.as_bytes(), &self.encode_cursor(cursor))
        {
            tracing::error!(%error, share, "cannot write share group cursor");
        }
    }

    /// A persistent session joined `share`: the group's cursor starts now if it has none.
    pub(super) fn group_joined(&self, share: &str) {
        if !is_share(share) {
            return;
        }
        let mut cursors = self.group_cursors.lock();
        if cursors.contains_key(share) {
            return;
        }
        let floors = self.floors();
        self.write_group_cursor(share, &floors);
        cursors.insert(share.to_string(), floors);
    }

    pub(super) fn group_gone(&self, share: &str) {
        if self.group_cursors.lock().remove(share).is_some() {
            let _ = self.groups.delete(share.as_bytes());
        }
    }

    pub(super) fn durable_group_list(&self) -> Vec<Arc<str>> {
        self.group_cursors
            .lock()
            .keys()
            .map(|k| k.as_str().into())
            .collect()
    }

    pub(super) fn checkpoint_group_cursor(
        &self,
        share: &str,
        floors: &[u64],
        held: &HeldSeqs,
    ) -> bool {
        let mut cursor = floors.to_vec();
        for &(stream, seq) in held {
            if let Some(c) = cursor.get_mut(usize::from(stream)) {
                *c = (*c).min(seq);
            }
        }
        // The write is issued under the lock: reclamation reads the group cursors and then
        // the state stream's last sequence, so every cursor it sees is covered by the
        // durability it waits for (`reclaim`).
        let mut cursors = self.group_cursors.lock();
        match cursors.get_mut(share) {
            None => return false,
            Some(written) if *written == cursor => return false,
            Some(written) => written.clone_from(&cursor),
        }
        self.write_group_cursor(share, &cursor);
        true
    }

    /// `cursor` lowered to the written cursor of every group `client_id` is a member of: the
    /// bound below which its completed-exchange markers may be cleared.
    pub(super) fn done_floor(&self, client_id: &str, cursor: &[u64]) -> Vec<u64> {
        let shares: Vec<String> = match self.mirror.lock().get(client_id) {
            Some(record) => record
                .subscriptions
                .iter()
                .map(|(f, _)| f)
                .filter(|f| is_share(f))
                .cloned()
                .collect(),
            None => return cursor.to_vec(),
        };
        self.lowered_by_groups(shares.iter().map(String::as_str), cursor)
    }

    /// `cursor` lowered to the written cursor of each group in `filters` (other filters are
    /// skipped). A member's cursor alone does not hold the group's messages it has in flight
    /// (the group's cursor does, ARCHITECTURE §5): below this floor, and only there, is an
    /// exchange of the member stale.
    pub(super) fn lowered_by_groups<'a>(
        &self,
        filters: impl Iterator<Item = &'a str>,
        cursor: &[u64],
    ) -> Vec<u64> {
        let mut floor = cursor.to_vec();
        let groups = self.group_cursors.lock();
        for share in filters.filter(|f| is_share(f)) {
            if let Some(g) = groups.get(share) {
                for (f, &c) in floor.iter_mut().zip(g) {
                    *f = (*f).min(c);
                }
            }
        }
        floor
    }
}

/// Rebuilds the queues of the share groups that persistent sessions (`records`) are members
/// of (see the module doc); deletes the records of groups without one.
pub(super) fn recover_groups(
    store: &DurableStore,
    records: &Map<String, SessionRecord>,
    cursors: &Map<String, Map<String, u64>>,
    exchanges: &Map<String, ClientExchanges>,
    entries: Vec<(bytes::Bytes, bytes::Bytes)>,
) -> Result<Vec<StoredGroup>, StoreError> {
    let mut members: Map<&str, Vec<&str>> = Map::default();
    for (client, record) in records {
        for (filter, _) in &record.subscriptions {
            if is_share(filter) {
                members.entry(filter.as_str()).or_default().push(client);
            }
        }
    }
    let slot_cursor = |positions: &Map<String, u64>| -> Vec<u64> {
        store
            .slots
            .iter()
            .map(|s| positions.get(&s.spec.name).copied().unwrap_or(1))
            .collect()
    };
    let mut written: Map<String, Vec<u64>> = Map::default();
    for (key, value) in entries {
        let Ok(share) = std::str::from_utf8(&key) else {
            continue;
        };
        if !members.contains_key(share) {
            tracing::info!(
                share,
                "share group has no member session left; its queue is dropped"
            );
            let _ = store.groups.delete(share.as_bytes());
            continue;
        }
        match codec::decode_positions(&value) {
            Some(p) => {
                written.insert(share.to_string(), slot_cursor(&p.into_iter().collect()));
            }
            None => tracing::error!(share, "undecodable share group cursor skipped"),
        }
    }
    let mut out = Vec::with_capacity(members.len());
    for (share, clients) in members {
        let cursor = match written.remove(share) {
            Some(c) => c,
            None => {
                // Never checkpointed: start where the earliest member stood.
                let empty = Map::default();
                let mut c = vec![u64::MAX; store.slots.len()];
                for client in &clients {
                    let m = slot_cursor(cursors.get(*client).unwrap_or(&empty));
                    for (a, b) in c.iter_mut().zip(m) {
                        *a = (*a).min(b);
                    }
                }
                store.write_group_cursor(share, &c);
                c
            }
        };
        let excluded: Set<StoreRef> = clients
            .iter()
            .filter_map(|c| exchanges.get(*c))
            .flat_map(|e| e.excluded())
            .collect();
        let queued = replay(store, share, &cursor, &excluded)?;
        store.group_cursors.lock().insert(share.to_string(), cursor);
        out.push(StoredGroup {
            share: share.to_string(),
            queued: queued.into(),
        });
    }
    Ok(out)
}

/// The stored QoS>0 messages after `cursor` that the group's filter matches, minus `excluded`.
fn replay(
    store: &DurableStore,
    share: &str,
    cursor: &[u64],
    excluded: &Set<StoreRef>,
) -> Result<VecDeque<Message>, StoreError> {
    let mut pending = VecDeque::new();
    let Some(Ok((_, filter))) = tern_topic::parse_shared_filter(share) else {
        tracing::error!(share, "stored share group has an invalid filter; skipped");
        return Ok(pending);
    };
    let fs = FilterSet::new([filter]);
    let max_pending = store.limits.max_pending_per_session;
    let now = store.now_ns();
    let mut dropped = 0u64;
    for (index, slot) in store.slots.iter().enumerate() {
        let mut from = cursor.get(index).copied().unwrap_or(1);
        let last_seq = slot.stream.info().last_seq.unwrap_or(0);
        loop {
            let batch = read_damage_tolerant(&slot.stream, from, &fs)?;
            for r in batch.records {
                if crate::model::topics::is_internal(&r.topic) || r.is_tombstone() {
                    continue;
                }
                let stored = StoreRef {
                    stream: index as u16,
                    seq: r.seq,
                };
                if excluded.contains(&stored) {
                    continue;
                }
                let age = Duration::from_nanos(now.saturating_sub(r.time_ns));
                let Some(message) = codec::decode_message(&r.topic, &r.properties, r.payload, age)
                else {
                    tracing::error!(seq = r.seq, share, "undecodable message record skipped");
                    continue;
                };
                if message.qos == tern_wire::QoS::AtMostOnce {
                    continue;
                }
                message.mark_stored(stored);
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
    if dropped > 0 {
        tracing::warn!(
            share,
            dropped,
            "share group queue limit: oldest stored messages dropped at start-up"
        );
    }
    if !pending.is_empty() {
        tracing::info!(
            share,
            queued = pending.len(),
            "share group queue replayed from the store"
        );
    }
    Ok(pending)
}
