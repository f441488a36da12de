//! The packet type of the fixed header: the one part of the packet model that errors, reason
//! codes and the property table need, kept below them all (the packets themselves are in
//! `packet`, which imports these modules).

/// The packet type nibble of the fixed header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PacketType {
    Connect = 1,
    ConnAck = 2,
    Publish = 3,
    PubAck = 4,
    PubRec = 5,
    PubRel = 6,
    PubComp = 7,
    Subscribe = 8,
    SubAck = 9,
    Unsubscribe = 10,
    UnsubAck = 11,
    PingReq = 12,
    PingResp = 13,
    Disconnect = 14,
    Auth = 15,
}

/// The packet type of a fixed header's type nibble; `None` for 0 (reserved).
pub(crate) fn packet_type_from_u8(value: u8) -> Option<PacketType> {
    use PacketType::*;
    Some(match value {
        1 => Connect,
        2 => ConnAck,
        3 => Publish,
        4 => PubAck,
        5 => PubRec,
        6 => PubRel,
        7 => PubComp,
        8 => Subscribe,
        9 => SubAck,
        10 => Unsubscribe,
        11 => UnsubAck,
        12 => PingReq,
        13 => PingResp,
        14 => Disconnect,
        15 => Auth,
        _ => return None,
    })
}
