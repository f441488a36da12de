//! A table of malformed and forbidden inputs, each with the error (and so the reason code) it
//! must give. Conformance statements are named where the spec numbers them.

use bytes::BytesMut;
use tern_wire::*;

const MAX: u32 = 1 << 20;

fn hex(text: &str) -> Vec<u8> {
    let clean: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    (0..clean.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&clean[i..i + 2], 16).unwrap())
        .collect()
}

/// A packet with a correct remaining length around `body`.
fn packet(first_byte: u8, body: &str) -> Vec<u8> {
    let body = hex(body);
    let mut out = vec![first_byte];
    let mut len = body.len();
    loop {
        let byte = (len % 128) as u8;
        len /= 128;
        if len == 0 {
            out.push(byte);
            break;
        }
        out.push(byte | 0x80);
    }
    out.extend_from_slice(&body);
    out
}

/// CONNECT body for `MQTT` level `level` with `flags` and keep alive 60, then `rest`.
fn connect(level: u8, flags: u8, rest: &str) -> Vec<u8> {
    packet(
        0x10,
        &format!("00044d515454{level:02x}{flags:02x}003c{rest}"),
    )
}

use DecodeError as E;
use Protocol::{V3_1_1 as V4, V5};

struct Case {
    name: &'static str,
    protocol: Protocol,
    bytes: Vec<u8>,
    error: DecodeError,
    reason: u8,
}

fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    let mut add = |name, protocol, bytes, error, reason| {
        cases.push(Case {
            name,
            protocol,
            bytes,
            error,
            reason,
        })
    };
    let flags = |packet_type, flags| E::InvalidFixedHeaderFlags { packet_type, flags };

    // Fixed header.
    add(
        "MQTT-2.1.3-1 PUBACK flags",
        V4,
        hex("41020001"),
        flags(PacketType::PubAck, 1),
        0x81,
    );
    add(
        "MQTT-2.1.3-1 PINGREQ flags",
        V5,
        hex("c800"),
        flags(PacketType::PingReq, 8),
        0x81,
    );
    add(
        "MQTT-2.1.3-1 CONNECT flags",
        V5,
        hex("1100"),
        flags(PacketType::Connect, 1),
        0x81,
    );
    add(
        "MQTT-3.6.1-1 PUBREL flags 0",
        V4,
        hex("60020001"),
        flags(PacketType::PubRel, 0),
        0x81,
    );
    add(
        "MQTT-3.8.1-1 SUBSCRIBE flags 0",
        V4,
        packet(0x80, "00010003612f6200"),
        flags(PacketType::Subscribe, 0),
        0x81,
    );
    add(
        "MQTT-3.10.1-1 UNSUBSCRIBE flags 0",
        V5,
        packet(0xA0, "0001000003612f62"),
        flags(PacketType::Unsubscribe, 0),
        0x81,
    );
    add(
        "packet type 0",
        V4,
        hex("0000"),
        E::InvalidPacketType(0),
        0x81,
    );
    add(
        "AUTH on a 3.1.1 connection",
        V4,
        hex("f000"),
        E::InvalidPacketType(15),
        0x81,
    );
    add(
        "remaining length of five bytes",
        V4,
        hex("30ffffffff7f"),
        E::MalformedRemainingLength,
        0x81,
    );
    add(
        "packet larger than the maximum",
        V5,
        packet(0x30, "0003612f62 00 68656c6c6f"),
        E::PacketTooLarge {
            size_bytes: 13,
            max_bytes: 12,
        },
        0x95,
    );

    // PUBLISH.
    add(
        "MQTT-3.3.1-4 QoS 3",
        V4,
        packet(0x36, "0003612f620001"),
        E::InvalidQoS,
        0x81,
    );
    add(
        "MQTT-3.3.1-2 DUP on QoS 0",
        V4,
        packet(0x38, "0003612f62"),
        E::DupOnQoS0,
        0x81,
    );
    add(
        "MQTT-2.2.1-3 PUBLISH QoS 1 packet id 0",
        V4,
        packet(0x32, "0003612f620000"),
        E::PacketIdZero,
        0x82,
    );
    add(
        "topic length past the end",
        V4,
        packet(0x30, "0009612f62"),
        E::Truncated,
        0x81,
    );
    add(
        "MQTT-1.5.4-1 ill-formed UTF-8",
        V4,
        packet(0x30, "000361ff62"),
        E::InvalidUtf8,
        0x81,
    );
    add(
        "MQTT-1.5.4-1 UTF-16 surrogate",
        V5,
        packet(0x30, "0003eda08000"),
        E::InvalidUtf8,
        0x81,
    );
    add(
        "MQTT-1.5.4-2 U+0000 in topic",
        V4,
        packet(0x30, "0003610062"),
        E::NullCharacter,
        0x81,
    );
    add(
        "MQTT-3.3.2-2 + in topic",
        V4,
        packet(0x30, "0003612f2b"),
        E::WildcardInTopicName,
        0x81,
    );
    add(
        "MQTT-3.3.2-2 # in topic",
        V5,
        packet(0x30, "0001 23 00"),
        E::WildcardInTopicName,
        0x81,
    );
    add(
        "MQTT-4.7.3-1 empty topic (3.1.1)",
        V4,
        packet(0x30, "0000 6869"),
        E::EmptyTopicName,
        0x82,
    );
    add(
        "empty topic without topic alias (5.0)",
        V5,
        packet(0x30, "0000 00 6869"),
        E::EmptyTopicName,
        0x82,
    );

    // Properties.
    add(
        "duplicate message expiry interval",
        V5,
        packet(0x30, "0003612f62 0a 0200000001 0200000002"),
        E::DuplicateProperty(0x02),
        0x82,
    );
    add(
        "two subscription identifiers in SUBSCRIBE",
        V5,
        packet(0x82, "0001 04 0b01 0b02 0003612f6200"),
        E::DuplicateProperty(0x0B),
        0x82,
    );
    add(
        "session expiry interval not allowed in PUBLISH",
        V5,
        packet(0x30, "0003612f62 05 1100000001"),
        E::PropertyNotAllowed {
            id: 0x11,
            packet: PacketType::Publish,
        },
        0x82,
    );
    add(
        "will delay interval not allowed in CONNECT properties",
        V5,
        connect(5, 0x02, "05 1800000001 0000"),
        E::PropertyNotAllowed {
            id: 0x18,
            packet: PacketType::Connect,
        },
        0x82,
    );
    add(
        "reason string not allowed in PUBLISH",
        V5,
        packet(0x30, "0003612f62 04 1f000178"),
        E::PropertyNotAllowed {
            id: 0x1F,
            packet: PacketType::Publish,
        },
        0x82,
    );
    add(
        "unknown property 0x07",
        V5,
        packet(0x30, "0003612f62 02 0700"),
        E::UnknownProperty(0x07),
        0x81,
    );
    add(
        "property identifier as a two-byte varint",
        V5,
        packet(0x30, "0003612f62 02 8101"),
        E::UnknownProperty(0x81),
        0x81,
    );
    add(
        "subscription identifier 0",
        V5,
        packet(0x30, "0003612f62 02 0b00"),
        E::InvalidPropertyValue(0x0B),
        0x82,
    );
    add(
        "MQTT-3.3.2-8 topic alias 0",
        V5,
        packet(0x30, "0000 03 230000"),
        E::InvalidPropertyValue(0x23),
        0x94,
    );
    add(
        "payload format indicator 2",
        V5,
        packet(0x30, "0003612f62 02 0102"),
        E::InvalidPropertyValue(0x01),
        0x82,
    );
    add(
        "receive maximum 0",
        V5,
        connect(5, 0x02, "03 210000 0000"),
        E::InvalidPropertyValue(0x21),
        0x82,
    );
    add(
        "maximum packet size 0",
        V5,
        connect(5, 0x02, "05 2700000000 0000"),
        E::InvalidPropertyValue(0x27),
        0x82,
    );
    add(
        "request problem information 2",
        V5,
        connect(5, 0x02, "02 1702 0000"),
        E::InvalidPropertyValue(0x17),
        0x82,
    );
    add(
        "request response information 2",
        V5,
        connect(5, 0x02, "02 1902 0000"),
        E::InvalidPropertyValue(0x19),
        0x82,
    );
    add(
        "authentication data without method",
        V5,
        packet(0xF0, "18 03 160000"),
        E::AuthDataWithoutMethod,
        0x82,
    );
    add(
        "property length past the end",
        V5,
        packet(0x40, "0001 00 05"),
        E::Truncated,
        0x81,
    );
    add(
        "property value past the property length",
        V5,
        packet(0x30, "0003612f62 02 0200000001"),
        E::Truncated,
        0x81,
    );

    // CONNECT.
    add(
        "MQTT-3.1.2-1 unknown protocol name",
        V4,
        packet(0x10, "00044d5154580402003c0000"),
        E::InvalidProtocolName,
        0x84,
    );
    add(
        "MQTT-3.1.2-2 unsupported level 6",
        V5,
        connect(6, 0x02, "0000"),
        E::UnsupportedProtocolVersion { level: 6 },
        0x84,
    );
    add(
        "MQTT-3.1.2-2 MQIsdp with level 4",
        V4,
        packet(0x10, "00064d5149736470 04 02 003c 0000"),
        E::UnsupportedProtocolVersion { level: 4 },
        0x84,
    );
    add(
        "MQTT-3.1.2-3 reserved flag",
        V4,
        connect(4, 0x03, "0000"),
        E::ConnectReservedFlag,
        0x81,
    );
    add(
        "MQTT-3.1.2-11 will QoS without will flag",
        V4,
        connect(4, 0x0A, "0000"),
        E::WillFlagsWithoutWill,
        0x81,
    );
    add(
        "MQTT-3.1.2-15 will retain without will flag",
        V5,
        connect(5, 0x22, "00 0000"),
        E::WillFlagsWithoutWill,
        0x81,
    );
    add(
        "MQTT-3.1.2-14 will QoS 3",
        V4,
        connect(4, 0x1E, "0000 0001 74 0000"),
        E::InvalidQoS,
        0x81,
    );
    add(
        "MQTT-3.1.2-22 password without user name (3.1.1)",
        V4,
        connect(4, 0x42, "0000 00027077"),
        E::PasswordWithoutUsername,
        0x81,
    );
    add(
        "will topic with a wildcard",
        V4,
        connect(4, 0x06, "0000 00012b 0000"),
        E::WildcardInTopicName,
        0x81,
    );
    add(
        "bytes after the password",
        V4,
        connect(4, 0xC2, "0000 000175 00027077 ff"),
        E::TrailingBytes,
        0x81,
    );
    add(
        "client identifier missing",
        V4,
        connect(4, 0x02, ""),
        E::Truncated,
        0x81,
    );

    // CONNACK.
    add(
        "CONNACK reserved flags",
        V4,
        hex("20020200"),
        E::InvalidConnAckFlags(2),
        0x81,
    );
    add(
        "MQTT-3.2.2-4 session present with a refusal",
        V4,
        hex("20020105"),
        E::InvalidConnAckFlags(1),
        0x81,
    );
    add(
        "CONNACK return code 6 (3.1.1)",
        V4,
        hex("20020006"),
        E::InvalidReasonCode {
            packet: PacketType::ConnAck,
            code: 6,
        },
        0x82,
    );

    // Acks and control packets.
    add(
        "MQTT-2.2.1-3 PUBACK packet id 0",
        V4,
        hex("40020000"),
        E::PacketIdZero,
        0x82,
    );
    add(
        "PUBACK remaining length 3 (3.1.1)",
        V4,
        hex("4003000100"),
        E::TrailingBytes,
        0x81,
    );
    add("PUBACK truncated", V5, hex("400100"), E::Truncated, 0x81);
    add(
        "PUBACK reason 0x05",
        V5,
        hex("4003000105"),
        E::InvalidReasonCode {
            packet: PacketType::PubAck,
            code: 5,
        },
        0x82,
    );
    add(
        "PUBREL reason 0x10",
        V5,
        hex("6203000110"),
        E::InvalidReasonCode {
            packet: PacketType::PubRel,
            code: 0x10,
        },
        0x82,
    );
    add(
        "PINGREQ with a body",
        V4,
        hex("c00100"),
        E::TrailingBytes,
        0x81,
    );
    add(
        "DISCONNECT with a body (3.1.1)",
        V4,
        hex("e00100"),
        E::TrailingBytes,
        0x81,
    );
    add(
        "DISCONNECT reason 0x01",
        V5,
        hex("e00101"),
        E::InvalidReasonCode {
            packet: PacketType::Disconnect,
            code: 1,
        },
        0x82,
    );
    add(
        "AUTH reason 0x80",
        V5,
        hex("f00180"),
        E::InvalidReasonCode {
            packet: PacketType::Auth,
            code: 0x80,
        },
        0x82,
    );

    // SUBSCRIBE family.
    add(
        "MQTT-3.8.3-3 SUBSCRIBE without filters (3.1.1)",
        V4,
        hex("82020001"),
        E::NoTopicFilters,
        0x82,
    );
    add(
        "MQTT-3.8.3-3 SUBSCRIBE without filters (5.0)",
        V5,
        hex("8203000100"),
        E::NoTopicFilters,
        0x82,
    );
    add(
        "MQTT-3.10.3-2 UNSUBSCRIBE without filters",
        V4,
        hex("a2020001"),
        E::NoTopicFilters,
        0x82,
    );
    add(
        "MQTT-2.2.1-3 SUBSCRIBE packet id 0",
        V4,
        packet(0x82, "00000001 6100"),
        E::PacketIdZero,
        0x82,
    );
    add(
        "MQTT-3.8.3-4 3.1.1 options with no-local bit",
        V4,
        packet(0x82, "0001 000161 04"),
        E::SubscriptionOptionsReserved,
        0x81,
    );
    add(
        "MQTT-3.8.3-5 5.0 options reserved bit 6",
        V5,
        packet(0x82, "0001 00 000161 40"),
        E::SubscriptionOptionsReserved,
        0x81,
    );
    add(
        "retain handling 3",
        V5,
        packet(0x82, "0001 00 000161 30"),
        E::InvalidRetainHandling,
        0x82,
    );
    add(
        "subscription QoS 3",
        V5,
        packet(0x82, "0001 00 000161 03"),
        E::InvalidQoS,
        0x81,
    );
    add(
        "filter without options byte",
        V4,
        packet(0x82, "0001 000161"),
        E::Truncated,
        0x81,
    );
    add(
        "SUBACK code 0x03 (3.1.1)",
        V4,
        hex("9003000103"),
        E::InvalidReasonCode {
            packet: PacketType::SubAck,
            code: 3,
        },
        0x82,
    );
    add(
        "SUBACK without codes",
        V5,
        hex("9003000100"),
        E::Truncated,
        0x81,
    );
    add(
        "UNSUBACK with codes (3.1.1)",
        V4,
        hex("b003000100"),
        E::TrailingBytes,
        0x81,
    );
    cases
}

