//! Outbound QoS 2 exchanges of persistent sessions (ARCHITECTURE §3, outbound), in three key
//! spaces of `tern.sessions`:
//! - `p` ++ client ++ `\0` ++ packet id (u16 BE) → the message's position: the PUBLISH went
//!   (or is about to go) out under this id. Written **before** the first PUBLISH leaves, so a
//!   restarted broker resends the message under the same id;
//! - `o` ++ client ++ `\0` ++ packet id → position (or none for an unstored message): PUBREC
//!   arrived, PUBREL pending. Written before the PUBREL leaves; the `p` entry is deleted after
//!   it (same stream: the delete is never durable before the put);
//! - `d` ++ client ++ `\0` ++ stream name ++ `\0` ++ seq (u64 BE) → empty: the exchange of
//!   that message completed (PUBCOMP, or a PUBREC with a failure reason). A completed message
//!   may still lie above the session's cursor (an earlier message holds it back); the marker
//!   keeps it from being replayed as a new PUBLISH, and is cleared once the cursor passes it.
//!
//! Keying the live exchange by packet id and the completed one by position means a packet id
//! can be reused at once after PUBCOMP without losing what completed.
//!
//! # Invariants
//! - Every record of one exchange is in the one `tern.sessions` stream, written in exchange
//!   order: a later record durable implies the earlier ones are (group commit writes in order).
//! - The in-memory `ClientExchanges` mirror the live keys written for that client.

use std::collections::BTreeSet;

use tern_store::StoreError;

use super::{DurableStore, codec, io_error};
use crate::hash::Map;
use crate::model::{OutboundSent, StoreRef, Ticket};

/// Where an outbound QoS 2 exchange stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LivePhase {
    /// PUBLISH sent under the id, PUBREC not yet received.
    Sent,
    /// PUBREC received; PUBREL sent or to send.
    PubRel,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Live {
    pub(crate) stored: Option<StoreRef>,
    pub(crate) phase: LivePhase,
}

/// One persistent session's outbound QoS 2 state.
#[derive(Debug, Default)]
pub(super) struct ClientExchanges {
    pub(crate) live: Map<u16, Live>,
    /// Completed messages still above the session's cursor.
    pub(crate) done: BTreeSet<StoreRef>,
}

impl ClientExchanges {
    /// Positions the session must not replay as new PUBLISHes.
    pub(crate) fn excluded(&self) -> impl Iterator<Item = StoreRef> + '_ {
        self.live
            .values()
            .filter_map(|l| l.stored)
            .chain(self.done.iter().copied())
    }
}

pub(super) fn exchange_key(client_id: &str, packet_id: u16) -> Vec<u8> {
    let mut k = Vec::with_capacity(client_id.len() + 3);
    k.extend_from_slice(client_id.as_bytes());
    k.push(0);
    k.extend_from_slice(&packet_id.to_be_bytes());
    k
}

/// `(client, packet id)` from an `exchange_key`.
fn split_exchange_key(key: &[u8]) -> Option<(&str, u16)> {
    if key.len() < 3 || key[key.len() - 3] != 0 {
        return None;
    }
    let (client, pi) = key.split_at(key.len() - 3);
    Some((
        std::str::from_utf8(client).ok()?,
        u16::from_be_bytes([pi[1], pi[2]]),
    ))
}

