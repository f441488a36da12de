//! Incremental decoding: one packet from the front of a `BytesMut` that may hold a partial
//! packet, several packets, or garbage.
//!
//! # Invariants
//! - On `Ok(None)` and on `Err(_)` the buffer is untouched; on `Ok(Some(_))` exactly the
//!   packet's bytes were split off its front.
//! - The fixed header is checked (type, flags, remaining length, maximum packet size) before
//!   the body needs to be present, so a peer cannot make us buffer a packet we will refuse.
//! - Decoding never panics and allocates only in proportion to the packet it holds (vectors of
//!   filters, reason codes and user properties), so the maximum packet size bounds it.

mod ack;
mod connect;
mod control;
pub(crate) mod properties;
mod publish;
pub(crate) mod reader;
mod subscribe;

use bytes::{Bytes, BytesMut};

use crate::error::DecodeError;
use crate::packet::{Packet, PacketType, Protocol};
use crate::packet_type::packet_type_from_u8;
use crate::varint::{self, Varint};
use reader::Reader;

/// Fixed header facts the per-packet decoders need.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FixedHeader {
    pub(crate) packet_type: PacketType,
    pub(crate) flags: u8,
}

/// Decodes one packet from the front of `buf`.
///
/// `Ok(None)`: need more bytes (`buf` untouched). `Ok(Some(p))`: the packet's bytes were split
/// off the front of `buf` and frozen; topic, payload and binary fields of `p` are slices of them.
/// `protocol` is the connection's negotiated version; CONNECT carries and uses its own, so
/// for the first packet of a connection any value will do (AUTH is only accepted with `V5`).
/// `max_packet_size_bytes` limits the whole packet, fixed header included, and is enforced as
/// soon as the fixed header is complete ([`DecodeError::PacketTooLarge`]).
pub fn decode(
    buf: &mut BytesMut,
    protocol: Protocol,
    max_packet_size_bytes: u32,
) -> Result<Option<Packet>, DecodeError> {
    let Some(&first) = buf.first() else {
        return Ok(None);
    };
    let header = fixed_header(first, protocol)?;
    let (remaining_len, len_bytes) = match varint::parse(&buf[1..]) {
        Varint::Complete(value, used) => (value as usize, used),
        Varint::Incomplete => return Ok(None),
        Varint::Malformed => return Err(DecodeError::MalformedRemainingLength),
    };
    let header_len = 1 + len_bytes;
    let total_len = header_len + remaining_len;
    if total_len as u64 > u64::from(max_packet_size_bytes) {
        return Err(DecodeError::PacketTooLarge {
            size_bytes: total_len as u64,
            max_bytes: max_packet_size_bytes,
        });
    }
    if buf.len() < total_len {
        return Ok(None);
    }
    // Decode from the split-off frame; on error the bytes go back in front ([`restore`]).
    let frame = buf.split_to(total_len).freeze();
    if header.packet_type == PacketType::Publish {
        // A tail call, so the callee builds the packet in our return slot: each move of a
        // `Packet` is a memcpy, and for a small PUBLISH that costs about as much as the parsing.
        return publish::publish(buf, frame, header_len, header.flags, protocol.is_v5());
    }
    match body(header, &frame, header_len, protocol) {
        Ok(packet) => Ok(Some(packet)),
        Err(error) => {
            restore(buf, &frame);
            Err(error)
        }
    }
}

/// Puts a packet that failed to decode back in front of `buf`, so an error leaves `buf` as it
/// was (an error ends the connection, so the copy's cost does not matter).
#[cold]
pub(crate) fn restore(buf: &mut BytesMut, frame: &Bytes) {
    let mut restored = BytesMut::with_capacity(frame.len() + buf.len());
    restored.extend_from_slice(frame);
    restored.extend_from_slice(buf);
    *buf = restored;
}

/// Checks the first byte: packet type and the reserved flag bits ([MQTT-2.1.3-1]).
#[inline]
fn fixed_header(first: u8, protocol: Protocol) -> Result<FixedHeader, DecodeError> {
    let type_bits = first >> 4;
    let flags = first & 0x0F;
    let packet_type = match packet_type_from_u8(type_bits) {
        Some(PacketType::Auth) if !protocol.is_v5() => {
            return Err(DecodeError::InvalidPacketType(type_bits));
        }
        Some(packet_type) => packet_type,
        None => return Err(DecodeError::InvalidPacketType(type_bits)),
    };
    let expected = match packet_type {
        PacketType::Publish => {
            // QoS 3 is malformed ([MQTT-3.3.1-4]); DUP on QoS 0 too ([MQTT-3.3.1-2]).
            let qos_bits = (flags >> 1) & 0b11;
            if qos_bits == 3 {
                return Err(DecodeError::InvalidQoS);
            }
            if qos_bits == 0 && flags & 0b1000 != 0 {
                return Err(DecodeError::DupOnQoS0);
            }
            flags
        }
        // [MQTT-3.6.1-1], [MQTT-3.8.1-1], [MQTT-3.10.1-1]
        PacketType::PubRel | PacketType::Subscribe | PacketType::Unsubscribe => 0b0010,
        _ => 0,
    };
    if flags != expected {
        return Err(DecodeError::InvalidFixedHeaderFlags { packet_type, flags });
    }
    Ok(FixedHeader { packet_type, flags })
}

/// Decodes the body of every packet but PUBLISH.
fn body(
    header: FixedHeader,
    frame: &Bytes,
    header_len: usize,
    protocol: Protocol,
) -> Result<Packet, DecodeError> {
    let v5 = protocol.is_v5();
    let mut reader = Reader::new(frame, header_len);
    let packet = match header.packet_type {
        PacketType::Connect => Packet::Connect(Box::new(connect::connect(&mut reader)?)),
        PacketType::ConnAck => Packet::ConnAck(connect::connack(&mut reader, v5)?),
        // Dispatched to `publish::publish` by `decode` before we get here.
        PacketType::Publish => return Err(DecodeError::InvalidPacketType(3)),
        PacketType::PubAck => Packet::PubAck(ack::ack(&mut reader, PacketType::PubAck, v5)?),
        PacketType::PubRec => Packet::PubRec(ack::ack(&mut reader, PacketType::PubRec, v5)?),
        PacketType::PubRel => Packet::PubRel(ack::ack(&mut reader, PacketType::PubRel, v5)?),
        PacketType::PubComp => Packet::PubComp(ack::ack(&mut reader, PacketType::PubComp, v5)?),
        PacketType::Subscribe => Packet::Subscribe(subscribe::subscribe(&mut reader, v5)?),
        PacketType::SubAck => Packet::SubAck(subscribe::suback(&mut reader, v5)?),
        PacketType::Unsubscribe => Packet::Unsubscribe(subscribe::unsubscribe(&mut reader, v5)?),
        PacketType::UnsubAck => Packet::UnsubAck(subscribe::unsuback(&mut reader, v5)?),
        PacketType::PingReq => {
            reader.finish()?;
            Packet::PingReq
        }
        PacketType::PingResp => {
            reader.finish()?;
            Packet::PingResp
        }
        PacketType::Disconnect => Packet::Disconnect(control::disconnect(&mut reader, v5)?),
        PacketType::Auth => Packet::Auth(control::auth(&mut reader)?),
    };
    Ok(packet)
}

/// Reads a non-zero packet identifier ([MQTT-2.2.1-3]).
#[inline]
pub(crate) fn packet_id(reader: &mut Reader<'_>) -> Result<u16, DecodeError> {
    match reader.u16()? {
        0 => Err(DecodeError::PacketIdZero),
        id => Ok(id),
    }
}
