//! CONNECT and CONNACK (sections 3.1, 3.2).

use bytes::{BufMut, BytesMut};

use crate::encode::fields::{binary_len, put_binary, put_str, str_len};
use crate::encode::properties::{self, Scope};
use crate::encode::{Plan, first_byte};
use crate::error::EncodeError;
use crate::packet::{ConnAck, Connect, PacketType, Protocol};
use crate::property_table::{Place, WILL};
use crate::reason::connack_v3_code;

fn protocol_name(protocol: Protocol) -> &'static [u8] {
    match protocol {
        Protocol::V3_1 => b"MQIsdp",
        Protocol::V3_1_1 | Protocol::V5 => b"MQTT",
    }
}

pub(crate) fn plan_connect(connect: &Connect) -> Result<Plan, EncodeError> {
    let v5 = connect.protocol.is_v5();
    // Protocol name, level, flags, keep alive.
    let mut body_len = 2 + protocol_name(connect.protocol).len() + 1 + 1 + 2;
    let mut props_len = 0;
    let mut will_props_len = 0;
    if v5 {
        props_len = properties::content_len(
            &connect.properties,
            Place::packet(PacketType::Connect),
            Scope::All,
        )?;
        body_len += properties::block_len(props_len);
    }
    body_len += str_len(&connect.client_id)?;
    if let Some(will) = &connect.will {
        if will.topic.is_empty() {
            return Err(EncodeError::EmptyTopicName);
        }
        if v5 {
            will_props_len = properties::content_len(&will.properties, WILL, Scope::All)?;
            body_len += properties::block_len(will_props_len);
        }
        body_len += str_len(&will.topic)? + binary_len(&will.payload)?;
    }
    if let Some(username) = &connect.username {
        body_len += str_len(username)?;
    }
    if let Some(password) = &connect.password {
        body_len += binary_len(password)?;
    }
    Ok(Plan {
        first_byte: first_byte(PacketType::Connect),
        body_len,
        props_len,
        will_props_len,
    })
}

pub(crate) fn write_connect(connect: &Connect, plan: &Plan, out: &mut BytesMut) {
    let v5 = connect.protocol.is_v5();
    put_binary(out, protocol_name(connect.protocol));
    out.put_u8(connect.protocol.level());
    let mut flags = 0u8;
    if connect.clean_start {
        flags |= 0b0000_0010;
    }
    if let Some(will) = &connect.will {
        flags |= 0b0000_0100 | ((will.qos as u8) << 3);
        if will.retain {
            flags |= 0b0010_0000;
        }
    }
    if connect.password.is_some() {
        flags |= 0b0100_0000;
    }
    if connect.username.is_some() {
        flags |= 0b1000_0000;
    }
    out.put_u8(flags);
    out.put_u16(connect.keep_alive_s);
    if v5 {
        properties::write(&connect.properties, plan.props_len, Scope::All, out);
    }
    put_str(out, &connect.client_id);
    if let Some(will) = &connect.will {
        if v5 {
            properties::write(&will.properties, plan.will_props_len, Scope::All, out);
        }
        put_str(out, &will.topic);
        put_binary(out, &will.payload);
    }
    if let Some(username) = &connect.username {
        put_str(out, username);
    }
    if let Some(password) = &connect.password {
        put_binary(out, password);
    }
}

pub(crate) fn plan_connack(connack: &ConnAck, v5: bool) -> Result<Plan, EncodeError> {
    let mut body_len = 2;
    let mut props_len = 0;
    if v5 {
        props_len = properties::content_len(
            &connack.properties,
            Place::packet(PacketType::ConnAck),
            Scope::All,
        )?;
        body_len += properties::block_len(props_len);
    }
    Ok(Plan {
        first_byte: first_byte(PacketType::ConnAck),
        body_len,
        props_len,
        will_props_len: 0,
    })
}

pub(crate) fn write_connack(connack: &ConnAck, v5: bool, plan: &Plan, out: &mut BytesMut) {
    out.put_u8(u8::from(connack.session_present));
    if v5 {
        out.put_u8(connack.reason.0);
        properties::write(&connack.properties, plan.props_len, Scope::All, out);
    } else {
        out.put_u8(connack_v3_code(connack.reason));
    }
}
