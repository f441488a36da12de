//! An application message as the broker holds it after admission: shared (`Arc`) by every
//! subscriber queue it is routed to, encoded once per protocol version.
//!
//! # Invariants
//! - `properties` never holds a topic alias or subscription identifiers: those are per
//!   delivery and are added by the writer of each subscriber.
//! - A message without a Message Expiry Interval is encoded at most once per protocol family.
//!   One with an interval is encoded once per protocol family and value of the remaining
//!   interval (whole seconds): a live fan-out shares one encoding, only deliveries made in a
//!   later second get a new one.
//! - A message that goes to one subscriber and whose body is its payload (3.x; 5.0 without
//!   properties) builds no template: its writer writes the head from [`Message::plain_shape`]
//!   into its own batch buffer. One routed to several (`fan_out`, set before any of those
//!   deliveries is queued) shares the template's encoding, whole QoS 0 packets included.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use bytes::Bytes;
use tern_wire::{Properties, Protocol, PublishShape, PublishTemplate, QoS, Str};

use crate::model::StoreRef;
use tokio::time::Instant;

/// Bytes counted per queued message on top of topic and payload (headers, bookkeeping).
pub(crate) const MESSAGE_OVERHEAD_BYTES: usize = 64;

#[derive(Debug)]
pub struct Message {
    pub(crate) topic: Str,
    pub(crate) payload: Bytes,
    /// QoS the publisher used; each delivery is downgraded to its subscription's QoS.
    pub(crate) qos: QoS,
    /// Retain flag as published.
    pub(crate) retain: bool,
    pub(crate) properties: Properties,
    pub(crate) arrived_at: Instant,
    /// Client id of the publisher (for No Local); `None` for wills and `$SYS`.
    pub(crate) publisher: Option<Arc<str>>,
    /// Where the store keeps it, once a write was issued for it: set once, by whoever issued
    /// the write ([`Message::mark_stored`]), before the message is routed.
    stored: OnceLock<StoreRef>,
    /// Routed to more than one subscriber (or held for many: retained, restored at start-up):
    /// deliveries share the template's bytes instead of each writing the message into its own
    /// batch.
    fan_out: AtomicBool,
    template_v3: OnceLock<Option<PublishTemplate>>,
    template_v5: OnceLock<Option<PublishTemplate>>,
    /// The v5 encoding for the remaining expiry interval it carries (messages with expiry).
    template_v5_expiring: Mutex<Option<(u32, PublishTemplate)>>,
}

impl Message {
    /// The topic it was published to. The fields are read-only outside the crate: the
    /// encodings cached in the message mirror them (module invariants).
    pub fn topic(&self) -> &Str {
        &self.topic
    }

    pub fn payload(&self) -> &Bytes {
        &self.payload
    }

    /// QoS the publisher used.
    pub fn qos(&self) -> QoS {
        self.qos
    }

    /// Retain flag as published.
    pub fn retain(&self) -> bool {
        self.retain
    }

    pub fn new(
        topic: Str,
        payload: Bytes,
        qos: QoS,
        retain: bool,
        mut properties: Properties,
        publisher: Option<Arc<str>>,
        arrived_at: Instant,
    ) -> Message {
        // Edited in place: a message without properties (the common case) allocates nothing.
        if let Some(values) = properties.values_mut() {
            values.topic_alias = None;
            values.subscription_identifiers.clear();
            // An interval of 0 is treated as "no expiry", as mosquitto does.
            if values.message_expiry_interval_s == Some(0) {
                values.message_expiry_interval_s = None;
            }
        }
        // A PUBLISH whose only property was its topic alias keeps no block.
        properties.shrink();
        Message {
            topic,
            payload,
            qos,
            retain,
            properties,
            arrived_at,
            publisher,
            stored: OnceLock::new(),
            fan_out: AtomicBool::new(false),
            template_v3: OnceLock::new(),
            template_v5: OnceLock::new(),
            template_v5_expiring: Mutex::new(None),
        }
    }

