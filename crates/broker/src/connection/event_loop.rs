//! The connection's event loop: one task reads, decodes and dispatches, and writes between
//! reads (ARCHITECTURE §2.1, one task per connection); every wait is one poll function, so that
//! an idle connection keeps no select futures.

use std::future::poll_fn;
use std::io;
use std::num::NonZeroU64;
use std::task::{Context, Poll};

use bytes::BytesMut;
use tern_wire::{DecodeError, ReasonCode, decode};
use tokio::time::Instant;

use super::outflow::{OutEnv, Outflow, WriteFailed};
use super::read::{poll_ordered, settle, try_read_chunk};
use super::{Close, Conn, Event, Live, MAX_CONTROL_BACKLOG};
use crate::metrics::Metrics;
use crate::transport::{TransportRead, TransportWrite};

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

impl<R: TransportRead, W: TransportWrite<Io = R>> Live<R, W> {
    /// Reads, decodes and dispatches until the connection ends; writes between reads. Its
    /// state is every idle connection's: fields are borrowed from `self` (arguments would be
    /// kept twice, as arguments and as locals), what it waits for is polled, and the steps
    /// that do not wait are plain functions (no future of their own).
    pub(super) async fn read_loop(&mut self) -> Close {
        // (Tickets start at 1: `NonZeroU64` keeps the option in 8 bytes of the idle state.)
        let (mut ticket, mut ended) = match poll_fn(|cx| Poll::Ready(self.leftovers(cx))).await {
            ReadNow::Read { ticket, ended } => (ticket, ended),
            ReadNow::Nothing | ReadNow::Lost => (None, false),
        };
        loop {
            // Scoped: it is not kept across the wait below.
            let had_ticket = ticket.is_some();
            if let Some(ticket) = ticket.take() {
                // Every read the driver reported before this one takes effect first.
                let ticket = ticket.get();
                let slot = &self.conn.read_slot;
                poll_fn(|cx| slot.order().poll_turn(ticket, cx)).await;
            }
            let decoded = match self.dispatch() {
                Ok(decoded) => decoded,
                Err(close) => return close,
            };
            if had_ticket {
                self.conn.read_slot.handled();
            }
            if ended {
                return Close::Lost;
            }
            self.after_dispatch(decoded);
            if decoded {
                // The writers this batch woke sit in this worker's LIFO slot, which the other
                // worker cannot steal: without a yield a fast publisher starves them and their
                // queues overflow (measured: 89% of QoS 0 dropped at 1 pub -> 1 sub; 0% after).
                tokio::task::yield_now().await;
            }
            // One outbound step per turn, before waiting: a connection that always has bytes
            // to read still writes (its acks), one that always has packets to write still reads.
            poll_fn(|cx| {
                self.outbound_step(cx);
                Poll::Ready(())
            })
            .await;
            if let Some(close) = self.conn.ended_from_outside() {
                return close;
            }
            let (waiting, reading) = self.conn.before_wait();
            let event = poll_fn(|cx| {
                poll_event(
                    &mut self.conn,
                    &self.reader,
                    &mut self.out,
                    waiting,
                    reading,
                    cx,
                )
            })
            .await;
            match self.conn.on_event(event, &mut self.out) {
                Err(close) => return close,
                Ok(false) => {}
                Ok(true) => match poll_fn(|cx| Poll::Ready(self.read_now(cx))).await {
                    ReadNow::Nothing => {}
                    ReadNow::Lost => return Close::Lost,
                    ReadNow::Read {
                        ticket: read_ticket,
                        ended: read_ended,
                    } => {
                        ticket = read_ticket;
                        ended = read_ended;
                    }
                },
            }
        }
    }

