//! One network connection: the CONNECT handshake (`connect`, with what it is granted in `terms`), then the read loop
//! (`event_loop`) that decodes packets and dispatches them (`publish`, `acks`, `subscribe`),
//! then the close
//! (`close`): final DISCONNECT, will, session detach. The same task writes: between reads it
//! drives the connection's [`outflow::Outflow`], so an idle connection is one task.
//!
//! # Invariants
//! - The read buffer is allocated only when data arrives, sized to it, and released whenever
//!   it is fully consumed, so an idle connection holds no read buffer.
//! - While the ack pipeline is full, or `MAX_CONTROL_BACKLOG` control packets wait to be
//!   written, the loop does not read from the socket (backpressure, never unbounded queues);
//!   it goes on writing.
//! - Reads and writes alternate: every turn of the loop takes one outbound step before it
//!   waits, so neither a busy socket nor a busy queue holds the other direction back.
//! - Every control packet this task sends goes through the session's control queue, and only
//!   while the session still belongs to this connection (`conn_gen`).
//! - The loop waits in one poll function that looks at its sources in a fixed order (wake,
//!   pipeline, socket, outbound), as a `biased` select would, without the select's
//!   futures in every idle connection's state.
//! - Keep alive is the broker-wide sweeper's ([`crate::state::keep_alive`]): the loop records every
//!   read that decoded packets (`ConnCtl::touch`) and closes with `Close::KeepAlive` on the
//!   sweeper's 0x8D kick; no timer is kept in the connection's future.
//! - The loop reads through the connection's `ReadSlot` and acts on what one read returned only
//!   once every read with a smaller ticket was handled, then completes its ticket before it
//!   awaits anything else ([`crate::read_order`]: packets take effect across connections in the
//!   order the I/O driver reported them). It holds no ticket while it does not read.

mod acks;
mod close;
mod connect;
mod event_loop;
mod inflight;
mod linger;
pub(crate) mod outflow;
mod peek;
mod publish;
mod quota;
mod read;
mod strict;
mod subscribe;
mod terms;

use std::future::Future;
use std::io;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tern_wire::{Packet, Protocol, ReasonCode, Will};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::engine::Shared;
use crate::metrics::Metrics;
use crate::read_order::ReadSlot;
use crate::state::ack_pipeline::{AckKind, Released};
use crate::state::outbound::encode_packet;
use crate::state::session::{ConnCtl, Session};
use crate::state::topic_alias::InboundAliases;
use crate::transport::{ConnectionInfo, Transport, TransportRead, TransportWrite};
use outflow::{Outflow, WriteFailed};

/// Control packets (acks, SUBACK, PINGRESP) waiting to be written beyond which the connection
/// stops reading: a client that sends without reading cannot grow the queue without bound.
const MAX_CONTROL_BACKLOG: usize = 1024;

/// Largest PUBACK/PUBREC/PUBCOMP we encode (no properties): fixed header, id, reason.
const MAX_ACK_BYTES: usize = 8;

/// Why a connection ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Close {
    /// DISCONNECT from the client; `send_will` for v5 reason 0x04.
    ClientDisconnect { send_will: bool },
    /// EOF or a socket error without DISCONNECT.
    Lost,
    /// We end it for a protocol reason (v5: DISCONNECT with this code).
    Protocol(ReasonCode),
    /// Nothing received within 1.5 × keep alive [MQTT-3.1.2-22].
    KeepAlive,
    /// Ended from outside: takeover 0x8E, slow subscriber 0x97, write failure 0x80.
    Kicked(ReasonCode),
    /// Server shutdown (v5: DISCONNECT 0x8B).
    Shutdown,
}

impl std::fmt::Display for Close {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Close::ClientDisconnect { send_will: false } => f.write_str("client disconnect"),
            Close::ClientDisconnect { send_will: true } => {
                f.write_str("client disconnect with will (0x04)")
            }
            Close::Lost => f.write_str("connection lost"),
            Close::Protocol(code) => write!(f, "protocol error 0x{:02x}", code.0),
            Close::KeepAlive => f.write_str("keep alive timeout"),
            Close::Kicked(code) if *code == ReasonCode::SESSION_TAKEN_OVER => {
                f.write_str("session taken over (0x8e)")
            }
            Close::Kicked(code) if *code == ReasonCode::ADMINISTRATIVE_ACTION => {
                f.write_str("administrative action (0x98)")
            }
            Close::Kicked(code) => write!(f, "closed by the broker 0x{:02x}", code.0),
            Close::Shutdown => f.write_str("server shutting down"),
        }
    }
}

