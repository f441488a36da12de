//! Will messages: built from CONNECT, published on an abnormal close, a keep-alive timeout,
//! a protocol error, a takeover, or DISCONNECT 0x04; discarded on DISCONNECT 0x00
//! [MQTT-3.1.2-8], [MQTT-3.14.4-3]. A v5 Will Delay Interval defers it until the delay passes
//! or the session ends, whichever is first, and a resume within the delay cancels it.

use std::sync::Arc;

use bytes::Bytes;

use tern_wire::Will;
use tokio::time::Instant;

use crate::broker::Shared;
use crate::message::{Message, compact_properties, copy_str};
use crate::router;
use crate::session::{Session, expiry};

/// The will as the connection keeps it until it closes: boxed (a `Will` is large and most
/// connections never use theirs) and copied out of the read buffer it was decoded from.
pub fn keep(will: Will) -> Box<Will> {
    Box::new(Will {
        topic: copy_str(&will.topic),
        payload: Bytes::copy_from_slice(&will.payload),
        qos: will.qos,
        retain: will.retain,
        properties: compact_properties(&will.properties),
    })
}

/// The message a will turns into (the Will Delay Interval is not a PUBLISH property).
pub fn to_message(will: &Will, now: Instant) -> Arc<Message> {
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

/// Sends (or schedules) the will of the connection `conn_gen` that is closing.
pub fn trigger(shared: &Arc<Shared>, session: &Arc<Session>, conn_gen: u64, will: &Will) {
    let message = to_message(will, Instant::now());
    let delay_s = will.properties.will_delay_interval_s.unwrap_or(0);
    if delay_s == 0 {
        router::publish(shared, message);
        return;
    }
    let (ours, ended) = {
        let state = session.state.lock();
        (state.conn_gen == conn_gen, state.ended)
    };
    if ended {
        // Replaced by a clean start: the session ended, so the will is due now.
        router::publish(shared, message);
    } else if ours
        && !expiry::arm_will(
            shared.clone(),
            session.clone(),
            conn_gen,
            message.clone(),
            delay_s,
        )
    {
        router::publish(shared, message);
    }
    // else: taken over by a connection that resumed the session: cancelled (MQTT-3.1.3-9).
}
