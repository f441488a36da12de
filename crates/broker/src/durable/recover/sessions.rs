//! Persistent sessions at start-up: their outbound QoS 2 exchanges go back in flight under
//! the packet ids they had (PUBLISH resent with DUP=1, or PUBREL), and the stored messages
//! after their cursors that their filters match, minus those exchanges and the completed ones,
//! are queued in stream order.
//!
//! Each message stream is read **once** for every session together, from the lowest cursor
//! on: each record is matched against a trie of the sessions' filters, and decoded once into
//! one `Arc<Message>` that every session owed it shares (100,000 offline sessions holding the
//! same 10 messages hold 10 messages, not a million copies).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tern_store::{FilterSet, StoreError};
use tern_topic::SubscriptionTrie;
use tern_wire::QoS;

use super::super::codec::{self, SessionRecord};
use super::super::exchanges::{ClientExchanges, LivePhase};
use super::super::{DurableStore, RECOVERY_READ_BYTES};
use super::read_damage_tolerant;
use crate::hash::{Map, Set};
use crate::model::message::Message;
use crate::model::topics;
use crate::model::{StoreRef, StoredInflight, StoredSession};

/// Above this many distinct filters the stream read takes every topic and the trie alone
/// selects (a `FilterSet` matches filter by filter).
const MAX_READ_FILTERS: usize = 64;

/// What recovery knows of one persistent session before its messages are read.
pub(super) struct SessionInput<'a> {
    pub(crate) client: &'a str,
    pub(crate) record: &'a SessionRecord,
    pub(crate) cursor_of: Vec<u64>,
    pub(crate) exchanges: ClientExchanges,
    pub(crate) qos2_received: Vec<u16>,
}

/// What one session gets from the stream pass.
#[derive(Default)]
struct Replayed {
    pending: VecDeque<Arc<Message>>,
    /// Messages of exchanges in the `Sent` phase, to resend under their ids.
    resend: Map<StoreRef, Arc<Message>>,
    dropped: u64,
    /// Bytes of `pending` (`Message::approx_len`), for `max_pending_bytes_per_session`.
    pending_bytes: usize,
    /// The last sequence pushed (a record matching several filters is taken once).
    last: Option<StoreRef>,
}

/// Per session: the positions it must not replay as new PUBLISHes, and those to resend.
struct Exclusions {
    excluded: Set<StoreRef>,
    sent: Set<StoreRef>,
}

impl Replayed {
    /// Queues a replayed message, dropping the oldest beyond the session's bounds; the newest
    /// is kept even alone over the byte limit, as at run time.
    fn push_pending(&mut self, m: Arc<Message>, max_pending: usize, max_pending_bytes: usize) {
        self.pending_bytes += m.approx_len();
        self.pending.push_back(m);
        while self.pending.len() > 1
            && (self.pending.len() > max_pending || self.pending_bytes > max_pending_bytes)
        {
            if let Some(old) = self.pending.pop_front() {
                self.pending_bytes -= old.approx_len();
            }
            self.dropped += 1;
        }
    }
}

impl Exclusions {
    fn of(input: &SessionInput<'_>) -> Exclusions {
        Exclusions {
            excluded: input.exchanges.excluded().collect(),
            sent: input
                .exchanges
                .live
                .values()
                .filter(|l| l.phase == LivePhase::Sent)
                .filter_map(|l| l.stored)
                .collect(),
        }
    }
}

/// One trie of every session's non-shared filters (keyed by the session's index), and the
/// distinct filters.
fn filter_trie<'a>(inputs: &'a [SessionInput<'_>]) -> (SubscriptionTrie<u32, ()>, Set<&'a str>) {
    let mut trie: SubscriptionTrie<u32, ()> =
        SubscriptionTrie::with_limits(tern_topic::DEFAULT_MAX_FILTER_LEVELS, usize::MAX);
    let mut distinct: Set<&str> = Set::default();
    for (index, input) in inputs.iter().enumerate() {
        for (filter, _) in &input.record.subscriptions {
            if topics::is_shared_filter(filter) {
                continue;
            }
            if trie.subscribe(filter, index as u32, ()).is_ok() {
                distinct.insert(filter.as_str());
            }
        }
    }
    (trie, distinct)
}

/// A replayed record as a message at `stored`, decoded once for every session that holds it
/// (one shared encoding); an undecodable record is logged and skipped.
fn decode_stored(
    r: &tern_store::Record,
    stored: StoreRef,
    now_ns: u64,
    stream: &str,
) -> Option<Arc<Message>> {
    let age = Duration::from_nanos(now_ns.saturating_sub(r.time_ns));
    let Some(m) = codec::decode_message(&r.topic, &r.properties, r.payload.clone(), age) else {
        tracing::error!(seq = r.seq, stream, "undecodable message record skipped");
        return None;
    };
    m.mark_stored(stored);
    m.mark_fan_out();
    Some(Arc::new(m))
}

