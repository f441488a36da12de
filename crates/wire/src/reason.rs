//! MQTT 5.0 reason codes, used by the broker for every version (the encoder maps them to the 3.x
//! return codes where 3.x has any).

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
