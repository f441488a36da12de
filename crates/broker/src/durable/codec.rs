//! Byte encodings of the broker's records (the schema is in the `durable` module doc).
//! Decoders return `None` on anything malformed: a damaged record is skipped and reported by
//! the caller, never trusted.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tern_wire::{Properties, Protocol, QoS, RetainHandling, Str, SubscriptionOptions};
use tokio::time::Instant;

use crate::model::SubRecord;
use crate::model::message::Message;

/// Version byte opening every value this module writes.
pub(crate) const FORMAT_VERSION: u8 = 1;

const TAG_PAYLOAD_FORMAT: u8 = 1;
const TAG_EXPIRY: u8 = 2;
const TAG_CONTENT_TYPE: u8 = 3;
const TAG_RESPONSE_TOPIC: u8 = 4;
const TAG_CORRELATION: u8 = 5;
const TAG_USER: u8 = 6;
/// Publisher client id "none" (wills, `$SYS`).
const NO_PUBLISHER: u16 = u16::MAX;

/// Metadata bytes kept on the stack: the fixed fields, a client id of up to ~100 bytes and
/// small properties, so a stored PUBLISH allocates nothing for its metadata.
const META_INLINE_BYTES: usize = 128;

/// A message's encoded metadata ([`encode_meta`]).
pub(crate) type Meta = smallvec::SmallVec<[u8; META_INLINE_BYTES]>;

/// Where encoded fields go: a record's [`Meta`], or a `Vec` for the other values.
trait Sink {
    fn put(&mut self, bytes: &[u8]);
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

impl Sink for Meta {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

fn put_bytes(out: &mut impl Sink, b: &[u8]) {
    // Every field written here comes from an MQTT packet, whose strings and binaries have
    // u16 lengths; longer input is truncated rather than allowed to corrupt the framing.
    let len = b.len().min(usize::from(u16::MAX - 1));
    out.put(&(len as u16).to_be_bytes());
    out.put(&b[..len]);
}

/// The message's metadata (the record's `properties` field): version, QoS and retain flag,
/// publisher client id, then tagged MQTT 5 properties.
pub(crate) fn encode_meta(m: &Message, out: &mut Meta) {
    out.push(FORMAT_VERSION);
    out.push(m.qos as u8 | (u8::from(m.retain) << 2));
    match &m.publisher {
        Some(p) => put_bytes(out, p.as_bytes()),
        None => out.extend_from_slice(&NO_PUBLISHER.to_be_bytes()),
    }
    let p = &m.properties;
    if let Some(v) = p.payload_format_indicator {
        out.extend_from_slice(&[TAG_PAYLOAD_FORMAT, v]);
    }
    if let Some(v) = p.message_expiry_interval_s {
        out.push(TAG_EXPIRY);
        out.extend_from_slice(&v.to_be_bytes());
    }
    if let Some(v) = &p.content_type {
        out.push(TAG_CONTENT_TYPE);
        put_bytes(out, v.as_bytes());
    }
    if let Some(v) = &p.response_topic {
        out.push(TAG_RESPONSE_TOPIC);
        put_bytes(out, v.as_bytes());
    }
    if let Some(v) = &p.correlation_data {
        out.push(TAG_CORRELATION);
        put_bytes(out, v);
    }
    for (k, v) in &p.user {
        out.push(TAG_USER);
        put_bytes(out, k.as_bytes());
        put_bytes(out, v.as_bytes());
    }
}

/// A bounds-checked reader.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }
    pub(crate) fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
    pub(crate) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.buf.len() < n {
            return None;
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Some(head)
    }
    pub(crate) fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    pub(crate) fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
    pub(crate) fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_be_bytes)
    }
    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_be_bytes)
    }
    pub(crate) fn bytes(&mut self) -> Option<&'a [u8]> {
        let len = self.u16()?;
        self.take(usize::from(len))
    }
    pub(crate) fn str(&mut self) -> Option<&'a str> {
        std::str::from_utf8(self.bytes()?).ok()
    }
}

fn owned_str(s: &str) -> Option<Str> {
    Str::copy_from(s).ok()
}

