//! Decoding of an MQTT 5.0 property block (property length, then identifier/value pairs).
//!
//! # Invariants
//! - A property is accepted only where [`crate::property_table`] allows it.
//! - Duplicates are rejected except User Property and, in PUBLISH, Subscription Identifier.

use crate::decode::reader::Reader;
use crate::error::DecodeError;
use crate::packet::PacketType;
use crate::properties::{Properties, PropertyValues};
use crate::property_table::{self as id, Place, is_allowed};
use crate::varint::VARINT_MAX;

/// Reads the property length and the properties that follow it. An empty block (length 0)
/// allocates nothing; a non-empty one holds at least one property.
pub(crate) fn read(reader: &mut Reader<'_>, place: Place) -> Result<Properties, DecodeError> {
    let len = reader.varint()? as usize;
    if len == 0 {
        return Ok(Properties::default());
    }
    let mut props = Properties::default();
    // Allocates the block once, in place: no 400-byte value is built and moved into it.
    read_block(reader, place, len, &mut props)?;
    Ok(props)
}

fn read_block(
    reader: &mut Reader<'_>,
    place: Place,
    len: usize,
    props: &mut PropertyValues,
) -> Result<(), DecodeError> {
    let mut block = reader.sub(len)?;
    let mut seen: u64 = 0;
    while !block.is_empty() {
        let raw_id = block.varint()?;
        let Ok(prop_id) = u8::try_from(raw_id) else {
            return Err(DecodeError::UnknownProperty(raw_id));
        };
        if id::allowed_places(prop_id).is_none() {
            return Err(DecodeError::UnknownProperty(raw_id));
        }
        if !is_allowed(prop_id, place) {
            return Err(DecodeError::PropertyNotAllowed {
                id: prop_id,
                packet: place.packet_type(),
            });
        }
        let repeatable = prop_id == id::USER_PROPERTY
            || (prop_id == id::SUBSCRIPTION_IDENTIFIER
                && place == Place::packet(PacketType::Publish));
        let bit = 1u64 << prop_id;
        if seen & bit != 0 && !repeatable {
            return Err(DecodeError::DuplicateProperty(prop_id));
        }
        seen |= bit;
        read_one(&mut block, prop_id, props)?;
    }
    if props.authentication_data.is_some() && props.authentication_method.is_none() {
        return Err(DecodeError::AuthDataWithoutMethod);
    }
    Ok(())
}

fn zero_or_one(value: u8, prop_id: u8) -> Result<u8, DecodeError> {
    if value > 1 {
        return Err(DecodeError::InvalidPropertyValue(prop_id));
    }
    Ok(value)
}

fn non_zero_u16(value: u16, prop_id: u8) -> Result<u16, DecodeError> {
    if value == 0 {
        return Err(DecodeError::InvalidPropertyValue(prop_id));
    }
    Ok(value)
}

fn read_one(
    block: &mut Reader<'_>,
    prop_id: u8,
    props: &mut PropertyValues,
) -> Result<(), DecodeError> {
    match prop_id {
        id::PAYLOAD_FORMAT_INDICATOR => {
            props.payload_format_indicator = Some(zero_or_one(block.u8()?, prop_id)?)
        }
        id::MESSAGE_EXPIRY_INTERVAL => props.message_expiry_interval_s = Some(block.u32()?),
        id::CONTENT_TYPE => props.content_type = Some(block.string()?),
        id::RESPONSE_TOPIC => props.response_topic = Some(block.string()?),
        id::CORRELATION_DATA => props.correlation_data = Some(block.binary()?),
        id::SUBSCRIPTION_IDENTIFIER => {
            let value = block.varint()?;
            // Four varint bytes cannot exceed VARINT_MAX; 0 is a protocol error (3.3.2.3.8).
            if value == 0 || value > VARINT_MAX {
                return Err(DecodeError::InvalidPropertyValue(prop_id));
            }
            props.subscription_identifiers.push(value);
        }
        id::SESSION_EXPIRY_INTERVAL => props.session_expiry_interval_s = Some(block.u32()?),
        id::ASSIGNED_CLIENT_IDENTIFIER => props.assigned_client_identifier = Some(block.string()?),
        id::SERVER_KEEP_ALIVE => props.server_keep_alive_s = Some(block.u16()?),
        id::AUTHENTICATION_METHOD => props.authentication_method = Some(block.string()?),
        id::AUTHENTICATION_DATA => props.authentication_data = Some(block.binary()?),
        id::REQUEST_PROBLEM_INFORMATION => {
            props.request_problem_information = Some(zero_or_one(block.u8()?, prop_id)?)
        }
        id::WILL_DELAY_INTERVAL => props.will_delay_interval_s = Some(block.u32()?),
        id::REQUEST_RESPONSE_INFORMATION => {
            props.request_response_information = Some(zero_or_one(block.u8()?, prop_id)?)
        }
        id::RESPONSE_INFORMATION => props.response_information = Some(block.string()?),
        id::SERVER_REFERENCE => props.server_reference = Some(block.string()?),
        id::REASON_STRING => props.reason_string = Some(block.string()?),
        id::RECEIVE_MAXIMUM => props.receive_maximum = Some(non_zero_u16(block.u16()?, prop_id)?),
        id::TOPIC_ALIAS_MAXIMUM => props.topic_alias_maximum = Some(block.u16()?),
        id::TOPIC_ALIAS => props.topic_alias = Some(non_zero_u16(block.u16()?, prop_id)?),
        id::MAXIMUM_QOS => props.maximum_qos = Some(zero_or_one(block.u8()?, prop_id)?),
        id::RETAIN_AVAILABLE => props.retain_available = Some(zero_or_one(block.u8()?, prop_id)?),
        id::USER_PROPERTY => {
            let key = block.string()?;
            let value = block.string()?;
            props.user.push((key, value));
        }
        id::MAXIMUM_PACKET_SIZE => {
            let value = block.u32()?;
            if value == 0 {
                return Err(DecodeError::InvalidPropertyValue(prop_id));
            }
            props.maximum_packet_size = Some(value);
        }
        id::WILDCARD_SUBSCRIPTION_AVAILABLE => {
            props.wildcard_subscription_available = Some(zero_or_one(block.u8()?, prop_id)?)
        }
        id::SUBSCRIPTION_IDENTIFIER_AVAILABLE => {
            props.subscription_identifier_available = Some(zero_or_one(block.u8()?, prop_id)?)
        }
        id::SHARED_SUBSCRIPTION_AVAILABLE => {
            props.shared_subscription_available = Some(zero_or_one(block.u8()?, prop_id)?)
        }
        _ => return Err(DecodeError::UnknownProperty(u32::from(prop_id))),
    }
    Ok(())
}
