//! Encode-once fan-out of a PUBLISH: a [`PublishTemplate`] holds the bytes every subscriber of
//! one protocol version shares, and writes the small per-delivery head for each subscriber.
//!
//! Wire layout of one delivery: `head ++ body`, where
//! - head = fixed header, topic (or an empty topic when the client already knows the alias),
//!   packet identifier (QoS > 0), and in 5.0 the property length followed by the per-delivery
//!   properties (topic alias, subscription identifiers);
//! - body = the message's other properties (5.0) followed by the payload.
//!
//! The spec lets properties come in any order, so per-delivery ones can lead the block.
//!
//! [`PublishShape`] is the borrowed view heads are written from: a template's, or a message's
//! own fields when its body is its payload and it goes to one subscriber (no template at all).
//!
//! # Invariants
//! - `body` never changes after construction; clones share it (`Bytes`, `Arc`).
//! - [`publish_templates_built`] counts every successful [`PublishTemplate::new`], so tests can
//!   prove a message fanned out to many subscribers was encoded once.
//! - Subscription identifiers of 0 or above 268,435,455 cannot be encoded and are skipped
//!   (consistently by `packet_len` and `write_head`); so is a topic alias of 0.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::{BufMut, Bytes, BytesMut};

use crate::encode::fields::{put_str, str_len};
use crate::encode::properties::{self, Scope};
use crate::encode::publish::publish_first_byte;
use crate::error::EncodeError;
use crate::packet::{PacketType, Protocol, QoS, Str};
use crate::properties::Properties;
use crate::property_table::{self as id, Place};
use crate::varint::{self, VARINT_MAX};

static TEMPLATES_BUILT: AtomicU64 = AtomicU64::new(0);

/// Number of [`PublishTemplate`]s built by this process so far.
pub fn publish_templates_built() -> u64 {
    TEMPLATES_BUILT.load(Ordering::Relaxed)
}

/// What differs between two deliveries of the same message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery<'a> {
    pub qos: QoS,
    pub dup: bool,
    pub retain: bool,
    /// 0 for QoS 0.
    pub packet_id: u16,
    /// 5.0 only; ignored for 3.x.
    pub topic_alias: Option<u16>,
    /// `false`: the topic is sent empty because the client already knows `topic_alias`
    /// (5.0 only; 3.x always sends the topic).
    pub send_topic: bool,
    /// 5.0 only; ignored for 3.x.
    pub subscription_identifiers: &'a [u32],
}

impl Delivery<'_> {
    /// A QoS 0 delivery with no per-delivery properties.
    pub fn qos0(retain: bool) -> Delivery<'static> {
        Delivery {
            qos: QoS::AtMostOnce,
            dup: false,
            retain,
            packet_id: 0,
            topic_alias: None,
            send_topic: true,
            subscription_identifiers: &[],
        }
    }
}

/// A PUBLISH encoded once, shared by every subscriber of the same protocol version.
#[derive(Debug, Clone)]
pub struct PublishTemplate {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    protocol: Protocol,
    topic: Str,
    body: Bytes,
    /// Content length of the shared properties inside `body` (5.0).
    shared_props_len: usize,
    /// Whole QoS 0 packets, index = retain flag; built on first use.
    qos0: [OnceLock<Bytes>; 2],
}

/// Sizes of one delivery's head.
struct HeadPlan {
    remaining_len: usize,
    /// Property block content length (per-delivery + shared), 5.0 only.
    props_len: usize,
    send_topic: bool,
}

fn valid_subscription_identifier(value: u32) -> bool {
    value != 0 && value <= VARINT_MAX
}

/// What a delivery's head is computed from, borrowed: from a [`PublishTemplate`], or from a
/// message whose body is its payload (3.x, or 5.0 without properties), which then needs no
/// template (no allocation) when it goes to a single subscriber.
#[derive(Debug, Clone, Copy)]
pub struct PublishShape<'a> {
    protocol: Protocol,
    topic: &'a Str,
    body: &'a Bytes,
    /// Content length of the shared properties inside `body` (5.0).
    shared_props_len: usize,
}