    /// What a dispatched read leaves behind: an emptied buffer gives its memory back, and a read
    /// that decoded a packet tells the keep-alive sweeper (`crate::state::keep_alive`) with
    /// one store.
    fn after_dispatch(&mut self, decoded: bool) {
        if self.buf.is_empty() {
            // Also when its capacity is 0: a buffer split to its end still holds the read
            // it came from (measured: the CONNECT's ~100 B on every idle connection).
            self.buf = BytesMut::new();
        }
        if decoded {
            self.conn
                .ctl
                .touch(self.conn.shared.keep_alive.millis(self.conn.now));
        }
    }

    /// One step of the outbound half; a failed socket write ends the connection.
    fn outbound_step(&mut self, cx: &mut Context<'_>) {
        let env = OutEnv {
            config: &self.conn.shared.config,
            metrics: &self.conn.shared.metrics,
            store: &*self.conn.shared.store.exchanges,
            session: &self.conn.session,
            conn_gen: self.conn.conn_gen,
            changed_sessions: &self.conn.shared.changed_sessions,
        };
        if let Poll::Ready(Err(WriteFailed)) = self.out.poll_step(cx, &env, &self.reader) {
            self.conn.ctl.kick(ReasonCode::UNSPECIFIED_ERROR);
        }
    }

    /// Bytes the handshake read after the CONNECT go with the connection's first ticket, and
    /// are settled as a read's (`ReadNow::Nothing` if there are none).
    fn leftovers(&mut self, cx: &mut Context<'_>) -> ReadNow {
        if self.buf.is_empty() {
            return ReadNow::Nothing;
        }
        let ticket = self.conn.read_slot.leftovers().and_then(NonZeroU64::new);
        let settled = settle(&self.reader, &mut self.buf, &self.conn.read_slot, cx);
        // The handshake counted what it read; what settling read is counted here.
        Metrics::add(
            &self.conn.shared.metrics.bytes_received,
            settled.more as u64,
        );
        ReadNow::Read {
            ticket,
            ended: settled.ended,
        }
    }

    /// The socket is readable: reads what is there, takes the read's ticket and settles
    /// (`read::settle`). Polled (it registers with the driver), without a future of its own.
    fn read_now(&mut self, cx: &mut Context<'_>) -> ReadNow {
        let n = match try_read_chunk(&self.reader, &mut self.buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return ReadNow::Nothing,
            Ok(0) | Err(_) => return ReadNow::Lost,
            Ok(n) => n,
        };
        let ticket = NonZeroU64::new(self.conn.read_slot.read_done());
        // One clock read per socket read: packets of one read arrived together.
        self.conn.now = Instant::now();
        let settled = settle(&self.reader, &mut self.buf, &self.conn.read_slot, cx);
        Metrics::add(
            &self.conn.shared.metrics.bytes_received,
            (n + settled.more) as u64,
        );
        ReadNow::Read {
            ticket,
            ended: settled.ended,
        }
    }

    /// Decodes and handles the packets the read buffer holds, while the pipeline has room.
    /// `Ok(true)` if it decoded any.
    fn dispatch(&mut self) -> Result<bool, Close> {
        let mut decoded = false;
        // The store's writers wake once for all of this read's appends: one group commit, not
        // the first PUBLISH alone and the rest in the next one. Taken only when the read holds
        // more than one packet (a single append has nothing to group with): no guard,
        // allocation or queue lock per one-packet read.
        let mut deferred = None;
        while !self.conn.inflight.is_full() {
            let max_packet_size = self.conn.shared.config.max_packet_size_bytes;
            match decode(&mut self.buf, self.conn.protocol, max_packet_size) {
                Ok(Some(packet)) => {
                    decoded = true;
                    if !self.buf.is_empty() {
                        deferred.get_or_insert_with(|| {
                            self.conn.shared.store.messages.defer_writer_wakes()
                        });
                    }
                    self.conn.handle(packet)?;
                }
                Ok(None) => break,
                Err(error) => {
                    tracing::debug!(client_id = %self.conn.session.client_id, %error, "malformed packet");
                    return Err(Close::Protocol(decode_error_reason(&error)));
                }
            }
        }
        Ok(decoded)
    }
}