    /// A fresh copy (no cached encodings) for re-encoding with changed properties.
    pub(crate) fn clone_for_resend(other: &Message) -> Message {
        let copy = Message::new(
            other.topic.clone(),
            other.payload.clone(),
            other.qos,
            other.retain,
            other.properties.clone(),
            other.publisher.clone(),
            other.arrived_at,
        );
        if let Some(stored) = other.stored.get() {
            copy.mark_stored(*stored);
        }
        copy
    }

    /// Records where the store put this message (what [`crate::model::Appended`] reported, or
    /// what recovery read). A message has one position: a second, different one is a bug.
    pub(crate) fn mark_stored(&self, at: StoreRef) {
        let first = *self.stored.get_or_init(|| at);
        debug_assert_eq!(first, at, "a message is stored at one position");
    }

    /// The store position, if a write was issued for this message.
    pub fn store_ref(&self) -> Option<StoreRef> {
        self.stored.get().copied()
    }

    /// A copy whose byte fields own their memory (not slices of a shared read buffer).
    pub(crate) fn compacted(other: &Message) -> Message {
        Message::new(
            copy_str(&other.topic),
            Bytes::copy_from_slice(&other.payload),
            other.qos,
            other.retain,
            compact_properties(&other.properties),
            other.publisher.clone(),
            other.arrived_at,
        )
    }

    /// Size charged against queue limits.
    pub fn approx_len(&self) -> usize {
        self.topic.len() + self.payload.len() + MESSAGE_OVERHEAD_BYTES
    }

    /// `None` once the message has expired; otherwise the Message Expiry Interval to forward
    /// (`Some(None)` when the message never expires). MQTT-3.3.2-6: the forwarded value is the
    /// received one minus the time the message waited in the server.
    pub(crate) fn remaining_expiry_s(&self, now: Instant) -> Option<Option<u32>> {
        let Some(interval_s) = self.properties.message_expiry_interval_s else {
            return Some(None);
        };
        let waited = now.saturating_duration_since(self.arrived_at);
        let waited_s = waited.as_secs();
        if waited_s >= u64::from(interval_s) {
            return None;
        }
        // waited_s < interval_s <= u32::MAX, so the difference fits.
        Some(Some(interval_s - waited_s as u32))
    }

    pub(crate) fn is_expired(&self, now: Instant) -> bool {
        self.remaining_expiry_s(now).is_none()
    }

    /// Marks the message as delivered to several subscribers. Called before those deliveries
    /// are queued: the session lock of the queue publishes it to the writers (so `Relaxed`).
    pub(crate) fn mark_fan_out(&self) {
        self.fan_out.store(true, Ordering::Relaxed);
    }

    /// See [`Message::mark_fan_out`].
    pub(crate) fn fans_out(&self) -> bool {
        self.fan_out.load(Ordering::Relaxed)
    }

    /// The message's own fields as the encoding for `protocol` when its body is its payload
    /// (3.x always; 5.0 when it carries no properties, so no expiry either): no template, no
    /// allocation. `None` when a template is needed (or the message cannot be encoded: the
    /// template path then logs and drops it).
    pub(crate) fn plain_shape(&self, protocol: Protocol) -> Option<PublishShape<'_>> {
        if protocol.is_v5() && !self.properties.is_empty() {
            return None;
        }
        PublishShape::plain(protocol, &self.topic, &self.payload).ok()
    }

    /// The shared encoding for a subscriber speaking `protocol`, or `None` if the message has
    /// expired or cannot be encoded (it is then dropped for that subscriber).
    pub fn template(&self, protocol: Protocol, now: Instant) -> Option<PublishTemplate> {
        if !protocol.is_v5() {
            return self
                .template_v3
                .get_or_init(|| build(protocol, &self.topic, &Properties::default(), &self.payload))
                .clone();
        }
        match self.remaining_expiry_s(now)? {
            None => self
                .template_v5
                .get_or_init(|| build(protocol, &self.topic, &self.properties, &self.payload))
                .clone(),
            Some(remaining_s) => {
                let mut cached = self.template_v5_expiring.lock();
                if let Some((cached_s, template)) = cached.as_ref() {
                    if *cached_s == remaining_s {
                        return Some(template.clone());
                    }
                }
                let mut properties = self.properties.clone();
                properties.message_expiry_interval_s = Some(remaining_s);
                let template = build(protocol, &self.topic, &properties, &self.payload)?;
                *cached = Some((remaining_s, template.clone()));
                Some(template)
            }
        }
    }
}

