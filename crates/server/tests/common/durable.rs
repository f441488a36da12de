//! Clients for the durability tests: a raw tern-wire connection that never panics on a dead
//! broker (the tests kill it on purpose), and publishers / subscribers that keep their MQTT
//! session state (packet ids in flight, QoS 2 received set) across reconnects, as a real
//! client with a persistent session must.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tern_wire::{Ack, Connect, Packet, Properties, Protocol, Publish, QoS, ReasonCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::raw::{connect_packet, opts, s, subscribe};

/// Packets a client keeps unacknowledged (the "256 in flight").
pub const WINDOW: usize = 256;
const POLL: Duration = Duration::from_millis(20);

pub struct Conn {
    stream: TcpStream,
    buf: BytesMut,
    protocol: Protocol,
    /// The CONNACK's Session Present flag.
    pub session_present: bool,
}

fn ack(packet_id: u16) -> Ack {
    Ack {
        packet_id,
        reason: ReasonCode::SUCCESS,
        properties: Properties::default(),
    }
}

impl Conn {
    /// Connects; `None` if the broker is not there or refuses.
    pub async fn connect(addr: SocketAddr, connect: Connect) -> Option<Conn> {
        let stream = tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(addr))
            .await
            .ok()?
            .ok()?;
        let _ = stream.set_nodelay(true);
        let mut c = Conn {
            stream,
            buf: BytesMut::with_capacity(64 * 1024),
            protocol: connect.protocol,
            session_present: false,
        };
        if !c.send(&Packet::Connect(Box::new(connect))).await {
            return None;
        }
        match c.recv(Duration::from_secs(5)).await {
            Ok(Some(Packet::ConnAck(ca))) if ca.reason == ReasonCode::SUCCESS => {
                c.session_present = ca.session_present;
                Some(c)
            }
            _ => None,
        }
    }

    pub async fn send(&mut self, packet: &Packet) -> bool {
        let mut out = BytesMut::new();
        if tern_wire::encode(packet, self.protocol, &mut out).is_err() {
            return false;
        }
        self.stream.write_all(&out).await.is_ok()
    }

    /// `Ok(None)` on timeout, `Err(())` once the connection is gone.
    pub async fn recv(&mut self, timeout: Duration) -> Result<Option<Packet>, ()> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tern_wire::decode(&mut self.buf, self.protocol, u32::MAX) {
                Ok(Some(p)) => return Ok(Some(p)),
                Ok(None) => {}
                Err(_) => return Err(()),
            }
            match tokio::time::timeout_at(deadline, self.stream.read_buf(&mut self.buf)).await {
                Err(_) => return Ok(None),
                Ok(Ok(0)) | Ok(Err(_)) => return Err(()),
                Ok(Ok(_)) => {}
            }
        }
    }
}

pub fn persistent_connect(protocol: Protocol, client_id: &str) -> Connect {
    let mut c = connect_packet(protocol, client_id, false, 0);
    if protocol.is_v5() {
        c.properties.session_expiry_interval_s = Some(u32::MAX);
    }
    c
}

/// A publisher of numbered messages ("0", "1", ...) on one topic at one QoS.
pub struct Publisher {
    pub client_id: String,
    pub protocol: Protocol,
    pub qos: u8,
    pub topic: String,
    /// Next number to publish; numbers below `limit` are published.
    pub next: u64,
    pub limit: u64,
    /// In flight: number → (packet id, PUBREC received).
    pub inflight: BTreeMap<u64, (u16, bool)>,
    by_packet_id: HashMap<u16, u64>,
    next_packet_id: u16,
    /// Numbers whose PUBACK (QoS 1) or PUBREC (QoS 2) arrived: the broker owes them.
    pub acked: HashSet<u64>,
}

impl Publisher {
    pub fn new(client_id: &str, protocol: Protocol, qos: u8, topic: &str) -> Publisher {
        Publisher {
            client_id: client_id.into(),
            protocol,
            qos,
            topic: topic.into(),
            next: 0,
            limit: 0,
            inflight: BTreeMap::new(),
            by_packet_id: HashMap::new(),
            next_packet_id: 0,
            acked: HashSet::new(),
        }
    }

    pub fn done(&self) -> bool {
        self.next >= self.limit && self.inflight.is_empty()
    }

    fn publish_packet(&self, number: u64, packet_id: u16, dup: bool) -> Packet {
        Packet::Publish(Publish {
            dup,
            qos: QoS::from_u8(self.qos).expect("qos"),
            retain: false,
            topic: s(&self.topic),
            packet_id,
            properties: Properties::default(),
            payload: Bytes::from(number.to_string()),
        })
    }

    fn allocate(&mut self) -> u16 {
        loop {
            self.next_packet_id = self.next_packet_id.wrapping_add(1);
            if self.next_packet_id != 0 && !self.by_packet_id.contains_key(&self.next_packet_id) {
                return self.next_packet_id;
            }
        }
    }

