//! SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK (sections 3.8–3.11).
//!
//! Topic filters are only checked as MQTT strings here; their syntax is tern-topic's job,
//! because an invalid filter earns a per-filter SUBACK code (0x8F), not a disconnect.

use crate::decode::{packet_id, properties, reader::Reader};
use crate::error::DecodeError;
use crate::packet::{
    PacketType, QoS, RetainHandling, SubAck, Subscribe, SubscriptionOptions, UnsubAck, Unsubscribe,
};
use crate::properties::Properties;
use crate::property_table::Place;
use crate::reason::{ReasonCode, allowed_in};

fn props(
    reader: &mut Reader<'_>,
    packet_type: PacketType,
    v5: bool,
) -> Result<Properties, DecodeError> {
    if v5 {
        properties::read(reader, Place::packet(packet_type))
    } else {
        Ok(Properties::default())
    }
}

pub(crate) fn subscribe(reader: &mut Reader<'_>, v5: bool) -> Result<Subscribe, DecodeError> {
    let packet_id = packet_id(reader)?;
    let properties = props(reader, PacketType::Subscribe, v5)?;
    let mut filters = Vec::new();
    while !reader.is_empty() {
        let filter = reader.string()?;
        let options = options(reader.u8()?, v5)?;
        filters.push((filter, options));
    }
    if filters.is_empty() {
        return Err(DecodeError::NoTopicFilters);
    }
    Ok(Subscribe {
        packet_id,
        properties,
        filters,
    })
}

/// The subscription options byte (3.8.3.1).
fn options(byte: u8, v5: bool) -> Result<SubscriptionOptions, DecodeError> {
    // [MQTT-3.8.3-4] in 3.1.1: only the QoS bits; [MQTT-3.8.3-5] in 5.0: bits 6 and 7 reserved.
    let reserved = if v5 { 0b1100_0000 } else { 0b1111_1100 };
    if byte & reserved != 0 {
        return Err(DecodeError::SubscriptionOptionsReserved);
    }
    let qos = QoS::from_u8(byte & 0b11).ok_or(DecodeError::InvalidQoS)?;
    let retain_handling = match (byte >> 4) & 0b11 {
        0 => RetainHandling::SendAtSubscribe,
        1 => RetainHandling::SendIfNew,
        2 => RetainHandling::DoNotSend,
        _ => return Err(DecodeError::InvalidRetainHandling),
    };
    Ok(SubscriptionOptions {
        qos,
        no_local: byte & 0b0100 != 0,
        retain_as_published: byte & 0b1000 != 0,
        retain_handling,
    })
}

pub(crate) fn suback(reader: &mut Reader<'_>, v5: bool) -> Result<SubAck, DecodeError> {
    let packet_id = packet_id(reader)?;
    let properties = props(reader, PacketType::SubAck, v5)?;
    let mut reasons = Vec::with_capacity(reader.remaining());
    while !reader.is_empty() {
        let code = reader.u8()?;
        let allowed = if v5 {
            allowed_in(PacketType::SubAck, code)
        } else {
            matches!(code, 0x00..=0x02 | 0x80)
        };
        if !allowed {
            return Err(DecodeError::InvalidReasonCode {
                packet: PacketType::SubAck,
                code,
            });
        }
        reasons.push(ReasonCode(code));
    }
    if reasons.is_empty() {
        return Err(DecodeError::Truncated);
    }
    Ok(SubAck {
        packet_id,
        properties,
        reasons,
    })
}

pub(crate) fn unsubscribe(reader: &mut Reader<'_>, v5: bool) -> Result<Unsubscribe, DecodeError> {
    let packet_id = packet_id(reader)?;
    let properties = props(reader, PacketType::Unsubscribe, v5)?;
    let mut filters = Vec::new();
    while !reader.is_empty() {
        filters.push(reader.string()?);
    }
    if filters.is_empty() {
        return Err(DecodeError::NoTopicFilters);
    }
    Ok(Unsubscribe {
        packet_id,
        properties,
        filters,
    })
}

pub(crate) fn unsuback(reader: &mut Reader<'_>, v5: bool) -> Result<UnsubAck, DecodeError> {
    let packet_id = packet_id(reader)?;
    if !v5 {
        reader.finish()?;
        return Ok(UnsubAck {
            packet_id,
            properties: Properties::default(),
            reasons: Vec::new(),
        });
    }
    let properties = props(reader, PacketType::UnsubAck, v5)?;
    let mut reasons = Vec::with_capacity(reader.remaining());
    while !reader.is_empty() {
        let code = reader.u8()?;
        if !allowed_in(PacketType::UnsubAck, code) {
            return Err(DecodeError::InvalidReasonCode {
                packet: PacketType::UnsubAck,
                code,
            });
        }
        reasons.push(ReasonCode(code));
    }
    if reasons.is_empty() {
        return Err(DecodeError::Truncated);
    }
    Ok(UnsubAck {
        packet_id,
        properties,
        reasons,
    })
}
