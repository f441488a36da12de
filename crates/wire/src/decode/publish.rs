//! PUBLISH (section 3.3).

use bytes::{Buf, Bytes, BytesMut};

use crate::decode::{packet_id, properties, reader::Reader, restore};
use crate::error::DecodeError;
use crate::packet::{Packet, PacketType, Publish, QoS, Str};
use crate::properties::Properties;
use crate::property_table::Place;

/// The fields before the property block.
struct Head {
    qos: QoS,
    topic: Str,
    packet_id: u16,
    /// Offset of the property block (5.0) or of the payload (3.x).
    next: usize,
}

fn head(frame: &Bytes, body_start: usize, flags: u8) -> Result<Head, DecodeError> {
    // The fixed header already rejected QoS 3 and DUP on QoS 0.
    let qos = QoS::from_u8((flags >> 1) & 0b11).ok_or(DecodeError::InvalidQoS)?;
    let mut reader = Reader::new(frame, body_start);
    let topic = topic_name(&mut reader)?;
    let packet_id = if qos == QoS::AtMostOnce {
        0
    } else {
        packet_id(&mut reader)?
    };
    Ok(Head {
        qos,
        topic,
        packet_id,
        next: reader.position(),
    })
}

/// Reads the property block at `start`; returns the properties and the payload offset.
fn tail(frame: &Bytes, start: usize) -> Result<(Properties, usize), DecodeError> {
    let mut reader = Reader::new(frame, start);
    let properties = properties::read(&mut reader, Place::packet(PacketType::Publish))?;
    Ok((properties, reader.position()))
}

/// Decodes the PUBLISH in `frame` (body at `body_start`). The payload is `frame` itself,
/// advanced past the header fields, which saves a reference count round trip. On error the
/// frame is put back in front of `buf`.
///
/// Shaped for speed: the common case (no properties) builds the packet directly in the return
/// value; only a PUBLISH with properties moves its `Properties` once.
#[inline]
pub(crate) fn publish(
    buf: &mut BytesMut,
    mut frame: Bytes,
    body_start: usize,
    flags: u8,
    v5: bool,
) -> Result<Option<Packet>, DecodeError> {
    let head = match head(&frame, body_start, flags) {
        Ok(head) => head,
        Err(error) => return Err(fail(buf, &frame, error)),
    };
    let dup = flags & 0b1000 != 0;
    let retain = flags & 0b0001 != 0;
    // An empty property block is the single byte 0.
    if !v5 || frame.get(head.next) == Some(&0) {
        if head.topic.is_empty() {
            // [MQTT-4.7.3-1]; in 5.0 only with a topic alias (3.3.2.3.4).
            return Err(fail(buf, &frame, DecodeError::EmptyTopicName));
        }
        frame.advance(head.next + usize::from(v5));
        return Ok(Some(Packet::Publish(Publish {
            dup,
            qos: head.qos,
            retain,
            topic: head.topic,
            packet_id: head.packet_id,
            properties: Properties::default(),
            payload: frame,
        })));
    }
    let (properties, payload_start) = match tail(&frame, head.next) {
        Ok(tail) => tail,
        Err(error) => return Err(fail(buf, &frame, error)),
    };
    if head.topic.is_empty() && properties.topic_alias.is_none() {
        return Err(fail(buf, &frame, DecodeError::EmptyTopicName));
    }
    frame.advance(payload_start);
    Ok(Some(Packet::Publish(Publish {
        dup,
        qos: head.qos,
        retain,
        topic: head.topic,
        packet_id: head.packet_id,
        properties,
        payload: frame,
    })))
}

#[cold]
fn fail(buf: &mut BytesMut, frame: &Bytes, error: DecodeError) -> DecodeError {
    restore(buf, frame);
    error
}

/// A topic name: UTF-8 without U+0000 and without wildcards ([MQTT-3.3.2-2]). May be empty;
/// callers decide whether that is allowed.
#[inline]
pub(crate) fn topic_name(reader: &mut Reader<'_>) -> Result<Str, DecodeError> {
    let raw = reader.binary()?;
    // The three forbidden bytes are ASCII, so a byte scan is exact in UTF-8. No early exit:
    // the loop vectorises, and valid topics (the common case) are scanned whole anyway.
    let forbidden = raw.iter().fold(false, |found, &byte| {
        found | matches!(byte, 0 | b'+' | b'#')
    });
    if forbidden {
        return Err(if raw.contains(&0) {
            DecodeError::NullCharacter
        } else {
            DecodeError::WildcardInTopicName
        });
    }
    if !raw.is_ascii() {
        std::str::from_utf8(&raw).map_err(|_| DecodeError::InvalidUtf8)?;
    }
    Ok(Str::from_validated(raw))
}
