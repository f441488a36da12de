//! A minimal MQTT client session on top of tern-wire: connect, subscribe, and the buffers and
//! pre-encoded packets the load loops use.
//!
//! The load loops (`load.rs`) drive the socket themselves with `ready()` + `try_read`/`try_write`
//! so that one task per client can read and write without ever blocking one on the other.
//!
//! # Invariants
//! - `Conn::inbuf` never holds more than one partial packet beyond what `decode` consumed, and
//!   `decode` refuses packets over [`MAX_PACKET_BYTES`], so a broker cannot grow it unboundedly.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tern_wire::{
    Ack, Connect, Packet, Properties, Protocol, Publish, QoS, ReasonCode, Str, Subscribe,
    SubscriptionOptions,
};
use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;

use crate::cli::{ProtocolArg, Qos};
use crate::tls::{BenchStream, TlsClient};

/// Largest packet we accept from a broker.
pub const MAX_PACKET_BYTES: u32 = 256 * 1024 * 1024;
/// Bytes reserved in the read buffer before each read: many packets per read.
pub const READ_CHUNK_BYTES: usize = 64 * 1024;
/// How long CONNECT/CONNACK and SUBSCRIBE/SUBACK may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Error)]
pub enum MqttError {
    #[error("i/o: {0}")]
    Io(std::io::Error),
    #[error("broker sent a malformed packet: {0}")]
    Decode(tern_wire::DecodeError),
    #[error("cannot encode packet: {0}")]
    Encode(tern_wire::EncodeError),
    #[error("broker closed the connection")]
    Closed,
    #[error("broker refused the connection: reason {0:#04x}")]
    Refused(u8),
    #[error("broker refused the subscription: reason {0:#04x}")]
    SubscribeRefused(u8),
    #[error("broker granted QoS {granted} where {wanted} was asked")]
    Downgraded { wanted: u8, granted: u8 },
    #[error("unexpected {0} during {1}")]
    Unexpected(&'static str, &'static str),
    #[error("timed out during {0}")]
    Timeout(&'static str),
    #[error("invalid string: {0}")]
    BadString(String),
}

// Manual `From`s: with `#[from]` the inner error would also be the `source()` and `{:#}` would
// print it twice.
impl From<std::io::Error> for MqttError {
    fn from(error: std::io::Error) -> Self {
        MqttError::Io(error)
    }
}

impl From<tern_wire::DecodeError> for MqttError {
    fn from(error: tern_wire::DecodeError) -> Self {
        MqttError::Decode(error)
    }
}

impl From<tern_wire::EncodeError> for MqttError {
    fn from(error: tern_wire::EncodeError) -> Self {
        MqttError::Encode(error)
    }
}

impl ProtocolArg {
    pub fn wire(self) -> Protocol {
        match self {
            ProtocolArg::V311 => Protocol::V3_1_1,
            ProtocolArg::V5 => Protocol::V5,
        }
    }
}

impl Qos {
    pub fn wire(self) -> QoS {
        match self {
            Qos::AtMostOnce => QoS::AtMostOnce,
            Qos::AtLeastOnce => QoS::AtLeastOnce,
            Qos::ExactlyOnce => QoS::ExactlyOnce,
        }
    }

    pub fn from_wire(qos: QoS) -> Qos {
        match qos {
            QoS::AtMostOnce => Qos::AtMostOnce,
            QoS::AtLeastOnce => Qos::AtLeastOnce,
            QoS::ExactlyOnce => Qos::ExactlyOnce,
        }
    }
}

pub fn mqtt_str(text: &str) -> Result<Str, MqttError> {
    Str::copy_from(text).map_err(|_| MqttError::BadString(text.to_owned()))
}

/// What the broker told us in CONNACK that bounds our load.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    /// v5 Receive Maximum: QoS>0 PUBLISHes we may have unacknowledged.
    pub receive_maximum: Option<u16>,
}

/// A connected client.
pub struct Conn {
    pub stream: BenchStream,
    pub inbuf: BytesMut,
    pub protocol: Protocol,
    pub limits: ServerLimits,
}

