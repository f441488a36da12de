//! Wills on disk (MQTT-3.1.2-8 .. -10, MQTT-3.1.3-9 across a crash).
//!
//! - `w` ++ client id (key space of `tern.sessions`) → [`WillRecord`]: the will as a message,
//!   its Will Delay Interval, and whether its connection is still open or closed at a given
//!   time (the delay runs from then). Written at CONNECT for sessions of every expiry (a session
//!   that ends with its connection still owes its will after a crash); a CONNECT without a will
//!   deletes an earlier one (a reconnect cancels a pending will). Rewritten as closed when the
//!   connection closes without a clean DISCONNECT and the will has a delay. Deleted on a clean
//!   DISCONNECT (0x00), on shutdown (Tern sends no wills at a clean stop), and **before** the
//!   will is published: the broker publishes only once the delete is durable.
//! - At start-up each record is a will still owed: a connection that was open when the broker
//!   died closed without DISCONNECT, so its will is due after its delay (from the restart),
//!   or at once if its session did not survive (expiry 0, or expired while down); a closed
//!   one is due when its delay, counted from the recorded close (wall clock), has passed, or at
//!   once if overdue or its session is gone. Open records are rewritten as closed at the
//!   restart, so a second crash does not restart their delay.
//!
//! A will is published **at most once**: its record is deleted (durably) before it is
//! published, so a crash between the two loses it rather than publishing it twice.
//! MQTT-3.1.2-10 asks that the will be removed from the session state once published; nothing
//! in MQTT 5 §3.1.3.2 asks for more than one attempt, and a will (a notification that a client
//! went away) published twice is worse for its subscribers than the rare will lost in a
//! one-fsync window. Once published, the will is stored and routed like any PUBLISH (§5: a
//! QoS>0 will queued for an offline persistent session survives later crashes).

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use tern_store::StoreError;

use super::codec::{self, SessionRecord};
use super::{DurableStore, io_error};
use crate::hash::Map;
use crate::model::message::Message;
use crate::model::{StoredWill, Ticket};

const VERSION: u8 = 1;
const OPEN: u8 = 0;
const CLOSED: u8 = 1;

/// One `w` value: version u8, state u8 (0 open, 1 closed), closed at (Unix ms, u64 BE), delay
/// (s, u32 BE), topic length (u16 BE), topic, then [`codec::encode_retained`] of the message.
#[derive(Debug)]
pub(super) struct WillRecord {
    pub(crate) open: bool,
    pub(crate) closed_at_ms: u64,
    pub(crate) delay_s: u32,
    pub(crate) message: Message,
}

const HEADER: usize = 1 + 1 + 8 + 4;

fn encode(message: &Message, delay_s: u32) -> Vec<u8> {
    let body = codec::encode_retained(message);
    let topic = message.topic.as_bytes();
    let mut out = Vec::with_capacity(HEADER + 2 + topic.len() + body.len());
    out.push(VERSION);
    out.push(OPEN);
    out.extend_from_slice(&0u64.to_be_bytes());
    out.extend_from_slice(&delay_s.to_be_bytes());
    out.extend_from_slice(&(topic.len() as u16).to_be_bytes());
    out.extend_from_slice(topic);
    out.extend_from_slice(&body);
    out
}

/// Marks an encoded record closed at `at_ms`.
fn set_closed(value: &mut [u8], at_ms: u64) {
    if value.len() >= HEADER {
        value[1] = CLOSED;
        value[2..10].copy_from_slice(&at_ms.to_be_bytes());
    }
}

pub(super) fn decode(value: &Bytes) -> Option<WillRecord> {
    if value.len() < HEADER + 2 || value[0] != VERSION {
        return None;
    }
    let open = value[1] == OPEN;
    let closed_at_ms = u64::from_be_bytes(value[2..10].try_into().ok()?);
    let delay_s = u32::from_be_bytes(value[10..14].try_into().ok()?);
    let topic_len = usize::from(u16::from_be_bytes([value[14], value[15]]));
    let topic = value.get(16..16 + topic_len)?;
    let message = codec::decode_retained(topic, &value.slice(16 + topic_len..))?;
    Some(WillRecord {
        open,
        closed_at_ms,
        delay_s,
        message,
    })
}