/// Rebuilds every session (see the module doc).
pub(super) fn rebuild_all(
    store: &DurableStore,
    inputs: &[SessionInput<'_>],
) -> Result<Vec<StoredSession>, StoreError> {
    let mut replayed = replay_all(store, inputs)?;
    let mut out = Vec::with_capacity(inputs.len());
    for (input, r) in inputs.iter().zip(replayed.iter_mut()) {
        let client = input.client;
        let record = input.record;
        if r.dropped > 0 {
            tracing::warn!(
                client_id = client,
                dropped = r.dropped,
                "session queue limit: oldest stored messages dropped at start-up"
            );
        }
        let inflight = inflight(store, client, &input.exchanges, &mut r.resend);
        let queued = std::mem::take(&mut r.pending)
            .into_iter()
            .filter_map(|message| delivery_qos(record, client, &message).map(|qos| (message, qos)))
            .collect();
        out.push(StoredSession {
            client_id: client.to_string(),
            protocol: record.protocol(),
            expiry_interval_s: record.expiry_interval_s,
            subscriptions: record
                .subscriptions
                .iter()
                .map(|(f, sub)| (f.clone(), sub.options, sub.subscription_id))
                .collect(),
            qos2_received: input.qos2_received.clone(),
            inflight,
            queued,
            dropped_queue_limit: r.dropped,
        });
    }
    Ok(out)
}

/// One pass per message stream for all sessions (see the module doc).
fn replay_all(
    store: &DurableStore,
    inputs: &[SessionInput<'_>],
) -> Result<Vec<Replayed>, StoreError> {
    let max_pending = store.limits.max_pending_per_session;
    let max_pending_bytes = store.limits.max_pending_bytes_per_session;
    let mut out: Vec<Replayed> = inputs.iter().map(|_| Replayed::default()).collect();
    let exclusions: Vec<Exclusions> = inputs.iter().map(Exclusions::of).collect();
    let (trie, distinct) = filter_trie(inputs);
    if distinct.is_empty() {
        return Ok(out);
    }
    let fs = if distinct.len() <= MAX_READ_FILTERS {
        FilterSet::new(distinct.iter())
    } else {
        FilterSet::all()
    };
    let now = store.now_ns();
    let mut matched: Vec<u32> = Vec::new();
    for (index, slot) in store.slots.iter().enumerate() {
        let stream = index as u16;
        let cursor = |i: usize| inputs[i].cursor_of.get(index).copied().unwrap_or(1);
        let Some(mut from) = (0..inputs.len())
            .filter(|&i| !inputs[i].record.subscriptions.is_empty())
            .map(cursor)
            .min()
        else {
            continue;
        };
        let last_seq = slot.stream.info().last_seq.unwrap_or(0);
        loop {
            let batch = read_damage_tolerant(&slot.stream, from, &fs)?;
            for r in batch.records {
                if topics::is_internal(&r.topic) || r.is_tombstone() {
                    continue;
                }
                let Ok(topic) = std::str::from_utf8(&r.topic) else {
                    continue;
                };
                let stored = StoreRef { stream, seq: r.seq };
                matched.clear();
                trie.for_each_subscription(topic, |&i, _| matched.push(i));
                let mut message: Option<Option<Arc<Message>>> = None;
                for &i in &matched {
                    let i = i as usize;
                    if r.seq < cursor(i) || out[i].last == Some(stored) {
                        continue;
                    }
                    let ex = &exclusions[i];
                    let is_sent = ex.sent.contains(&stored);
                    if ex.excluded.contains(&stored) && !is_sent {
                        continue;
                    }
                    let m = message
                        .get_or_insert_with(|| decode_stored(&r, stored, now, &slot.spec.name));
                    let Some(m) = m else {
                        break;
                    };
                    let o = &mut out[i];
                    o.last = Some(stored);
                    if is_sent {
                        o.resend.insert(stored, m.clone());
                        if !crate::inject::on(crate::inject::Bug::ReplayIgnoresInflight) {
                            continue;
                        }
                    }
                    o.push_pending(m.clone(), max_pending, max_pending_bytes);
                }
            }
            if batch.next_seq <= from || batch.next_seq > last_seq {
                break;
            }
            from = batch.next_seq;
        }
    }
    Ok(out)
}

/// The session's live exchanges, in stream order (the order they were sent in, per
/// publisher): PUBREL pending ones resend PUBREL, sent ones the PUBLISH under the same id.
fn inflight(
    store: &DurableStore,
    client: &str,
    exchanges: &ClientExchanges,
    resend: &mut Map<StoreRef, Arc<Message>>,
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
            LivePhase::PubRel => Arc::new(pubrel_placeholder(stored)),
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
        message.mark_stored(position);
    }
    message
}

/// The message at `at`, read directly (an in-flight message the session's filters no longer
/// match, after an unsubscribe).
fn read_one(store: &DurableStore, at: StoreRef) -> Option<Arc<Message>> {
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
    let age = Duration::from_nanos(store.now_ns().saturating_sub(r.time_ns));
    let message = codec::decode_message(&r.topic, &r.properties, r.payload, age)?;
    message.mark_stored(at);
    Some(Arc::new(message))
}

/// The delivery QoS of `message` for a session with these subscriptions (the highest of the
/// matching non-shared ones), or `None` if none matches.
fn delivery_qos(record: &SessionRecord, client_id: &str, message: &Message) -> Option<QoS> {
    record
        .subscriptions
        .iter()
        .filter(|(filter, sub)| {
            !topics::is_shared_filter(filter)
                && tern_topic::filter_matches(filter, &message.topic)
                && !(sub.options.no_local && message.publisher.as_deref() == Some(client_id))
        })
        .map(|(_, sub)| message.qos.min(sub.options.qos))
        .max()
}
