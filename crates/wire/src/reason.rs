//! MQTT 5.0 reason codes, used by the broker for every version (the encoder maps them to the 3.x
//! return codes where 3.x has any).

use crate::packet_type::PacketType;

/// A reason code byte. Values below 0x80 mean success, 0x80 and above mean failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ReasonCode(pub u8);

impl ReasonCode {
    pub const SUCCESS: ReasonCode = ReasonCode(0x00);
    pub const NORMAL_DISCONNECTION: ReasonCode = ReasonCode(0x00);
    pub const GRANTED_QOS_0: ReasonCode = ReasonCode(0x00);
    pub const GRANTED_QOS_1: ReasonCode = ReasonCode(0x01);
    pub const GRANTED_QOS_2: ReasonCode = ReasonCode(0x02);
    pub const DISCONNECT_WITH_WILL_MESSAGE: ReasonCode = ReasonCode(0x04);
    pub const NO_MATCHING_SUBSCRIBERS: ReasonCode = ReasonCode(0x10);
    pub const NO_SUBSCRIPTION_EXISTED: ReasonCode = ReasonCode(0x11);
    pub const CONTINUE_AUTHENTICATION: ReasonCode = ReasonCode(0x18);
    pub const RE_AUTHENTICATE: ReasonCode = ReasonCode(0x19);
    pub const UNSPECIFIED_ERROR: ReasonCode = ReasonCode(0x80);
    pub const MALFORMED_PACKET: ReasonCode = ReasonCode(0x81);
    pub const PROTOCOL_ERROR: ReasonCode = ReasonCode(0x82);
    pub const IMPLEMENTATION_SPECIFIC_ERROR: ReasonCode = ReasonCode(0x83);
    pub const UNSUPPORTED_PROTOCOL_VERSION: ReasonCode = ReasonCode(0x84);
    pub const CLIENT_IDENTIFIER_NOT_VALID: ReasonCode = ReasonCode(0x85);
    pub const BAD_USER_NAME_OR_PASSWORD: ReasonCode = ReasonCode(0x86);
    pub const NOT_AUTHORIZED: ReasonCode = ReasonCode(0x87);
    pub const SERVER_UNAVAILABLE: ReasonCode = ReasonCode(0x88);
    pub const SERVER_BUSY: ReasonCode = ReasonCode(0x89);
    pub const BANNED: ReasonCode = ReasonCode(0x8A);
    pub const SERVER_SHUTTING_DOWN: ReasonCode = ReasonCode(0x8B);
    pub const BAD_AUTHENTICATION_METHOD: ReasonCode = ReasonCode(0x8C);
    pub const KEEP_ALIVE_TIMEOUT: ReasonCode = ReasonCode(0x8D);
    pub const SESSION_TAKEN_OVER: ReasonCode = ReasonCode(0x8E);
    pub const TOPIC_FILTER_INVALID: ReasonCode = ReasonCode(0x8F);
    pub const TOPIC_NAME_INVALID: ReasonCode = ReasonCode(0x90);
    pub const PACKET_IDENTIFIER_IN_USE: ReasonCode = ReasonCode(0x91);
    pub const PACKET_IDENTIFIER_NOT_FOUND: ReasonCode = ReasonCode(0x92);
    pub const RECEIVE_MAXIMUM_EXCEEDED: ReasonCode = ReasonCode(0x93);
    pub const TOPIC_ALIAS_INVALID: ReasonCode = ReasonCode(0x94);
    pub const PACKET_TOO_LARGE: ReasonCode = ReasonCode(0x95);
    pub const MESSAGE_RATE_TOO_HIGH: ReasonCode = ReasonCode(0x96);
    pub const QUOTA_EXCEEDED: ReasonCode = ReasonCode(0x97);
    pub const ADMINISTRATIVE_ACTION: ReasonCode = ReasonCode(0x98);
    pub const PAYLOAD_FORMAT_INVALID: ReasonCode = ReasonCode(0x99);
    pub const RETAIN_NOT_SUPPORTED: ReasonCode = ReasonCode(0x9A);
    pub const QOS_NOT_SUPPORTED: ReasonCode = ReasonCode(0x9B);
    pub const USE_ANOTHER_SERVER: ReasonCode = ReasonCode(0x9C);
    pub const SERVER_MOVED: ReasonCode = ReasonCode(0x9D);
    pub const SHARED_SUBSCRIPTIONS_NOT_SUPPORTED: ReasonCode = ReasonCode(0x9E);
    pub const CONNECTION_RATE_EXCEEDED: ReasonCode = ReasonCode(0x9F);
    pub const MAXIMUM_CONNECT_TIME: ReasonCode = ReasonCode(0xA0);
    pub const SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED: ReasonCode = ReasonCode(0xA1);
    pub const WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED: ReasonCode = ReasonCode(0xA2);