pub(crate) struct Conn {
    shared: Arc<Shared>,
    session: Arc<Session>,
    ctl: Arc<ConnCtl>,
    conn_gen: u64,
    /// The CONNECT's username (checked against the password file, if there is one).
    username: Option<Arc<str>>,
    /// The ACL as this connection last saw it (`crate::auth`).
    acl: crate::auth::AclView,
    protocol: Protocol,
    /// The keep alive in force, 0 for none (the admin API's; the broker-wide sweeper enforces
    /// it through `_keep_alive`, so no timer is kept in every idle connection's future).
    keep_alive_s: u16,
    will: Option<Box<Will>>,
    /// Names `will` in the store (`crate::will`).
    will_token: u64,
    aliases: InboundAliases,
    /// This connection's read tickets (ARCHITECTURE §2.1).
    read_slot: Arc<ReadSlot>,
    /// The ack pipeline, the Receive Maximum's count and released outcomes, boxed only while
    /// inbound packets are in flight.
    inflight: inflight::InflightSlot,
    /// The CONNECT's Session Expiry Interval was 0 (a DISCONNECT may not raise it).
    connect_expiry_zero: bool,
    /// The client's Maximum Packet Size (`u32::MAX` if none).
    client_max_packet_size_bytes: u32,
    /// When the bytes being decoded arrived (arrival time of their messages).
    now: Instant,
    /// Its place under `max_connections`, given back when the connection is dropped.
    _slot: connect::ConnectionSlot,
    /// Its entry in the keep-alive table (`crate::state::keep_alive`), left when dropped.
    _keep_alive: Option<crate::state::keep_alive::Watched>,
}

enum Event {
    /// `ConnCtl::wake`: queued packets, a kick or the shutdown.
    Woken,
    Durable,
    /// The socket is readable (or failed).
    Readable(io::Result<()>),
    /// The outbound side wrote a batch, or cannot write any more.
    Wrote(Result<(), WriteFailed>),
}

/// Serves one accepted connection to the end. `info`: where it came from. `stop` is watched
/// during the handshake only: then the server's shutdown reaches the connection through the
/// registry (`Registry::shut_down_connections`), at no cost to an idle connection's future.
/// `held` lives as long as the connection (the accept loop's count of live tasks): a future
/// wrapped around this one would keep the arguments' room beside it.
pub(crate) fn run<T: Transport, H: Send + 'static>(
    shared: Arc<Shared>,
    transport: T,
    info: ConnectionInfo,
    stop: watch::Receiver<bool>,
    held: H,
) -> impl Future<Output = ()> + Send + 'static {
    // Boxed: the handshake and the arguments only it needs are large and short-lived; out of
    // line they do not inflate every idle connection's future (an async fn keeps its arguments).
    let connecting = Box::pin(establish(shared, transport, info, stop, Lingers::Yes));
    async move {
        // Captured, not bound: a binding would keep a second copy beside the block's own, and
        // a move at the end would add drop flags. Dropped with the block, after `live`.
        let _ = &held;
        // The loop is awaited here, not inside a `serve` future: one frame fewer in every idle
        // connection's task.
        let Some(mut live) = connecting.await else {
            return;
        };
        let reason = live.read_loop().await;
        let lingers = live.close(reason).await;
        // Moved whole into a plain function (no partial move here, no drop flags): the linger
        // is a task of its own, not part of this future.
        live.end(lingers);
    }
}

/// [`run`], closed as a shutdown does once `stop` turns true: outside a listener (tests, sim).
/// `lingers`: whether a close the broker started lingers as a listener's does (the simulator's
/// TCP, whose writes wait once the peer stops reading) or not (in-memory transports).
pub(crate) async fn run_until_stopped<T: Transport>(
    shared: Arc<Shared>,
    transport: T,
    info: ConnectionInfo,
    mut stop: watch::Receiver<bool>,
    lingers: Lingers,
) {
    let mut live = Box::pin(establish(shared, transport, info, stop.clone(), lingers)).await;
    let Some(serving_live) = &mut live else {
        return;
    };
    let linger = {
        let ctl = serving_live.conn.ctl.clone();
        let serving = serving_live.serve();
        tokio::pin!(serving);
        let closed = tokio::select! {
            biased;
            closed = &mut serving => Some(closed),
            _ = stop.wait_for(|stopped| *stopped) => None,
        };
        match closed {
            Some(linger) => linger,
            None => {
                ctl.shut_down();
                serving.await
            }
        }
    };
    if let Some(live) = live.take() {
        live.end(linger && lingers == Lingers::Yes);
    }
}

