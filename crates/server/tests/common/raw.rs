//! A raw MQTT client: a TCP stream plus tern-wire's `encode`/`decode`, for edge cases that
//! third-party clients cannot produce (and for QoS 2 windows, which rumqttc gets wrong).
//! Malformed packets are written as literal byte arrays (see [`RawClient::send_bytes`]) so that
//! a codec bug cannot hide a broker bug.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

#[allow(unused_imports)]
pub use tern_wire::{
    Ack, ConnAck, Connect, Disconnect, Packet, Properties, Protocol, Publish, QoS, ReasonCode,
    RetainHandling, Str, SubAck, Subscribe, SubscriptionOptions, UnsubAck, Unsubscribe, Will,
};

use super::WAIT;

/// Largest packet the test client accepts from the broker (the broker's own limits are what
/// the tests look at, not ours).
const CLIENT_MAX_PACKET_BYTES: u32 = 64 * 1024 * 1024;

/// How the broker answered a SUBSCRIBE it may refuse.
#[derive(Debug, PartialEq)]
pub enum SubOutcome {
    Acked(Vec<ReasonCode>),
    /// Connection closed; the v5 DISCONNECT reason if one came.
    Closed(Option<ReasonCode>),
}

/// What one bounded read produced.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // test helper: one value at a time
pub enum Recv {
    Packet(Packet),
    /// EOF or connection reset.
    Closed,
    Timeout,
    /// The broker sent bytes that tern-wire rejects.
    Undecodable(String),
}

pub struct RawClient {
    stream: TcpStream,
    buf: BytesMut,
    /// Packets read ahead (PUBLISHes that arrived before an awaited SUBACK), returned first.
    pending: VecDeque<Packet>,
    /// Version used to decode what the broker sends (set from the CONNECT we sent).
    pub protocol: Protocol,
}

/// A short description of a packet for failure messages (payloads can be megabytes).
pub fn brief(p: &Packet) -> String {
    match p {
        Packet::Publish(m) => format!(
            "PUBLISH(topic={:?}, qos={:?}, id={}, dup={}, retain={}, {} payload bytes, props={:?})",
            m.topic,
            m.qos,
            m.packet_id,
            m.dup,
            m.retain,
            m.payload.len(),
            m.properties
        ),
        other => format!("{other:?}"),
    }
}

/// [`brief`] of a list, long lists cut in the middle.
pub fn briefs(ps: &[Packet]) -> String {
    if ps.len() <= 8 {
        return format!("[{}]", ps.iter().map(brief).collect::<Vec<_>>().join(", "));
    }
    let head: Vec<String> = ps[..4].iter().map(brief).collect();
    let tail: Vec<String> = ps[ps.len() - 3..].iter().map(brief).collect();
    format!(
        "[{}, ... {} more ..., {}]",
        head.join(", "),
        ps.len() - 7,
        tail.join(", ")
    )
}

impl std::fmt::Display for Recv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Recv::Packet(p) => f.write_str(&brief(p)),
            other => write!(f, "{other:?}"),
        }
    }
}

/// `Str` from test text.
pub fn s(text: &str) -> Str {
    Str::copy_from(text).expect("test strings have no U+0000")
}

/// A clean-start v5 CONNECT without keep alive; tests adjust the other fields.
pub fn v5_connect(client_id: &str) -> Connect {
    connect_packet(Protocol::V5, client_id, true, 0)
}

/// A CONNECT with the given basics; tests adjust the other fields.
pub fn connect_packet(
    protocol: Protocol,
    client_id: &str,
    clean_start: bool,
    keep_alive_s: u16,
) -> Connect {
    Connect {
        protocol,
        clean_start,
        keep_alive_s,
        properties: Properties::default(),
        client_id: s(client_id),
        will: None,
        username: None,
        password: None,
    }
}

pub fn qos(level: u8) -> QoS {
    QoS::from_u8(level).expect("qos 0..=2")
}

pub fn publish(topic: &str, payload: &[u8], qos_level: u8, packet_id: u16) -> Publish {
    Publish {
        dup: false,
        qos: qos(qos_level),
        retain: false,
        topic: s(topic),
        packet_id,
        properties: Properties::default(),
        payload: Bytes::copy_from_slice(payload),
    }
}

