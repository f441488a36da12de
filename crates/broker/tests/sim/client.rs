//! The simulator's clients: raw tern-wire connections (adapted from
//! crates/server/tests/common/durable.rs), for the publishers (`publisher.rs`) and
//! subscribers (`subscriber.rs`) with persistent sessions whose MQTT session state (packet ids in flight, the QoS 2 received set) lives in
//! the client, outside the broker, and so survives every fault. Each runs as a task that
//! reconnects whenever its connection dies and resends what the spec says it must.
//!
//! Their state sits behind a mutex the controller reads (progress, completion, the checker),
//! locked only between awaits.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use tern_broker::ByteStream;
use tern_store::sim::SimDisk;
use tern_wire::{Ack, Connect, Packet, Properties, Protocol, ReasonCode, Str};
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
    pub(super) fn refusals(&self) -> u64 {
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
    /// The broker boot this connection was made to.
    pub(super) boot: u64,
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

/// A stalled client stops reading for a while after every `every`-th packet.
pub(super) async fn stall(stall: Option<(u64, u64)>, received: u64) {
    if let Some((every, ms)) = stall {
        if received % every == 0 {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
    }
}
