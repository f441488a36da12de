//! PUBLISH (section 3.3).

use bytes::{BufMut, BytesMut};

use crate::encode::fields::{put_str, str_len};
use crate::encode::properties::{self, Scope};
use crate::encode::{Plan, first_byte};
use crate::error::EncodeError;
use crate::packet::{PacketType, Publish, QoS};
use crate::property_table::Place;

/// First byte of a PUBLISH. DUP is only ever set for QoS 1 and 2 ([MQTT-3.3.1-2]).
#[inline]
pub(crate) fn publish_first_byte(qos: QoS, dup: bool, retain: bool) -> u8 {
    let dup = dup && qos != QoS::AtMostOnce;
    first_byte(PacketType::Publish) | (u8::from(dup) << 3) | ((qos as u8) << 1) | u8::from(retain)
}

pub(crate) fn plan(publish: &Publish, v5: bool) -> Result<Plan, EncodeError> {
    if publish.topic.is_empty() && !(v5 && publish.properties.topic_alias.is_some()) {
        return Err(EncodeError::EmptyTopicName);
    }
    let mut body_len = str_len(&publish.topic)? + publish.payload.len();
    if publish.qos != QoS::AtMostOnce {
        if publish.packet_id == 0 {
            return Err(EncodeError::PacketIdZero);
        }
        body_len += 2;
    }
    let mut props_len = 0;
    if v5 {
        props_len = properties::content_len(
            &publish.properties,
            Place::packet(PacketType::Publish),
            Scope::All,
        )?;
        body_len += properties::block_len(props_len);
    }
    Ok(Plan {
        first_byte: publish_first_byte(publish.qos, publish.dup, publish.retain),
        body_len,
        props_len,
        will_props_len: 0,
    })
}

pub(crate) fn write(publish: &Publish, v5: bool, plan: &Plan, out: &mut BytesMut) {
    put_str(out, &publish.topic);
    if publish.qos != QoS::AtMostOnce {
        out.put_u16(publish.packet_id);
    }
    if v5 {
        properties::write(&publish.properties, plan.props_len, Scope::All, out);
    }
    out.put_slice(&publish.payload);
}
