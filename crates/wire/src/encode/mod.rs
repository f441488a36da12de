//! Encoding packets into a `BytesMut`.
//!
//! Every packet is encoded in two steps: a [`Plan`] computes the body size and the property
//! block sizes (validating field lengths and which properties the packet may carry), then the
//! writer reserves the exact size once and writes straight into the buffer.
//!
//! # Invariants
//! - Nothing is written unless the plan succeeded, so an error leaves `out` untouched.
//! - Short forms are used where the spec allows them (5.0 acks and DISCONNECT without reason
//!   code and properties when the reason is success and there are no properties), as
//!   mosquitto does.
//! - 3.x packets never carry properties; 5.0-only fields (properties, reasons) are dropped.

mod ack;
mod connect;
pub(crate) mod fields;
pub(crate) mod properties;
pub(crate) mod publish;
mod subscribe;

use bytes::{BufMut, BytesMut};

use crate::error::EncodeError;
use crate::packet::{Packet, PacketType, Protocol};
use crate::varint::{self, VARINT_MAX};

/// Sizes computed before writing.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Plan {
    pub(crate) first_byte: u8,
    pub(crate) body_len: usize,
    /// Content length of the packet's property block (5.0 only).
    pub(crate) props_len: usize,
    /// Content length of the will property block (5.0 CONNECT with a will only).
    pub(crate) will_props_len: usize,
}

impl Plan {
    pub(crate) fn total_len(&self) -> usize {
        1 + varint::len(self.body_len as u32) + self.body_len
    }
}

/// Size of `packet` on the wire, fixed header included.
pub fn encoded_len(packet: &Packet, protocol: Protocol) -> Result<usize, EncodeError> {
    Ok(plan(packet, protocol)?.total_len())
}

/// Appends `packet` to `out`. CONNECT is encoded in its own `Connect::protocol`.
pub fn encode(packet: &Packet, protocol: Protocol, out: &mut BytesMut) -> Result<(), EncodeError> {
    let plan = plan(packet, protocol)?;
    out.reserve(plan.total_len());
    out.put_u8(plan.first_byte);
    varint::write(plan.body_len as u32, out);
    let v5 = protocol.is_v5();
    match packet {
        Packet::Connect(connect) => connect::write_connect(connect, &plan, out),
        Packet::ConnAck(connack) => connect::write_connack(connack, v5, &plan, out),
        Packet::Publish(publish) => publish::write(publish, v5, &plan, out),
        Packet::PubAck(ack) | Packet::PubRec(ack) | Packet::PubRel(ack) | Packet::PubComp(ack) => {
            ack::write(ack, v5, &plan, out)
        }
        Packet::Subscribe(subscribe) => subscribe::write_subscribe(subscribe, v5, &plan, out),
        Packet::SubAck(suback) => subscribe::write_suback(suback, v5, &plan, out),
        Packet::Unsubscribe(unsubscribe) => {
            subscribe::write_unsubscribe(unsubscribe, v5, &plan, out)
        }
        Packet::UnsubAck(unsuback) => subscribe::write_unsuback(unsuback, v5, &plan, out),
        Packet::PingReq | Packet::PingResp => {}
        Packet::Disconnect(disconnect) => {
            if v5 {
                ack::write_reason_tail(disconnect.reason, &disconnect.properties, &plan, out)
            }
        }
        Packet::Auth(auth) => ack::write_reason_tail(auth.reason, &auth.properties, &plan, out),
    }
    Ok(())
}

fn plan(packet: &Packet, protocol: Protocol) -> Result<Plan, EncodeError> {
    let v5 = protocol.is_v5();
    let plan = match packet {
        Packet::Connect(connect) => connect::plan_connect(connect)?,
        Packet::ConnAck(connack) => connect::plan_connack(connack, v5)?,
        Packet::Publish(publish) => publish::plan(publish, v5)?,
        Packet::PubAck(ack) => ack::plan(ack, PacketType::PubAck, v5)?,
        Packet::PubRec(ack) => ack::plan(ack, PacketType::PubRec, v5)?,
        Packet::PubRel(ack) => ack::plan(ack, PacketType::PubRel, v5)?,
        Packet::PubComp(ack) => ack::plan(ack, PacketType::PubComp, v5)?,
        Packet::Subscribe(subscribe) => subscribe::plan_subscribe(subscribe, v5)?,
        Packet::SubAck(suback) => subscribe::plan_suback(suback, v5)?,
        Packet::Unsubscribe(unsubscribe) => subscribe::plan_unsubscribe(unsubscribe, v5)?,
        Packet::UnsubAck(unsuback) => subscribe::plan_unsuback(unsuback, v5)?,
        Packet::PingReq => Plan {
            first_byte: 0xC0,
            ..Plan::default()
        },
        Packet::PingResp => Plan {
            first_byte: 0xD0,
            ..Plan::default()
        },
        Packet::Disconnect(disconnect) => ack::plan_disconnect(disconnect, v5)?,
        Packet::Auth(auth) => {
            if !v5 {
                return Err(EncodeError::NotInProtocol(PacketType::Auth));
            }
            ack::plan_auth(auth)?
        }
    };
    if plan.body_len > VARINT_MAX as usize {
        return Err(EncodeError::PacketTooLarge(plan.body_len));
    }
    Ok(plan)
}

/// The first byte of the fixed header for a packet type with its fixed flags.
pub(crate) fn first_byte(packet_type: PacketType) -> u8 {
    let flags = match packet_type {
        PacketType::PubRel | PacketType::Subscribe | PacketType::Unsubscribe => 0b0010,
        _ => 0,
    };
    (packet_type as u8) << 4 | flags
}