    pub fn is_success(self) -> bool {
        self.0 < 0x80
    }
}

/// Reason codes the spec allows in each packet (MQTT 5.0 sections 3.2.2.2, 3.4.2.1, 3.5.2.1,
/// 3.6.2.1, 3.7.2.1, 3.9.3, 3.11.3, 3.14.2.1, 3.15.2.1).
pub(crate) fn allowed_in(packet_type: PacketType, code: u8) -> bool {
    use PacketType::*;
    match packet_type {
        ConnAck => matches!(
            code,
            0x00 | 0x80..=0x8A | 0x8C | 0x90 | 0x95 | 0x97 | 0x99..=0x9D | 0x9F
        ),
        PubAck | PubRec => matches!(
            code,
            0x00 | 0x10 | 0x80 | 0x83 | 0x87 | 0x90 | 0x91 | 0x97 | 0x99
        ),
        PubRel | PubComp => matches!(code, 0x00 | 0x92),
        SubAck => matches!(
            code,
            0x00..=0x02 | 0x80 | 0x83 | 0x87 | 0x8F | 0x91 | 0x97 | 0x9E | 0xA1 | 0xA2
        ),
        UnsubAck => matches!(code, 0x00 | 0x11 | 0x80 | 0x83 | 0x87 | 0x8F | 0x91),
        Disconnect => matches!(
            code,
            0x00 | 0x04 | 0x80..=0x83 | 0x87 | 0x89 | 0x8B | 0x8D..=0x90 | 0x93..=0xA2
        ),
        Auth => matches!(code, 0x00 | 0x18 | 0x19),
        Connect | Publish | Subscribe | Unsubscribe | PingReq | PingResp => false,
    }
}

/// MQTT 3.1.1 CONNACK return code for a 5.0 reason code (3.2.2.3). Reasons 3.x cannot express
/// become 0x03 "server unavailable" (the nearest refusal that does not blame the client's
/// credentials or identity).
pub(crate) fn connack_v3_code(reason: ReasonCode) -> u8 {
    match reason.0 {
        0x00 => 0x00,
        0x84 => 0x01,
        0x85 => 0x02,
        0x88 | 0x89 => 0x03,
        0x86 | 0x8C => 0x04,
        0x87 | 0x8A => 0x05,
        _ => 0x03,
    }
}

/// The 5.0 reason code for an MQTT 3.1.1 CONNACK return code; `None` above 5.
pub(crate) fn connack_from_v3_code(code: u8) -> Option<ReasonCode> {
    Some(match code {
        0x00 => ReasonCode::SUCCESS,
        0x01 => ReasonCode::UNSUPPORTED_PROTOCOL_VERSION,
        0x02 => ReasonCode::CLIENT_IDENTIFIER_NOT_VALID,
        0x03 => ReasonCode::SERVER_UNAVAILABLE,
        0x04 => ReasonCode::BAD_USER_NAME_OR_PASSWORD,
        0x05 => ReasonCode::NOT_AUTHORIZED,
        _ => return None,
    })
}
