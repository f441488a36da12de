//! Every MQTT 5.0 property in every packet that can carry properties: accepted exactly where
//! the spec's table (section 2.2.2.2) allows it, a protocol error (0x82) elsewhere. Every
//! undefined identifier is malformed (0x81).

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

fn with_len(first_byte: u8, body: Vec<u8>) -> Vec<u8> {
    assert!(body.len() < 128);
    let mut out = vec![first_byte, body.len() as u8];
    out.extend(body);
    out
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Place {
    Connect,
    Will,
    ConnAck,
    Publish,
    PubAck,
    PubRec,
    PubRel,
    PubComp,
    Subscribe,
    SubAck,
    Unsubscribe,
    UnsubAck,
    Disconnect,
    Auth,
}

const PLACES: [Place; 14] = [
    Place::Connect,
    Place::Will,
    Place::ConnAck,
    Place::Publish,
    Place::PubAck,
    Place::PubRec,
    Place::PubRel,
    Place::PubComp,
    Place::Subscribe,
    Place::SubAck,
    Place::Unsubscribe,
    Place::UnsubAck,
    Place::Disconnect,
    Place::Auth,
];

/// A packet of `place` whose (only) property block is `block` (length prefix included).
fn packet_with(place: Place, block: &[u8]) -> Vec<u8> {
    let cat = |parts: &[&[u8]]| parts.concat();
    let b = block;
    match place {
        Place::Connect => with_len(
            0x10,
            cat(&[&hex("00044d515454 05 02 003c"), b, &hex("0000")]),
        ),
        Place::Will => with_len(
            0x10,
            cat(&[
                &hex("00044d515454 05 06 003c 00 0000"),
                b,
                &hex("000174 0000"),
            ]),
        ),
        Place::ConnAck => with_len(0x20, cat(&[&hex("0000"), b])),
        Place::Publish => with_len(0x30, cat(&[&hex("000174"), b])),
        Place::PubAck => with_len(0x40, cat(&[&hex("0001 00"), b])),
        Place::PubRec => with_len(0x50, cat(&[&hex("0001 00"), b])),
        Place::PubRel => with_len(0x62, cat(&[&hex("0001 00"), b])),
        Place::PubComp => with_len(0x70, cat(&[&hex("0001 00"), b])),
        Place::Subscribe => with_len(0x82, cat(&[&hex("0001"), b, &hex("000161 00")])),
        Place::SubAck => with_len(0x90, cat(&[&hex("0001"), b, &hex("00")])),
        Place::Unsubscribe => with_len(0xA2, cat(&[&hex("0001"), b, &hex("000161")])),
        Place::UnsubAck => with_len(0xB0, cat(&[&hex("0001"), b, &hex("00")])),
        Place::Disconnect => with_len(0xE0, cat(&[&hex("00"), b])),
        Place::Auth => with_len(0xF0, cat(&[&hex("00"), b])),
    }
}

/// The spec's table, written out independently of the crate's.
fn spec_allows(id: u8, place: Place) -> bool {
    use Place::*;
    match id {
        0x01 | 0x02 | 0x03 | 0x08 | 0x09 => matches!(place, Publish | Will),
        0x0B => matches!(place, Publish | Subscribe),
        0x11 => matches!(place, Connect | ConnAck | Disconnect),
        0x12 | 0x13 | 0x1A | 0x24 | 0x25 | 0x28 | 0x29 | 0x2A => place == ConnAck,
        0x15 | 0x16 => matches!(place, Connect | ConnAck | Auth),
        0x17 | 0x19 => place == Connect,
        0x18 => place == Will,
        0x1C => matches!(place, ConnAck | Disconnect),
        0x1F => matches!(
            place,
            ConnAck | PubAck | PubRec | PubRel | PubComp | SubAck | UnsubAck | Disconnect | Auth
        ),
        0x21 | 0x22 | 0x27 => matches!(place, Connect | ConnAck),
        0x23 => place == Publish,
        0x26 => true,
        _ => false,
    }
}

/// A valid value for each property (identifier included). Authentication data is followed
/// by a method, which is allowed wherever the data is, because data alone is an error.
fn sample(id: u8) -> Vec<u8> {
    let value = match id {
        0x01 | 0x17 | 0x19 | 0x24 | 0x25 | 0x28 | 0x29 | 0x2A => "01",
        0x02 | 0x11 | 0x18 | 0x27 => "0000000a",
        0x03 | 0x08 | 0x12 | 0x15 | 0x1A | 0x1C | 0x1F => "000161",
        0x09 => "00020102",
        0x0B => "05",
        0x13 | 0x21 | 0x22 | 0x23 => "000a",
        0x16 => "000101 15 000161",
        0x26 => "000161 000162",
        _ => unreachable!(),
    };
    let mut out = vec![id];
    out.extend(hex(value));
    out
}

const DEFINED: [u8; 27] = [
    0x01, 0x02, 0x03, 0x08, 0x09, 0x0B, 0x11, 0x12, 0x13, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1A, 0x1C,
    0x1F, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x28, 0x29, 0x2A,
];

#[test]
fn each_property_is_accepted_exactly_where_the_spec_allows_it() {
    for id in DEFINED {
        let property = sample(id);
        let mut block = vec![property.len() as u8];
        block.extend(&property);
        for place in PLACES {
            let bytes = packet_with(place, &block);
            let mut buf = BytesMut::from(&bytes[..]);
            let result = decode(&mut buf, Protocol::V5, MAX);
            if spec_allows(id, place) {
                let packet = result
                    .unwrap_or_else(|e| panic!("{id:#04x} in {place:?}: {e}"))
                    .unwrap();
                // And the encoder writes it back.
                let mut out = BytesMut::new();
                encode(&packet, Protocol::V5, &mut out).unwrap();
                assert_eq!(decode(&mut out, Protocol::V5, MAX).unwrap(), Some(packet));
            } else {
                let error = result.expect_err("must be refused");
                assert!(
                    matches!(error, DecodeError::PropertyNotAllowed { id: found, .. } if found == id),
                    "{id:#04x} in {place:?}: {error:?}"
                );
                assert_eq!(error.reason_code(), ReasonCode::PROTOCOL_ERROR);
            }
        }
    }
}

#[test]
fn the_encoder_refuses_properties_the_packet_cannot_carry() {
    let props: Properties = PropertyValues {
        topic_alias: Some(3),
        ..PropertyValues::default()
    }
    .into();
    let ack = Packet::PubAck(Ack {
        packet_id: 1,
        reason: ReasonCode::SUCCESS,
        properties: props,
    });
    let mut out = BytesMut::new();
    assert_eq!(
        encode(&ack, Protocol::V5, &mut out),
        Err(EncodeError::PropertyNotAllowed {
            id: 0x23,
            packet: PacketType::PubAck
        })
    );
    assert!(out.is_empty());
}

#[test]
fn undefined_identifiers_are_malformed() {
    for id in 0u8..0x80 {
        if DEFINED.contains(&id) {
            continue;
        }
        let bytes = packet_with(Place::Publish, &[2, id, 0]);
        let mut buf = BytesMut::from(&bytes[..]);
        let error = decode(&mut buf, Protocol::V5, MAX).expect_err("undefined");
        assert_eq!(
            error,
            DecodeError::UnknownProperty(u32::from(id)),
            "{id:#04x}"
        );
        assert_eq!(error.reason_code(), ReasonCode::MALFORMED_PACKET);
    }
}