pub fn opts(qos_level: u8) -> SubscriptionOptions {
    SubscriptionOptions {
        qos: qos(qos_level),
        ..SubscriptionOptions::default()
    }
}

pub fn subscribe(packet_id: u16, filters: &[(&str, SubscriptionOptions)]) -> Subscribe {
    Subscribe {
        packet_id,
        properties: Properties::default(),
        filters: filters.iter().map(|(f, o)| (s(f), *o)).collect(),
    }
}

pub fn ack(packet_id: u16) -> Ack {
    Ack {
        packet_id,
        reason: ReasonCode::SUCCESS,
        properties: Properties::default(),
    }
}

impl RawClient {
    /// The client end's local port (the broker sees it as the peer's port).
    pub fn local_port(&self) -> u16 {
        self.stream.local_addr().map_or(0, |a| a.port())
    }

    /// Opens a TCP connection (nothing sent yet).
    pub async fn open(addr: SocketAddr, protocol: Protocol) -> RawClient {
        let stream = tokio::time::timeout(WAIT, TcpStream::connect(addr))
            .await
            .expect("tcp connect timed out")
            .expect("tcp connect");
        stream.set_nodelay(true).expect("nodelay");
        RawClient {
            stream,
            buf: BytesMut::with_capacity(16 * 1024),
            pending: VecDeque::new(),
            protocol,
        }
    }

    /// Opens a TCP connection whose receive buffer is small, for a subscriber that stops
    /// reading: the broker's queue then fills after little data.
    pub async fn open_small_window(addr: SocketAddr, protocol: Protocol) -> RawClient {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
        let stream = tokio::time::timeout(WAIT, socket.connect(addr))
            .await
            .expect("tcp connect timed out")
            .expect("tcp connect");
        RawClient {
            stream,
            buf: BytesMut::with_capacity(16 * 1024),
            pending: VecDeque::new(),
            protocol,
        }
    }

    /// Opens a connection, sends `connect` and returns the client with the broker's first packet.
    pub async fn connect_with(addr: SocketAddr, connect: Connect) -> (RawClient, Packet) {
        let mut c = RawClient::open(addr, connect.protocol).await;
        c.send(&Packet::Connect(Box::new(connect))).await;
        let first = c.expect_packet().await;
        (c, first)
    }

    /// Connects and asserts a successful CONNACK.
    pub async fn connect_ok(addr: SocketAddr, connect: Connect) -> (RawClient, ConnAck) {
        let (c, first) = RawClient::connect_with(addr, connect).await;
        match first {
            Packet::ConnAck(ca) if ca.reason == ReasonCode::SUCCESS => (c, ca),
            other => panic!("expected successful CONNACK, got {other:?}"),
        }
    }

    /// v5 client with clean start, keep alive 0 (no keep-alive timer), no properties.
    pub async fn v5(addr: SocketAddr, client_id: &str) -> RawClient {
        RawClient::connect_ok(addr, connect_packet(Protocol::V5, client_id, true, 0))
            .await
            .0
    }

    /// 3.1.1 client with clean session, keep alive 0.
    pub async fn v4(addr: SocketAddr, client_id: &str) -> RawClient {
        RawClient::connect_ok(addr, connect_packet(Protocol::V3_1_1, client_id, true, 0))
            .await
            .0
    }

    pub async fn send(&mut self, packet: &Packet) {
        let mut out = BytesMut::new();
        tern_wire::encode(packet, self.protocol, &mut out).expect("encode test packet");
        self.send_bytes(&out).await;
    }

    /// Sends `packets` with one write: on loopback a small write arrives as one segment, which
    /// the broker reads at once, so it has read them all before it acts on any of them.
    pub async fn send_all(&mut self, packets: &[Packet]) {
        let mut out = BytesMut::new();
        for packet in packets {
            tern_wire::encode(packet, self.protocol, &mut out).expect("encode test packet");
        }
        self.send_bytes(&out).await;
    }

    /// Writes bytes as they are. Errors are ignored: the broker may already have closed the
    /// connection, which the test then observes with [`RawClient::expect_closed`].
    pub async fn send_bytes(&mut self, bytes: &[u8]) {
        let _ = self.stream.write_all(bytes).await;
        let _ = self.stream.flush().await;
    }