/// What a connection lives on after its handshake.
struct Live<R, W> {
    conn: Conn,
    reader: R,
    /// Bytes read and not decoded yet (empty, without an allocation, while idle).
    buf: BytesMut,
    out: Outflow<W>,
}

/// Logged if a connection's info was never set (it always is before its loop starts).
const UNKNOWN_PEER: std::net::SocketAddr = std::net::SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::UNSPECIFIED,
    0,
));

/// Whether a socket whose close the broker started lingers (`linger`): a real socket does, and
/// so does the simulator's TCP (turmoil's: a write waits once 64 are unread, as a real one
/// waits on a full buffer); the in-memory transports of tests do not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lingers {
    Yes,
    No,
}

/// The handshake, then what the connection's life starts with.
async fn establish<T: Transport>(
    shared: Arc<Shared>,
    transport: T,
    info: ConnectionInfo,
    mut stop: watch::Receiver<bool>,
    lingers: Lingers,
) -> Option<Live<T::Read, T::Write>> {
    let peer = info.peer;
    let (mut reader, writer) = transport.split();
    let mut buf = BytesMut::new();
    let handshake = connect::handshake(&shared, &mut reader, writer, &mut buf, &mut stop, info);
    let (conn, (socket, writer, connack_after)) = match handshake.await {
        Ok(accepted) => accepted,
        Err(connect::Refused::Answered) if lingers == Lingers::Yes => {
            // The refusing CONNACK is written: the client must get to read it.
            linger::linger(&shared, reader);
            return None;
        }
        Err(_) => return None,
    };
    let keep_alive_s = conn.keep_alive_s;
    tracing::info!(%peer, client_id = %conn.session.client_id, protocol = ?conn.protocol, keep_alive_s, "client connected");
    Metrics::add(&shared.metrics.clients_connected, 1);
    if *stop.borrow() {
        // The shutdown's pass over the registry may have run before the attach; if it did
        // not, it reaches this connection too (`ConnCtl::shut_down` is idempotent).
        conn.ctl.shut_down();
    }
    Some(Live {
        conn,
        reader,
        buf,
        out: Outflow::new(socket, writer, connack_after),
    })
}

impl<R: TransportRead, W: TransportWrite<Io = R>> Live<R, W> {
    /// The connection's life: the read loop (which also writes), then the close. By reference:
    /// a value moved into an async fn keeps its room in the caller's future and the callee's.
    async fn serve(&mut self) -> bool {
        let reason = self.read_loop().await;
        self.close(reason).await
    }

    /// After the read loop: logs why, then the close path. (`Drop for Conn` covers an abort:
    /// no guards are kept in every idle connection's future.) True if the socket should
    /// linger: the broker started the close and its reason (if any) was written.
    async fn close(&mut self, reason: Close) -> bool {
        // Its tickets must not hold other readers back while it closes.
        self.conn.read_slot.close();
        {
            // Set before the loop started (the peer is not kept in the future for this line).
            let peer = self.conn.ctl.info().map_or(UNKNOWN_PEER, |info| info.peer);
            tracing::info!(%peer, client_id = %self.conn.session.client_id, reason = %reason, "client disconnected");
        }
        // Boxed like the handshake: only a closing connection needs the close path's state.
        Box::pin(self.conn.finish(reason, &mut self.out, &mut self.reader)).await
    }

    /// After the close: everything of the connection goes (its place under `max_connections`,
    /// its keep-alive entry, its session's `Arc`), then the socket lingers if `lingers`, or is
    /// closed with the rest.
    fn end(self, lingers: bool) {
        let Live {
            conn, reader, out, ..
        } = self;
        let shared = conn.shared.clone();
        drop(out);
        drop(conn);
        if lingers {
            linger::linger(&shared, reader);
        }
    }
}

impl Drop for Conn {
    /// Whatever way the task ends (also by abort): the connection's read tickets must not hold
    /// other readers back, and a later connection of this client must not wait for it
    /// (`close::await_predecessor`). Both are idempotent: the close path did them already
    /// unless the task was aborted.
    fn drop(&mut self) {
        self.read_slot.close();
        self.ctl.set_routed();
    }
}

