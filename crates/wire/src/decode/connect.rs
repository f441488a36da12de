//! CONNECT and CONNACK (sections 3.1, 3.2), including the CONNECT of MQTT 3.1 (`MQIsdp`).

use crate::decode::publish::topic_name;
use crate::decode::{properties, reader::Reader};
use crate::error::DecodeError;
use crate::packet::{ConnAck, Connect, PacketType, Protocol, QoS, Will};
use crate::properties::Properties;
use crate::property_table::{Place, WILL};
use crate::reason::{ReasonCode, allowed_in, connack_from_v3_code};

const FLAG_RESERVED: u8 = 0b0000_0001;
const FLAG_CLEAN_START: u8 = 0b0000_0010;
const FLAG_WILL: u8 = 0b0000_0100;
const FLAG_WILL_QOS: u8 = 0b0001_1000;
const FLAG_WILL_RETAIN: u8 = 0b0010_0000;
const FLAG_PASSWORD: u8 = 0b0100_0000;
const FLAG_USERNAME: u8 = 0b1000_0000;

/// Protocol name and level → version ([MQTT-3.1.2-1], [MQTT-3.1.2-2]).
fn protocol(name: &[u8], level: u8) -> Result<Protocol, DecodeError> {
    match (name, level) {
        (b"MQTT", 4) => Ok(Protocol::V3_1_1),
        (b"MQTT", 5) => Ok(Protocol::V5),
        (b"MQIsdp", 3) => Ok(Protocol::V3_1),
        (b"MQTT" | b"MQIsdp", _) => Err(DecodeError::UnsupportedProtocolVersion { level }),
        _ => Err(DecodeError::InvalidProtocolName),
    }
}

pub(crate) fn connect(reader: &mut Reader<'_>) -> Result<Connect, DecodeError> {
    let name = reader.binary()?;
    let level = reader.u8()?;
    let protocol = protocol(&name, level)?;
    let v5 = protocol.is_v5();
    let flags = reader.u8()?;
    if flags & FLAG_RESERVED != 0 {
        return Err(DecodeError::ConnectReservedFlag); // [MQTT-3.1.2-3]
    }
    let has_will = flags & FLAG_WILL != 0;
    let will_qos_bits = (flags & FLAG_WILL_QOS) >> 3;
    let will_retain = flags & FLAG_WILL_RETAIN != 0;
    if !has_will && (will_qos_bits != 0 || will_retain) {
        // [MQTT-3.1.2-11], [MQTT-3.1.2-13], [MQTT-3.1.2-15]
        return Err(DecodeError::WillFlagsWithoutWill);
    }
    let will_qos = QoS::from_u8(will_qos_bits).ok_or(DecodeError::InvalidQoS)?; // [MQTT-3.1.2-14]
    let has_username = flags & FLAG_USERNAME != 0;
    let has_password = flags & FLAG_PASSWORD != 0;
    if !v5 && has_password && !has_username {
        return Err(DecodeError::PasswordWithoutUsername); // [MQTT-3.1.2-22]
    }
    let keep_alive_s = reader.u16()?;
    let properties = if v5 {
        properties::read(reader, Place::packet(PacketType::Connect))?
    } else {
        Properties::default()
    };
    let client_id = reader.string()?;
    let will = if has_will {
        let will_properties = if v5 {
            properties::read(reader, WILL)?
        } else {
            Properties::default()
        };
        let topic = topic_name(reader)?;
        if topic.is_empty() {
            return Err(DecodeError::EmptyTopicName);
        }
        let payload = reader.binary()?;
        Some(Will {
            topic,
            payload,
            qos: will_qos,
            retain: will_retain,
            properties: will_properties,
        })
    } else {
        None
    };
    let username = if has_username {
        Some(reader.string()?)
    } else {
        None
    };
    let password = if has_password {
        Some(reader.binary()?)
    } else {
        None
    };
    reader.finish()?;
    Ok(Connect {
        protocol,
        clean_start: flags & FLAG_CLEAN_START != 0,
        keep_alive_s,
        properties,
        client_id,
        will,
        username,
        password,
    })
}

pub(crate) fn connack(reader: &mut Reader<'_>, v5: bool) -> Result<ConnAck, DecodeError> {
    let flags = reader.u8()?;
    if flags & 0b1111_1110 != 0 {
        return Err(DecodeError::InvalidConnAckFlags(flags));
    }
    let session_present = flags & 1 != 0;
    let code = reader.u8()?;
    let invalid = DecodeError::InvalidReasonCode {
        packet: PacketType::ConnAck,
        code,
    };
    let reason = if v5 {
        if !allowed_in(PacketType::ConnAck, code) {
            return Err(invalid);
        }
        ReasonCode(code)
    } else {
        connack_from_v3_code(code).ok_or(invalid)?
    };
    // [MQTT-3.2.2-4] (3.1.1), [MQTT-3.2.2-6] (5.0)
    if session_present && code != 0 {
        return Err(DecodeError::InvalidConnAckFlags(flags));
    }
    // Some 5.0 servers omit an empty property block; accept that.
    let properties = if v5 && !reader.is_empty() {
        properties::read(reader, Place::packet(PacketType::ConnAck))?
    } else {
        Properties::default()
    };
    reader.finish()?;
    Ok(ConnAck {
        session_present,
        reason,
        properties,
    })
}
