//! Retained messages: one per topic, replaced by a newer one, cleared by an empty payload
//! [MQTT-3.3.1-5..-7], bounded by `max_retained_messages`.
//!
//! # Invariants
//! - The map never holds an empty-payload message nor more than `max_retained_messages`
//!   entries; a new topic beyond the limit is not retained (logged), replacing one always is.

use std::collections::HashMap;
use std::sync::Arc;

use tern_wire::Str;
use tokio::time::Instant;

use crate::broker::Shared;
use crate::message::Message;

#[derive(Debug, Default)]
pub struct Retained {
    by_topic: HashMap<Str, Arc<Message>>,
}

impl Retained {
    pub fn len(&self) -> usize {
        self.by_topic.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_topic.is_empty()
    }

    /// Stores or clears the retained message of `message.topic`. False if refused (full).
    pub fn set(&mut self, message: &Arc<Message>, max_messages: usize) -> bool {
        if message.payload.is_empty() {
            self.by_topic.remove(&message.topic);
            return true;
        }
        if self.by_topic.len() >= max_messages && !self.by_topic.contains_key(&message.topic) {
            return false;
        }
        // Retained messages live long: copy them out of the read buffer they were decoded
        // into, which would otherwise stay pinned whole by a few bytes.
        let compact = Arc::new(Message::compacted(message));
        self.by_topic.insert(compact.topic.clone(), compact);
        true
    }

    /// Unexpired retained messages matching `filter` (a plain filter, no `$share/`).
    pub fn matching(&self, filter: &str, now: Instant) -> Vec<Arc<Message>> {
        // Exact filters (no wildcard) are a single lookup; wildcards scan.
        if !filter.contains(['+', '#']) {
            let Ok(key) = Str::copy_from(filter) else {
                return Vec::new();
            };
            return self
                .by_topic
                .get(&key)
                .filter(|m| !m.is_expired(now))
                .cloned()
                .into_iter()
                .collect();
        }
        self.by_topic
            .values()
            .filter(|m| tern_topic::filter_matches(filter, &m.topic) && !m.is_expired(now))
            .cloned()
            .collect()
    }

    /// Drops expired retained messages (called from the `$SYS` tick).
    pub fn purge_expired(&mut self, now: Instant) {
        self.by_topic.retain(|_, m| !m.is_expired(now));
    }
}

/// Applies a RETAIN=1 message to the retained store.
pub fn update(shared: &Shared, message: &Arc<Message>) {
    let stored = shared
        .retained
        .write()
        .set(message, shared.config.max_retained_messages);
    if stored {
        let kept = (!message.payload.is_empty()).then_some(&**message);
        shared.store.retained_changed(&message.topic, kept);
    } else {
        tracing::warn!(topic = %message.topic, "retained store full; message not retained");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use tern_wire::{Properties, QoS};

    fn msg(topic: &'static str, payload: &'static [u8]) -> Arc<Message> {
        Arc::new(Message::new(
            Str::from_static(topic),
            Bytes::from_static(payload),
            QoS::AtMostOnce,
            true,
            Properties::default(),
            None,
            Instant::now(),
        ))
    }

    #[tokio::test]
    async fn set_replace_clear_mqtt_3_3_1_5_to_7() {
        let mut r = Retained::default();
        let now = Instant::now();
        assert!(r.set(&msg("a/b", b"1"), 10));
        assert!(r.set(&msg("a/b", b"2"), 10));
        assert_eq!(r.len(), 1);
        assert_eq!(&r.matching("a/+", now)[0].payload[..], b"2");
        assert_eq!(r.matching("a/b", now).len(), 1);
        assert!(r.set(&msg("a/b", b""), 10));
        assert!(r.is_empty());
    }

    #[tokio::test]
    async fn bounded_by_max_retained_messages() {
        let mut r = Retained::default();
        assert!(r.set(&msg("a", b"1"), 1));
        assert!(!r.set(&msg("b", b"1"), 1));
        assert!(r.set(&msg("a", b"2"), 1), "replacing is always allowed");
    }
}
