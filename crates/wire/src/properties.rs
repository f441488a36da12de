//! MQTT 5.0 properties: [`PropertyValues`], one struct holding every property, and
//! [`Properties`], the one-pointer handle packets and messages carry.
//!
//! Most packets carry no properties (3.x never, 5.0 acks and most PUBLISHes rarely), while the
//! flat struct is ~400 bytes. The handle keeps it out of line and absent when empty, so a
//! packet without properties neither allocates nor moves those bytes around.
//!
//! # Invariants
//! - Every property other than User Property and Subscription Identifier appears at most once
//!   in a packet; the decoder rejects duplicates as a protocol error.
//! - `user` keeps the order of the wire ([MQTT-3.3.2-18]: forwarded in order).
//! - The decoder accepts a property only in the packets the spec lists for it.

use std::ops::{Deref, DerefMut};

use bytes::Bytes;

use crate::string::Str;

/// All MQTT 5.0 properties. A field is `None` (or empty) when the property is absent.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PropertyValues {
    /// 0x01 — PUBLISH, Will.
    pub payload_format_indicator: Option<u8>,
    /// 0x02 — PUBLISH, Will.
    pub message_expiry_interval_s: Option<u32>,
    /// 0x03 — PUBLISH, Will.
    pub content_type: Option<Str>,
    /// 0x08 — PUBLISH, Will.
    pub response_topic: Option<Str>,
    /// 0x09 — PUBLISH, Will.
    pub correlation_data: Option<Bytes>,
    /// 0x0B — PUBLISH (repeatable, server to client), SUBSCRIBE (once). Values 1..=268_435_455.
    pub subscription_identifiers: Vec<u32>,
    /// 0x11 — CONNECT, CONNACK, DISCONNECT.
    pub session_expiry_interval_s: Option<u32>,
    /// 0x12 — CONNACK.
    pub assigned_client_identifier: Option<Str>,
    /// 0x13 — CONNACK.
    pub server_keep_alive_s: Option<u16>,
    /// 0x15 — CONNECT, CONNACK, AUTH.
    pub authentication_method: Option<Str>,
    /// 0x16 — CONNECT, CONNACK, AUTH.
    pub authentication_data: Option<Bytes>,
    /// 0x17 — CONNECT.
    pub request_problem_information: Option<u8>,
    /// 0x18 — Will.
    pub will_delay_interval_s: Option<u32>,
    /// 0x19 — CONNECT.
    pub request_response_information: Option<u8>,
    /// 0x1A — CONNACK.
    pub response_information: Option<Str>,
    /// 0x1C — CONNACK, DISCONNECT.
    pub server_reference: Option<Str>,
    /// 0x1F — CONNACK, PUBACK, PUBREC, PUBREL, PUBCOMP, SUBACK, UNSUBACK, DISCONNECT, AUTH.
    pub reason_string: Option<Str>,
    /// 0x21 — CONNECT, CONNACK. Never 0.
    pub receive_maximum: Option<u16>,
    /// 0x22 — CONNECT, CONNACK.
    pub topic_alias_maximum: Option<u16>,
    /// 0x23 — PUBLISH. Never 0.
    pub topic_alias: Option<u16>,
    /// 0x24 — CONNACK. 0 or 1.
    pub maximum_qos: Option<u8>,
    /// 0x25 — CONNACK. 0 or 1.
    pub retain_available: Option<u8>,
    /// 0x26 — every packet that has properties. Order preserved.
    pub user: Vec<(Str, Str)>,
    /// 0x27 — CONNECT, CONNACK. Never 0.
    pub maximum_packet_size: Option<u32>,
    /// 0x28 — CONNACK. 0 or 1.
    pub wildcard_subscription_available: Option<u8>,
    /// 0x29 — CONNACK. 0 or 1.
    pub subscription_identifier_available: Option<u8>,
    /// 0x2A — CONNACK. 0 or 1.
    pub shared_subscription_available: Option<u8>,
}