/// A copy of `s` that owns its bytes.
pub(crate) fn copy_str(s: &Str) -> Str {
    Str::copy_from(s.as_str()).unwrap_or_else(|_| s.clone())
}

/// A copy of the properties a message or will carries, owning its bytes.
pub(crate) fn compact_properties(properties: &Properties) -> Properties {
    let mut copy = properties.clone();
    // Edited in place, so that no properties stay no allocation.
    let Some(values) = copy.values_mut() else {
        return copy;
    };
    values.content_type = values.content_type.as_ref().map(copy_str);
    values.response_topic = values.response_topic.as_ref().map(copy_str);
    values.correlation_data = values
        .correlation_data
        .as_ref()
        .map(|b| Bytes::copy_from_slice(b));
    for (key, value) in &mut values.user {
        *key = copy_str(key);
        *value = copy_str(value);
    }
    copy
}

fn build(
    protocol: Protocol,
    topic: &Str,
    properties: &Properties,
    payload: &Bytes,
) -> Option<PublishTemplate> {
    match PublishTemplate::new(protocol, topic, properties, payload) {
        Ok(template) => Some(template),
        Err(error) => {
            tracing::warn!(%topic, %error, "cannot encode message; dropped");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tern_wire::PropertyValues;

    fn message(expiry: Option<u32>, at: Instant) -> Message {
        let properties: Properties = PropertyValues {
            message_expiry_interval_s: expiry,
            topic_alias: Some(3),
            ..PropertyValues::default()
        }
        .into();
        Message::new(
            Str::from_static("a/b"),
            Bytes::from_static(b"x"),
            QoS::AtLeastOnce,
            false,
            properties,
            None,
            at,
        )
    }

    #[test]
    fn topic_alias_is_never_kept() {
        let mut m = message(None, Instant::now());
        assert_eq!(m.properties.topic_alias, None);
        // It was the only property: the message keeps no property block at all.
        assert!(m.properties.values_mut().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn remaining_expiry_counts_down_mqtt_3_3_2_6() {
        let m = message(Some(10), Instant::now());
        assert_eq!(m.remaining_expiry_s(Instant::now()), Some(Some(10)));
        tokio::time::advance(Duration::from_millis(3_500)).await;
        assert_eq!(m.remaining_expiry_s(Instant::now()), Some(Some(7)));
        tokio::time::advance(Duration::from_millis(6_500)).await;
        assert_eq!(m.remaining_expiry_s(Instant::now()), None);
        assert!(m.is_expired(Instant::now()));
        let forever = message(None, Instant::now());
        assert_eq!(forever.remaining_expiry_s(Instant::now()), Some(None));
    }

    #[test]
    fn compacting_no_properties_allocates_none() {
        assert!(
            compact_properties(&Properties::default())
                .values_mut()
                .is_none()
        );
        let user: Properties = PropertyValues {
            user: vec![(Str::from_static("k"), Str::from_static("v"))],
            ..PropertyValues::default()
        }
        .into();
        assert_eq!(compact_properties(&user), user);
    }

    /// One `Message` per published message, kept while any queue holds it: properties live out
    /// of line (inline they made it 584 bytes).
    const MAX_MESSAGE_BYTES: usize = 192;

    #[test]
    fn messages_stay_small() {
        assert!(
            size_of::<Message>() <= MAX_MESSAGE_BYTES,
            "{}",
            size_of::<Message>()
        );
    }
}