impl<'a> PublishShape<'a> {
    /// A PUBLISH without shared properties: the body is `payload`. Refuses what
    /// [`PublishTemplate::new`] refuses (a topic or packet too long to encode).
    pub fn plain(
        protocol: Protocol,
        topic: &'a Str,
        payload: &'a Bytes,
    ) -> Result<PublishShape<'a>, EncodeError> {
        str_len(topic)?;
        check_size(topic, payload)?;
        Ok(PublishShape {
            protocol,
            topic,
            body: payload,
            shared_props_len: 0,
        })
    }

    /// The shared bytes that follow every head.
    pub fn body(&self) -> &'a Bytes {
        self.body
    }

    fn head_plan(&self, delivery: &Delivery<'_>) -> HeadPlan {
        let v5 = self.protocol.is_v5();
        let send_topic = delivery.send_topic || !v5;
        let mut remaining_len = 2 + if send_topic { self.topic.len() } else { 0 };
        if delivery.qos != QoS::AtMostOnce {
            remaining_len += 2;
        }
        let mut props_len = 0;
        if v5 {
            props_len = self.shared_props_len;
            if delivery.topic_alias.is_some_and(|alias| alias != 0) {
                props_len += 3;
            }
            for &value in delivery.subscription_identifiers {
                if valid_subscription_identifier(value) {
                    props_len += 1 + varint::len(value);
                }
            }
            remaining_len += varint::len(props_len as u32) + props_len - self.shared_props_len;
        }
        remaining_len += self.body.len();
        HeadPlan {
            remaining_len,
            props_len,
            send_topic,
        }
    }

    /// Size of the full packet on the wire for this delivery.
    pub fn packet_len(&self, delivery: &Delivery<'_>) -> usize {
        let plan = self.head_plan(delivery);
        1 + varint::len(plan.remaining_len as u32) + plan.remaining_len
    }

    /// Size of the head alone.
    pub fn head_len(&self, delivery: &Delivery<'_>) -> usize {
        self.packet_len(delivery) - self.body.len()
    }

    /// Writes the per-delivery head into `out`. The full packet is `head ++ body()`.
    pub fn write_head(&self, delivery: &Delivery<'_>, out: &mut BytesMut) {
        let plan = self.head_plan(delivery);
        let head_len =
            1 + varint::len(plan.remaining_len as u32) + plan.remaining_len - self.body.len();
        out.reserve(head_len);
        out.put_u8(publish_first_byte(
            delivery.qos,
            delivery.dup,
            delivery.retain,
        ));
        varint::write(plan.remaining_len as u32, out);
        if plan.send_topic {
            put_str(out, self.topic);
        } else {
            out.put_u16(0);
        }
        if delivery.qos != QoS::AtMostOnce {
            out.put_u16(delivery.packet_id);
        }
        if self.protocol.is_v5() {
            varint::write(plan.props_len as u32, out);
            if let Some(alias) = delivery.topic_alias.filter(|&alias| alias != 0) {
                out.put_u8(id::TOPIC_ALIAS);
                out.put_u16(alias);
            }
            for &value in delivery.subscription_identifiers {
                if valid_subscription_identifier(value) {
                    out.put_u8(id::SUBSCRIPTION_IDENTIFIER);
                    varint::write(value, out);
                }
            }
        }
    }
}

/// Worst case head: topic, packet id, property length, alias; identifiers are bounded by the
/// caller's maximum packet size check through `packet_len`.
fn check_size(topic: &Str, body: &Bytes) -> Result<(), EncodeError> {
    let base = 2 + topic.len() + 2 + 4 + 3 + body.len();
    if base > VARINT_MAX as usize {
        return Err(EncodeError::PacketTooLarge(base));
    }
    Ok(())
}

impl PublishTemplate {
    /// Encodes once the parts every delivery shares: the message's properties except
    /// topic alias and subscription identifiers, and the payload.
    pub fn new(
        protocol: Protocol,
        topic: &Str,
        properties: &Properties,
        payload: &Bytes,
    ) -> Result<PublishTemplate, EncodeError> {
        str_len(topic)?;
        let (body, shared_props_len) = if protocol.is_v5() {
            let shared = properties::content_len(
                properties,
                Place::packet(PacketType::Publish),
                Scope::Shared,
            )?;
            if shared == 0 {
                (payload.clone(), 0)
            } else {
                let mut body = BytesMut::with_capacity(shared + payload.len());
                properties::write_content(properties, Scope::Shared, &mut body);
                body.put_slice(payload);
                (body.freeze(), shared)
            }
        } else {
            (payload.clone(), 0)
        };
        check_size(topic, &body)?;
        TEMPLATES_BUILT.fetch_add(1, Ordering::Relaxed);
        Ok(PublishTemplate {
            inner: Arc::new(Inner {
                protocol,
                topic: topic.clone(),
                body,
                shared_props_len,
                qos0: [OnceLock::new(), OnceLock::new()],
            }),
        })
    }

    pub fn protocol(&self) -> Protocol {
        self.inner.protocol
    }

    pub fn topic(&self) -> &Str {
        &self.inner.topic
    }

    /// The shared bytes that follow every head.
    pub fn body(&self) -> &Bytes {
        &self.inner.body
    }

    /// The fields heads are written from.
    pub fn shape(&self) -> PublishShape<'_> {
        let inner = &*self.inner;
        PublishShape {
            protocol: inner.protocol,
            topic: &inner.topic,
            body: &inner.body,
            shared_props_len: inner.shared_props_len,
        }
    }

    /// Size of the full packet on the wire for this delivery.
    pub fn packet_len(&self, delivery: &Delivery<'_>) -> usize {
        self.shape().packet_len(delivery)
    }

    /// Size of the head alone.
    pub fn head_len(&self, delivery: &Delivery<'_>) -> usize {
        self.shape().head_len(delivery)
    }

    /// Writes the per-delivery head into `out`. The full packet is `head ++ body()`.
    pub fn write_head(&self, delivery: &Delivery<'_>, out: &mut BytesMut) {
        self.shape().write_head(delivery, out);
    }

    /// Whole packet for a QoS 0 delivery with no per-delivery properties, built once per retain
    /// flag and shared by every such delivery.
    pub fn qos0_packet(&self, retain: bool) -> Bytes {
        self.inner.qos0[usize::from(retain)]
            .get_or_init(|| {
                let delivery = Delivery::qos0(retain);
                let mut out = BytesMut::with_capacity(self.packet_len(&delivery));
                self.write_head(&delivery, &mut out);
                out.put_slice(&self.inner.body);
                out.freeze()
            })
            .clone()
    }
}
