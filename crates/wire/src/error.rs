//! Typed decode and encode errors. Every decode failure maps to the MQTT 5.0 reason code the
//! broker must put in its DISCONNECT (or CONNACK) before closing the connection.

use crate::packet_type::PacketType;
use crate::reason::ReasonCode;

/// Why a byte string is not an acceptable MQTT packet.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The fixed header announces a packet larger than the negotiated maximum (0x95).
    #[error("packet of {size_bytes} bytes exceeds the maximum of {max_bytes} bytes")]
    PacketTooLarge { size_bytes: u64, max_bytes: u32 },
    /// Remaining length longer than four bytes ([MQTT-1.5.5-1]).
    #[error("remaining length is encoded in more than four bytes")]
    MalformedRemainingLength,
    /// A Variable Byte Integer inside the packet (property length, property identifier,
    /// subscription identifier) longer than four bytes.
    #[error("variable byte integer longer than four bytes")]
    MalformedVarint,
    /// Packet type 0, or AUTH on a 3.x connection.
    #[error("invalid packet type {0}")]
    InvalidPacketType(u8),
    /// Reserved bits of the fixed header are wrong ([MQTT-2.1.3-1], [MQTT-3.6.1-1],
    /// [MQTT-3.8.1-1], [MQTT-3.10.1-1]).
    #[error("invalid fixed header flags {flags:#06b} for {packet_type:?}")]
    InvalidFixedHeaderFlags { packet_type: PacketType, flags: u8 },
    /// QoS 3 in a PUBLISH, a will, or a subscription ([MQTT-3.3.1-4]).
    #[error("QoS 3 is not a QoS")]
    InvalidQoS,
    /// DUP set on a QoS 0 PUBLISH ([MQTT-3.3.1-2]).
    #[error("DUP flag set on a QoS 0 PUBLISH")]
    DupOnQoS0,
    /// A length field or a fixed-size field reaches past the end of the packet.
    #[error("a field reaches past the end of the packet")]
    Truncated,
    /// Bytes left over after the last field of a packet that has no payload to absorb them.
    #[error("unexpected bytes after the last field")]
    TrailingBytes,
    /// A UTF-8 string field is not well-formed UTF-8 ([MQTT-1.5.4-1]).
    #[error("string is not well-formed UTF-8")]
    InvalidUtf8,
    /// A UTF-8 string field holds U+0000 ([MQTT-1.5.4-2]).
    #[error("string contains U+0000")]
    NullCharacter,
    /// CONNECT names neither `MQTT` nor `MQIsdp` ([MQTT-3.1.2-1]).
    #[error("unknown protocol name")]
    InvalidProtocolName,
    /// CONNECT announces a protocol level we do not speak. The broker answers CONNACK return code
    /// 0x01 to a 3.x client and reason 0x84 to a 5.0 client, then closes ([MQTT-3.1.2-2]).
    #[error("unsupported protocol level {level}")]
    UnsupportedProtocolVersion { level: u8 },
    /// CONNECT flags bit 0 is set ([MQTT-3.1.2-3]).
    #[error("CONNECT reserved flag is set")]
    ConnectReservedFlag,
    /// Will QoS or will retain set while the will flag is 0 ([MQTT-3.1.2-11], [MQTT-3.1.2-13],
    /// [MQTT-3.1.2-15]).
    #[error("will QoS or will retain set without a will")]
    WillFlagsWithoutWill,
    /// 3.x: password flag set without the user name flag ([MQTT-3.1.2-22]).
    #[error("password without user name")]
    PasswordWithoutUsername,
    /// A packet identifier of 0 where a non-zero one is required ([MQTT-2.2.1-3]).
    #[error("packet identifier 0")]
    PacketIdZero,
    /// A PUBLISH topic holds `+` or `#` ([MQTT-3.3.2-2]).
    #[error("wildcard in a PUBLISH topic name")]
    WildcardInTopicName,
    /// A PUBLISH topic is empty: never allowed in 3.x ([MQTT-4.7.3-1]); in 5.0 only together
    /// with a topic alias (a protocol error otherwise, section 3.3.2.3.4).
    #[error("empty topic name without a topic alias")]
    EmptyTopicName,
    /// A property identifier that MQTT 5.0 does not define.
    #[error("unknown property identifier {0:#04x}")]
    UnknownProperty(u32),
    /// A property that the spec does not allow in this packet.
    #[error("property {id:#04x} is not allowed in {packet:?}")]
    PropertyNotAllowed { id: u8, packet: PacketType },
    /// A property other than user property and PUBLISH subscription identifier appears twice.
    #[error("property {0:#04x} appears more than once")]
    DuplicateProperty(u8),
    /// A property value the spec forbids (receive maximum 0, subscription identifier 0,
    /// a 0/1 byte with another value, ...).
    #[error("invalid value for property {0:#04x}")]
    InvalidPropertyValue(u8),
    /// Authentication data without an authentication method.
    #[error("authentication data without authentication method")]
    AuthDataWithoutMethod,
    /// A SUBSCRIBE or UNSUBSCRIBE with no topic filter ([MQTT-3.8.3-3], [MQTT-3.10.3-2]).
    #[error("no topic filter")]
    NoTopicFilters,
    /// Reserved bits of a subscription options byte are set ([MQTT-3.8.3-4], [MQTT-3.8.3-5]).
    #[error("reserved bits set in subscription options")]
    SubscriptionOptionsReserved,
    /// Retain handling 3 (a protocol error in 5.0, 3.8.3.1).
    #[error("retain handling 3")]
    InvalidRetainHandling,
    /// A reason (or 3.x return) code not allowed in this packet.
    #[error("reason code {code:#04x} is not allowed in {packet:?}")]
    InvalidReasonCode { packet: PacketType, code: u8 },
    /// CONNACK reserved flag bits set, or session present with a failure code ([MQTT-3.2.2-6]).
    #[error("invalid CONNACK flags {0:#04x}")]
    InvalidConnAckFlags(u8),
}

