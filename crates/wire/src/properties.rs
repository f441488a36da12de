//! MQTT 5.0 properties: one struct holding every property, and the table of which packet may
//! carry which property.
//!
//! # Invariants
//! - Every property other than User Property and Subscription Identifier appears at most once
//!   in a packet; the decoder rejects duplicates as a protocol error.
//! - `user` keeps the order of the wire ([MQTT-3.3.2-18]: forwarded in order).
//! - The decoder accepts a property only in the packets the spec lists for it.

use bytes::Bytes;

use crate::packet::Str;

/// All MQTT 5.0 properties. A field is `None` (or empty) when the property is absent.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Properties {
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

impl Properties {
    pub fn is_empty(&self) -> bool {
        *self == Properties::default()
    }
}
