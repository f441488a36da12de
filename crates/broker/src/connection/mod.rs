//! One network connection: the CONNECT handshake (`connect`), then the read loop that
//! decodes packets and dispatches them (`publish`, `acks`, `subscribe`), then the close
//! (`close`): final DISCONNECT, will, session detach. The writer half runs in its own task
//! ([`crate::outbound::run_writer`]).
//!
//! # Invariants
//! - The read buffer is allocated only when data arrives, sized to it, and released whenever
//!   it is fully consumed, so an idle connection holds no read buffer.
//! - While the ack pipeline is full, or `MAX_CONTROL_BACKLOG` control packets wait for the
//!   writer, the loop does not read from the socket (backpressure, never unbounded queues).
//! - Every control packet this task sends goes through the session's control queue, and only
//!   while the session still belongs to this connection (`conn_gen`).
//! - The loop reads through the connection's `ReadSlot` and acts on what one read returned only
//!   once every read with a smaller ticket was handled, then completes its ticket before it
//!   awaits anything else ([`crate::read_order`]: packets take effect across connections in the
//!   order the I/O driver reported them). It holds no ticket while it does not read.

mod acks;
mod close;
mod connect;
mod publish;
mod quota;
mod read;
mod strict;
mod subscribe;

use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tern_wire::{DecodeError, Packet, Protocol, ReasonCode, Will, decode};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::ack_pipeline::{AckKind, AckPipeline, Released};
use crate::broker::Shared;
use crate::message::Message;
use crate::metrics::Metrics;
use crate::outbound::encode_packet;
use crate::read_order::{CloseOnDrop, ReadSlot};
use crate::session::{ConnCtl, RoutedOnDrop, Session};
use crate::topic_alias::InboundAliases;
use crate::transport::{ConnectionInfo, Transport, TransportRead};
use read::{ordered_readable, settle, try_read_chunk};

/// Control packets (acks, SUBACK, PINGRESP) queued for the writer beyond which the reader
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
    client_id: Arc<str>,
    /// The CONNECT's username (checked against the password file, if there is one).
    username: Option<Arc<str>>,
    /// The ACL as this connection last saw it (`crate::auth`).
    acl: crate::auth::AclView,
    protocol: Protocol,
    /// 1.5 × the keep alive in force; `None` when keep alive is off.
    keep_alive: Option<Duration>,
    will: Option<Box<Will>>,
    /// Names `will` in the store (`crate::will`).
    will_token: u64,
    aliases: InboundAliases,
    /// This connection's read tickets (ARCHITECTURE §2.1).
    read_slot: Arc<ReadSlot>,
    pipeline: AckPipeline<Arc<Message>>,
    /// Exchanges counted against our Receive Maximum.
    quota: quota::InboundQuota,
    released: Vec<Released<Arc<Message>>>,
    /// The CONNECT's Session Expiry Interval was 0 (a DISCONNECT may not raise it).
    connect_expiry_zero: bool,
    /// The client's Maximum Packet Size (`u32::MAX` if none).
    client_max_packet_size_bytes: u32,
    /// When the bytes being decoded arrived (arrival time of their messages).
    now: Instant,
    /// Its place under `max_connections`, given back when the connection is dropped.
    _slot: connect::ConnectionSlot,
}

enum Event {
    Kicked(ReasonCode),
    Shutdown,
    Durable,
    Drained,
    /// The socket is readable (or failed).
    Readable(io::Result<()>),
    KeepAliveDue,
}

/// Serves one accepted connection to the end. `info` says where it came from (listener,
/// peer, client certificate).
pub async fn run<T: Transport>(
    shared: Arc<Shared>,
    transport: T,
    info: ConnectionInfo,
    mut stop: watch::Receiver<bool>,
) {
    let peer = info.peer;
    let (mut reader, writer) = transport.split();
    let mut buf = BytesMut::new();
    // Boxed: the handshake and close states are large and short-lived; kept out of line they
    // do not inflate the future every idle connection keeps for its whole life.
    let Some((mut conn, writer)) = Box::pin(connect::handshake(
        &shared,
        &mut reader,
        writer,
        &mut buf,
        &mut stop,
        info,
    ))
    .await
    else {
        return;
    };
    let keep_alive_s = conn.keep_alive.map_or(0, |d| {
        u16::try_from(d.as_millis() / 1500).unwrap_or(u16::MAX)
    });
    conn.ctl.set_info(crate::session::ConnInfo {
        peer,
        keep_alive_s,
        connected_at: std::time::SystemTime::now(),
    });
    tracing::info!(%peer, client_id = %conn.client_id, protocol = ?conn.protocol, keep_alive_s, "client connected");
    Metrics::add(&shared.metrics.clients_connected, 1);
    let writer_task = tokio::spawn(crate::outbound::run_writer(
        shared.clone(),
        conn.session.clone(),
        conn.ctl.clone(),
        conn.conn_gen,
        writer.0,
        writer.1,
        writer.2,
    ));
    // Whatever way the task ends (also by abort), a later connection of this client must not
    // wait for it (`close::await_predecessor`).
    let _routed = RoutedOnDrop(conn.ctl.clone());
    // Whatever way the loop ends (also by abort), its tickets must not hold other readers back.
    let tickets = CloseOnDrop(conn.read_slot.clone());
    let reason = conn.read_loop(&mut reader, &mut buf, &mut stop).await;
    drop(tickets);
    tracing::info!(%peer, client_id = %conn.client_id, reason = %reason, "client disconnected");
    Box::pin(conn.finish(reason, writer_task)).await;
}

