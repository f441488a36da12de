//! Encoding of an MQTT 5.0 property block. Properties are written in identifier order, user
//! properties in their own order ([MQTT-3.3.2-18]).
//!
//! # Invariants
//! - [`content_len`] checks every present property against the table of allowed places and
//!   every field length; [`write`] relies on that and does not check again.

use bytes::{BufMut, BytesMut};

use crate::encode::fields::{binary_len, put_binary, put_str, str_len};
use crate::error::EncodeError;
use crate::properties::PropertyValues;
use crate::property_table::{self as id, Place, is_allowed};
use crate::varint::{self, VARINT_MAX};

/// Which properties to include.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    All,
    /// Everything except topic alias and subscription identifiers (a PUBLISH template's
    /// shared part; those two are written per delivery).
    Shared,
}

fn check(prop_id: u8, place: Place) -> Result<(), EncodeError> {
    if is_allowed(prop_id, place) {
        Ok(())
    } else {
        Err(EncodeError::PropertyNotAllowed {
            id: prop_id,
            packet: place.packet_type(),
        })
    }
}

/// Size of the properties themselves, without the property length prefix.
pub(crate) fn content_len(
    props: &PropertyValues,
    place: Place,
    scope: Scope,
) -> Result<usize, EncodeError> {
    let mut len = 0;
    macro_rules! fixed {
        ($field:ident, $id:expr, $size:expr) => {
            if props.$field.is_some() {
                check($id, place)?;
                len += 1 + $size;
            }
        };
    }
    macro_rules! string {
        ($field:ident, $id:expr) => {
            if let Some(value) = &props.$field {
                check($id, place)?;
                len += 1 + str_len(value)?;
            }
        };
    }
    macro_rules! binary {
        ($field:ident, $id:expr) => {
            if let Some(value) = &props.$field {
                check($id, place)?;
                len += 1 + binary_len(value)?;
            }
        };
    }
    fixed!(payload_format_indicator, id::PAYLOAD_FORMAT_INDICATOR, 1);
    fixed!(message_expiry_interval_s, id::MESSAGE_EXPIRY_INTERVAL, 4);
    string!(content_type, id::CONTENT_TYPE);
    string!(response_topic, id::RESPONSE_TOPIC);
    binary!(correlation_data, id::CORRELATION_DATA);
    if scope == Scope::All {
        for &value in &props.subscription_identifiers {
            check(id::SUBSCRIPTION_IDENTIFIER, place)?;
            if value == 0 || value > VARINT_MAX {
                return Err(EncodeError::InvalidPropertyValue(
                    id::SUBSCRIPTION_IDENTIFIER,
                ));
            }
            len += 1 + varint::len(value);
        }
    }
    fixed!(session_expiry_interval_s, id::SESSION_EXPIRY_INTERVAL, 4);
    string!(assigned_client_identifier, id::ASSIGNED_CLIENT_IDENTIFIER);
    fixed!(server_keep_alive_s, id::SERVER_KEEP_ALIVE, 2);
    string!(authentication_method, id::AUTHENTICATION_METHOD);
    binary!(authentication_data, id::AUTHENTICATION_DATA);
    fixed!(
        request_problem_information,
        id::REQUEST_PROBLEM_INFORMATION,
        1
    );
    fixed!(will_delay_interval_s, id::WILL_DELAY_INTERVAL, 4);
    fixed!(
        request_response_information,
        id::REQUEST_RESPONSE_INFORMATION,
        1
    );
    string!(response_information, id::RESPONSE_INFORMATION);
    string!(server_reference, id::SERVER_REFERENCE);
    string!(reason_string, id::REASON_STRING);
    fixed!(receive_maximum, id::RECEIVE_MAXIMUM, 2);
    fixed!(topic_alias_maximum, id::TOPIC_ALIAS_MAXIMUM, 2);
    if scope == Scope::All {
        fixed!(topic_alias, id::TOPIC_ALIAS, 2);
    }
    fixed!(maximum_qos, id::MAXIMUM_QOS, 1);
    fixed!(retain_available, id::RETAIN_AVAILABLE, 1);
    for (key, value) in &props.user {
        check(id::USER_PROPERTY, place)?;
        len += 1 + str_len(key)? + str_len(value)?;
    }
    fixed!(maximum_packet_size, id::MAXIMUM_PACKET_SIZE, 4);
    fixed!(
        wildcard_subscription_available,
        id::WILDCARD_SUBSCRIPTION_AVAILABLE,
        1
    );
    fixed!(
        subscription_identifier_available,
        id::SUBSCRIPTION_IDENTIFIER_AVAILABLE,
        1
    );
    fixed!(
        shared_subscription_available,
        id::SHARED_SUBSCRIPTION_AVAILABLE,
        1
    );
    if len > VARINT_MAX as usize {
        return Err(EncodeError::PacketTooLarge(len));
    }
    Ok(len)
}