/// What an absent property block reads as.
static EMPTY: PropertyValues = PropertyValues {
    payload_format_indicator: None,
    message_expiry_interval_s: None,
    content_type: None,
    response_topic: None,
    correlation_data: None,
    subscription_identifiers: Vec::new(),
    session_expiry_interval_s: None,
    assigned_client_identifier: None,
    server_keep_alive_s: None,
    authentication_method: None,
    authentication_data: None,
    request_problem_information: None,
    will_delay_interval_s: None,
    request_response_information: None,
    response_information: None,
    server_reference: None,
    reason_string: None,
    receive_maximum: None,
    topic_alias_maximum: None,
    topic_alias: None,
    maximum_qos: None,
    retain_available: None,
    user: Vec::new(),
    maximum_packet_size: None,
    wildcard_subscription_available: None,
    subscription_identifier_available: None,
    shared_subscription_available: None,
};

impl PropertyValues {
    pub fn is_empty(&self) -> bool {
        *self == EMPTY
    }
}

/// The properties of a packet or message: one pointer, null when there are none.
///
/// Reads go through `Deref` (an absent block reads as all fields absent); the first write
/// through `DerefMut` allocates. Build one from a struct literal with
/// `PropertyValues { .., ..PropertyValues::default() }.into()`.
///
/// # Invariants
/// - Equality, `Debug` and [`Properties::is_empty`] look at the values only: an allocated
///   block with every field absent equals `Properties::default()`.
#[derive(Clone, Default)]
pub struct Properties(Option<Box<PropertyValues>>);

impl Properties {
    /// Cheap when no block was ever allocated (the common case).
    pub fn is_empty(&self) -> bool {
        self.0.as_deref().is_none_or(PropertyValues::is_empty)
    }

    /// The values for in-place edits, without allocating when there are none.
    pub fn values_mut(&mut self) -> Option<&mut PropertyValues> {
        self.0.as_deref_mut()
    }

    /// Frees the block if every property in it is absent.
    pub fn shrink(&mut self) {
        if self.0.as_deref().is_some_and(PropertyValues::is_empty) {
            self.0 = None;
        }
    }
}

impl From<PropertyValues> for Properties {
    fn from(values: PropertyValues) -> Properties {
        if values.is_empty() {
            Properties(None)
        } else {
            Properties(Some(Box::new(values)))
        }
    }
}

impl Deref for Properties {
    type Target = PropertyValues;

    fn deref(&self) -> &PropertyValues {
        self.0.as_deref().unwrap_or(&EMPTY)
    }
}

impl DerefMut for Properties {
    fn deref_mut(&mut self) -> &mut PropertyValues {
        self.0.get_or_insert_with(Box::default)
    }
}

impl PartialEq for Properties {
    fn eq(&self, other: &Properties) -> bool {
        match (&self.0, &other.0) {
            (None, None) => true,
            _ => **self == **other,
        }
    }
}

impl Eq for Properties {}

impl std::fmt::Debug for Properties {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&**self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_block_reads_as_empty_and_allocates_on_first_write() {
        let mut props = Properties::default();
        assert!(props.is_empty());
        assert_eq!(props.topic_alias, None);
        assert!(props.values_mut().is_none());
        props.topic_alias = Some(3);
        assert!(!props.is_empty());
        assert_eq!(props.values_mut().map(|v| v.topic_alias), Some(Some(3)));
    }

    #[test]
    fn an_emptied_block_equals_an_absent_one_and_shrinks() {
        let mut props: Properties = PropertyValues {
            reason_string: Some(Str::from_static("why")),
            ..PropertyValues::default()
        }
        .into();
        assert_ne!(props, Properties::default());
        props.reason_string = None;
        assert!(props.is_empty());
        assert_eq!(props, Properties::default());
        assert_eq!(format!("{props:?}"), format!("{:?}", Properties::default()));
        props.shrink();
        assert!(props.values_mut().is_none());
    }

    #[test]
    fn empty_values_convert_to_an_absent_block() {
        let mut props = Properties::from(PropertyValues::default());
        assert!(props.values_mut().is_none());
    }
}