fn done_key(client_id: &str, stream_name: &str, seq: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(client_id.len() + stream_name.len() + 10);
    k.extend_from_slice(client_id.as_bytes());
    k.push(0);
    k.extend_from_slice(stream_name.as_bytes());
    k.push(0);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

/// `(client, stream name, seq)` from a `done_key` (MQTT strings never hold U+0000).
fn split_done_key(key: &[u8]) -> Option<(&str, &str, u64)> {
    let (rest, seq) = key.split_at(key.len().checked_sub(8)?);
    let rest = rest.strip_suffix(&[0])?;
    let split = rest.iter().position(|&b| b == 0)?;
    let client = std::str::from_utf8(&rest[..split]).ok()?;
    let name = std::str::from_utf8(&rest[split + 1..]).ok()?;
    Some((client, name, u64::from_be_bytes(seq.try_into().ok()?)))
}

fn ticket(result: Result<tern_store::Ticket, StoreError>) -> Ticket {
    match result {
        Ok(t) => Ticket::from_store(t),
        Err(error) => Ticket::failed(io_error(error)),
    }
}

impl DurableStore {
    fn stream_name(&self, stream: u16) -> Option<&str> {
        self.slots
            .get(usize::from(stream))
            .map(|s| s.spec.name.as_str())
    }

    fn encode_position(&self, stored: Option<StoreRef>) -> Vec<u8> {
        let positions: Vec<(&str, u64)> = stored
            .and_then(|r| self.stream_name(r.stream).map(|name| (name, r.seq)))
            .into_iter()
            .collect();
        codec::encode_positions(&positions)
    }

    fn is_persistent(&self, client_id: &str) -> bool {
        self.mirror.lock().contains_key(client_id)
    }

    /// "The PUBLISH of `stored` goes out under `packet_id`" (see the module doc), unless
    /// retention removed `stored` already: then nothing is recorded and the PUBLISH must not
    /// go (a retention drop; finding 5 of docs/simulation.md: the session had taken a queued
    /// copy before the checkpoint dropped it, and the exchange, recorded against a removed
    /// record, was dropped by a restart while the client held its packet id).
    pub(super) fn record_sent(
        &self,
        client_id: &str,
        packet_id: u16,
        stored: StoreRef,
    ) -> OutboundSent {
        if !self.is_persistent(client_id) {
            return OutboundSent::Untracked;
        }
        {
            let mut exchanges = self.exchanges.lock();
            // Under the exchanges lock (see `reclaim`): limits never remove a message in
            // flight from here on, and whether they removed it before is then settled.
            if !self.pin_if_stored(stored) {
                tracing::debug!(
                    client_id,
                    ?stored,
                    "retention removed a queued QoS 2 message before its exchange started; not sent"
                );
                return OutboundSent::Removed;
            }
            exchanges
                .entry(client_id.to_string())
                .or_default()
                .live
                .insert(
                    packet_id,
                    Live {
                        stored: Some(stored),
                        phase: LivePhase::Sent,
                    },
                );
        }
        let key = exchange_key(client_id, packet_id);
        OutboundSent::Recorded(ticket(
            self.sent.put(&key, &self.encode_position(Some(stored))),
        ))
    }

    /// "PUBREL pending" for `packet_id`; the `p` entry goes after it.
    pub(super) fn record_pubrel(
        &self,
        client_id: &str,
        packet_id: u16,
        stored: Option<StoreRef>,
    ) -> Option<Ticket> {
        if !self.is_persistent(client_id) {
            return None;
        }
        let key = exchange_key(client_id, packet_id);
        let result = self.outbound.put(&key, &self.encode_position(stored));
        let mut exchanges = self.exchanges.lock();
        if let Some(stored) = stored {
            self.pin(stored);
        }
        let previous = exchanges
            .entry(client_id.to_string())
            .or_default()
            .live
            .insert(
                packet_id,
                Live {
                    stored,
                    phase: LivePhase::PubRel,
                },
            );
        if previous.is_some_and(|l| l.phase == LivePhase::Sent) {
            if let Err(error) = self.sent.delete(&key) {
                tracing::warn!(%error, client_id, "cannot clear a sent-exchange entry");
            }
        }
        Some(ticket(result))
    }

    /// The exchange of `packet_id` is over: mark its message done, then drop the live entry.
    pub(super) fn record_completed(&self, client_id: &str, packet_id: u16) {
        let live = {
            let mut exchanges = self.exchanges.lock();
            let Some(client) = exchanges.get_mut(client_id) else {
                return;
            };
            let Some(live) = client.live.remove(&packet_id) else {
                return;
            };
            if let Some(stored) = live.stored {
                client.done.insert(stored);
            }
            live
        };
        if let Some(stored) = live.stored {
            if let Some(name) = self.stream_name(stored.stream) {
                if let Err(error) = self.done.put(&done_key(client_id, name, stored.seq), &[]) {
                    tracing::warn!(%error, client_id, "cannot record a completed exchange");
                }
            }
        }
        let key = exchange_key(client_id, packet_id);
        let result = match live.phase {
            LivePhase::Sent => self.sent.delete(&key),
            LivePhase::PubRel => self.outbound.delete(&key),
        };
        if let Err(error) = result {
            tracing::warn!(%error, client_id, "cannot clear a completed exchange");
        }
    }

    /// Done markers below the session's newly written cursor can go: replay starts above them.
    pub(super) fn clear_passed(&self, client_id: &str, cursor: &[u64]) {
        let passed: Vec<StoreRef> = {
            let mut exchanges = self.exchanges.lock();
            let Some(client) = exchanges.get_mut(client_id) else {
                return;
            };
            let passed: Vec<StoreRef> = client
                .done
                .iter()
                .filter(|r| {
                    cursor
                        .get(usize::from(r.stream))
                        .is_some_and(|&c| r.seq < c)
                })
                .copied()
                .collect();
            for r in &passed {
                client.done.remove(r);
            }
            passed
        };
        for r in passed {
            if let Some(name) = self.stream_name(r.stream) {
                let _ = self.done.delete(&done_key(client_id, name, r.seq));
            }
        }
    }

    /// Drops the live exchanges of `client` whose message lies below its durable cursor, and
    /// their records. A cursor is written only below every message the session holds, and a
    /// live exchange is held; so such an entry ended before that cursor was written (its
    /// delete was lost, or never issued). Restoring it would put the message back in flight
    /// and pull the cursor below messages whose "done" markers were already cleared: the
    /// crash test saw hundreds of QoS 2 messages replayed that way. Returns how many went.
    pub(super) fn drop_stale(
        &self,
        client_id: &str,
        client: &mut ClientExchanges,
        cursor: &[u64],
    ) -> usize {
        let stale: Vec<(u16, Live)> = client
            .live
            .iter()
            .filter(|(_, l)| {
                l.stored.is_some_and(|r| {
                    cursor
                        .get(usize::from(r.stream))
                        .is_some_and(|&c| r.seq < c)
                })
            })
            .map(|(&pi, &l)| (pi, l))
            .collect();
        for (packet_id, live) in &stale {
            client.live.remove(packet_id);
            let key = exchange_key(client_id, *packet_id);
            let _ = match live.phase {
                LivePhase::Sent => self.sent.delete(&key),
                LivePhase::PubRel => self.outbound.delete(&key),
            };
            tracing::warn!(
                client_id,
                packet_id,
                stored = ?live.stored,
                phase = ?live.phase,
                "outbound exchange below the session's cursor is stale; removed"
            );
        }
        stale.len()
    }

    /// Removes every exchange record of an ended session.
    pub(super) fn forget_exchanges(&self, client_id: &str) {
        let Some(client) = self.exchanges.lock().remove(client_id) else {
            return;
        };
        for (packet_id, live) in client.live {
            let key = exchange_key(client_id, packet_id);
            let _ = match live.phase {
                LivePhase::Sent => self.sent.delete(&key),
                LivePhase::PubRel => self.outbound.delete(&key),
            };
        }
        for r in client.done {
            if let Some(name) = self.stream_name(r.stream) {
                let _ = self.done.delete(&done_key(client_id, name, r.seq));
            }
        }
    }

    /// Reads every exchange record at start-up, keeping those of sessions in `live_clients`
    /// and deleting the rest (left over from sessions that ended or expired).
    /// `entries` is `tern.sessions` read once, by key-space prefix (`Keyspace::read_all`).
    pub(super) fn load_exchanges(
        &self,
        live_clients: &dyn Fn(&str) -> bool,
        entries: &mut Map<u8, Vec<(bytes::Bytes, bytes::Bytes)>>,
    ) -> Map<String, ClientExchanges> {
        let name_index: Map<&str, u16> = self
            .slots
            .iter()
            .enumerate()
            .map(|(i, s)| (s.spec.name.as_str(), i as u16))
            .collect();
        let position = |value: &[u8]| {
            codec::decode_positions(value)
                .and_then(|p| p.into_iter().next())
                .and_then(|(name, seq)| {
                    name_index
                        .get(name.as_str())
                        .map(|&stream| StoreRef { stream, seq })
                })
        };
        let mut out: Map<String, ClientExchanges> = Map::default();
        // `p` first: an `o` entry for the same id is the later phase and replaces it.
        for (keyspace, phase) in [
            (&self.sent, LivePhase::Sent),
            (&self.outbound, LivePhase::PubRel),
        ] {
            for (key, value) in entries.remove(&keyspace.prefix()).unwrap_or_default() {
                let Some((client, packet_id)) = split_exchange_key(&key) else {
                    continue;
                };
                if !live_clients(client) {
                    let _ = keyspace.delete(&key);
                    continue;
                }
                let stored = position(&value);
                if phase == LivePhase::Sent && stored.is_none() {
                    let _ = keyspace.delete(&key);
                    continue;
                }
                let live = Live { stored, phase };
                let previous = out
                    .entry(client.to_string())
                    .or_default()
                    .live
                    .insert(packet_id, live);
                if phase == LivePhase::PubRel
                    && previous.is_some_and(|l| l.phase == LivePhase::Sent)
                {
                    // A crash between "PUBREL pending" and the delete of the `p` entry left
                    // both. The `p` entry is the older (a packet id is reused only after its
                    // exchange completed, and that delete precedes the new `p` in the same
                    // stream). Left in place it would outlive the exchange (completion clears
                    // the `o` entry only) and, at a later start, resend a completed message as
                    // a new PUBLISH: a duplicate, and a cursor held back below messages whose
                    // done markers were already cleared.
                    let _ = self.sent.delete(&key);
                }
            }
        }
        for (key, _) in entries.remove(&self.done.prefix()).unwrap_or_default() {
            let Some((client, name, seq)) = split_done_key(&key) else {
                continue;
            };
            match name_index.get(name) {
                Some(&stream) if live_clients(client) => {
                    out.entry(client.to_string())
                        .or_default()
                        .done
                        .insert(StoreRef { stream, seq });
                }
                _ => {
                    let _ = self.done.delete(&key);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ExchangeStore, MessageLog, Recovery, SessionStore};

    /// A crash after "PUBREL pending" was written but before the `p` entry's delete: both are
    /// on disk. The exchange resumes as PUBREL pending, and once it completes no stale `p`
    /// entry brings the message back as a new PUBLISH at the next start.
    #[tokio::test]
    async fn a_stale_sent_entry_beside_pubrel_pending_is_cleared_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let message = || {
            crate::model::message::Message::new(
                tern_wire::Str::from_static("t"),
                bytes::Bytes::from_static(b"m"),
                tern_wire::QoS::ExactlyOnce,
                false,
                tern_wire::Properties::default(),
                None,
                tokio::time::Instant::now(),
            )
        };
        let open = || DurableStore::open(dir.path(), super::super::DurableConfig::default());
        {
            let store = open().unwrap();
            store.session_opened("sub", tern_wire::Protocol::V5, u32::MAX, true);
            let m = message();
            let mut t = store
                .append_publish("pub", &m, None)
                .map(|a| a.record_on(&m))
                .unwrap();
            t.wait().await.unwrap();
            let stored = m.store_ref().unwrap();
            store
                .record_sent("sub", 40, stored)
                .ticket()
                .unwrap()
                .wait()
                .await
                .unwrap();
            // "PUBREL pending" written, the `p` delete lost in the crash.
            let key = exchange_key("sub", 40);
            let mut t = Ticket::from_store(
                store
                    .outbound
                    .put(&key, &store.encode_position(Some(stored)))
                    .unwrap(),
            );
            t.wait().await.unwrap();
        }
        {
            let store = open().unwrap();
            let recovered = store.recover();
            let sub = recovered
                .sessions
                .iter()
                .find(|s| s.client_id == "sub")
                .unwrap();
            assert_eq!(sub.inflight.len(), 1);
            assert!(sub.inflight[0].pubrel_pending, "resumes with PUBREL");
            store.outbound_completed("sub", 40);
            store.sessions.kv.stream().flush().unwrap();
        }
        let store = open().unwrap();
        let recovered = store.recover();
        let sub = recovered
            .sessions
            .iter()
            .find(|s| s.client_id == "sub")
            .unwrap();
        assert!(
            sub.inflight.is_empty(),
            "the completed message is not resent as a new PUBLISH"
        );
        assert!(sub.queued.is_empty(), "nor queued: its done marker holds");
    }

    #[test]
    fn keys_round_trip() {
        assert_eq!(
            split_exchange_key(&exchange_key("a/b", 513)),
            Some(("a/b", 513))
        );
        assert_eq!(
            split_done_key(&done_key("client", "messages", 7)),
            Some(("client", "messages", 7))
        );
        // A sequence whose bytes contain zeros and the separator byte still splits right.
        assert_eq!(
            split_done_key(&done_key("c", "s", 0x0000_0100_0000_0000)),
            Some(("c", "s", 0x0000_0100_0000_0000))
        );
        assert_eq!(split_done_key(b"short"), None);
    }
}