/// Size of the block: property length prefix plus content.
#[inline]
pub(crate) fn block_len(content_len: usize) -> usize {
    varint::len(content_len as u32) + content_len
}

/// Writes the property length and the properties; `content_len` came from [`content_len`]
/// with the same `scope`.
pub(crate) fn write(props: &PropertyValues, content_len: usize, scope: Scope, out: &mut BytesMut) {
    varint::write(content_len as u32, out);
    if content_len > 0 {
        write_content(props, scope, out);
    }
}

/// Writes the properties without the length prefix.
pub(crate) fn write_content(props: &PropertyValues, scope: Scope, out: &mut BytesMut) {
    macro_rules! put {
        ($field:ident, $id:expr, $put:ident) => {
            if let Some(value) = props.$field {
                out.put_u8($id);
                out.$put(value);
            }
        };
    }
    macro_rules! string {
        ($field:ident, $id:expr) => {
            if let Some(value) = &props.$field {
                out.put_u8($id);
                put_str(out, value);
            }
        };
    }
    macro_rules! binary {
        ($field:ident, $id:expr) => {
            if let Some(value) = &props.$field {
                out.put_u8($id);
                put_binary(out, value);
            }
        };
    }
    put!(
        payload_format_indicator,
        id::PAYLOAD_FORMAT_INDICATOR,
        put_u8
    );
    put!(
        message_expiry_interval_s,
        id::MESSAGE_EXPIRY_INTERVAL,
        put_u32
    );
    string!(content_type, id::CONTENT_TYPE);
    string!(response_topic, id::RESPONSE_TOPIC);
    binary!(correlation_data, id::CORRELATION_DATA);
    if scope == Scope::All {
        for &value in &props.subscription_identifiers {
            out.put_u8(id::SUBSCRIPTION_IDENTIFIER);
            varint::write(value, out);
        }
    }
    put!(
        session_expiry_interval_s,
        id::SESSION_EXPIRY_INTERVAL,
        put_u32
    );
    string!(assigned_client_identifier, id::ASSIGNED_CLIENT_IDENTIFIER);
    put!(server_keep_alive_s, id::SERVER_KEEP_ALIVE, put_u16);
    string!(authentication_method, id::AUTHENTICATION_METHOD);
    binary!(authentication_data, id::AUTHENTICATION_DATA);
    put!(
        request_problem_information,
        id::REQUEST_PROBLEM_INFORMATION,
        put_u8
    );
    put!(will_delay_interval_s, id::WILL_DELAY_INTERVAL, put_u32);
    put!(
        request_response_information,
        id::REQUEST_RESPONSE_INFORMATION,
        put_u8
    );
    string!(response_information, id::RESPONSE_INFORMATION);
    string!(server_reference, id::SERVER_REFERENCE);
    string!(reason_string, id::REASON_STRING);
    put!(receive_maximum, id::RECEIVE_MAXIMUM, put_u16);
    put!(topic_alias_maximum, id::TOPIC_ALIAS_MAXIMUM, put_u16);
    if scope == Scope::All {
        put!(topic_alias, id::TOPIC_ALIAS, put_u16);
    }
    put!(maximum_qos, id::MAXIMUM_QOS, put_u8);
    put!(retain_available, id::RETAIN_AVAILABLE, put_u8);
    for (key, value) in &props.user {
        out.put_u8(id::USER_PROPERTY);
        put_str(out, key);
        put_str(out, value);
    }
    put!(maximum_packet_size, id::MAXIMUM_PACKET_SIZE, put_u32);
    put!(
        wildcard_subscription_available,
        id::WILDCARD_SUBSCRIPTION_AVAILABLE,
        put_u8
    );
    put!(
        subscription_identifier_available,
        id::SUBSCRIPTION_IDENTIFIER_AVAILABLE,
        put_u8
    );
    put!(
        shared_subscription_available,
        id::SHARED_SUBSCRIPTION_AVAILABLE,
        put_u8
    );
}
