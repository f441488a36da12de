//! PUBLISH (section 3.3).

use crate::decode::{packet_id, properties, reader::Reader};
use crate::error::DecodeError;
use crate::packet::{PacketType, Publish, QoS, Str};
use crate::property_table::Place;

pub(crate) fn publish(
    reader: &mut Reader<'_>,
    flags: u8,
    v5: bool,
) -> Result<Publish, DecodeError> {
    // The fixed header already rejected QoS 3 and DUP on QoS 0.
    let qos = QoS::from_u8((flags >> 1) & 0b11).ok_or(DecodeError::InvalidQoS)?;
    let topic = topic_name(reader)?;
    let packet_id = if qos == QoS::AtMostOnce {
        0
    } else {
        packet_id(reader)?
    };
    let properties = if v5 {
        properties::read(reader, Place::packet(PacketType::Publish))?
    } else {
        Default::default()
    };
    // [MQTT-4.7.3-1]; in 5.0 an empty topic needs a topic alias (3.3.2.3.4).
    if topic.is_empty() && properties.topic_alias.is_none() {
        return Err(DecodeError::EmptyTopicName);
    }
    Ok(Publish {
        dup: flags & 0b1000 != 0,
        qos,
        retain: flags & 0b0001 != 0,
        topic,
        packet_id,
        properties,
        payload: reader.rest(),
    })
}

/// A topic name: UTF-8 without U+0000 and without wildcards ([MQTT-3.3.2-2]). May be empty;
/// callers decide whether that is allowed.
#[inline]
pub(crate) fn topic_name(reader: &mut Reader<'_>) -> Result<Str, DecodeError> {
    let raw = reader.binary()?;
    // One pass for the three forbidden bytes; all are ASCII so a byte scan is exact in UTF-8.
    for &byte in raw.iter() {
        match byte {
            0 => return Err(DecodeError::NullCharacter),
            b'+' | b'#' => return Err(DecodeError::WildcardInTopicName),
            _ => {}
        }
    }
    if !raw.is_ascii() {
        std::str::from_utf8(&raw).map_err(|_| DecodeError::InvalidUtf8)?;
    }
    Ok(Str::from_validated(raw))
}
