//! The simulator's clients: raw tern-wire connections (adapted from
//! crates/server/tests/common/durable.rs) and publishers (subscribers: `subscriber.rs`) with
//! persistent sessions whose MQTT session state (packet ids in flight, the QoS 2 received set) lives in
//! the client, outside the broker, and so survives every fault. Each runs as a task that
//! reconnects whenever its connection dies and resends what the spec says it must.
//!
//! Their state sits behind a mutex the controller reads (progress, completion, the checker),
//! locked only between awaits.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use tern_broker::ByteStream;
use tern_store::sim::SimDisk;
use tern_wire::{Ack, Connect, Packet, Properties, Protocol, Publish, QoS, ReasonCode, Str};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub(super) const POLL: Duration = Duration::from_millis(20);
/// How long a packet may take to be accepted by the connection before it counts as dead.
const SEND_TIMEOUT: Duration = Duration::from_secs(1);

/// Where the broker listens.
pub enum Endpoint {
    /// Real loopback TCP (the scripted probes' runner, `tcp.rs`): `None` while it is down.
    Tcp(Mutex<Option<SocketAddr>>),
    /// The turmoil host [`BROKER_HOST`] (the seed runner, `run.rs`): whether it is up.
    Sim(AtomicBool),
}

/// The turmoil host name of the broker and the port it listens on.
pub const BROKER_HOST: &str = "broker";
pub const BROKER_PORT: u16 = 1883;

/// What the clients share with the controller: where the broker listens, a stop flag, and
/// the number of messages acknowledged so far (faults strike at seeded values of it).
pub struct Net {
    pub endpoint: Endpoint,
    pub stop: AtomicBool,
    pub acks: AtomicU64,
    /// The broker's boot (0 = first), as the controller last started it.
    pub boot: AtomicU64,
    /// The disk: once its boot moved on (a power loss or crash struck), the broker that
    /// still runs until the controller kills it is dead, and no client connects to it.
    pub disk: SimDisk,
    /// Let clients connect to such a broker all the same: a broker whose disk failed under
    /// it (`--linger`; how seed 9 found the QoS 2 retry bug, docs/simulation.md).
    pub linger: bool,
    /// A digest of every packet every client sent and received, in order, with the
    /// simulation's virtual time (equal digests: the clients saw the same run).
    events: Mutex<u64>,
    /// A counter that orders events across clients (`clean.rs`): the run is one thread.
    stamps: AtomicU64,
    /// The broker's PUBLISH refusals at its bounds so far, over every boot (the seed runner's
    /// gauges, `bounds.rs`; none on the probes' runner): see [`PubState::refused`].
    pub refusals: Mutex<Option<Box<dyn Fn() -> u64 + Send>>>,
}

impl Net {
    pub fn new(endpoint: Endpoint, disk: &SimDisk, linger: bool) -> Net {
        Net {
            endpoint,
            stop: AtomicBool::new(false),
            acks: AtomicU64::new(0),
            boot: AtomicU64::new(0),
            disk: disk.clone(),
            linger,
            events: Mutex::new(0),
            stamps: AtomicU64::new(0),
            refusals: Mutex::new(None),
        }
    }

    /// PUBLISHes the broker refused at its bounds so far (0 without gauges).
    fn refusals(&self) -> u64 {
        self.refusals.lock().as_ref().map_or(0, |f| f())
    }

    /// Whether the broker at the advertised address still has its disk.
    fn alive(&self, boot: u64) -> bool {
        self.linger || self.disk.boot() == boot
    }

    /// The next value of a counter that orders what the clients do.
    pub fn stamp(&self) -> u64 {
        self.stamps.fetch_add(1, Ordering::Relaxed)
    }

    /// Folds one client event (who, direction, bytes) into the event digest, with the
    /// simulation's virtual time.
    fn log(&self, who: &str, dir: u8, bytes: &[u8]) {
        use std::hash::{Hash, Hasher};
        let mut digest = self.events.lock();
        // `DefaultHasher::new()` has fixed keys: the same input hashes the same in every run.
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (*digest, who, dir, turmoil::sim_elapsed(), bytes).hash(&mut h);
        *digest = h.finish();
    }

    pub fn events_digest(&self) -> u64 {
        *self.events.lock()
    }
}