/// Rebuilds a message from a record. `age` is how long ago it was stored (for expiry).
pub(crate) fn decode_message(
    topic: &[u8],
    meta: &[u8],
    payload: Bytes,
    age: Duration,
) -> Option<Message> {
    let topic = owned_str(std::str::from_utf8(topic).ok()?)?;
    let mut r = Reader::new(meta);
    if r.u8()? != FORMAT_VERSION {
        return None;
    }
    let flags = r.u8()?;
    let qos = QoS::from_u8(flags & 3)?;
    let retain = flags & 4 != 0;
    let publisher_len = r.u16()?;
    let publisher: Option<Arc<str>> = if publisher_len == NO_PUBLISHER {
        None
    } else {
        Some(
            std::str::from_utf8(r.take(usize::from(publisher_len))?)
                .ok()?
                .into(),
        )
    };
    let mut p = Properties::default();
    while !r.is_empty() {
        match r.u8()? {
            TAG_PAYLOAD_FORMAT => p.payload_format_indicator = Some(r.u8()?),
            TAG_EXPIRY => p.message_expiry_interval_s = Some(r.u32()?),
            TAG_CONTENT_TYPE => p.content_type = Some(owned_str(r.str()?)?),
            TAG_RESPONSE_TOPIC => p.response_topic = Some(owned_str(r.str()?)?),
            TAG_CORRELATION => p.correlation_data = Some(Bytes::copy_from_slice(r.bytes()?)),
            TAG_USER => {
                let k = owned_str(r.str()?)?;
                let v = owned_str(r.str()?)?;
                p.user.push((k, v));
            }
            _ => return None,
        }
    }
    let now = Instant::now();
    let arrived_at = now.checked_sub(age).unwrap_or(now);
    Some(Message::new(
        topic, payload, qos, retain, p, publisher, arrived_at,
    ))
}

/// A retained message as one value: meta length, meta, payload.
pub(crate) fn encode_retained(m: &Message) -> Vec<u8> {
    let mut meta = Meta::new();
    encode_meta(m, &mut meta);
    let mut out = Vec::with_capacity(4 + meta.len() + m.payload.len());
    out.extend_from_slice(&(meta.len() as u32).to_be_bytes());
    out.extend_from_slice(&meta);
    out.extend_from_slice(&m.payload);
    out
}

pub(crate) fn decode_retained(topic: &[u8], value: &Bytes) -> Option<Message> {
    let mut r = Reader::new(value);
    let meta_len = r.u32()? as usize;
    let meta = r.take(meta_len)?;
    let payload = value.slice(4 + meta_len..);
    // The time a retained message was set is not kept: its expiry restarts.
    decode_message(topic, meta, payload, Duration::ZERO)
}

/// A persistent session: protocol, expiry, subscriptions.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct SessionRecord {
    pub(crate) protocol_level: u8,
    pub(crate) expiry_interval_s: u32,
    /// Unix time (s) the session lost its connection; 0 while connected (or never closed
    /// cleanly: a crash). Its expiry runs from then.
    pub(crate) closed_at_unix_s: u64,
    /// Identifies this life of the session (set when it starts afresh): rx records carry it,
    /// so those of an earlier session under the same client id never count.
    pub(crate) incarnation: u64,
    pub(crate) subscriptions: Vec<(String, SubRecord)>,
}

fn options_byte(o: &SubscriptionOptions) -> u8 {
    o.qos as u8
        | (u8::from(o.no_local) << 2)
        | (u8::from(o.retain_as_published) << 3)
        | ((o.retain_handling as u8) << 4)
}

fn options_from(b: u8) -> Option<SubscriptionOptions> {
    Some(SubscriptionOptions {
        qos: QoS::from_u8(b & 3)?,
        no_local: b & 4 != 0,
        retain_as_published: b & 8 != 0,
        retain_handling: match (b >> 4) & 3 {
            0 => RetainHandling::SendAtSubscribe,
            1 => RetainHandling::SendIfNew,
            2 => RetainHandling::DoNotSend,
            _ => return None,
        },
    })
}

