//! One persistent session at start-up: its outbound QoS 2 exchanges go back in flight under
//! the packet ids they had (PUBLISH resent with DUP=1, or PUBREL), and the stored messages
//! after its cursor that its filters match, minus those exchanges and the completed ones, are
//! queued in stream order.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use tern_store::{FilterSet, StoreError};
use tern_wire::QoS;

use super::super::codec::{self, SessionRecord};
use super::super::exchanges::{ClientExchanges, LivePhase};
use super::super::{DurableStore, RECOVERY_READ_BYTES, now_ns};
use super::read_damage_tolerant;
use crate::message::Message;
use crate::persist::{StoreRef, StoredInflight, StoredSession};

/// Rebuilds `client`'s session from its record, cursor and exchanges.
pub(super) fn rebuild(
    store: &DurableStore,
    client: &str,
    record: &SessionRecord,
    cursor_of: &[u64],
    exchanges: &ClientExchanges,
    qos2_received: Vec<u16>,
) -> Result<StoredSession, StoreError> {
    let excluded: HashSet<StoreRef> = exchanges.excluded().collect();
    let (pending, mut resend, dropped) =
        replay(store, client, record, cursor_of, &excluded, exchanges)?;
    let inflight = inflight(store, client, exchanges, &mut resend);
    let queued = pending
        .into_iter()
        .filter_map(|message| delivery_qos(record, client, &message).map(|qos| (message, qos)))
        .collect();
    Ok(StoredSession {
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
        dropped_queue_limit: dropped,
    })
}

/// What [`replay`] found: the messages to queue, those to resend under their ids, and how
/// many of the oldest were left out for the session queue limits.
type Replayed = (VecDeque<Message>, HashMap<StoreRef, Message>, u64);

/// The stored messages after the cursor that the session's (non-shared) filters match: the
/// ones to queue, and those of exchanges in the `Sent` phase (to resend under their ids).
fn replay(
    store: &DurableStore,
    client: &str,
    record: &SessionRecord,
    cursor_of: &[u64],
    excluded: &HashSet<StoreRef>,
    exchanges: &ClientExchanges,
) -> Result<Replayed, StoreError> {
    let max_pending = store.limits.max_pending_per_session;
    let max_pending_bytes = store.limits.max_pending_bytes_per_session;
    let mut pending_bytes = 0usize;
    let sent: HashSet<StoreRef> = exchanges
        .live
        .values()
        .filter(|l| l.phase == LivePhase::Sent)
        .filter_map(|l| l.stored)
        .collect();
    let mut pending = VecDeque::new();
    let mut resend = HashMap::new();
    let filters: Vec<&str> = record
        .subscriptions
        .iter()
        .map(|(f, _)| f.as_str())
        .filter(|f| !f.starts_with("$share/"))
        .collect();
    if filters.is_empty() {
        return Ok((pending, resend, 0));
    }
    let fs = FilterSet::new(filters.iter());
    let now = now_ns();
    let mut dropped = 0u64;
    for (index, slot) in store.slots.iter().enumerate() {
        let mut from = cursor_of.get(index).copied().unwrap_or(1);
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
                if excluded.contains(&stored) && !sent.contains(&stored) {
                    continue;
                }
                let age = Duration::from_nanos(now.saturating_sub(r.time_ns));
                let Some(message) = codec::decode_message(&r.topic, &r.properties, r.payload, age)
                else {
                    tracing::error!(
                        seq = r.seq,
                        stream = slot.spec.name,
                        "undecodable message record skipped"
                    );
                    continue;
                };
                let _ = message.stored.set(stored);
                if sent.contains(&stored) {
                    resend.insert(stored, message);
                    continue;
                }
                pending_bytes += message.approx_len();
                pending.push_back(message);
                // The newest is kept even alone over the byte limit, as at run time.
                while pending.len() > 1
                    && (pending.len() > max_pending || pending_bytes > max_pending_bytes)
                {
                    if let Some(old) = pending.pop_front() {
                        pending_bytes -= old.approx_len();
                    }
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
            client_id = client,
            dropped,
            "session queue limit: oldest stored messages dropped at start-up"
        );
    }
    Ok((pending, resend, dropped))
}

/// The session's live exchanges, in stream order (the order they were sent in, per
/// publisher): PUBREL pending ones resend PUBREL, sent ones the PUBLISH under the same id.
fn inflight(
    store: &DurableStore,
    client: &str,
    exchanges: &ClientExchanges,
    resend: &mut HashMap<StoreRef, Message>,
) -> Vec<StoredInflight> {
    let mut live: Vec<(u16, Option<StoreRef>, LivePhase)> = exchanges
        .live
        .iter()
        .map(|(&pi, l)| (pi, l.stored, l.phase))
        .collect();
    live.sort_by_key(|&(pi, stored, _)| (stored, pi));
    let mut out = Vec::with_capacity(live.len());
    for (packet_id, stored, phase) in live {
        let message = match phase {
            LivePhase::PubRel => pubrel_placeholder(stored),
            LivePhase::Sent => {
                let Some(message) =
                    stored.and_then(|r| resend.remove(&r).or_else(|| read_one(store, r)))
                else {
                    // Retention removed it or its block is damaged: the exchange cannot be
                    // resumed; it is reported and counts as given up.
                    tracing::warn!(
                        client_id = client,
                        packet_id,
                        ?stored,
                        "in-flight QoS 2 message no longer in the store; exchange dropped"
                    );
                    continue;
                };
                message
            }
        };
        out.push(StoredInflight {
            packet_id,
            message,
            qos: QoS::ExactlyOnce,
            pubrel_pending: phase == LivePhase::PubRel,
        });
    }
    out
}

/// A message in flight whose PUBREC arrived: only its position matters (the session holds
/// it, so its cursor stays below it until PUBCOMP); the PUBLISH is never sent again.
fn pubrel_placeholder(stored: Option<StoreRef>) -> Message {
    let message = Message::new(
        tern_wire::Str::from_static("$tern/pubrel"),
        bytes::Bytes::new(),
        QoS::ExactlyOnce,
        false,
        tern_wire::Properties::default(),
        None,
        tokio::time::Instant::now(),
    );
    if let Some(position) = stored {
        let _ = message.stored.set(position);
    }
    message
}

/// The message at `at`, read directly (an in-flight message the session's filters no longer
/// match, after an unsubscribe).
fn read_one(store: &DurableStore, at: StoreRef) -> Option<Message> {
    let slot = store.slots.get(usize::from(at.stream))?;
    let batch = slot
        .stream
        .read_from(at.seq, &FilterSet::all(), 1, RECOVERY_READ_BYTES)
        .ok()?;
    let r = batch
        .records
        .into_iter()
        .next()
        .filter(|r| r.seq == at.seq)?;
    let age = Duration::from_nanos(now_ns().saturating_sub(r.time_ns));
    let message = codec::decode_message(&r.topic, &r.properties, r.payload, age)?;
    let _ = message.stored.set(at);
    Some(message)
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
