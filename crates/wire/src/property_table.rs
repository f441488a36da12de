//! Property identifiers (section 2.2.2.2) and the table of packets each one may appear in.
//!
//! # Invariants
//! - A "place" is a bit index: the packet type number (1..=15) of the fixed header, or
//!   [`WILL`] (0, unused by any packet type) for the will properties of CONNECT.

use crate::packet_type::{PacketType, packet_type_from_u8};

pub(crate) const PAYLOAD_FORMAT_INDICATOR: u8 = 0x01;
pub(crate) const MESSAGE_EXPIRY_INTERVAL: u8 = 0x02;
pub(crate) const CONTENT_TYPE: u8 = 0x03;
pub(crate) const RESPONSE_TOPIC: u8 = 0x08;
pub(crate) const CORRELATION_DATA: u8 = 0x09;
pub(crate) const SUBSCRIPTION_IDENTIFIER: u8 = 0x0B;
pub(crate) const SESSION_EXPIRY_INTERVAL: u8 = 0x11;
pub(crate) const ASSIGNED_CLIENT_IDENTIFIER: u8 = 0x12;
pub(crate) const SERVER_KEEP_ALIVE: u8 = 0x13;
pub(crate) const AUTHENTICATION_METHOD: u8 = 0x15;
pub(crate) const AUTHENTICATION_DATA: u8 = 0x16;
pub(crate) const REQUEST_PROBLEM_INFORMATION: u8 = 0x17;
pub(crate) const WILL_DELAY_INTERVAL: u8 = 0x18;
pub(crate) const REQUEST_RESPONSE_INFORMATION: u8 = 0x19;
pub(crate) const RESPONSE_INFORMATION: u8 = 0x1A;
pub(crate) const SERVER_REFERENCE: u8 = 0x1C;
pub(crate) const REASON_STRING: u8 = 0x1F;
pub(crate) const RECEIVE_MAXIMUM: u8 = 0x21;
pub(crate) const TOPIC_ALIAS_MAXIMUM: u8 = 0x22;
pub(crate) const TOPIC_ALIAS: u8 = 0x23;
pub(crate) const MAXIMUM_QOS: u8 = 0x24;
pub(crate) const RETAIN_AVAILABLE: u8 = 0x25;
pub(crate) const USER_PROPERTY: u8 = 0x26;
pub(crate) const MAXIMUM_PACKET_SIZE: u8 = 0x27;
pub(crate) const WILDCARD_SUBSCRIPTION_AVAILABLE: u8 = 0x28;
pub(crate) const SUBSCRIPTION_IDENTIFIER_AVAILABLE: u8 = 0x29;
pub(crate) const SHARED_SUBSCRIPTION_AVAILABLE: u8 = 0x2A;

/// Where a property block sits: a packet type, or the will properties of CONNECT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Place(u8);

/// The will properties inside CONNECT.
pub(crate) const WILL: Place = Place(0);

impl Place {
    pub(crate) fn packet(packet_type: PacketType) -> Place {
        Place(packet_type as u8)
    }

    /// The packet type reported in errors (CONNECT for the will).
    pub(crate) fn packet_type(self) -> PacketType {
        packet_type_from_u8(self.0).unwrap_or(PacketType::Connect)
    }

    fn bit(self) -> u16 {
        1 << self.0
    }
}

const fn bits(places: &[u8]) -> u16 {
    let mut mask = 0u16;
    let mut index = 0;
    while index < places.len() {
        mask |= 1 << places[index];
        index += 1;
    }
    mask
}

const W: u8 = 0;
const CONNECT: u8 = 1;
const CONNACK: u8 = 2;
const PUBLISH: u8 = 3;
const PUBACK: u8 = 4;
const PUBREC: u8 = 5;
const PUBREL: u8 = 6;
const PUBCOMP: u8 = 7;
const SUBSCRIBE: u8 = 8;
const SUBACK: u8 = 9;
const UNSUBSCRIBE: u8 = 10;
const UNSUBACK: u8 = 11;
const DISCONNECT: u8 = 14;
const AUTH: u8 = 15;

/// Bit mask of the places property `id` may appear in; `None` for an undefined identifier.
pub(crate) fn allowed_places(id: u8) -> Option<u16> {
    Some(match id {
        PAYLOAD_FORMAT_INDICATOR
        | MESSAGE_EXPIRY_INTERVAL
        | CONTENT_TYPE
        | RESPONSE_TOPIC
        | CORRELATION_DATA => bits(&[PUBLISH, W]),
        SUBSCRIPTION_IDENTIFIER => bits(&[PUBLISH, SUBSCRIBE]),
        SESSION_EXPIRY_INTERVAL => bits(&[CONNECT, CONNACK, DISCONNECT]),
        ASSIGNED_CLIENT_IDENTIFIER
        | SERVER_KEEP_ALIVE
        | RESPONSE_INFORMATION
        | MAXIMUM_QOS
        | RETAIN_AVAILABLE
        | WILDCARD_SUBSCRIPTION_AVAILABLE
        | SUBSCRIPTION_IDENTIFIER_AVAILABLE
        | SHARED_SUBSCRIPTION_AVAILABLE => bits(&[CONNACK]),
        AUTHENTICATION_METHOD | AUTHENTICATION_DATA => bits(&[CONNECT, CONNACK, AUTH]),
        REQUEST_PROBLEM_INFORMATION | REQUEST_RESPONSE_INFORMATION => bits(&[CONNECT]),
        WILL_DELAY_INTERVAL => bits(&[W]),
        SERVER_REFERENCE => bits(&[CONNACK, DISCONNECT]),
        REASON_STRING => bits(&[
            CONNACK, PUBACK, PUBREC, PUBREL, PUBCOMP, SUBACK, UNSUBACK, DISCONNECT, AUTH,
        ]),
        RECEIVE_MAXIMUM | TOPIC_ALIAS_MAXIMUM | MAXIMUM_PACKET_SIZE => bits(&[CONNECT, CONNACK]),
        TOPIC_ALIAS => bits(&[PUBLISH]),
        USER_PROPERTY => bits(&[
            W,
            CONNECT,
            CONNACK,
            PUBLISH,
            PUBACK,
            PUBREC,
            PUBREL,
            PUBCOMP,
            SUBSCRIBE,
            SUBACK,
            UNSUBSCRIBE,
            UNSUBACK,
            DISCONNECT,
            AUTH,
        ]),
        _ => return None,
    })
}

/// Whether property `id` may appear at `place`.
pub(crate) fn is_allowed(id: u8, place: Place) -> bool {
    allowed_places(id).is_some_and(|mask| mask & place.bit() != 0)
}