    /// One bounded read of the next packet.
    pub async fn recv(&mut self, timeout: Duration) -> Recv {
        if let Some(p) = self.pending.pop_front() {
            return Recv::Packet(p);
        }
        let deadline = Instant::now() + timeout;
        loop {
            match tern_wire::decode(&mut self.buf, self.protocol, CLIENT_MAX_PACKET_BYTES) {
                Ok(Some(packet)) => return Recv::Packet(packet),
                Ok(None) => {}
                Err(e) => return Recv::Undecodable(format!("{e:?}")),
            }
            match tokio::time::timeout_at(deadline, self.stream.read_buf(&mut self.buf)).await {
                Err(_) => return Recv::Timeout,
                Ok(Ok(0)) | Ok(Err(_)) => return Recv::Closed,
                Ok(Ok(_)) => {}
            }
        }
    }

    /// The next packet; fails the test if none arrives within [`WAIT`].
    pub async fn expect_packet(&mut self) -> Packet {
        self.expect_packet_within(WAIT).await
    }

    pub async fn expect_packet_within(&mut self, timeout: Duration) -> Packet {
        match self.recv(timeout).await {
            Recv::Packet(p) => p,
            other => panic!("expected a packet within {timeout:?}, got {other}"),
        }
    }

    /// Asserts that the broker closes the connection within `timeout`. Returns the packets that
    /// arrived before the close (e.g. a v5 DISCONNECT).
    pub async fn expect_closed_within(&mut self, timeout: Duration) -> Vec<Packet> {
        let deadline = Instant::now() + timeout;
        let mut before = Vec::new();
        loop {
            match self
                .recv(deadline.saturating_duration_since(Instant::now()))
                .await
            {
                Recv::Packet(p) => before.push(p),
                Recv::Closed => return before,
                Recv::Timeout => panic!(
                    "connection still open after {timeout:?}; packets received meanwhile: {}",
                    briefs(&before)
                ),
                Recv::Undecodable(e) => {
                    panic!(
                        "undecodable bytes from broker: {e} after {}",
                        briefs(&before)
                    )
                }
            }
        }
    }

    pub async fn expect_closed(&mut self) -> Vec<Packet> {
        self.expect_closed_within(WAIT).await
    }

    /// Asserts that the connection is closed with no packet at all before the close.
    pub async fn expect_closed_silently(&mut self) {
        let before = self.expect_closed().await;
        assert!(
            before.is_empty(),
            "expected a close without any packet, got {before:?}"
        );
    }

    /// v5: asserts a DISCONNECT arrives (optionally after other packets, which are returned)
    /// followed by the close; returns the DISCONNECT's reason code.
    pub async fn expect_disconnect(&mut self) -> ReasonCode {
        self.expect_disconnect_within(WAIT).await
    }

    pub async fn expect_disconnect_within(&mut self, timeout: Duration) -> ReasonCode {
        let before = self.expect_closed_within(timeout).await;
        match before.last() {
            Some(Packet::Disconnect(d)) => d.reason,
            _ => panic!("expected DISCONNECT then close, got {}", briefs(&before)),
        }
    }

    /// Reads raw bytes until the broker closes the connection (bounded by [`WAIT`]); for
    /// answers that must not go through the codec (e.g. a CONNACK for an unknown version).
    pub async fn expect_closed_raw(&mut self) -> Vec<u8> {
        let deadline = Instant::now() + WAIT;
        loop {
            match tokio::time::timeout_at(deadline, self.stream.read_buf(&mut self.buf)).await {
                Err(_) => panic!(
                    "connection still open after {WAIT:?}; bytes so far: {:02x?}",
                    &self.buf[..]
                ),
                Ok(Ok(0)) | Ok(Err(_)) => return self.buf.split().to_vec(),
                Ok(Ok(_)) => {}
            }
        }
    }

    /// Asserts that nothing arrives (and the connection stays open) for `quiet`.
    pub async fn expect_nothing(&mut self, quiet: Duration) {
        match self.recv(quiet).await {
            Recv::Timeout => {}
            other => panic!("expected nothing for {quiet:?}, got {other}"),
        }
    }

