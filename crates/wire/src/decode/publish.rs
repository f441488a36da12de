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

#[inline(always)]
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
/// value and allocates nothing for properties.
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
    let scan = scan_topic(&raw);
    if scan.forbidden {
        return Err(if raw.contains(&0) {
            DecodeError::NullCharacter
        } else {
            DecodeError::WildcardInTopicName
        });
    }
    if !scan.ascii {
        std::str::from_utf8(&raw).map_err(|_| DecodeError::InvalidUtf8)?;
    }
    Ok(Str::from_validated(raw))
}

/// What one pass over a topic name found.
struct TopicScan {
    /// U+0000, `+` or `#` somewhere (all three are single ASCII bytes in UTF-8).
    forbidden: bool,
    /// Every byte is ASCII, so the UTF-8 check can be skipped.
    ascii: bool,
}

const LOW_BITS: u64 = 0x0101_0101_0101_0101;
const HIGH_BITS: u64 = 0x8080_8080_8080_8080;

/// Non-zero iff some byte of `word` is zero (the classic SWAR test).
#[inline(always)]
fn has_zero_byte(word: u64) -> u64 {
    word.wrapping_sub(LOW_BITS) & !word & HIGH_BITS
}

/// Scans eight bytes at a time: topics are short, and a byte loop cost more than the rest of
/// PUBLISH decoding together.
#[inline]
fn scan_topic(bytes: &[u8]) -> TopicScan {
    let mut found = 0u64;
    let mut high = 0u64;
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let mut array = [0u8; 8];
        array.copy_from_slice(chunk);
        let word = u64::from_le_bytes(array);
        high |= word & HIGH_BITS;
        found |= has_zero_byte(word)
            | has_zero_byte(word ^ (LOW_BITS * u64::from(b'+')))
            | has_zero_byte(word ^ (LOW_BITS * u64::from(b'#')));
    }
    let mut forbidden = found != 0;
    let mut ascii = high == 0;
    for &byte in chunks.remainder() {
        forbidden |= matches!(byte, 0 | b'+' | b'#');
        ascii &= byte.is_ascii();
    }
    TopicScan { forbidden, ascii }
}

#[cfg(test)]
mod tests {
    use super::scan_topic;

    #[test]
    fn scan_agrees_with_a_byte_loop() {
        let samples: [&[u8]; 9] = [
            b"",
            b"a/b",
            b"sensors/room1/temp",
            b"sensors/room1/+",
            b"#",
            b"abcdefgh#",
            b"abcdefg\0",
            "caf\u{e9}/t".as_bytes(),
            b"\x80\x81abcdefgh",
        ];
        for sample in samples {
            let scan = scan_topic(sample);
            assert_eq!(
                scan.forbidden,
                sample.iter().any(|b| matches!(b, 0 | b'+' | b'#')),
                "{sample:?}"
            );
            assert_eq!(scan.ascii, sample.is_ascii(), "{sample:?}");
        }
        // Every position of a 17-byte topic, so both the words and the tail are covered.
        for at in 0..17 {
            for bad in [0u8, b'+', b'#', 0x80] {
                let mut topic = [b'x'; 17];
                topic[at] = bad;
                let scan = scan_topic(&topic);
                assert_eq!(scan.forbidden, bad != 0x80);
                assert_eq!(scan.ascii, bad != 0x80);
            }
        }
    }
}