impl Conn {
    fn handle(&mut self, packet: Packet) -> Result<(), Close> {
        match packet {
            Packet::Publish(publish) => self.on_publish(publish),
            Packet::PubAck(ack) => self.on_puback(ack),
            Packet::PubRec(ack) => self.on_pubrec(ack),
            Packet::PubRel(ack) => self.on_pubrel(ack),
            Packet::PubComp(ack) => self.on_pubcomp(ack),
            Packet::Subscribe(subscribe) => self.on_subscribe(subscribe),
            Packet::Unsubscribe(unsubscribe) => self.on_unsubscribe(unsubscribe),
            Packet::PingReq => {
                self.send(&Packet::PingResp);
                Ok(())
            }
            Packet::Disconnect(disconnect) => Err(self.on_disconnect(disconnect)),
            // MQTT-3.1.0-2: a second CONNECT is a protocol error. AUTH without an
            // authentication method, and server-to-client packets, are too.
            Packet::Connect(_)
            | Packet::Auth(_)
            | Packet::ConnAck(_)
            | Packet::SubAck(_)
            | Packet::UnsubAck(_)
            | Packet::PingResp => Err(Close::Protocol(ReasonCode::PROTOCOL_ERROR)),
        }
    }

    /// Queues one control packet for the writer.
    fn send(&mut self, packet: &Packet) {
        if let Some(bytes) = self.encode(packet) {
            self.send_bytes(std::iter::once(bytes));
        }
    }

    fn encode(&self, packet: &Packet) -> Option<Bytes> {
        // No scratch kept in `Conn`: it lives in every idle connection's future, and these
        // packets (SUBACK, UNSUBACK, PINGRESP) are rare.
        encode_packet(packet, self.protocol, &mut BytesMut::new())
    }

    fn send_bytes(&self, packets: impl IntoIterator<Item = Bytes>) {
        {
            let mut state = self.session.state.lock();
            if state.conn_gen != self.conn_gen || state.ended {
                return;
            }
            for packet in packets {
                state.out.push_control(packet);
            }
        }
        self.ctl.wake.notify();
    }

    /// Routes released deliveries and queues released acknowledgements, in order.
    fn flush_released(&mut self) {
        let Some(inflight) = self.inflight.get_existing() else {
            return;
        };
        if inflight.released.is_empty() {
            return;
        }
        // Taken and put back so that its buffer is reused: this runs for every PUBLISH.
        let mut released = std::mem::take(&mut inflight.released);
        // Acks are queued before the deliveries are routed: both were released together, and
        // a publisher subscribed to its own topic then sees its PUBACK before the echo.
        let mut acks = 0;
        for item in &released {
            if let Released::Ack {
                kind,
                packet_id,
                reason,
                counted,
            } = item
            {
                if *counted {
                    // Queued just below: from here on the client may use the slot again.
                    inflight.quota.on_released(kind, *packet_id, *reason);
                }
                if *kind != AckKind::None {
                    acks += 1;
                }
            }
        }
        if acks > 0 {
            // One allocation for all of them (each ack is a few bytes).
            let mut scratch = BytesMut::with_capacity(acks * MAX_ACK_BYTES);
            let mut state = self.session.state.lock();
            if state.conn_gen == self.conn_gen && !state.ended {
                encode_acks(&released, self.protocol, &mut scratch, |bytes| {
                    state.out.push_control(bytes);
                });
                drop(state);
                self.ctl.wake.notify();
            }
        }
        for item in released.drain(..) {
            if let Released::Deliver(message) = item {
                // Its retained record was applied when the pipeline released it (the
                // pipeline's release hook, `retained::release_hook`).
                crate::engine::route::route_released(&self.shared, message);
            }
        }
        inflight.released = released;
    }
}

/// The released acknowledgements, encoded in packet order, each handed to `each`.
fn encode_acks<D>(
    released: &[Released<D>],
    protocol: Protocol,
    scratch: &mut BytesMut,
    mut each: impl FnMut(Bytes),
) {
    for item in released {
        let Released::Ack {
            kind,
            packet_id,
            reason,
            ..
        } = item
        else {
            continue;
        };
        let ack = tern_wire::Ack {
            packet_id: *packet_id,
            reason: *reason,
            properties: Default::default(),
        };
        let packet = match kind {
            AckKind::None => continue,
            AckKind::PubAck => Packet::PubAck(ack),
            AckKind::PubRec => Packet::PubRec(ack),
            AckKind::PubComp => Packet::PubComp(ack),
            AckKind::Encoded(bytes) => {
                each(bytes.clone());
                continue;
            }
        };
        if let Some(bytes) = encode_packet(&packet, protocol, scratch) {
            each(bytes);
        }
    }
}

#[cfg(test)]
mod tests;