impl DecodeError {
    /// The MQTT 5.0 reason code that describes this error on the wire.
    pub fn reason_code(&self) -> ReasonCode {
        use DecodeError::*;
        match self {
            PacketTooLarge { .. } => ReasonCode::PACKET_TOO_LARGE,
            UnsupportedProtocolVersion { .. } | InvalidProtocolName => {
                ReasonCode::UNSUPPORTED_PROTOCOL_VERSION
            }
            // [MQTT-3.3.2-8]: a Topic Alias of 0 earns "Topic Alias invalid".
            InvalidPropertyValue(crate::property_table::TOPIC_ALIAS) => {
                ReasonCode::TOPIC_ALIAS_INVALID
            }
            PacketIdZero
            | EmptyTopicName
            | PropertyNotAllowed { .. }
            | DuplicateProperty(_)
            | InvalidPropertyValue(_)
            | AuthDataWithoutMethod
            | NoTopicFilters
            | InvalidRetainHandling
            | InvalidReasonCode { .. } => ReasonCode::PROTOCOL_ERROR,
            MalformedRemainingLength
            | MalformedVarint
            | InvalidPacketType(_)
            | InvalidFixedHeaderFlags { .. }
            | InvalidQoS
            | DupOnQoS0
            | Truncated
            | TrailingBytes
            | InvalidUtf8
            | NullCharacter
            | ConnectReservedFlag
            | WillFlagsWithoutWill
            | PasswordWithoutUsername
            // 0x90 is for names that are "correctly formed" but refused; a wildcard makes the
            // name ill-formed ([MQTT-3.3.2-2]), and mosquitto treats it as malformed too.
            | WildcardInTopicName
            | UnknownProperty(_)
            | SubscriptionOptionsReserved
            | InvalidConnAckFlags(_) => ReasonCode::MALFORMED_PACKET,
        }
    }
}

/// Why a packet value cannot be put on the wire.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// The remaining length would exceed 268,435,455 bytes.
    #[error("packet body of {0} bytes exceeds the MQTT maximum")]
    PacketTooLarge(usize),
    /// A string or binary field longer than 65,535 bytes.
    #[error("field of {0} bytes exceeds 65535 bytes")]
    FieldTooLong(usize),
    /// The packet does not exist in this protocol version (AUTH in 3.x).
    #[error("{0:?} does not exist in this protocol version")]
    NotInProtocol(PacketType),
    /// A property the spec does not allow in this packet.
    #[error("property {id:#04x} is not allowed in {packet:?}")]
    PropertyNotAllowed { id: u8, packet: PacketType },
    /// A property value that cannot be encoded (subscription identifier 0 or too large).
    #[error("invalid value for property {0:#04x}")]
    InvalidPropertyValue(u8),
    /// QoS 1/2 PUBLISH, SUBSCRIBE, UNSUBSCRIBE or an ack with packet identifier 0.
    #[error("packet identifier 0")]
    PacketIdZero,
    /// SUBSCRIBE or UNSUBSCRIBE with no topic filter.
    #[error("no topic filter")]
    NoTopicFilters,
    /// A PUBLISH or will with an empty topic (allowed only for a 5.0 PUBLISH with a topic alias).
    #[error("empty topic name without a topic alias")]
    EmptyTopicName,
}
