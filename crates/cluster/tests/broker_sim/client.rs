//! The simulator's MQTT clients: raw tern-wire connections over loopback TCP to whichever
//! node they pick (a node that does not lead forwards the connection to the leader, byte for
//! byte, as in production), with persistent sessions whose client-side state (packet ids in
//! flight, a QoS 2 subscriber's open exchanges) lives here and survives every fault. Each
//! runs as a task that reconnects whenever its connection dies or stalls and resends what
//! the spec says it must.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tern_store::sim::SimRng;
use tern_wire::{
    Ack, Connect, Packet, Properties, Protocol, Publish, QoS, ReasonCode, Str, Subscribe,
    SubscriptionOptions,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::run::Log;

/// The client ports of the nodes that are up (`None`: down).
pub type Addrs = Arc<Mutex<Vec<Option<SocketAddr>>>>;

/// How long a CONNACK may take: a forwarding node waits for a leader (up to
/// `LEADER_WAIT_MS`), and a new leader's engine starts with a recovery.
const CONNACK_WAIT: Duration = Duration::from_secs(12);
/// A connection with acknowledgements owed and nothing heard for this long is given up.
const STALL: Duration = Duration::from_secs(3);
const RETRY: Duration = Duration::from_millis(100);
/// Messages a publisher has in flight at once.
const WINDOW: usize = 4;
/// How long a connection a client gave up on (and replaced by a new one for the same
/// session) may stay open: the server closes it when the new one takes the session over
/// [MQTT-3.1.4-3], or when the engine serving it stops (its node no longer leads).
pub const TAKEOVER_WAIT: Duration = Duration::from_secs(8);

pub fn s(text: &str) -> Str {
    Str::copy_from(text).expect("no U+0000")
}

fn ack(packet_id: u16) -> Ack {
    Ack {
        packet_id,
        reason: ReasonCode::SUCCESS,
        properties: Properties::default(),
    }
}

fn persistent_connect(protocol: Protocol, client_id: &str) -> Connect {
    let mut properties = Properties::default();
    if protocol.is_v5() {
        properties.session_expiry_interval_s = Some(u32::MAX);
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

/// What the clients share with the controller.
pub struct Shared {
    pub addrs: Addrs,
    pub stop: AtomicBool,
    /// Moved on by the controller after each fault: each client then gives up its connection
    /// with a chance of one in two, and opens a new one without closing it (a client that
    /// believes its connection dead), so that sessions are taken over across the failover.
    pub epoch: AtomicU64,
    /// Given-up connections still watched (`watch_takeover`).
    pub watchers: AtomicU64,
    pub log: Log,
    pub violations: Mutex<Vec<String>>,
}

impl Shared {
    fn violation(&self, v: String) {
        self.log.line(format!("VIOLATION {v}"));
        self.violations.lock().unwrap().push(v);
    }
}

struct Conn {
    stream: TcpStream,
    buf: BytesMut,
    protocol: Protocol,
    node: usize,
    session_present: bool,
}

impl Conn {
    /// Connects to a node picked at random among those up, other than `avoid` if there is
    /// another (a client that gave up a connection tries elsewhere); `None` if it fails.
    async fn connect(
        shared: &Shared,
        rng: &mut SimRng,
        connect: Connect,
        avoid: Option<usize>,
    ) -> Option<Conn> {
        let mut up: Vec<(usize, SocketAddr)> = {
            let a = shared.addrs.lock().unwrap();
            a.iter()
                .enumerate()
                .filter_map(|(i, x)| x.map(|x| (i, x)))
                .collect()
        };
        if up.iter().any(|(i, _)| Some(*i) != avoid) {
            up.retain(|(i, _)| Some(*i) != avoid);
        }
        if up.is_empty() {
            return None;
        }
        let (node, addr) = *rng.pick(&up);
        let stream = tokio::time::timeout(Duration::from_secs(1), TcpStream::connect(addr))
            .await
            .ok()?
            .ok()?;
        let _ = stream.set_nodelay(true);
        let mut c = Conn {
            stream,
            buf: BytesMut::with_capacity(16 * 1024),
            protocol: connect.protocol,
            node,
            session_present: false,
        };
        if !c.send(&Packet::Connect(Box::new(connect))).await {
            return None;
        }
        match c.recv(CONNACK_WAIT).await {
            Ok(Some(Packet::ConnAck(ca))) if ca.reason == ReasonCode::SUCCESS => {
                c.session_present = ca.session_present;
                Some(c)
            }
            _ => None,
        }
    }

    async fn send(&mut self, packet: &Packet) -> bool {
        let mut out = BytesMut::new();
        if tern_wire::encode(packet, self.protocol, &mut out).is_err() {
            return false;
        }
        let write = self.stream.write_all(&out);
        matches!(
            tokio::time::timeout(Duration::from_secs(2), write).await,
            Ok(Ok(()))
        )
    }

    /// `Ok(None)` on timeout, `Err(())` once the connection is gone.
    async fn recv(&mut self, timeout: Duration) -> Result<Option<Packet>, ()> {
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

/// Watches a connection its client gave up on once a new one for the same session has its
/// CONNACK: the server must close it (one owner per session).
async fn watch_takeover(mut old: Conn, shared: Arc<Shared>, name: String, new_node: usize) {
    let deadline = tokio::time::Instant::now() + TAKEOVER_WAIT;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match old.recv(left).await {
            Err(()) => break,
            // Sent before the takeover, or by a second owner: not acknowledged either way.
            Ok(Some(_)) => continue,
            Ok(None) => {
                shared.violation(format!(
                    "one owner per session: {name}'s old connection (via node {}) still open \
                     {}s after its session was taken over via node {}",
                    old.node + 1,
                    TAKEOVER_WAIT.as_secs(),
                    new_node + 1
                ));
                break;
            }
        }
    }
    shared.watchers.fetch_sub(1, Ordering::Relaxed);
}

/// Hands a given-up connection to a watcher once its replacement is connected.
fn watch_old(old: &mut Option<Conn>, shared: &Arc<Shared>, name: &str, new_node: usize) {
    if let Some(old) = old.take() {
        shared.watchers.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(watch_takeover(
            old,
            shared.clone(),
            name.to_string(),
            new_node,
        ));
    }
}

/// Whether the client gives up its connection now (see [`Shared::epoch`]).
fn give_up(shared: &Shared, seen: &mut u64, rng: &mut SimRng) -> bool {
    let epoch = shared.epoch.load(Ordering::Relaxed);
    if epoch == *seen {
        return false;
    }
    *seen = epoch;
    rng.chance(0.5)
}

/// A publisher's state, read by the controller and the checker.
#[derive(Default)]
pub struct PubState {
    /// Sequence numbers acknowledged (PUBACK, or PUBREC for QoS 2, with success).
    pub acked: BTreeSet<u64>,
    /// Refused by the broker (an error reason code): not acknowledged, not resent.
    pub refused: BTreeSet<u64>,
    pub sent: u64,
    pub done: bool,
}

pub struct Publisher {
    pub index: usize,
    pub protocol: Protocol,
    pub qos: QoS,
    pub total: u64,
    pub pace_ms: u64,
    pub state: Arc<Mutex<PubState>>,
}

pub fn topic(publisher: usize) -> String {
    format!("t/p{publisher}")
}

fn payload(publisher: usize, seq: u64) -> Bytes {
    Bytes::from(format!("{publisher}:{seq}"))
}

/// (publisher, seq) from a payload.
fn parse(payload: &[u8]) -> Option<(usize, u64)> {
    let text = std::str::from_utf8(payload).ok()?;
    let (p, s) = text.split_once(':')?;
    Some((p.parse().ok()?, s.parse().ok()?))
}

/// One message in flight: its sequence number and whether the PUBREC came (QoS 2).
#[derive(Clone, Copy)]
struct Flight {
    seq: u64,
    released: bool,
}

impl Publisher {
    fn publish(&self, id: u16, seq: u64, dup: bool) -> Packet {
        Packet::Publish(Publish {
            dup,
            qos: self.qos,
            retain: false,
            topic: s(&topic(self.index)),
            packet_id: id,
            properties: Properties::default(),
            payload: payload(self.index, seq),
        })
    }

    pub async fn run(self, shared: Arc<Shared>, seed: u64) {
        let name = format!("pub{}", self.index);
        let mut rng = SimRng::keyed(&[seed, 0x707562, self.index as u64]);
        let mut inflight: BTreeMap<u16, Flight> = BTreeMap::new();
        let mut next_seq = 0u64;
        let mut next_id = 1u16;
        let mut established = false;
        let (mut old, mut seen) = (None, 0u64);
        while !shared.stop.load(Ordering::Relaxed) {
            let avoid = old.as_ref().map(|c: &Conn| c.node);
            let connect = persistent_connect(self.protocol, &name);
            let Some(mut conn) = Conn::connect(&shared, &mut rng, connect, avoid).await else {
                tokio::time::sleep(RETRY).await;
                continue;
            };
            shared.log.line(format!(
                "{name} connected via node {} (session present: {})",
                conn.node + 1,
                conn.session_present
            ));
            watch_old(&mut old, &shared, &name, conn.node);
            if established && !conn.session_present {
                shared.violation(format!(
                    "{name}'s persistent session was lost (CONNACK session present 0 via node {})",
                    conn.node + 1
                ));
            }
            // Resend in order: PUBLISH (DUP) for what has no PUBREC, PUBREL for what has.
            let mut order: Vec<(u16, Flight)> = inflight.iter().map(|(k, v)| (*k, *v)).collect();
            order.sort_by_key(|(_, f)| f.seq);
            let mut ok = true;
            for (id, f) in order {
                let p = if f.released {
                    Packet::PubRel(ack(id))
                } else {
                    self.publish(id, f.seq, true)
                };
                if !conn.send(&p).await {
                    ok = false;
                    break;
                }
            }
            let mut last_heard = tokio::time::Instant::now();
            let mut abandon = false;
            while ok && !shared.stop.load(Ordering::Relaxed) {
                if give_up(&shared, &mut seen, &mut rng) {
                    shared.log.line(format!("{name} gives up its connection"));
                    abandon = true;
                    break;
                }
                if inflight.len() < WINDOW && next_seq < self.total {
                    while inflight.contains_key(&next_id) {
                        next_id = next_id.checked_add(1).unwrap_or(1);
                    }
                    let id = next_id;
                    next_id = next_id.checked_add(1).unwrap_or(1);
                    let seq = next_seq;
                    next_seq += 1;
                    inflight.insert(
                        id,
                        Flight {
                            seq,
                            released: false,
                        },
                    );
                    self.state.lock().unwrap().sent = next_seq;
                    if !conn.send(&self.publish(id, seq, false)).await {
                        break;
                    }
                } else if inflight.is_empty() {
                    self.state.lock().unwrap().done = true;
                    return;
                }
                let wait = Duration::from_millis(self.pace_ms);
                let packet = match conn.recv(wait).await {
                    Err(()) => break,
                    Ok(None) => {
                        if !inflight.is_empty() && last_heard.elapsed() > STALL {
                            shared
                                .log
                                .line(format!("{name} gives up a stalled connection"));
                            abandon = true;
                            break;
                        }
                        continue;
                    }
                    Ok(Some(p)) => p,
                };
                last_heard = tokio::time::Instant::now();
                match packet {
                    Packet::PubAck(a) | Packet::PubRec(a) => {
                        let Some(f) = inflight.get_mut(&a.packet_id) else {
                            continue;
                        };
                        if a.reason.0 >= 0x80 {
                            let seq = f.seq;
                            inflight.remove(&a.packet_id);
                            self.state.lock().unwrap().refused.insert(seq);
                            shared
                                .log
                                .line(format!("{name}: {seq} refused with {:#x}", a.reason.0));
                            continue;
                        }
                        self.state.lock().unwrap().acked.insert(f.seq);
                        established = true;
                        if self.qos == QoS::ExactlyOnce {
                            f.released = true;
                            if !conn.send(&Packet::PubRel(ack(a.packet_id))).await {
                                break;
                            }
                        } else {
                            inflight.remove(&a.packet_id);
                        }
                    }
                    Packet::PubComp(a)
                        if inflight.get(&a.packet_id).is_some_and(|f| f.released) =>
                    {
                        inflight.remove(&a.packet_id);
                    }
                    _ => {}
                }
            }
            if abandon {
                old = Some(conn);
            }
        }
    }
}

/// One delivery a subscriber's application received.
#[derive(Clone, Copy, Debug)]
pub struct Delivery {
    pub publisher: usize,
    pub seq: u64,
}

#[derive(Default)]
pub struct SubState {
    /// In the order the application received them.
    pub delivered: Vec<Delivery>,
    pub established: bool,
}

/// How a QoS 2 subscriber hands a message to its application (MQTT 5.0 §4.3.3, figure 4.3):
/// Method A on the PUBLISH (and then refuses the packet id until the PUBREL), Method B on
/// the PUBREL.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Method {
    A,
    B,
}

pub struct Subscriber {
    pub index: usize,
    pub protocol: Protocol,
    pub qos: QoS,
    pub method: Method,
    pub state: Arc<Mutex<SubState>>,
}

impl Subscriber {
    fn deliver(&self, payload: &[u8]) {
        if let Some((publisher, seq)) = parse(payload) {
            self.state
                .lock()
                .unwrap()
                .delivered
                .push(Delivery { publisher, seq });
        }
    }

    pub async fn run(self, shared: Arc<Shared>, seed: u64) {
        let name = format!("sub{}", self.index);
        let mut rng = SimRng::keyed(&[seed, 0x737562, self.index as u64]);
        // Method B: PUBLISHes awaiting their PUBREL; Method A: ids delivered, awaiting it.
        let mut held: BTreeMap<u16, Bytes> = BTreeMap::new();
        let mut established = false;
        let (mut old, mut seen) = (None, 0u64);
        while !shared.stop.load(Ordering::Relaxed) {
            let avoid = old.as_ref().map(|c: &Conn| c.node);
            let connect = persistent_connect(self.protocol, &name);
            let Some(mut conn) = Conn::connect(&shared, &mut rng, connect, avoid).await else {
                tokio::time::sleep(RETRY).await;
                continue;
            };
            shared.log.line(format!(
                "{name} connected via node {} (session present: {})",
                conn.node + 1,
                conn.session_present
            ));
            watch_old(&mut old, &shared, &name, conn.node);
            if established && !conn.session_present {
                shared.violation(format!(
                    "{name}'s persistent session was lost (CONNACK session present 0 via node {})",
                    conn.node + 1
                ));
            }
            if !conn.session_present {
                // The client discards its session state with the server's [MQTT-4.1.0-1].
                held.clear();
                if !self.subscribe(&mut conn).await {
                    continue;
                }
                established = true;
                self.state.lock().unwrap().established = true;
            }
            let mut last_heard = tokio::time::Instant::now();
            let mut abandon = false;
            while !shared.stop.load(Ordering::Relaxed) {
                if give_up(&shared, &mut seen, &mut rng) {
                    shared.log.line(format!("{name} gives up its connection"));
                    abandon = true;
                    break;
                }
                let packet = match conn.recv(Duration::from_millis(200)).await {
                    Err(()) => break,
                    Ok(None) if last_heard.elapsed() > 2 * STALL => {
                        shared
                            .log
                            .line(format!("{name} gives up a silent connection"));
                        abandon = true;
                        break;
                    }
                    Ok(None) => continue,
                    Ok(Some(p)) => p,
                };
                last_heard = tokio::time::Instant::now();
                let reply = match packet {
                    Packet::Publish(p) => match p.qos {
                        QoS::AtMostOnce => {
                            self.deliver(&p.payload);
                            None
                        }
                        QoS::AtLeastOnce => {
                            self.deliver(&p.payload);
                            Some(Packet::PubAck(ack(p.packet_id)))
                        }
                        QoS::ExactlyOnce => {
                            match self.method {
                                Method::B => {
                                    held.insert(p.packet_id, p.payload);
                                }
                                Method::A => {
                                    if let std::collections::btree_map::Entry::Vacant(e) =
                                        held.entry(p.packet_id)
                                    {
                                        self.deliver(&p.payload);
                                        e.insert(Bytes::new());
                                    }
                                }
                            }
                            Some(Packet::PubRec(ack(p.packet_id)))
                        }
                    },
                    Packet::PubRel(a) => {
                        if let Some(payload) = held.remove(&a.packet_id)
                            && self.method == Method::B
                        {
                            self.deliver(&payload);
                        }
                        Some(Packet::PubComp(ack(a.packet_id)))
                    }
                    _ => None,
                };
                if let Some(r) = reply
                    && !conn.send(&r).await
                {
                    break;
                }
            }
            if abandon {
                old = Some(conn);
            }
        }
    }

    async fn subscribe(&self, conn: &mut Conn) -> bool {
        let sub = Packet::Subscribe(Subscribe {
            packet_id: 1,
            properties: Properties::default(),
            filters: vec![(
                s("t/#"),
                SubscriptionOptions {
                    qos: self.qos,
                    ..SubscriptionOptions::default()
                },
            )],
        });
        if !conn.send(&sub).await {
            return false;
        }
        let deadline = tokio::time::Instant::now() + CONNACK_WAIT;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match conn.recv(left).await {
                Ok(Some(Packet::SubAck(a))) => {
                    return a.reasons.first().is_some_and(|r| r.0 < 0x80);
                }
                Ok(Some(_)) => {}
                _ => return false,
            }
        }
    }
}