/// The DISCONNECT reason for a packet that failed to decode.
fn decode_error_reason(error: &DecodeError) -> ReasonCode {
    match error {
        // Topic Alias 0 (MQTT-3.3.2-8) is "Topic Alias invalid", not a generic protocol error.
        DecodeError::InvalidPropertyValue(TOPIC_ALIAS_PROPERTY_ID) => {
            ReasonCode::TOPIC_ALIAS_INVALID
        }
        other => other.reason_code(),
    }
}

/// Property identifier of Topic Alias.
const TOPIC_ALIAS_PROPERTY_ID: u8 = 0x23;

impl Conn {
    async fn read_loop<R: TransportRead>(
        &mut self,
        reader: &mut R,
        buf: &mut BytesMut,
        stop: &mut watch::Receiver<bool>,
    ) -> Close {
        let max_packet_size = self.shared.config.max_packet_size_bytes;
        let mut last_packet_at = Instant::now();
        let mut decoded = 0usize;
        if *stop.borrow() {
            return Close::Shutdown;
        }
        // One timer for the connection's life, re-armed only when it fires early (traffic
        // moved the deadline): no timer churn per packet.
        let far_future = Instant::now() + Duration::from_secs(86_400 * 365);
        let first_deadline = last_packet_at
            .checked_add(self.keep_alive.unwrap_or(Duration::MAX))
            .unwrap_or(far_future);
        let keep_alive_timer = tokio::time::sleep_until(first_deadline);
        tokio::pin!(keep_alive_timer);
        // Kept alive (registered with the driver) across the loop while reading is on.
        let slot = self.read_slot.clone();
        let reader = &*reader;
        let fresh = || ordered_readable(reader, &slot);
        let readable = fresh();
        tokio::pin!(readable);
        // Bytes the handshake read after the CONNECT go with the connection's first ticket.
        let mut ticket = None;
        let mut ended = false;
        if !buf.is_empty() {
            ticket = self.read_slot.leftovers();
            ended = settle(reader, buf, readable.as_mut(), &fresh).await.ended;
        }
        loop {
            let read_ticket = ticket.take();
            if let Some(ticket) = read_ticket {
                // Every read the driver reported before this one takes effect first.
                self.read_slot.order().turn(ticket).await;
            }
            while !self.pipeline.is_full() {
                match decode(buf, self.protocol, max_packet_size) {
                    Ok(Some(packet)) => {
                        decoded += 1;
                        if let Err(close) = self.handle(packet) {
                            return close;
                        }
                    }
                    Ok(None) => break,
                    Err(error) => {
                        tracing::debug!(client_id = %self.client_id, %error, "malformed packet");
                        return Close::Protocol(decode_error_reason(&error));
                    }
                }
            }
            if read_ticket.is_some() {
                self.read_slot.handled();
            }
            if ended {
                return Close::Lost;
            }
            if buf.is_empty() && buf.capacity() > 0 {
                *buf = BytesMut::new();
            }
            if decoded > 0 {
                last_packet_at = self.now;
                decoded = 0;
                // The writers this batch woke sit in this worker's LIFO slot, which the other
                // worker cannot steal: without a yield a fast publisher starves them and their
                // queues overflow (measured: 89% of QoS 0 dropped at 1 pub -> 1 sub; 0% after).
                tokio::task::yield_now().await;
            }
            let waiting = self.pipeline.has_pending_ticket();
            let backlogged = self.session.state.lock().out.control.len() >= MAX_CONTROL_BACKLOG;
            let reading = !self.pipeline.is_full() && !backlogged;
            if !reading {
                // Not registered while not reading: no ticket may wait for this connection.
                readable.set(fresh());
                self.read_slot.not_reading();
            }
            let event = tokio::select! {
                biased;
                reason = self.ctl.kicked() => Event::Kicked(reason),
                _ = stop.changed() => Event::Shutdown,
                _ = self.pipeline.wait_front(&mut self.released), if waiting => Event::Durable,
                _ = self.ctl.drained.notified(), if backlogged => Event::Drained,
                ready = &mut readable, if reading => Event::Readable(ready),
                _ = &mut keep_alive_timer, if self.keep_alive.is_some() => Event::KeepAliveDue,
            };
            match event {
                Event::Kicked(reason) => return Close::Kicked(reason),
                Event::Shutdown => return Close::Shutdown,
                Event::Durable => {
                    self.flush_released();
                    if self.pipeline.failed() {
                        // Not acknowledged: the client resends after reconnecting.
                        return Close::Protocol(ReasonCode::UNSPECIFIED_ERROR);
                    }
                }
                Event::Drained => {}
                Event::Readable(Err(_)) => return Close::Lost,
                Event::Readable(Ok(())) => {
                    readable.set(fresh());
                    let n = match try_read_chunk(reader, buf) {
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                        Ok(0) | Err(_) => return Close::Lost,
                        Ok(n) => n,
                    };
                    ticket = Some(self.read_slot.read_done());
                    // One clock read per socket read: packets of one read arrived together.
                    self.now = Instant::now();
                    let settled = settle(reader, buf, readable.as_mut(), &fresh).await;
                    ended = settled.ended;
                    let bytes = n + settled.more;
                    Metrics::add(&self.shared.metrics.bytes_received, bytes as u64);
                }
                Event::KeepAliveDue => {
                    // MQTT-3.1.2-22: nothing received within 1.5 x keep alive.
                    // Not kept in a local across the loop's awaits: 16 B of every idle future.
                    let deadline = last_packet_at + self.keep_alive.unwrap_or(Duration::MAX);
                    if Instant::now() >= deadline {
                        return Close::KeepAlive;
                    }
                    keep_alive_timer.as_mut().reset(deadline);
                }
            }
        }
    }

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
        self.ctl.wake.notify_one();
    }

    /// Routes released deliveries and queues released acknowledgements, in order.
    fn flush_released(&mut self) {
        if self.released.is_empty() {
            return;
        }
        // Taken and put back so that its buffer is reused: this runs for every PUBLISH.
        let mut released = std::mem::take(&mut self.released);
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
                    self.quota.on_released(kind, *packet_id, *reason);
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
                self.ctl.wake.notify_one();
            }
        }
        for item in released.drain(..) {
            if let Released::Deliver(message) = item {
                // Its retained record was applied when the pipeline released it (the
                // pipeline's release hook, `retained::release_hook`).
                crate::router::route(&self.shared, message.clone());
                self.shared.store.message_released(&message);
            }
        }
        self.released = released;
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
mod tests {
    /// What every idle connection keeps: its reader future (Conn inline), its writer future and
    /// its session. Guards against a large state (e.g. an unboxed `Will` or handshake) creeping
    /// back into the long-lived futures.
    #[tokio::test]
    async fn idle_connection_state_stays_small() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (server, peer) = listener.accept().await.unwrap();
        let broker = crate::Broker::new(crate::BrokerConfig::default()).unwrap();
        let (_tx, rx) = tokio::sync::watch::channel(false);
        let info = crate::transport::ConnectionInfo::new(
            crate::transport::ListenerContext::plain_tcp("test"),
            peer,
        );
        let reader = super::run(broker.shared().clone(), server, info, rx);
        let (_r, w) = client.into_split();
        let session = crate::session::Session::new("x".into(), tern_wire::Protocol::V5, 0);
        let writer = crate::outbound::run_writer(
            broker.shared().clone(),
            session,
            std::sync::Arc::new(crate::session::ConnCtl::default()),
            0,
            w,
            crate::outbound::WriterState::new(tern_wire::Protocol::V5, 0, 0),
            None,
        );
        eprintln!(
            "SIZES reader={} writer={} conn={} session={} ctl={}",
            std::mem::size_of_val(&reader),
            std::mem::size_of_val(&writer),
            std::mem::size_of::<super::Conn>(),
            std::mem::size_of::<crate::session::Session>(),
            std::mem::size_of::<crate::session::ConnCtl>()
        );
        assert!(
            std::mem::size_of_val(&reader) <= 2048,
            "{}",
            std::mem::size_of_val(&reader)
        );
        assert!(
            std::mem::size_of_val(&writer) <= 1024,
            "{}",
            std::mem::size_of_val(&writer)
        );
        assert!(std::mem::size_of::<super::Conn>() <= 512);
        // Both alias maps live in every connection's futures; empty they are a pointer.
        assert!(std::mem::size_of::<crate::topic_alias::InboundAliases>() <= 16);
        assert!(std::mem::size_of::<crate::topic_alias::OutboundAliases>() <= 16);
        assert!(std::mem::size_of::<crate::session::Session>() <= 512);
    }
}