impl SessionRecord {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = vec![FORMAT_VERSION, self.protocol_level];
        out.extend_from_slice(&self.expiry_interval_s.to_be_bytes());
        out.extend_from_slice(&self.closed_at_unix_s.to_be_bytes());
        out.extend_from_slice(&self.incarnation.to_be_bytes());
        for (filter, rec) in &self.subscriptions {
            put_bytes(&mut out, filter.as_bytes());
            out.push(options_byte(&rec.options));
            out.extend_from_slice(&rec.subscription_id.unwrap_or(0).to_be_bytes());
        }
        out
    }

    pub(crate) fn decode(value: &[u8]) -> Option<SessionRecord> {
        let mut r = Reader::new(value);
        if r.u8()? != FORMAT_VERSION {
            return None;
        }
        let protocol_level = r.u8()?;
        let expiry_interval_s = r.u32()?;
        let closed_at_unix_s = r.u64()?;
        let incarnation = r.u64()?;
        let mut subscriptions = Vec::new();
        while !r.is_empty() {
            let filter = r.str()?.to_string();
            let options = options_from(r.u8()?)?;
            let id = r.u32()?;
            subscriptions.push((
                filter,
                SubRecord {
                    options,
                    subscription_id: (id != 0).then_some(id),
                },
            ));
        }
        Some(SessionRecord {
            protocol_level,
            expiry_interval_s,
            closed_at_unix_s,
            incarnation,
            subscriptions,
        })
    }

    pub(crate) fn protocol(&self) -> Protocol {
        match self.protocol_level {
            5 => Protocol::V5,
            3 => Protocol::V3_1,
            _ => Protocol::V3_1_1,
        }
    }
}

/// A (stream name, sequence) list: cursors, and the position of a PUBREL-pending message.
pub(crate) fn encode_positions(positions: &[(&str, u64)]) -> Vec<u8> {
    let mut out = vec![FORMAT_VERSION];
    for (name, seq) in positions {
        put_bytes(&mut out, name.as_bytes());
        out.extend_from_slice(&seq.to_be_bytes());
    }
    out
}

pub(crate) fn decode_positions(value: &[u8]) -> Option<Vec<(String, u64)>> {
    let mut r = Reader::new(value);
    if r.u8()? != FORMAT_VERSION {
        return None;
    }
    let mut out = Vec::new();
    while !r.is_empty() {
        let name = r.str()?.to_string();
        out.push((name, r.u64()?));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tern_wire::PropertyValues;

    #[test]
    fn message_meta_round_trips() {
        let props: Properties = PropertyValues {
            payload_format_indicator: Some(1),
            message_expiry_interval_s: Some(60),
            content_type: Some(Str::from_static("text/plain")),
            response_topic: Some(Str::from_static("r/t")),
            correlation_data: Some(Bytes::from_static(b"\x00\x01")),
            user: vec![(Str::from_static("k"), Str::from_static("v"))],
            ..PropertyValues::default()
        }
        .into();
        let m = Message::new(
            Str::from_static("a/b"),
            Bytes::from_static(b"hello"),
            QoS::ExactlyOnce,
            true,
            props.clone(),
            Some("pub-1".into()),
            Instant::now(),
        );
        let mut meta = Meta::new();
        encode_meta(&m, &mut meta);
        let back = decode_message(b"a/b", &meta, m.payload.clone(), Duration::ZERO).unwrap();
        assert_eq!(back.qos, QoS::ExactlyOnce);
        assert!(back.retain);
        assert_eq!(back.publisher.as_deref(), Some("pub-1"));
        assert_eq!(back.properties, props);
        assert_eq!(&back.payload[..], b"hello");
        let r = decode_retained(b"a/b", &Bytes::from(encode_retained(&m))).unwrap();
        assert_eq!(&r.payload[..], b"hello");
        // Truncations are refused, never panic.
        for cut in 0..meta.len() {
            let _ = decode_message(b"a/b", &meta[..cut], Bytes::new(), Duration::ZERO);
        }
    }

    #[test]
    fn session_record_round_trips() {
        let rec = SessionRecord {
            protocol_level: 5,
            expiry_interval_s: 30,
            closed_at_unix_s: 1_700_000_000,
            incarnation: 42,
            subscriptions: vec![(
                "x/#".into(),
                SubRecord {
                    options: SubscriptionOptions {
                        qos: QoS::AtLeastOnce,
                        no_local: true,
                        retain_as_published: true,
                        retain_handling: RetainHandling::DoNotSend,
                    },
                    subscription_id: Some(7),
                },
            )],
        };
        assert_eq!(SessionRecord::decode(&rec.encode()), Some(rec));
        let pos = encode_positions(&[("messages", 42)]);
        assert_eq!(decode_positions(&pos), Some(vec![("messages".into(), 42)]));
    }
}
