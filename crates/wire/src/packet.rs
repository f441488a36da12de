//! The packet model shared by the decoder, the encoder, the broker and the bench tool.
//!
//! One model serves MQTT 3.1, 3.1.1 and 5.0. Fields that only exist in 5.0 (properties, reason
//! codes on acknowledgements) are left empty/default for the older versions; the encoder drops
//! them and the decoder never fills them for 3.x.
//!
//! # Invariants
//! - A [`Str`] always holds well-formed UTF-8 without U+0000 ([MQTT-1.5.4-1], [MQTT-1.5.4-2]).
//! - `Publish::packet_id` is 0 exactly when `qos` is [`QoS::AtMostOnce`].
//! - Byte fields (`Bytes`) are zero-copy slices of the buffer they were decoded from.

use bytes::Bytes;

use crate::properties::Properties;
use crate::reason::ReasonCode;
// The packet model's own vocabulary, defined below it so that errors, reason codes and
// properties can use them without importing the packets (`packet_type`, `string`).
pub use crate::packet_type::PacketType;
pub use crate::string::Str;

/// Protocol version announced in CONNECT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// MQTT 3.1: protocol name `MQIsdp`, level 3.
    V3_1,
    /// MQTT 3.1.1: protocol name `MQTT`, level 4.
    V3_1_1,
    /// MQTT 5.0: protocol name `MQTT`, level 5.
    V5,
}

impl Protocol {
    /// The protocol level byte of CONNECT.
    pub fn level(self) -> u8 {
        match self {
            Protocol::V3_1 => 3,
            Protocol::V3_1_1 => 4,
            Protocol::V5 => 5,
        }
    }

    /// Whether packets of this version carry properties and reason codes.
    pub fn is_v5(self) -> bool {
        matches!(self, Protocol::V5)
    }
}

/// Quality of service of a PUBLISH or a subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum QoS {
    #[default]
    AtMostOnce = 0,
    AtLeastOnce = 1,
    ExactlyOnce = 2,
}

impl QoS {
    /// `None` for 3 and above (3 is a malformed packet, [MQTT-3.3.1-4]).
    pub fn from_u8(value: u8) -> Option<QoS> {
        match value {
            0 => Some(QoS::AtMostOnce),
            1 => Some(QoS::AtLeastOnce),
            2 => Some(QoS::ExactlyOnce),
            _ => None,
        }
    }
}

/// Every MQTT control packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packet {
    Connect(Box<Connect>),
    ConnAck(ConnAck),
    Publish(Publish),
    PubAck(Ack),
    PubRec(Ack),
    PubRel(Ack),
    PubComp(Ack),
    Subscribe(Subscribe),
    SubAck(SubAck),
    Unsubscribe(Unsubscribe),
    UnsubAck(UnsubAck),
    PingReq,
    PingResp,
    Disconnect(Disconnect),
    /// MQTT 5.0 only.
    Auth(Auth),
}

