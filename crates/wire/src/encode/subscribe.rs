//! SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK (sections 3.8–3.11).

use bytes::{BufMut, BytesMut};

use crate::encode::fields::{put_str, str_len};
use crate::encode::properties::{self, Scope};
use crate::encode::{Plan, first_byte};
use crate::error::EncodeError;
use crate::packet::{PacketType, SubAck, Subscribe, SubscriptionOptions, UnsubAck, Unsubscribe};
use crate::properties::PropertyValues;
use crate::property_table::{self as id, Place};
use crate::reason::ReasonCode;

/// Packet identifier plus (5.0) the property block; returns `(body_len, props_len)`.
fn head(
    packet_id: u16,
    props: &PropertyValues,
    packet_type: PacketType,
    v5: bool,
) -> Result<(usize, usize), EncodeError> {
    if packet_id == 0 {
        return Err(EncodeError::PacketIdZero);
    }
    if !v5 {
        return Ok((2, 0));
    }
    let props_len = properties::content_len(props, Place::packet(packet_type), Scope::All)?;
    Ok((2 + properties::block_len(props_len), props_len))
}

fn write_head(packet_id: u16, props: &PropertyValues, v5: bool, plan: &Plan, out: &mut BytesMut) {
    out.put_u16(packet_id);
    if v5 {
        properties::write(props, plan.props_len, Scope::All, out);
    }
}

fn options_byte(options: &SubscriptionOptions, v5: bool) -> u8 {
    let mut byte = options.qos as u8;
    if v5 {
        byte |= u8::from(options.no_local) << 2;
        byte |= u8::from(options.retain_as_published) << 3;
        byte |= (options.retain_handling as u8) << 4;
    }
    byte
}

pub(crate) fn plan_subscribe(subscribe: &Subscribe, v5: bool) -> Result<Plan, EncodeError> {
    if subscribe.filters.is_empty() {
        return Err(EncodeError::NoTopicFilters);
    }
    if subscribe.properties.subscription_identifiers.len() > 1 {
        // At most one in SUBSCRIBE (3.8.2.1.2).
        return Err(EncodeError::InvalidPropertyValue(
            id::SUBSCRIPTION_IDENTIFIER,
        ));
    }
    let (mut body_len, props_len) = head(
        subscribe.packet_id,
        &subscribe.properties,
        PacketType::Subscribe,
        v5,
    )?;
    for (filter, _) in &subscribe.filters {
        body_len += str_len(filter)? + 1;
    }
    Ok(Plan {
        first_byte: first_byte(PacketType::Subscribe),
        body_len,
        props_len,
        will_props_len: 0,
    })
}

pub(crate) fn write_subscribe(subscribe: &Subscribe, v5: bool, plan: &Plan, out: &mut BytesMut) {
    write_head(subscribe.packet_id, &subscribe.properties, v5, plan, out);
    for (filter, options) in &subscribe.filters {
        put_str(out, filter);
        out.put_u8(options_byte(options, v5));
    }
}

pub(crate) fn plan_suback(suback: &SubAck, v5: bool) -> Result<Plan, EncodeError> {
    let (body_len, props_len) = head(suback.packet_id, &suback.properties, PacketType::SubAck, v5)?;
    Ok(Plan {
        first_byte: first_byte(PacketType::SubAck),
        body_len: body_len + suback.reasons.len(),
        props_len,
        will_props_len: 0,
    })
}

/// 3.1.1 SUBACK return codes: granted QoS 0–2, or 0x80 for any failure (3.9.3).
fn suback_v3_code(reason: ReasonCode) -> u8 {
    if reason.0 <= 2 { reason.0 } else { 0x80 }
}

pub(crate) fn write_suback(suback: &SubAck, v5: bool, plan: &Plan, out: &mut BytesMut) {
    write_head(suback.packet_id, &suback.properties, v5, plan, out);
    for &reason in &suback.reasons {
        out.put_u8(if v5 { reason.0 } else { suback_v3_code(reason) });
    }
}

pub(crate) fn plan_unsubscribe(unsubscribe: &Unsubscribe, v5: bool) -> Result<Plan, EncodeError> {
    if unsubscribe.filters.is_empty() {
        return Err(EncodeError::NoTopicFilters);
    }
    let (mut body_len, props_len) = head(
        unsubscribe.packet_id,
        &unsubscribe.properties,
        PacketType::Unsubscribe,
        v5,
    )?;
    for filter in &unsubscribe.filters {
        body_len += str_len(filter)?;
    }
    Ok(Plan {
        first_byte: first_byte(PacketType::Unsubscribe),
        body_len,
        props_len,
        will_props_len: 0,
    })
}

pub(crate) fn write_unsubscribe(
    unsubscribe: &Unsubscribe,
    v5: bool,
    plan: &Plan,
    out: &mut BytesMut,
) {
    write_head(
        unsubscribe.packet_id,
        &unsubscribe.properties,
        v5,
        plan,
        out,
    );
    for filter in &unsubscribe.filters {
        put_str(out, filter);
    }
}

pub(crate) fn plan_unsuback(unsuback: &UnsubAck, v5: bool) -> Result<Plan, EncodeError> {
    let (body_len, props_len) = head(
        unsuback.packet_id,
        &unsuback.properties,
        PacketType::UnsubAck,
        v5,
    )?;
    // 3.1.1 UNSUBACK has no payload.
    let reasons_len = if v5 { unsuback.reasons.len() } else { 0 };
    Ok(Plan {
        first_byte: first_byte(PacketType::UnsubAck),
        body_len: body_len + reasons_len,
        props_len,
        will_props_len: 0,
    })
}

pub(crate) fn write_unsuback(unsuback: &UnsubAck, v5: bool, plan: &Plan, out: &mut BytesMut) {
    write_head(unsuback.packet_id, &unsuback.properties, v5, plan, out);
    if v5 {
        for &reason in &unsuback.reasons {
            out.put_u8(reason.0);
        }
    }
}