pub fn s(text: &str) -> Str {
    Str::copy_from(text).expect("no U+0000")
}

pub(super) fn ack(packet_id: u16) -> Ack {
    Ack {
        packet_id,
        reason: ReasonCode::SUCCESS,
        properties: Properties::default(),
    }
}

/// A clean-start CONNECT whose session ends with the connection.
pub fn clean_connect(protocol: Protocol, client_id: &str) -> Connect {
    let mut c = connect_with(protocol, client_id, None);
    c.clean_start = true;
    c.properties.session_expiry_interval_s = None;
    c
}

pub fn persistent_connect(protocol: Protocol, client_id: &str) -> Connect {
    connect_with(protocol, client_id, None)
}

/// A persistent session's CONNECT; `receive_maximum` (v5) bounds what the broker sends
/// before acknowledgements come back.
fn connect_with(protocol: Protocol, client_id: &str, receive_maximum: Option<u16>) -> Connect {
    let mut properties = Properties::default();
    if protocol.is_v5() {
        properties.session_expiry_interval_s = Some(u32::MAX);
        properties.receive_maximum = receive_maximum;
    }
    Connect {
        protocol,
        clean_start: false,
        keep_alive_s: 0,
        properties,
        client_id: s(client_id),
        will: None,
        username: None,
        password: None,
    }
}

pub struct Conn {
    stream: Box<dyn ByteStream>,
    net: Arc<Net>,
    client_id: String,
    buf: BytesMut,
    protocol: Protocol,
    pub(super) session_present: bool,
    boot: u64,
}

impl Conn {
    /// Connects to the broker's current address; `None` if it is down or refuses.
    pub async fn connect(net: &Arc<Net>, connect: Connect) -> Option<Conn> {
        let mut c = Conn::open(net, connect).await?;
        let boot = c.boot;
        match c.recv(Duration::from_secs(3)).await {
            Ok(Some(Packet::ConnAck(ca)))
                if ca.reason == ReasonCode::SUCCESS && net.alive(boot) =>
            {
                c.session_present = ca.session_present;
                Some(c)
            }
            _ => None,
        }
    }

    /// Sends the CONNECT without waiting for the CONNACK (it is the next packet to read).
    pub async fn open(net: &Arc<Net>, connect: Connect) -> Option<Conn> {
        let boot = net.boot.load(Ordering::Relaxed);
        let stream: Box<dyn ByteStream> = match &net.endpoint {
            Endpoint::Tcp(addr) => {
                let addr = (*addr.lock())?;
                if !net.alive(boot) {
                    return None;
                }
                let connecting = tokio::net::TcpStream::connect(addr);
                let stream = tokio::time::timeout(Duration::from_secs(1), connecting)
                    .await
                    .ok()?
                    .ok()?;
                let _ = stream.set_nodelay(true);
                Box::new(stream)
            }
            Endpoint::Sim(up) => {
                if !up.load(Ordering::Relaxed) || !net.alive(boot) {
                    return None;
                }
                let connecting = turmoil::net::TcpStream::connect((BROKER_HOST, BROKER_PORT));
                let stream = tokio::time::timeout(Duration::from_secs(1), connecting)
                    .await
                    .ok()?
                    .ok()?;
                Box::new(stream)
            }
        };
        let mut c = Conn {
            stream,
            net: net.clone(),
            client_id: connect.client_id.to_string(),
            buf: BytesMut::with_capacity(16 * 1024),
            protocol: connect.protocol,
            session_present: false,
            boot,
        };
        c.send(&Packet::Connect(Box::new(connect)))
            .await
            .then_some(c)
    }

    pub async fn send(&mut self, packet: &Packet) -> bool {
        let mut out = BytesMut::new();
        if tern_wire::encode(packet, self.protocol, &mut out).is_err() {
            return false;
        }
        self.net.log(&self.client_id, 0, &out);
        // A write to a crashed broker can wait forever (turmoil's socket buffer full, its peer
        // gone: seed 493's subscriber hung in a PUBACK): a connection that takes this long to
        // accept a packet is dead.
        let write = self.stream.write_all(&out);
        matches!(tokio::time::timeout(SEND_TIMEOUT, write).await, Ok(Ok(())))
    }

