//! The clients' connections: raw tern-wire over loopback TCP to whichever node a client
//! picks (a node that does not lead forwards the connection to the leader, byte for byte, as
//! in production), and a client's side of its persistent session across connections
//! ([`Session`]): reconnecting, checking that the server kept the session, and giving up a
//! connection without closing it, whose closing by the server is then watched (one owner per
//! session).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use tern_store::sim::SimRng;
use tern_wire::{Ack, Connect, Packet, Properties, Protocol, ReasonCode, Str};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::run::Log;

/// The client ports of the nodes that are up (`None`: down).
pub type Addrs = Arc<Mutex<Vec<Option<SocketAddr>>>>;

/// How long a CONNACK may take: a forwarding node waits for a leader (up to
/// `LEADER_WAIT_MS`), and a new leader's engine starts with a recovery.
pub const CONNACK_WAIT: Duration = Duration::from_secs(12);
/// A connection with acknowledgements owed and nothing heard for this long is given up.
pub const STALL: Duration = Duration::from_secs(3);
const RETRY: Duration = Duration::from_millis(100);
/// How long a connection a client gave up on (and replaced by a new one for the same
/// session) may stay open: the server closes it when the new one takes the session over
/// [MQTT-3.1.4-3], or when the engine serving it stops (its node no longer leads).
pub const TAKEOVER_WAIT: Duration = Duration::from_secs(8);

pub fn s(text: &str) -> Str {
    Str::copy_from(text).expect("no U+0000")
}

pub fn ack(packet_id: u16) -> Ack {
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
    /// Set once every fault is over: the publishers then publish their tail and finish.
    pub faults_over: AtomicBool,
    pub log: Log,
    pub violations: Mutex<Vec<String>>,
}

impl Shared {
    fn violation(&self, v: String) {
        self.log.line(format!("VIOLATION {v}"));
        self.violations.lock().unwrap().push(v);
    }
}

pub struct Conn {
    stream: TcpStream,
    buf: BytesMut,
    protocol: Protocol,
    pub node: usize,
    pub session_present: bool,
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

    pub async fn send(&mut self, packet: &Packet) -> bool {
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

/// A client's side of its persistent session, across its connections.
pub struct Session {
    pub name: String,
    protocol: Protocol,
    rng: SimRng,
    /// The connection given up last, watched once the next one is connected.
    old: Option<Conn>,
    /// The fault epoch last seen ([`Shared::epoch`]).
    seen: u64,
    /// Whether the server has the session (a SUBACK or an acknowledgement came).
    established: bool,
}

impl Session {
    pub fn new(name: String, protocol: Protocol, rng: SimRng) -> Session {
        Session {
            name,
            protocol,
            rng,
            old: None,
            seen: 0,
            established: false,
        }
    }

    /// Connects with the persistent session, trying again until it works; `None` once the
    /// clients stop. A lost session is a violation once it was established.
    pub async fn connect(&mut self, shared: &Arc<Shared>) -> Option<Conn> {
        while !shared.stop.load(Ordering::Relaxed) {
            let avoid = self.old.as_ref().map(|c| c.node);
            let connect = persistent_connect(self.protocol, &self.name);
            let Some(conn) = Conn::connect(shared, &mut self.rng, connect, avoid).await else {
                tokio::time::sleep(RETRY).await;
                continue;
            };
            let (name, node) = (&self.name, conn.node + 1);
            shared.log.line(format!(
                "{name} connected via node {node} (session present: {})",
                conn.session_present
            ));
            if let Some(old) = self.old.take() {
                shared.watchers.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(watch_takeover(old, shared.clone(), name.clone(), conn.node));
            }
            if self.established && !conn.session_present {
                shared.violation(format!(
                    "{name}'s persistent session was lost (CONNACK session present 0 via node \
                     {node})"
                ));
            }
            return Some(conn);
        }
        None
    }

    pub fn established(&mut self) {
        self.established = true;
    }

    /// Whether the client gives up its connection now (see [`Shared::epoch`]).
    pub fn give_up(&mut self, shared: &Shared) -> bool {
        let epoch = shared.epoch.load(Ordering::Relaxed);
        if epoch == self.seen {
            return false;
        }
        self.seen = epoch;
        self.rng.chance(0.5)
    }

    /// Keeps `conn` open, given up: the server must close it once the next connection
    /// takes the session over.
    pub fn abandon(&mut self, conn: Conn, why: &str, shared: &Shared) {
        shared.log.line(format!("{} gives up {why}", self.name));
        self.old = Some(conn);
    }
}