    pub async fn expect_publish(&mut self) -> Publish {
        match self.expect_packet().await {
            Packet::Publish(p) => p,
            other => panic!("expected PUBLISH, got {}", brief(&other)),
        }
    }

    /// Sends SUBSCRIBE and returns the SUBACK's reason codes (asserting the packet id).
    /// PUBLISHes that arrive before the SUBACK (the specs do not order retained messages
    /// against it) are kept and returned by the next reads.
    pub async fn subscribe(&mut self, packet: Subscribe) -> Vec<ReasonCode> {
        let id = packet.packet_id;
        self.send(&Packet::Subscribe(packet)).await;
        let mut early = Vec::new();
        let reasons = loop {
            match self.expect_packet().await {
                Packet::SubAck(sa) => {
                    assert_eq!(sa.packet_id, id, "SUBACK packet id [MQTT-3.8.4-2]");
                    break sa.reasons;
                }
                p @ Packet::Publish(_) => early.push(p),
                other => panic!("expected SUBACK, got {}", brief(&other)),
            }
        };
        for p in early.into_iter().rev() {
            self.pending.push_front(p);
        }
        reasons
    }

    /// Sends SUBSCRIBE for a request the broker may refuse either way the specs allow: with a
    /// SUBACK failure code per filter, or by treating the packet as malformed and closing
    /// (v5: after a DISCONNECT).
    pub async fn try_subscribe(&mut self, packet: Subscribe) -> SubOutcome {
        let id = packet.packet_id;
        self.send(&Packet::Subscribe(packet)).await;
        match self.recv(WAIT).await {
            Recv::Packet(Packet::SubAck(sa)) => {
                assert_eq!(sa.packet_id, id, "SUBACK packet id [MQTT-3.8.4-2]");
                SubOutcome::Acked(sa.reasons)
            }
            Recv::Packet(Packet::Disconnect(d)) => {
                let rest = self.expect_closed().await;
                assert!(rest.is_empty(), "packets after DISCONNECT: {rest:?}");
                SubOutcome::Closed(Some(d.reason))
            }
            Recv::Closed => SubOutcome::Closed(None),
            other => panic!("expected SUBACK or close, got {other}"),
        }
    }

    /// Subscribes to one filter at `qos_level` and asserts it was granted that QoS.
    pub async fn sub(&mut self, filter: &str, qos_level: u8) {
        let reasons = self
            .subscribe(subscribe(1, &[(filter, opts(qos_level))]))
            .await;
        assert_eq!(reasons, vec![ReasonCode(qos_level)], "SUBACK for {filter}");
    }

    /// The next packet that is not a PUBLISH; PUBLISHes read meanwhile are kept (in order) for
    /// later reads. Lets a handshake proceed while deliveries interleave with it.
    pub async fn expect_non_publish(&mut self) -> Packet {
        let mut deferred = Vec::new();
        let found = loop {
            match self.expect_packet().await {
                p @ Packet::Publish(_) => deferred.push(p),
                other => break other,
            }
        };
        for p in deferred.into_iter().rev() {
            self.pending.push_front(p);
        }
        found
    }

    /// Publishes and completes the handshake for its QoS (PUBACK, or PUBREC/PUBREL/PUBCOMP).
    /// PUBLISHes delivered to this client meanwhile are kept for later reads.
    pub async fn publish_acked(&mut self, p: Publish) {
        let id = p.packet_id;
        let level = p.qos;
        self.send(&Packet::Publish(p)).await;
        match level {
            QoS::AtMostOnce => {}
            QoS::AtLeastOnce => match self.expect_non_publish().await {
                Packet::PubAck(a) if a.packet_id == id => {
                    assert!(a.reason.is_success(), "PUBACK reason {:?}", a.reason)
                }
                other => panic!("expected PUBACK {id}, got {}", brief(&other)),
            },
            QoS::ExactlyOnce => {
                match self.expect_non_publish().await {
                    Packet::PubRec(a) if a.packet_id == id => {
                        assert!(a.reason.is_success(), "PUBREC reason {:?}", a.reason)
                    }
                    other => panic!("expected PUBREC {id}, got {}", brief(&other)),
                }
                self.send(&Packet::PubRel(ack(id))).await;
                match self.expect_non_publish().await {
                    Packet::PubComp(a) if a.packet_id == id => {}
                    other => panic!("expected PUBCOMP {id}, got {}", brief(&other)),
                }
            }
        }
    }

