//! Will messages: built from CONNECT, published on an abnormal close, a keep-alive timeout,
//! a protocol error, a takeover, or DISCONNECT 0x04; discarded on DISCONNECT 0x00
//! [MQTT-3.1.2-8], [MQTT-3.14.4-3]. A v5 Will Delay Interval defers it until the delay passes
//! or the session ends, whichever is first, and a resume within the delay cancels it.
//!
//! Durability (`crate::durable::wills` has the records): the store records the will at
//! CONNECT ([`crate::model::WillStore::will_set`], which hands back a token naming this
//! connection's will), marks it closed when its delay starts, and deletes it when it is
//! cancelled or fired. [`fire`] publishes only once that delete is durable: a will is
//! published at most once, even across a crash. Wills recovered at start-up are fired or
//! re-armed by [`arm_recovered`].

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use tern_wire::Will;
use tokio::time::Instant;

use crate::engine::Shared;
use crate::engine::expiry;
use crate::engine::route;
use crate::model::message::{Message, compact_properties, copy_str};
use crate::state::session::Session;

/// The will as the connection keeps it until it closes: boxed (a `Will` is large and most
/// connections never use theirs) and copied out of the read buffer it was decoded from.
pub(crate) fn keep(will: Will) -> Box<Will> {
    Box::new(Will {
        topic: copy_str(&will.topic),
        payload: Bytes::copy_from_slice(&will.payload),
        qos: will.qos,
        retain: will.retain,
        properties: compact_properties(&will.properties),
    })
}

/// The message a will turns into (the Will Delay Interval is not a PUBLISH property).
pub(crate) fn to_message(will: &Will, now: Instant) -> Arc<Message> {
    let mut properties = will.properties.clone();
    properties.will_delay_interval_s = None;
    Arc::new(Message::new(
        will.topic.clone(),
        will.payload.clone(),
        will.qos,
        will.retain,
        properties,
        None,
        now,
    ))
}

/// CONNECT: records the new connection's will (or that it has none) in the store; the token
/// names it in later calls; the CONNACK waits for the ticket.
pub(crate) fn record(
    shared: &Shared,
    client_id: &str,
    will: Option<&Will>,
) -> (u64, Option<crate::model::Ticket>) {
    let message = will.map(|w| to_message(w, Instant::now()));
    let delay_s = will.map_or(0, |w| w.properties.will_delay_interval_s.unwrap_or(0));
    shared
        .store
        .wills
        .will_set(client_id, message.as_deref().map(|m| (m, delay_s)))
}

/// The will `token` of `client_id` will not be sent (clean DISCONNECT, shutdown).
pub(crate) fn cancel(shared: &Shared, client_id: &str, token: u64) {
    drop(shared.store.wills.will_cleared(client_id, token));
}

/// Sends (or schedules) the will of the connection `conn_gen` that is closing.
pub(crate) fn trigger(
    shared: &Arc<Shared>,
    session: &Arc<Session>,
    conn_gen: u64,
    will: &Will,
    token: u64,
) {
    let message = to_message(will, Instant::now());
    let delay_s = will.properties.will_delay_interval_s.unwrap_or(0);
    if delay_s == 0 {
        fire(shared, &session.client_id, token, message);
        return;
    }
    let (ours, ended) = {
        let state = session.state.lock();
        (state.conn_gen == conn_gen, state.ended)
    };
    if ended {
        // Replaced by a clean start: the session ended, so the will is due now.
        fire(shared, &session.client_id, token, message);
    } else if ours {
        let delay = Duration::from_secs(u64::from(delay_s));
        if expiry::arm_will(
            shared.clone(),
            session.clone(),
            conn_gen,
            message.clone(),
            token,
            delay,
        ) {
            shared.store.wills.will_delayed(&session.client_id, token);
        } else {
            fire(shared, &session.client_id, token, message);
        }
    } else {
        // Taken over by a connection that resumed the session: cancelled (MQTT-3.1.3-9).
        cancel(shared, &session.client_id, token);
    }
}

/// Publishes a will that is due: its record is deleted first, and the will is published once
/// the delete is durable (at most once, see the module doc). Published wills are stored like
/// a client's PUBLISH before they are routed.
pub(crate) fn fire(shared: &Arc<Shared>, client_id: &str, token: u64, message: Arc<Message>) {
    let cleared = shared.store.wills.will_cleared(client_id, token);
    if cleared.is_none() {
        // Nothing recorded (a store that keeps no wills): nothing to wait for first.
        match store(shared, client_id, &message) {
            None => publish(shared, message),
            Some(mut stored) => {
                let shared = shared.clone();
                let client_id: Arc<str> = client_id.into();
                tokio::spawn(async move {
                    wait_stored(&mut stored, &client_id).await;
                    publish(&shared, message);
                });
            }
        }
        return;
    }
    let shared = shared.clone();
    let client_id: Arc<str> = client_id.into();
    tokio::spawn(async move {
        if let Some(mut cleared) = cleared {
            if let Err(error) = cleared.wait().await {
                tracing::error!(%error, %client_id, "will record not deleted; publishing anyway");
            }
        }
        if let Some(mut stored) = store(&shared, &client_id, &message) {
            wait_stored(&mut stored, &client_id).await;
        }
        publish(&shared, message);
    });
}

/// Appends the will to its message stream. Never under `$` (`$SYS/`, and `$tern/`, the
/// store's control records, which a will topic must not be able to forge).
fn store(shared: &Shared, client_id: &str, message: &Message) -> Option<crate::model::Ticket> {
    if crate::model::topics::is_dollar(&message.topic) {
        return None;
    }
    shared
        .store
        .messages
        .append_publish(client_id, message, None)
        .map(|appended| appended.record_on(message))
}

async fn wait_stored(ticket: &mut crate::model::Ticket, client_id: &str) {
    if let Err(error) = ticket.wait().await {
        tracing::error!(%error, client_id, "will message not stored; published from memory");
    }
}

fn publish(shared: &Shared, message: Arc<Message>) {
    route::publish_released(shared, message);
}

/// Fires or re-arms the wills recovered from the store (called from `serve`, where a runtime
/// exists): a will due now is published; one whose delay still runs waits on its restored
/// (offline) session, so a reconnect within the delay cancels it and the session's end
/// publishes it.
pub(crate) fn arm_recovered(shared: &Arc<Shared>) {
    let wills = std::mem::take(&mut *shared.recovered_wills.lock());
    for stored in wills {
        let message = Arc::new(stored.message);
        let session = shared.sessions.get(&stored.client_id);
        if stored.due_in > Duration::ZERO {
            if let Some(session) = session {
                let conn_gen = session.state.lock().conn_gen;
                if expiry::arm_will(
                    shared.clone(),
                    session,
                    conn_gen,
                    message.clone(),
                    stored.token,
                    stored.due_in,
                ) {
                    continue;
                }
            }
        }
        fire(shared, &stored.client_id, stored.token, message);
    }
}