impl Packet {
    /// The packet type, e.g. for logs and metrics.
    pub fn packet_type(&self) -> PacketType {
        match self {
            Packet::Connect(_) => PacketType::Connect,
            Packet::ConnAck(_) => PacketType::ConnAck,
            Packet::Publish(_) => PacketType::Publish,
            Packet::PubAck(_) => PacketType::PubAck,
            Packet::PubRec(_) => PacketType::PubRec,
            Packet::PubRel(_) => PacketType::PubRel,
            Packet::PubComp(_) => PacketType::PubComp,
            Packet::Subscribe(_) => PacketType::Subscribe,
            Packet::SubAck(_) => PacketType::SubAck,
            Packet::Unsubscribe(_) => PacketType::Unsubscribe,
            Packet::UnsubAck(_) => PacketType::UnsubAck,
            Packet::PingReq => PacketType::PingReq,
            Packet::PingResp => PacketType::PingResp,
            Packet::Disconnect(_) => PacketType::Disconnect,
            Packet::Auth(_) => PacketType::Auth,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connect {
    pub protocol: Protocol,
    /// "Clean session" in 3.1.1, "clean start" in 5.0.
    pub clean_start: bool,
    pub keep_alive_s: u16,
    pub properties: Properties,
    /// May be empty (the server assigns one, or rejects it, per version rules).
    pub client_id: Str,
    pub will: Option<Will>,
    pub username: Option<Str>,
    pub password: Option<Bytes>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Will {
    pub topic: Str,
    pub payload: Bytes,
    pub qos: QoS,
    pub retain: bool,
    /// Will properties (5.0): delay interval, payload format, expiry, content type, response
    /// topic, correlation data, user properties.
    pub properties: Properties,
}

/// CONNACK. `reason` holds the 5.0 reason code; for 3.x the encoder maps it to the 3.1.1 return
/// code (0x84→1, 0x85→2, 0x88/0x89→3, 0x86→4, 0x87→5) and the decoder maps back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnAck {
    pub session_present: bool,
    pub reason: ReasonCode,
    pub properties: Properties,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publish {
    pub dup: bool,
    pub qos: QoS,
    pub retain: bool,
    /// May be empty in 5.0 when a topic alias carries the topic.
    pub topic: Str,
    /// 0 exactly when `qos` is `AtMostOnce`.
    pub packet_id: u16,
    pub properties: Properties,
    pub payload: Bytes,
}

/// PUBACK, PUBREC, PUBREL and PUBCOMP. For 3.x `reason` is always `ReasonCode::SUCCESS` and
/// `properties` empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack {
    pub packet_id: u16,
    pub reason: ReasonCode,
    pub properties: Properties,
}

/// Retain handling subscription option (5.0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RetainHandling {
    /// 0: send retained messages at the time of the subscribe.
    #[default]
    SendAtSubscribe = 0,
    /// 1: send retained messages only if the subscription did not exist.
    SendIfNew = 1,
    /// 2: do not send retained messages.
    DoNotSend = 2,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SubscriptionOptions {
    pub qos: QoS,
    pub no_local: bool,
    pub retain_as_published: bool,
    pub retain_handling: RetainHandling,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscribe {
    pub packet_id: u16,
    pub properties: Properties,
    /// Never empty ([MQTT-3.8.3-3]).
    pub filters: Vec<(Str, SubscriptionOptions)>,
}

/// SUBACK. For 3.x, codes 0x00–0x02 are granted QoS and anything ≥ 0x80 encodes as 0x80.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubAck {
    pub packet_id: u16,
    pub properties: Properties,
    pub reasons: Vec<ReasonCode>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsubscribe {
    pub packet_id: u16,
    pub properties: Properties,
    /// Never empty ([MQTT-3.10.3-2]).
    pub filters: Vec<Str>,
}

/// UNSUBACK. For 3.x the reasons are not on the wire (decoded as empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnsubAck {
    pub packet_id: u16,
    pub properties: Properties,
    pub reasons: Vec<ReasonCode>,
}

/// DISCONNECT. For 3.x always `NORMAL_DISCONNECTION` with no properties.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disconnect {
    pub reason: ReasonCode,
    pub properties: Properties,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Auth {
    pub reason: ReasonCode,
    pub properties: Properties,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Packets are moved by value through the decoder, the reader and the channels of the
    /// broker; properties live out of line so these moves stay small (they were 472 and 408
    /// bytes with the properties inline).
    const MAX_PACKET_BYTES: usize = 80;
    const MAX_ACK_BYTES: usize = 16;

    #[test]
    fn packets_stay_small() {
        assert_eq!(size_of::<Properties>(), size_of::<usize>());
        assert!(
            size_of::<Packet>() <= MAX_PACKET_BYTES,
            "{}",
            size_of::<Packet>()
        );
        assert!(size_of::<Ack>() <= MAX_ACK_BYTES, "{}", size_of::<Ack>());
    }
}