impl Conn {
    /// A kick (the sweeper's keep-alive timeout, a takeover, a slow subscriber, a failed
    /// write) or the server's shutdown ends the loop.
    fn ended_from_outside(&self) -> Option<Close> {
        if let Some(reason) = self.ctl.kick_reason() {
            return Some(if reason == ReasonCode::KEEP_ALIVE_TIMEOUT {
                // MQTT-3.1.2-22: the sweeper found nothing received within 1.5 x keep alive.
                Close::KeepAlive
            } else {
                Close::Kicked(reason)
            });
        }
        self.ctl.is_shut_down().then_some(Close::Shutdown)
    }

    /// Before the loop waits: drops the in-flight box if nothing is in flight, and says what
    /// to wait for, `(waiting for a store write, reading)`.
    fn before_wait(&mut self) -> (bool, bool) {
        self.inflight.release_if_idle();
        let waiting = self.inflight.has_pending_ticket();
        let backlogged = self.session.state.lock().out.control_len() >= MAX_CONTROL_BACKLOG;
        let reading = !self.inflight.is_full() && !backlogged;
        if !reading {
            // Not armed while not reading: no ticket may wait for this connection.
            self.read_slot.not_reading();
        }
        (waiting, reading)
    }

    /// Acts on what the wait returned. `Ok(true)`: the socket is readable.
    fn on_event<W: TransportWrite>(
        &mut self,
        event: Event,
        out: &mut Outflow<W>,
    ) -> Result<bool, Close> {
        match event {
            // A kick or the shutdown is seen at the top of the loop.
            Event::Woken => out.wake(),
            Event::Wrote(Ok(())) => {}
            Event::Wrote(Err(WriteFailed)) => {
                self.ctl.kick(ReasonCode::UNSPECIFIED_ERROR);
            }
            Event::Durable => {
                self.flush_released();
                if self.inflight.failed() {
                    // Not acknowledged: the client resends after reconnecting.
                    return Err(Close::Protocol(ReasonCode::UNSPECIFIED_ERROR));
                }
            }
            Event::Readable(Err(_)) => return Err(Close::Lost),
            Event::Readable(Ok(())) => return Ok(true),
        }
        Ok(false)
    }
}

/// What [`Live::read_now`] found.
enum ReadNow {
    /// Nothing after all (a spurious readiness).
    Nothing,
    /// End of stream or a failed socket.
    Lost,
    /// Bytes, with their ticket; `ended`: the peer closed after them.
    Read {
        ticket: Option<NonZeroU64>,
        ended: bool,
    },
}

/// One wait of the read loop: what `tokio::select! { biased; ... }` over these sources would
/// return, in one poll function, so that no select futures are kept in every idle connection's
/// state (the closure calling it holds a few references).
fn poll_event<R: TransportRead, W: TransportWrite<Io = R>>(
    conn: &mut Conn,
    reader: &R,
    out: &mut Outflow<W>,
    waiting: bool,
    reading: bool,
    cx: &mut Context<'_>,
) -> Poll<Event> {
    if conn.ctl.wake.poll(cx).is_ready() {
        return Poll::Ready(Event::Woken);
    }
    if waiting {
        if let Some(inflight) = conn.inflight.get_existing() {
            if inflight
                .pipeline
                .poll_front(cx, &mut inflight.released)
                .is_ready()
            {
                return Poll::Ready(Event::Durable);
            }
        }
    }
    if reading {
        if let Poll::Ready(ready) = poll_ordered(reader, &conn.read_slot, cx) {
            return Poll::Ready(Event::Readable(ready));
        }
    }
    let env = OutEnv {
        config: &conn.shared.config,
        metrics: &conn.shared.metrics,
        store: &*conn.shared.store.exchanges,
        session: &conn.session,
        conn_gen: conn.conn_gen,
        changed_sessions: &conn.shared.changed_sessions,
    };
    if let Poll::Ready(wrote) = out.poll_step(cx, &env, reader) {
        return Poll::Ready(Event::Wrote(wrote));
    }
    Poll::Pending
}