    /// `Ok(None)` on timeout, `Err(())` once the connection is gone. What a broker sent
    /// before the controller killed it is still read, as a client would (an ack sent after a
    /// power loss struck inside a call shows `ack-before-fsync`).
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
                Ok(Ok(0)) | Ok(Err(_)) => {
                    self.net.log(&self.client_id, 2, &[]);
                    return Err(());
                }
                Ok(Ok(n)) => {
                    let at = self.buf.len() - n;
                    self.net.log(&self.client_id, 1, &self.buf[at..]);
                }
            }
        }
    }
}

/// Waits for a connection, backing off while the broker is down; `None` once stopped.
pub(super) async fn reconnect(
    net: &Arc<Net>,
    protocol: Protocol,
    client_id: &str,
    receive_maximum: Option<u16>,
) -> Option<Conn> {
    loop {
        if net.stop.load(Ordering::Relaxed) {
            return None;
        }
        let connect = connect_with(protocol, client_id, receive_maximum);
        if let Some(c) = Conn::connect(net, connect).await {
            return Some(c);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Payload of message `n` of publisher `p`: `p:n:` and padding.
pub fn payload(p: usize, n: u64, pad: usize) -> Bytes {
    let mut v = format!("{p}:{n}:").into_bytes();
    v.resize(v.len() + pad, b'.');
    Bytes::from(v)
}

/// `(publisher, number)` of a payload, if it is one of ours.
pub fn parse(payload: &[u8]) -> Option<(usize, u64)> {
    let t = std::str::from_utf8(payload).ok()?;
    let mut it = t.splitn(3, ':');
    let p = it.next()?.parse().ok()?;
    let n = it.next()?.parse().ok()?;
    Some((p, n))
}

#[derive(Debug, Clone)]
pub struct PubSpec {
    pub index: usize,
    pub protocol: Protocol,
    pub qos: u8,
    pub topic: String,
    pub limit: u64,
    pub window: usize,
    pub pad: usize,
    /// Network fault: the client closes its socket (no DISCONNECT) after this many packets
    /// received on a connection, and reconnects.
    pub drop_after: Option<u64>,
    /// Stalled client: after every `.0`-th packet received it stops reading for `.1` ms
    /// (its PUBRECs / PUBACKs wait in the socket meanwhile).
    pub stall: Option<(u64, u64)>,
    /// Every message retained: the topic's retained value must end as one of the last
    /// acknowledged or later messages.
    pub retain: bool,
}

impl PubSpec {
    pub fn client_id(&self) -> String {
        format!("sim-pub-{}", self.index)
    }
}

/// How long a publisher waits after a refused PUBLISH before it reconnects to resend it.
const REFUSED_BACKOFF: Duration = Duration::from_millis(20);

#[derive(Default)]
pub struct PubState {
    /// Next number to publish.
    pub next: u64,
    /// In flight: number → (packet id, PUBREC received).
    pub inflight: BTreeMap<u64, (u16, bool)>,
    by_packet_id: BTreeMap<u16, u64>,
    next_packet_id: u16,
    /// Numbers whose PUBACK (QoS 1) or PUBREC (QoS 2) arrived: the broker owes them.
    pub acked: BTreeSet<u64>,
    /// Numbers the broker may have refused (a PUBACK or PUBREC with a reason code of 0x80 or
    /// more: a failed write, a broker limit; and what was in flight behind it): resent on a
    /// later connection, so perhaps published after later numbers. Also what was in flight
    /// unacknowledged when a connection ended while the broker refused PUBLISHes at a bound
    /// (its refusal may sit unread in the socket the client dropped, or come after the
    /// drop, while later numbers of the same window were accepted: seed 676, finding 16).
    pub refused: BTreeSet<u64>,
    /// [`Net::refusals`] when the current connection was made.
    refusals_at_connect: u64,
    /// Number → (connection, broker boot) its PUBACK / PUBREC came on.
    pub acked_on: BTreeMap<u64, (u64, u64)>,
    /// Connection → the broker boot it was made to.
    pub boots: Vec<u64>,
    pub connections: u64,
    /// Reconnects answered with Session Present = 0 (noted, not a violation: the CONNACK
    /// does not wait for the session record).
    pub sessions_lost: u64,
    /// What the publisher sent and got, per connection (printed for a failing seed with
    /// `TERN_SIM_TRACE`): `c3:boot1` a connection, `P12/5d` PUBLISH of number 12 under
    /// id 5 (DUP), `R5` PUBREL, `a5` PUBACK / PUBREC, `x5:0x97` a refusal, `C5` PUBCOMP,
    /// `D5` the packet the connection was dropped at, unread.
    pub trace: Vec<String>,
}

impl PubState {
    pub fn done(&self, limit: u64) -> bool {
        self.next >= limit && self.inflight.is_empty()
    }

    /// A refusal: the client reconnects without reading the answers to what it sent after
    /// the refused number (the broker may have refused those too, or accepted them), and
    /// resends everything unacknowledged in flight on the next connection.
    fn note_refused(&mut self) {
        let unacked: Vec<u64> = self
            .inflight
            .iter()
            .filter(|(_, (_, released))| !released)
            .map(|(&n, _)| n)
            .collect();
        self.refused.extend(unacked);
    }

    /// A new connection: if the broker refused any PUBLISH at a bound since the last one was
    /// made, what is still unacknowledged in flight may have been refused there unseen.
    fn connected(&mut self, refusals: u64) {
        if refusals > self.refusals_at_connect {
            self.note_refused();
        }
        self.refusals_at_connect = refusals;
    }

    fn note(&mut self, entry: String) {
        let at = turmoil::sim_elapsed().unwrap_or_default().as_micros();
        let entry = format!("c{}:{entry}@{at}", self.connections);
        self.trace.push(entry);
    }

    fn allocate(&mut self) -> u16 {
        loop {
            self.next_packet_id = self.next_packet_id.wrapping_add(1);
            if self.next_packet_id != 0 && !self.by_packet_id.contains_key(&self.next_packet_id) {
                return self.next_packet_id;
            }
        }
    }
}

/// A publisher's packet as its trace shows it (see [`PubState::trace`]).
fn describe(packet: &Packet) -> String {
    match packet {
        Packet::Publish(p) => {
            let n = parse(&p.payload).map_or(u64::MAX, |m| m.1);
            let dup = if p.dup { "d" } else { "" };
            format!("P{n}/{}{dup}", p.packet_id)
        }
        Packet::PubRel(a) => format!("R{}", a.packet_id),
        Packet::PubAck(a) | Packet::PubRec(a) if a.reason.is_success() => {
            format!("a{}", a.packet_id)
        }
        Packet::PubAck(a) | Packet::PubRec(a) => format!("x{}:{:#04x}", a.packet_id, a.reason.0),
        Packet::PubComp(a) => format!("C{}", a.packet_id),
        other => format!("{:?}", std::mem::discriminant(other)),
    }
}

fn publish_packet(spec: &PubSpec, number: u64, packet_id: u16, dup: bool) -> Packet {
    Packet::Publish(Publish {
        dup,
        qos: QoS::from_u8(spec.qos).expect("qos"),
        retain: spec.retain,
        topic: s(&spec.topic),
        packet_id,
        properties: Properties::default(),
        payload: payload(spec.index, number, spec.pad),
    })
}

/// A publisher of `limit` numbered messages on one topic, `window` in flight at most.
pub async fn run_publisher(spec: PubSpec, state: Arc<Mutex<PubState>>, net: Arc<Net>) {
    'connection: loop {
        if state.lock().done(spec.limit) {
            return;
        }
        let Some(mut c) = reconnect(&net, spec.protocol, &spec.client_id(), None).await else {
            return;
        };
        let mut received_here = 0u64;
        // Session resumed: everything in flight is resent in order (PUBLISH with DUP, or
        // PUBREL once its PUBREC came).
        let resend: Vec<Packet> = {
            let mut st = state.lock();
            st.connected(net.refusals());
            st.connections += 1;
            st.boots.push(c.boot);
            st.note(format!("boot{}", c.boot));
            if st.connections > 1 && !c.session_present {
                st.sessions_lost += 1;
            }
            st.inflight
                .iter()
                .map(|(&n, &(pi, rel))| {
                    if rel {
                        Packet::PubRel(ack(pi))
                    } else {
                        publish_packet(&spec, n, pi, true)
                    }
                })
                .collect()
        };
        for p in resend {
            state.lock().note(describe(&p));
            if !c.send(&p).await {
                continue 'connection;
            }
        }
        loop {
            if net.stop.load(Ordering::Relaxed) {
                return;
            }
            let fresh: Vec<Packet> = {
                let mut st = state.lock();
                if st.done(spec.limit) {
                    return;
                }
                let mut v = Vec::new();
                while st.inflight.len() < spec.window && st.next < spec.limit {
                    let number = st.next;
                    let pi = st.allocate();
                    st.next += 1;
                    st.inflight.insert(number, (pi, false));
                    st.by_packet_id.insert(pi, number);
                    let p = publish_packet(&spec, number, pi, false);
                    st.note(describe(&p));
                    v.push(p);
                }
                v
            };
            for p in fresh {
                if !c.send(&p).await {
                    continue 'connection;
                }
            }
            let packet = match c.recv(POLL).await {
                Err(()) => continue 'connection,
                Ok(None) => continue,
                Ok(Some(p)) => p,
            };
            received_here += 1;
            if spec.drop_after.is_some_and(|k| received_here >= k) {
                // Dropped at a packet boundary: this packet is never read.
                state.lock().note(format!("D{}", describe(&packet)));
                continue 'connection;
            }
            state.lock().note(describe(&packet));
            stall(spec.stall, received_here).await;
            let reply = {
                let mut st = state.lock();
                match packet {
                    Packet::PubAck(a) if spec.qos == 1 && !a.reason.is_success() => {
                        // Refused (a broker limit, a failed write): not acknowledged, sent
                        // again on the next connection.
                        if st.by_packet_id.contains_key(&a.packet_id) {
                            st.note_refused();
                        }
                        Err(())
                    }
                    Packet::PubAck(a) if spec.qos == 1 => {
                        if let Some(n) = st.by_packet_id.remove(&a.packet_id) {
                            st.inflight.remove(&n);
                            if st.acked.insert(n) {
                                net.acks.fetch_add(1, Ordering::Relaxed);
                                let c = (st.connections, st.boots.last().copied().unwrap_or(0));
                                st.acked_on.insert(n, c);
                            }
                        }
                        Ok(None)
                    }
                    Packet::PubRec(a) if spec.qos == 2 => match st.by_packet_id.get(&a.packet_id) {
                        Some(&n) if a.reason.is_success() => {
                            if st.acked.insert(n) {
                                net.acks.fetch_add(1, Ordering::Relaxed);
                                let c = (st.connections, st.boots.last().copied().unwrap_or(0));
                                st.acked_on.insert(n, c);
                            }
                            if let Some(e) = st.inflight.get_mut(&n) {
                                e.1 = true;
                            }
                            Ok(Some(Packet::PubRel(ack(a.packet_id))))
                        }
                        // Refused (e.g. a failed write): sent again on the next connection.
                        Some(_) => {
                            st.note_refused();
                            Err(())
                        }
                        None => Ok(None),
                    },
                    Packet::PubComp(a) if spec.qos == 2 => {
                        let released = st
                            .by_packet_id
                            .get(&a.packet_id)
                            .and_then(|n| st.inflight.get(n))
                            .is_some_and(|e| e.1);
                        if released {
                            if let Some(n) = st.by_packet_id.remove(&a.packet_id) {
                                st.inflight.remove(&n);
                            }
                        }
                        Ok(None)
                    }
                    Packet::Disconnect(_) => continue 'connection,
                    _ => Ok(None),
                }
            };
            let Ok(reply) = reply else {
                // A real client backs off before it tries again (and the sim's reconnects
                // would otherwise fill the state streams with session records).
                tokio::time::sleep(REFUSED_BACKOFF).await;
                continue 'connection;
            };
            if let Some(p) = reply {
                state.lock().note(describe(&p));
                if !c.send(&p).await {
                    continue 'connection;
                }
            }
        }
    }
}

/// A stalled client stops reading for a while after every `every`-th packet.
pub(super) async fn stall(stall: Option<(u64, u64)>, received: u64) {
    if let Some((every, ms)) = stall {
        if received % every == 0 {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
    }
}