/// Options of one connection.
pub struct ConnectOptions<'a> {
    pub addr: SocketAddr,
    pub source: Option<IpAddr>,
    pub protocol: Protocol,
    pub client_id: &'a str,
    pub keep_alive_s: u16,
    /// Clean start 0 (v5: session expiry 1 h) instead of a clean session.
    pub persistent: bool,
    /// TLS (`--tls-ca`), or plain TCP.
    pub tls: Option<TlsClient>,
}

/// Session Expiry Interval a persistent bench client asks for (v5).
const PERSISTENT_SESSION_EXPIRY_S: u32 = 3600;

/// Opens TCP (and TLS), sends CONNECT, waits for a successful CONNACK.
pub async fn connect(options: &ConnectOptions<'_>) -> Result<Conn, MqttError> {
    let socket = match options.addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    if let Some(source) = options.source {
        socket.bind(SocketAddr::new(source, 0))?;
    }
    let stream = socket.connect(options.addr).await?;
    stream.set_nodelay(true)?;
    let stream = match &options.tls {
        None => BenchStream::Tcp(stream),
        Some(tls) => {
            let handshake = tls.handshake(stream);
            let tls = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake)
                .await
                .map_err(|_| MqttError::Timeout("TLS handshake"))??;
            BenchStream::Tls(Box::new(tls))
        }
    };
    let mut properties = Properties::default();
    if options.protocol.is_v5() {
        // Let the broker send as much as it wants: the load loops ack everything at once.
        properties.receive_maximum = Some(u16::MAX);
        properties.maximum_packet_size = Some(MAX_PACKET_BYTES);
        if options.persistent {
            properties.session_expiry_interval_s = Some(PERSISTENT_SESSION_EXPIRY_S);
        }
    }
    let connect = Packet::Connect(Box::new(Connect {
        protocol: options.protocol,
        clean_start: !options.persistent,
        keep_alive_s: options.keep_alive_s,
        properties,
        client_id: mqtt_str(options.client_id)?,
        will: None,
        username: None,
        password: None,
    }));
    let mut conn = Conn {
        stream,
        inbuf: BytesMut::with_capacity(1024),
        protocol: options.protocol,
        limits: ServerLimits {
            receive_maximum: None,
        },
    };
    conn.send(&connect).await?;
    let packet = tokio::time::timeout(HANDSHAKE_TIMEOUT, conn.next_packet())
        .await
        .map_err(|_| MqttError::Timeout("CONNECT"))??;
    match packet {
        Packet::ConnAck(ack) if ack.reason.is_success() => {
            conn.limits.receive_maximum = ack.properties.receive_maximum;
            Ok(conn)
        }
        Packet::ConnAck(ack) => Err(MqttError::Refused(ack.reason.0)),
        _ => Err(MqttError::Unexpected("packet", "CONNECT")),
    }
}

impl Conn {
    /// Encodes and writes one packet (setup path only; the load loops batch their own writes).
    pub async fn send(&mut self, packet: &Packet) -> Result<(), MqttError> {
        let mut out = BytesMut::new();
        tern_wire::encode(packet, self.protocol, &mut out)?;
        self.stream.write_all(&out).await?;
        self.stream.flush().await?;
        Ok(())
    }

    /// Reads until one whole packet is buffered and returns it.
    pub async fn next_packet(&mut self) -> Result<Packet, MqttError> {
        loop {
            if let Some(packet) =
                tern_wire::decode(&mut self.inbuf, self.protocol, MAX_PACKET_BYTES)?
            {
                return Ok(packet);
            }
            self.inbuf.reserve(4096);
            if self.stream.read_buf(&mut self.inbuf).await? == 0 {
                return Err(MqttError::Closed);
            }
        }
    }