    /// Runs until the connection dies, `run_for` passes, or (with `until_done`) everything
    /// up to `limit` is acknowledged and completed.
    pub async fn run(mut self, addr: SocketAddr, run_for: Duration, until_done: bool) -> Self {
        let started = Instant::now();
        let Some(mut c) =
            Conn::connect(addr, persistent_connect(self.protocol, &self.client_id)).await
        else {
            return self;
        };
        // Session resumed: everything in flight is resent in order (DUP, or PUBREL).
        let resend: Vec<(u64, u16, bool)> = self
            .inflight
            .iter()
            .map(|(&n, &(pi, rel))| (n, pi, rel))
            .collect();
        for (number, packet_id, released) in resend {
            let packet = if released {
                Packet::PubRel(ack(packet_id))
            } else {
                self.publish_packet(number, packet_id, true)
            };
            if !c.send(&packet).await {
                return self;
            }
        }
        loop {
            if started.elapsed() > run_for || (until_done && self.done()) {
                return self;
            }
            while self.inflight.len() < WINDOW && self.next < self.limit {
                let number = self.next;
                let packet_id = self.allocate();
                self.next += 1;
                self.inflight.insert(number, (packet_id, false));
                self.by_packet_id.insert(packet_id, number);
                if !c.send(&self.publish_packet(number, packet_id, false)).await {
                    return self;
                }
            }
            let packet = match c.recv(POLL).await {
                Err(()) => return self,
                Ok(None) => continue,
                Ok(Some(p)) => p,
            };
            match packet {
                Packet::PubAck(a) => {
                    if let Some(number) = self.by_packet_id.remove(&a.packet_id) {
                        self.inflight.remove(&number);
                        self.acked.insert(number);
                    }
                }
                Packet::PubRec(a) => {
                    if let Some(&number) = self.by_packet_id.get(&a.packet_id) {
                        assert!(a.reason.is_success(), "PUBREC {:?}", a.reason);
                        self.acked.insert(number);
                        if let Some(entry) = self.inflight.get_mut(&number) {
                            entry.1 = true;
                        }
                        if !c.send(&Packet::PubRel(ack(a.packet_id))).await {
                            return self;
                        }
                    }
                }
                Packet::PubComp(a) => {
                    let released = self
                        .by_packet_id
                        .get(&a.packet_id)
                        .and_then(|n| self.inflight.get(n))
                        .is_some_and(|e| e.1);
                    if released {
                        if let Some(number) = self.by_packet_id.remove(&a.packet_id) {
                            self.inflight.remove(&number);
                        }
                    }
                }
                _ => {}
            }
        }
    }
}

/// A subscriber with a persistent session; records every delivery (numbers, in order).
pub struct Subscriber {
    pub client_id: String,
    pub protocol: Protocol,
    pub qos: u8,
    pub filter: String,
    pub subscribed: bool,
    /// Application deliveries, in arrival order.
    pub got: Vec<u64>,
    /// The distinct numbers in `got`.
    pub have: HashSet<u64>,
    /// QoS 2 packet ids received and not yet released (Method B receiver).
    received: HashSet<u16>,
}

impl Subscriber {
    pub fn new(client_id: &str, protocol: Protocol, qos: u8, filter: &str) -> Subscriber {
        Subscriber {
            client_id: client_id.into(),
            protocol,
            qos,
            filter: filter.into(),
            subscribed: false,
            got: Vec::new(),
            have: HashSet::new(),
            received: HashSet::new(),
        }
    }

    pub async fn run(
        mut self,
        addr: SocketAddr,
        run_for: Duration,
        until: Option<HashSet<u64>>,
    ) -> Self {
        let started = Instant::now();
        let Some(mut c) =
            Conn::connect(addr, persistent_connect(self.protocol, &self.client_id)).await
        else {
            return self;
        };
        if !self.subscribed {
            let sub = subscribe(1, &[(self.filter.as_str(), opts(self.qos))]);
            if !c.send(&Packet::Subscribe(sub)).await {
                return self;
            }
        }
        loop {
            if started.elapsed() > run_for {
                return self;
            }
            if let Some(wanted) = &until {
                if self.subscribed && self.received.is_empty() && wanted.is_subset(&self.have) {
                    return self;
                }
            }
            let packet = match c.recv(POLL).await {
                Err(()) => return self,
                Ok(None) => continue,
                Ok(Some(p)) => p,
            };
            let reply = match packet {
                Packet::SubAck(sa) => {
                    assert_eq!(sa.reasons, vec![ReasonCode(self.qos)]);
                    self.subscribed = true;
                    None
                }
                Packet::Publish(p) => {
                    let number: u64 = std::str::from_utf8(&p.payload)
                        .ok()
                        .and_then(|t| t.parse().ok())
                        .unwrap_or_else(|| panic!("unexpected payload {:?}", p.payload));
                    match p.qos {
                        QoS::AtMostOnce => {
                            self.deliver(number);
                            None
                        }
                        QoS::AtLeastOnce => {
                            self.deliver(number);
                            Some(Packet::PubAck(ack(p.packet_id)))
                        }
                        QoS::ExactlyOnce => {
                            // Method B: deliver on PUBLISH unless the packet id is held.
                            if self.received.insert(p.packet_id) {
                                self.deliver(number);
                            }
                            Some(Packet::PubRec(ack(p.packet_id)))
                        }
                    }
                }
                Packet::PubRel(a) => {
                    self.received.remove(&a.packet_id);
                    Some(Packet::PubComp(ack(a.packet_id)))
                }
                _ => None,
            };
            if let Some(reply) = reply {
                if !c.send(&reply).await {
                    return self;
                }
            }
        }
    }
}

impl Subscriber {
    fn deliver(&mut self, number: u64) {
        self.got.push(number);
        self.have.insert(number);
    }
}

/// Numbers in `got` that arrived for the first time out of increasing order.
pub fn first_time_order_violations(got: &[u64]) -> Vec<(u64, u64)> {
    let mut seen = HashSet::new();
    let mut last: Option<u64> = None;
    let mut bad = Vec::new();
    for &n in got {
        if !seen.insert(n) {
            continue;
        }
        if let Some(l) = last {
            if n < l {
                bad.push((l, n));
            }
        }
        last = Some(n);
    }
    bad
}

/// Numbers delivered more than once.
pub fn duplicates(got: &[u64]) -> Vec<u64> {
    let mut seen = HashSet::new();
    got.iter().copied().filter(|n| !seen.insert(*n)).collect()
}
