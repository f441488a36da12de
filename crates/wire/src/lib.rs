//! tern-wire: the MQTT 3.1, 3.1.1 and 5.0 codec of Tern. No I/O, no sessions, no clock.
//!
//! Module map:
//! - [`packet`]: the packet model shared by decoder, encoder, broker and bench tool.
//! - [`properties`]: the MQTT 5.0 properties struct; `property_table` says which packet may
//!   carry which property.
//! - [`reason`]: reason codes, and their mapping to 3.x return codes.
//! - [`error`]: [`DecodeError`] (with [`DecodeError::reason_code`]) and [`EncodeError`].
//! - `varint`: Variable Byte Integers.
//! - `decode`: [`decode`], incremental and zero-copy, one file per packet family.
//! - `encode`: [`encode`] and [`encoded_len`], one file per packet family.
//! - [`fanout`]: [`PublishTemplate`] and [`Delivery`], a PUBLISH encoded once for many
//!   subscribers, and the [`publish_templates_built`] counter.
//!
//! # Invariants
//! - Decoding never panics, whatever the input, and never buffers or allocates more than the
//!   packet in hand (bounded by the caller's maximum packet size).
//! - For every valid packet `p` of a version `v`: `decode(encode(p, v), v) == p`.

mod decode;
mod encode;
pub mod error;
pub mod fanout;
pub mod packet;
pub mod properties;
mod property_table;
pub mod reason;
mod varint;

pub use bytes::{Bytes, BytesMut};
pub use decode::decode;
pub use encode::{encode, encoded_len};
pub use error::{DecodeError, EncodeError};
pub use fanout::{Delivery, PublishTemplate, publish_templates_built};
pub use packet::{
    Ack, Auth, ConnAck, Connect, Disconnect, Packet, PacketType, Protocol, Publish, QoS,
    RetainHandling, Str, SubAck, Subscribe, SubscriptionOptions, UnsubAck, Unsubscribe, Will,
};
pub use properties::Properties;
pub use reason::ReasonCode;
pub use varint::VARINT_MAX;