    /// Subscribes to `filters` at `qos` and waits for a SUBACK granting exactly that QoS.
    pub async fn subscribe(&mut self, filters: &[String], qos: Qos) -> Result<(), MqttError> {
        let options = SubscriptionOptions {
            qos: qos.wire(),
            ..SubscriptionOptions::default()
        };
        let filters = filters
            .iter()
            .map(|filter| Ok((mqtt_str(filter)?, options)))
            .collect::<Result<Vec<_>, MqttError>>()?;
        let count = filters.len();
        let packet = Packet::Subscribe(Subscribe {
            packet_id: 1,
            properties: Properties::default(),
            filters,
        });
        self.send(&packet).await?;
        let reply = tokio::time::timeout(HANDSHAKE_TIMEOUT, self.next_packet())
            .await
            .map_err(|_| MqttError::Timeout("SUBSCRIBE"))??;
        let Packet::SubAck(ack) = reply else {
            return Err(MqttError::Unexpected("packet", "SUBSCRIBE"));
        };
        if ack.reasons.len() != count {
            return Err(MqttError::Unexpected("SUBACK length", "SUBSCRIBE"));
        }
        for reason in ack.reasons {
            if !reason.is_success() {
                return Err(MqttError::SubscribeRefused(reason.0));
            }
            if reason.0 != qos.level() {
                return Err(MqttError::Downgraded {
                    wanted: qos.level(),
                    granted: reason.0,
                });
            }
        }
        Ok(())
    }

    /// Sends DISCONNECT (best effort: the run is over either way).
    pub async fn disconnect(&mut self) {
        let packet = Packet::Disconnect(tern_wire::Disconnect {
            reason: ReasonCode::NORMAL_DISCONNECTION,
            properties: Properties::default(),
        });
        let _ = self.send(&packet).await;
        let _ = self.stream.shutdown().await;
    }
}

/// A PUBLISH encoded once; each message copies it and patches packet id and payload header.
#[derive(Debug, Clone)]
pub struct PublishTemplate {
    pub bytes: Bytes,
    /// Offset of the two packet id bytes (QoS>0 only).
    pub packet_id_at: Option<usize>,
    /// Offset of the payload (the bench header is patched there).
    pub payload_at: usize,
}

impl PublishTemplate {
    pub fn new(
        protocol: Protocol,
        topic: &str,
        qos: Qos,
        payload_bytes: usize,
    ) -> Result<PublishTemplate, MqttError> {
        let payload = Bytes::from(vec![0u8; payload_bytes]);
        let build = |packet_id: u16| -> Result<BytesMut, MqttError> {
            let packet = Packet::Publish(Publish {
                dup: false,
                qos: qos.wire(),
                retain: false,
                topic: mqtt_str(topic)?,
                packet_id,
                properties: Properties::default(),
                payload: payload.clone(),
            });
            let mut out = BytesMut::new();
            tern_wire::encode(&packet, protocol, &mut out)?;
            Ok(out)
        };
        let (a, b) = match qos {
            Qos::AtMostOnce => (build(0)?, build(0)?),
            _ => (build(0x0101)?, build(0x0202)?),
        };
        let payload_at = a.len() - payload_bytes;
        // The packet id is wherever the two encodings differ: found, not assumed, so that any
        // encoder layout (e.g. v5 property length placement) is handled.
        let packet_id_at = a.iter().zip(b.iter()).position(|(x, y)| x != y);
        if qos != Qos::AtMostOnce && packet_id_at.is_none_or(|at| at + 2 > payload_at) {
            return Err(MqttError::Unexpected(
                "PUBLISH layout",
                "encoding the template",
            ));
        }
        Ok(PublishTemplate {
            bytes: a.freeze(),
            packet_id_at,
            payload_at,
        })
    }
}

/// Pre-encoded acknowledgement of one kind; [`AckTemplate::push`] patches the packet id.
#[derive(Debug, Clone)]
pub struct AckTemplate {
    bytes: Bytes,
    packet_id_at: usize,
}

#[derive(Debug, Clone, Copy)]
pub enum AckKind {
    PubAck,
    PubRec,
    PubRel,
    PubComp,
}