impl DurableStore {
    /// Records (or deletes) the will of a new connection; returns its token and the write the
    /// CONNACK waits for: a client told its will is registered must not lose it to a power
    /// loss, nor see an earlier connection's will come back.
    pub(super) fn set_will(
        &self,
        client_id: &str,
        will: Option<(&Message, u32)>,
    ) -> (u64, Option<Ticket>) {
        let token = self.will_tokens.fetch_add(1, Ordering::Relaxed);
        let mut wills = self.will_state.lock();
        let written = match will {
            Some((message, delay_s)) => {
                let value = encode(message, delay_s);
                let written = self.wills.put(client_id.as_bytes(), &value);
                wills.insert(client_id.to_string(), (token, value));
                Some(written)
            }
            None => wills
                .remove(client_id)
                .map(|_| self.wills.delete(client_id.as_bytes())),
        };
        let ticket = written.map(|written| match written {
            Ok(t) => Ticket::from_store(t),
            Err(error) => {
                tracing::error!(%error, client_id, "cannot write will");
                Ticket::failed(io_error(error))
            }
        });
        (token, ticket)
    }

    pub(super) fn delay_will(&self, client_id: &str, token: u64) {
        let mut wills = self.will_state.lock();
        let Some((current, value)) = wills.get_mut(client_id) else {
            return;
        };
        if *current != token {
            return;
        }
        set_closed(value, self.now_ns() / 1_000_000);
        if let Err(error) = self.wills.put(client_id.as_bytes(), value) {
            tracing::error!(%error, client_id, "cannot write will");
        }
    }

    pub(super) fn clear_will(&self, client_id: &str, token: u64) -> Option<Ticket> {
        let mut wills = self.will_state.lock();
        if wills.get(client_id).map(|(t, _)| *t) != Some(token) {
            return None;
        }
        wills.remove(client_id);
        Some(match self.wills.delete(client_id.as_bytes()) {
            Ok(t) => Ticket::from_store(t),
            Err(error) => {
                tracing::error!(%error, client_id, "cannot delete will");
                Ticket::failed(io_error(error))
            }
        })
    }
}

/// The wills still owed at start-up (see the module doc); `records` are the persistent
/// sessions that survived.
pub(super) fn recover_wills(
    store: &DurableStore,
    records: &Map<String, SessionRecord>,
    entries: Vec<(bytes::Bytes, bytes::Bytes)>,
) -> Result<Vec<StoredWill>, StoreError> {
    let now = store.now_ns() / 1_000_000;
    let mut out = Vec::new();
    for (key, value) in entries {
        let Ok(client) = std::str::from_utf8(&key) else {
            continue;
        };
        let Some(record) = decode(&value) else {
            tracing::error!(client_id = client, "undecodable will record dropped");
            let _ = store.wills.delete(&key);
            continue;
        };
        let session_alive = records.contains_key(client);
        let delay = Duration::from_secs(u64::from(record.delay_s));
        let due_in = if !session_alive {
            Duration::ZERO
        } else if record.open {
            delay
        } else {
            delay.saturating_sub(Duration::from_millis(
                now.saturating_sub(record.closed_at_ms),
            ))
        };
        let mut value = value.to_vec();
        if record.open {
            // The connection closed at the crash; its delay runs from the restart.
            set_closed(&mut value, now);
            let _ = store.wills.put(client.as_bytes(), &value);
        }
        let token = store.will_tokens.fetch_add(1, Ordering::Relaxed);
        store
            .will_state
            .lock()
            .insert(client.to_string(), (token, value));
        tracing::info!(
            client_id = client,
            due_in_ms = due_in.as_millis() as u64,
            "will recovered"
        );
        out.push(StoredWill {
            client_id: client.to_string(),
            message: record.message,
            due_in,
            token,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trips_and_closes() {
        let message = Message::new(
            tern_wire::Str::from_static("a/will"),
            Bytes::from_static(b"bye"),
            tern_wire::QoS::AtLeastOnce,
            true,
            tern_wire::Properties::default(),
            None,
            tokio::time::Instant::now(),
        );
        let mut value = encode(&message, 30);
        let r = decode(&Bytes::from(value.clone())).unwrap();
        assert!(r.open);
        assert_eq!(r.delay_s, 30);
        assert_eq!(&*r.message.topic, "a/will");
        assert_eq!(&r.message.payload[..], b"bye");
        assert!(r.message.retain);
        set_closed(&mut value, 1234);
        let r = decode(&Bytes::from(value)).unwrap();
        assert!(!r.open);
        assert_eq!(r.closed_at_ms, 1234);
        assert!(decode(&Bytes::from_static(b"\x09")).is_none());
    }
}
