//! tern-wire: the MQTT 3.1, 3.1.1 and 5.0 codec of Tern. No I/O, no sessions, no clock.
//!
//! Module map, one layer per line, lowest first: a module imports only its own line and the
//! lines before it (`crates/server/tests/layering.rs` holds the same order and enforces it).
//! - `varint`: Variable Byte Integers; `packet_type`: [`PacketType`], the fixed header's type.
//! - [`reason`]: reason codes, which packet may carry which, and their mapping to 3.x return
//!   codes; `property_table`: property identifiers and which packet may carry which property.
//! - [`error`]: [`DecodeError`] (with [`DecodeError::reason_code`]) and [`EncodeError`].
//! - `string`: [`Str`], the validated MQTT UTF-8 string.
//! - [`properties`]: the MQTT 5.0 properties: [`PropertyValues`] holds every property,
//!   [`Properties`] is the one-pointer handle packets carry (null when there are none).
//! - [`packet`]: the packet model shared by decoder, encoder, broker and bench tool (it
//!   re-exports [`PacketType`] and [`Str`], its vocabulary from below).
//! - `decode`: [`decode`], incremental and zero-copy, one file per packet family; `encode`:
//!   [`encode`] and [`encoded_len`], one file per packet family.
//! - [`fanout`]: [`PublishTemplate`], [`PublishShape`] and [`Delivery`], a PUBLISH encoded
//!   once for many subscribers, and the [`publish_templates_built`] counter.
//!
//! ```
//! use tern_wire::{decode, encode, Bytes, BytesMut, Packet, Protocol, Publish, QoS, Str, Properties};
//!
//! let publish = Packet::Publish(Publish {
//!     dup: false,
//!     qos: QoS::AtLeastOnce,
//!     retain: false,
//!     topic: Str::from_static("a/b"),
//!     packet_id: 1,
//!     properties: Properties::default(),
//!     payload: Bytes::from_static(b"hi"),
//! });
//! let mut buf = BytesMut::new();
//! encode(&publish, Protocol::V5, &mut buf)?;
//! let partial = buf.split_off(3);
//! assert_eq!(decode(&mut buf, Protocol::V5, 1024)?, None); // need more bytes
//! buf.unsplit(partial);
//! assert_eq!(decode(&mut buf, Protocol::V5, 1024)?, Some(publish));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Choices the spec leaves open, and how this crate makes them:
//! - Non-minimal Variable Byte Integers are accepted (the spec binds only the sender); the
//!   encoder always writes the minimal form.
//! - A wildcard in a PUBLISH (or will) topic is malformed (0x81), not 0x90 ("correctly formed
//!   but refused"); an unknown protocol name maps to 0x84 like an unknown level; packet
//!   identifier 0 and forbidden, duplicate or out-of-range properties are protocol errors
//!   (0x82), as in mosquitto; a topic alias of 0 is 0x94 [MQTT-3.3.2-8].
//! - Whether a PUBLISH carrying a subscription identifier came from a client (forbidden,
//!   [MQTT-3.3.4-6]) depends on the direction, which the codec does not know: the broker checks.
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
mod packet_type;
pub mod properties;
mod property_table;
pub mod reason;
mod string;
mod varint;

pub use bytes::{Bytes, BytesMut};
pub use decode::decode;
pub use encode::{encode, encoded_len};
pub use error::{DecodeError, EncodeError};
pub use fanout::{Delivery, PublishShape, PublishTemplate, publish_templates_built};
pub use packet::{
    Ack, Auth, ConnAck, Connect, Disconnect, Packet, Protocol, Publish, QoS, RetainHandling,
    SubAck, Subscribe, SubscriptionOptions, UnsubAck, Unsubscribe, Will,
};
pub use packet_type::PacketType;
pub use properties::{Properties, PropertyValues};
pub use reason::ReasonCode;
pub use string::Str;
pub use varint::{VARINT_MAX, parse_complete as parse_varint};
