//! PUBACK, PUBREC, PUBREL, PUBCOMP, DISCONNECT and AUTH: a packet identifier (acks only) and
//! an optional "reason code, then properties" tail.

use bytes::{BufMut, BytesMut};

use crate::encode::properties::{self, Scope};
use crate::encode::{Plan, first_byte};
use crate::error::EncodeError;
use crate::packet::{Ack, Auth, Disconnect, PacketType};
use crate::properties::PropertyValues;
use crate::property_table::Place;
use crate::reason::ReasonCode;

/// How much of the optional tail is written.
fn tail_len(
    reason: ReasonCode,
    props: &PropertyValues,
    place: Place,
) -> Result<(usize, usize), EncodeError> {
    let props_len = properties::content_len(props, place, Scope::All)?;
    let len = if props_len > 0 {
        1 + properties::block_len(props_len)
    } else if reason != ReasonCode::SUCCESS {
        1
    } else {
        0
    };
    Ok((len, props_len))
}

pub(crate) fn plan(ack: &Ack, packet_type: PacketType, v5: bool) -> Result<Plan, EncodeError> {
    if ack.packet_id == 0 {
        return Err(EncodeError::PacketIdZero);
    }
    let (tail, props_len) = if v5 {
        tail_len(ack.reason, &ack.properties, Place::packet(packet_type))?
    } else {
        (0, 0)
    };
    Ok(Plan {
        first_byte: first_byte(packet_type),
        body_len: 2 + tail,
        props_len,
        will_props_len: 0,
    })
}

pub(crate) fn write(ack: &Ack, v5: bool, plan: &Plan, out: &mut BytesMut) {
    out.put_u16(ack.packet_id);
    if v5 {
        write_reason_tail(ack.reason, &ack.properties, plan, out);
    }
}

pub(crate) fn plan_disconnect(disconnect: &Disconnect, v5: bool) -> Result<Plan, EncodeError> {
    let (tail, props_len) = if v5 {
        tail_len(
            disconnect.reason,
            &disconnect.properties,
            Place::packet(PacketType::Disconnect),
        )?
    } else {
        (0, 0)
    };
    Ok(Plan {
        first_byte: first_byte(PacketType::Disconnect),
        body_len: tail,
        props_len,
        will_props_len: 0,
    })
}

pub(crate) fn plan_auth(auth: &Auth) -> Result<Plan, EncodeError> {
    let (tail, props_len) = tail_len(
        auth.reason,
        &auth.properties,
        Place::packet(PacketType::Auth),
    )?;
    Ok(Plan {
        first_byte: first_byte(PacketType::Auth),
        body_len: tail,
        props_len,
        will_props_len: 0,
    })
}

/// Writes whatever part of the tail the plan counted (nothing, the reason code, or both).
pub(crate) fn write_reason_tail(
    reason: ReasonCode,
    props: &PropertyValues,
    plan: &Plan,
    out: &mut BytesMut,
) {
    if plan.props_len > 0 {
        out.put_u8(reason.0);
        properties::write(props, plan.props_len, Scope::All, out);
    } else if reason != ReasonCode::SUCCESS {
        out.put_u8(reason.0);
    }
}