#[test]
fn every_malformed_input_gives_its_error() {
    for case in cases() {
        let max = match case.error {
            E::PacketTooLarge { max_bytes, .. } => max_bytes,
            _ => MAX,
        };
        let mut buf = BytesMut::from(&case.bytes[..]);
        let result = decode(&mut buf, case.protocol, max);
        assert_eq!(result, Err(case.error.clone()), "{}", case.name);
        assert_eq!(
            case.error.reason_code(),
            ReasonCode(case.reason),
            "{}",
            case.name
        );
        assert_eq!(
            &buf[..],
            &case.bytes[..],
            "{}: buffer must be left as it was",
            case.name
        );
    }
}

#[test]
fn permitted_variants_are_accepted() {
    let accept = |name: &str, protocol: Protocol, bytes: Vec<u8>| {
        let mut buf = BytesMut::from(&bytes[..]);
        let packet = decode(&mut buf, protocol, MAX)
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .unwrap_or_else(|| panic!("{name}: incomplete"));
        assert!(buf.is_empty(), "{name}");
        packet
    };
    // 5.0 allows a password without a user name (3.1.2.9).
    let decoded = accept(
        "5.0 password without user name",
        V5,
        connect(5, 0x42, "00 0000 00027077"),
    );
    let Packet::Connect(connect_packet) = decoded else {
        panic!()
    };
    assert!(connect_packet.username.is_none() && connect_packet.password.is_some());
    // Short forms of 5.0 acks (3.4.2.1) and DISCONNECT (3.14.2.1).
    for bytes in [
        "40020001",
        "4003000110",
        "400400011000",
        "e000",
        "e00104",
        "e0020400",
    ] {
        accept(bytes, V5, hex(bytes));
    }
    // Non-minimal remaining length (documented choice: accepted).
    let decoded = accept("non-minimal remaining length", V4, hex("c08000"));
    assert_eq!(decoded, Packet::PingReq);
    // Empty topic with a topic alias (5.0).
    let decoded = accept(
        "empty topic with alias",
        V5,
        packet(0x30, "0000 03 230001 6869"),
    );
    let Packet::Publish(publish) = decoded else {
        panic!()
    };
    assert!(publish.topic.is_empty() && publish.properties.topic_alias == Some(1));
    // Repeated subscription identifiers and user properties in PUBLISH, order kept.
    let decoded = accept(
        "repeated identifiers",
        V5,
        packet(0x30, "000161 12 0b01 0b02 26000161000162 26000161000161"),
    );
    let Packet::Publish(publish) = decoded else {
        panic!()
    };
    assert_eq!(publish.properties.subscription_identifiers, vec![1, 2]);
    let user: Vec<(String, String)> = publish
        .properties
        .user
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert_eq!(
        user,
        vec![("a".into(), "b".into()), ("a".into(), "a".into())]
    );
    // 5.0 subscription options: no local, retain as published, retain handling 2, QoS 2.
    let decoded = accept(
        "subscription options",
        V5,
        packet(0x82, "0001 00 000161 2e"),
    );
    let Packet::Subscribe(subscribe) = decoded else {
        panic!()
    };
    assert_eq!(
        subscribe.filters[0].1,
        SubscriptionOptions {
            qos: QoS::ExactlyOnce,
            no_local: true,
            retain_as_published: true,
            retain_handling: RetainHandling::DoNotSend,
        }
    );
}

#[test]
fn need_more_bytes_leaves_the_buffer_alone() {
    for bytes in [
        &[][..],
        &[0x30],
        &[0x30, 0x80],
        &[0x30, 0x80, 0x80, 0x80],
        &[0x30, 0x05, 0x00],
    ] {
        let mut buf = BytesMut::from(bytes);
        assert_eq!(decode(&mut buf, V5, MAX), Ok(None));
        assert_eq!(&buf[..], bytes);
    }
}