impl AckTemplate {
    pub fn new(protocol: Protocol, kind: AckKind) -> Result<AckTemplate, MqttError> {
        let ack = Ack {
            packet_id: 0x0101,
            reason: ReasonCode::SUCCESS,
            properties: Properties::default(),
        };
        let packet = match kind {
            AckKind::PubAck => Packet::PubAck(ack),
            AckKind::PubRec => Packet::PubRec(ack),
            AckKind::PubRel => Packet::PubRel(ack),
            AckKind::PubComp => Packet::PubComp(ack),
        };
        let mut out = BytesMut::new();
        tern_wire::encode(&packet, protocol, &mut out)?;
        // Fixed header (2 bytes: remaining length < 128) then the packet id.
        if out.len() < 4 || out[2] != 1 || out[3] != 1 {
            return Err(MqttError::Unexpected("ack layout", "encoding the template"));
        }
        Ok(AckTemplate {
            bytes: out.freeze(),
            packet_id_at: 2,
        })
    }

    #[inline]
    pub fn push(&self, packet_id: u16, out: &mut BytesMut) {
        let start = out.len();
        out.extend_from_slice(&self.bytes);
        out[start + self.packet_id_at..start + self.packet_id_at + 2]
            .copy_from_slice(&packet_id.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payload::Header;

    /// A patched template decodes to the PUBLISH it claims to be, in every version and QoS.
    #[test]
    fn patched_templates_decode_with_their_packet_id_and_header() {
        for protocol in [Protocol::V3_1_1, Protocol::V5] {
            for qos in [Qos::AtMostOnce, Qos::AtLeastOnce, Qos::ExactlyOnce] {
                let template = PublishTemplate::new(protocol, "bench/t", qos, 32).unwrap();
                let mut wire = BytesMut::from(&template.bytes[..]);
                if let Some(at) = template.packet_id_at {
                    wire[at..at + 2].copy_from_slice(&4242u16.to_be_bytes());
                }
                let header = Header {
                    publisher_id: 7,
                    seq: 99,
                    send_time_ns: 123,
                };
                header.write(&mut wire[template.payload_at..]).unwrap();
                let Some(Packet::Publish(publish)) =
                    tern_wire::decode(&mut wire, protocol, MAX_PACKET_BYTES).unwrap()
                else {
                    panic!("not a PUBLISH");
                };
                assert_eq!(publish.qos, qos.wire());
                assert_eq!(&*publish.topic, "bench/t");
                assert_eq!(
                    publish.packet_id,
                    if qos == Qos::AtMostOnce { 0 } else { 4242 }
                );
                assert_eq!(publish.payload.len(), 32);
                assert_eq!(Header::read(&publish.payload).unwrap(), header);
                assert!(wire.is_empty());
            }
        }
    }

    #[test]
    fn ack_templates_decode_with_their_packet_id() {
        for protocol in [Protocol::V3_1_1, Protocol::V5] {
            let mut wire = BytesMut::new();
            for kind in [
                AckKind::PubAck,
                AckKind::PubRec,
                AckKind::PubRel,
                AckKind::PubComp,
            ] {
                AckTemplate::new(protocol, kind)
                    .unwrap()
                    .push(513, &mut wire);
            }
            let mut kinds = Vec::new();
            while let Some(packet) =
                tern_wire::decode(&mut wire, protocol, MAX_PACKET_BYTES).unwrap()
            {
                let (name, ack) = match packet {
                    Packet::PubAck(ack) => ("puback", ack),
                    Packet::PubRec(ack) => ("pubrec", ack),
                    Packet::PubRel(ack) => ("pubrel", ack),
                    Packet::PubComp(ack) => ("pubcomp", ack),
                    other => panic!("unexpected {other:?}"),
                };
                assert_eq!(ack.packet_id, 513);
                assert!(ack.reason.is_success());
                kinds.push(name);
            }
            assert_eq!(kinds, ["puback", "pubrec", "pubrel", "pubcomp"]);
        }
    }
}