    /// Receives one PUBLISH and acknowledges it per its QoS (for QoS 2: PUBREC, expects PUBREL,
    /// sends PUBCOMP; later PUBLISHes arriving before the PUBREL are kept for later reads).
    pub async fn receive_acked(&mut self) -> Publish {
        let p = self.expect_publish().await;
        match p.qos {
            QoS::AtMostOnce => {}
            QoS::AtLeastOnce => self.send(&Packet::PubAck(ack(p.packet_id))).await,
            QoS::ExactlyOnce => {
                self.send(&Packet::PubRec(ack(p.packet_id))).await;
                match self.expect_non_publish().await {
                    Packet::PubRel(a) if a.packet_id == p.packet_id => {}
                    other => panic!("expected PUBREL {}, got {}", p.packet_id, brief(&other)),
                }
                self.send(&Packet::PubComp(ack(p.packet_id))).await;
            }
        }
        p
    }

    /// A round trip through the broker (PINGREQ → PINGRESP): everything the broker sent before
    /// answering is returned. Useful as a barrier after fire-and-forget packets.
    pub async fn ping(&mut self) -> Vec<Packet> {
        self.send(&Packet::PingReq).await;
        let mut before = Vec::new();
        loop {
            match self.expect_packet().await {
                Packet::PingResp => return before,
                other => before.push(other),
            }
        }
    }

    /// Normal DISCONNECT (0x00) and close, then waits (bounded) until the broker has closed its
    /// side too. Without the wait, a message published right after could still reach the
    /// closing connection and be in flight there, so the next connection would get it resent
    /// (MQTT-4.4.0-1) instead of queued, and tests of queued messages would race.
    pub async fn disconnect(mut self) {
        let d = Disconnect {
            reason: ReasonCode::NORMAL_DISCONNECTION,
            properties: Properties::default(),
        };
        self.send(&Packet::Disconnect(d)).await;
        let _ = self.stream.shutdown().await;
        let deadline = Instant::now() + WAIT;
        loop {
            self.buf.clear();
            match tokio::time::timeout_at(deadline, self.stream.read_buf(&mut self.buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return,
                Ok(Ok(_)) => {}
            }
        }
    }

    /// Closes the socket without DISCONNECT (an abnormal close for the broker).
    pub async fn drop_connection(mut self) {
        let _ = self.stream.shutdown().await;
    }
}

/// A hand-assembled CONNECT (no codec involved): protocol name "MQTT", `level`, `flags`,
/// keep alive `keep_alive_s`, for level 5 an empty property block, then `client_id` and `tail`
/// (the rest of the payload, e.g. will fields), with a one-byte remaining length.
pub fn connect_bytes(
    level: u8,
    flags: u8,
    keep_alive_s: u16,
    client_id: &str,
    tail: &[u8],
) -> Vec<u8> {
    connect_bytes_with_properties(level, flags, keep_alive_s, &[], client_id, tail)
}

/// [`connect_bytes`] with a v5 property block (`properties` without its length byte).
pub fn connect_bytes_with_properties(
    level: u8,
    flags: u8,
    keep_alive_s: u16,
    properties: &[u8],
    client_id: &str,
    tail: &[u8],
) -> Vec<u8> {
    let mut body = vec![0x00, 0x04, b'M', b'Q', b'T', b'T', level, flags];
    body.extend_from_slice(&keep_alive_s.to_be_bytes());
    if level == 5 {
        assert!(properties.len() < 128);
        body.push(properties.len() as u8);
        body.extend_from_slice(properties);
    }
    body.extend_from_slice(&(client_id.len() as u16).to_be_bytes());
    body.extend_from_slice(client_id.as_bytes());
    body.extend_from_slice(tail);
    assert!(
        body.len() < 128,
        "connect_bytes builds one-byte remaining lengths only"
    );
    let mut packet = vec![0x10, body.len() as u8];
    packet.extend_from_slice(&body);
    packet
}
