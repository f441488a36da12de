//! The outbound half of a connection ([`Outflow`]): takes a batch from its session's
//! outbound state (`state::outbound`, no I/O there) and writes it to the transport.

use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::time::Instant;

use crate::metrics::Metrics;
use crate::model::Ticket;
use crate::state::outbound::{BatchBufs, BatchEnv, WriterState};
use crate::state::session::Session;
use crate::transport::TransportWrite;

/// The outbound half of a connection, driven by the connection's own task (there is no writer
/// task: an idle connection is one task). It takes a batch from the session
/// ([`crate::state::outbound::Outbound::fill_batch`]) and writes it without waiting: a write the socket cannot
/// take yet stays in `parts` until it is writable, while the task goes on reading.
///
/// Nothing is written before `connack_after` (the session's and the will's records) is durable:
/// the CONNACK is the first packet queued; if that write failed, the connection closes without
/// it.
pub(crate) struct Outflow<W> {
    socket: W,
    writer: WriterState,
    /// The batch being built and written, boxed while a batch is in progress.
    bufs: Option<Box<BatchBufs>>,
    /// A batch is being written (then `bufs` is there). Not `!parts.is_empty()`: a stream
    /// transport takes the parts into its own buffer before the stream takes them, and that
    /// write must still be driven.
    writing: bool,
    /// Boxed: waited for once, then gone; inline it would be in every idle connection.
    connack_after: Option<Box<Ticket>>,
    /// `connack_after` failed: nothing may be written (a ticket reports its outcome once).
    connack_failed: bool,
    /// Take a batch at the next step: the connection was woken, or the last write completed.
    want_batch: bool,
    /// The gate held packets at the last batch: its front write must be polled. Packets enter
    /// the gate only during a batch or with a wake (`hold_pubrel`), so while this is false an
    /// idle step takes no lock: the loop steps once per read.
    gate_busy: bool,
}

/// The connection cannot write any more (logged where it happened).
#[derive(Debug)]
pub(crate) struct WriteFailed;

/// What a step needs of the broker and of the session the connection belongs to: narrow
/// handles, not the broker-wide state.
pub(crate) struct OutEnv<'a> {
    pub(crate) config: &'a crate::config::BrokerConfig,
    pub(crate) metrics: &'a Metrics,
    /// Records outbound QoS 2 exchanges (ARCHITECTURE §3).
    pub(crate) store: &'a dyn crate::model::ExchangeStore,
    pub(crate) session: &'a Session,
    pub(crate) conn_gen: u64,
    /// Where the session announces that what it holds changed (the checkpointer's list).
    pub(crate) changed_sessions: &'a crate::state::session::ChangedSessions,
}

impl<W: TransportWrite> Outflow<W> {
    pub(crate) fn new(socket: W, writer: WriterState, connack_after: Option<Ticket>) -> Self {
        Outflow {
            socket,
            writer,
            bufs: None,
            writing: false,
            connack_after: connack_after.map(Box::new),
            connack_failed: false,
            // The CONNACK is queued.
            want_batch: true,
            gate_busy: false,
        }
    }

    /// Something was queued for the connection (its `ConnCtl::wake`): take a batch next.
    pub(crate) fn wake(&mut self) {
        self.want_batch = true;
    }

    /// One step: takes a batch if there is reason to, and writes it. `Ready(Ok)` once a batch
    /// was written completely (call again for the next), `Pending` while waiting for the
    /// socket, a wake, the gate's store write or the CONNACK's.
    pub(crate) fn poll_step(
        &mut self,
        cx: &mut Context<'_>,
        env: &OutEnv<'_>,
        io: &W::Io,
    ) -> Poll<Result<(), WriteFailed>> {
        if self.connack_failed {
            // Also when stepped again before the connection closes: nothing may leave.
            return Poll::Ready(Err(WriteFailed));
        }
        if let Some(ticket) = &mut self.connack_after {
            match ticket.poll_wait(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(error)) => {
                    tracing::error!(%error, client_id = %env.session.client_id, "session state not written; closing the connection without CONNACK");
                    self.connack_after = None;
                    self.connack_failed = true;
                    return Poll::Ready(Err(WriteFailed));
                }
                Poll::Ready(Ok(())) => self.connack_after = None,
            }
        }
        while !self.writing {
            if !self.want_batch && !self.gate_busy {
                self.release_idle();
                return Poll::Pending;
            }
            let mut state = env.session.state.lock();
            if state.conn_gen != env.conn_gen || state.ended {
                return Poll::Pending;
            }
            // Polled before the batch: a store write completing after it wakes the task.
            let gate_ready = state.out.poll_gate(cx).is_ready();
            if !self.want_batch && !gate_ready {
                self.gate_busy = state.out.gate_holds_packets();
                drop(state);
                self.release_idle();
                return Poll::Pending;
            }
            self.want_batch = false;
            let batch = BatchEnv {
                config: env.config,
                metrics: env.metrics,
                store: env.store,
                client_id: &env.session.client_id,
                persistent: state.expiry_interval_s > 0,
                now: Instant::now(),
            };
            let bufs = self.bufs.get_or_insert_with(Box::default);
            state.out.fill_batch(&mut self.writer, &batch, bufs);
            env.changed_sessions.note(env.session, &state);
            self.gate_busy = state.out.gate_holds_packets();
            if state.out.gate_failed() && bufs.parts.is_empty() {
                // A write the session's packets waited for failed: nothing more can leave
                // safely.
                return Poll::Ready(Err(WriteFailed));
            }
            drop(state);
            count_sent(&bufs.parts, env.metrics);
            self.writing = !bufs.parts.is_empty();
        }
        debug_assert!(self.bufs.is_some(), "a batch is written from its buffers");
        let parts = &mut self.bufs.get_or_insert_with(Box::default).parts;
        match self.socket.poll_write_parts(io, cx, parts) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(error)) => {
                tracing::debug!(%error, "write failed; closing connection");
                Poll::Ready(Err(WriteFailed))
            }
            Poll::Ready(Ok(())) => {
                self.writing = false;
                self.want_batch = true;
                Poll::Ready(Ok(()))
            }
        }
    }

    /// Idle (nothing being written): keep no batch buffers (the part list that carried the
    /// CONNACK alone cost every idle connection 128 B).
    fn release_idle(&mut self) {
        debug_assert!(!self.writing);
        self.bufs = None;
    }

    /// The close: finishes the batch being written (nothing new is taken: the session was
    /// detached), writes `final_packet` (our DISCONNECT) and shuts the socket. Nothing leaves
    /// before the CONNACK's records are durable. The caller bounds it in time. True if all was
    /// written and the writing side shut down.
    pub(crate) async fn close(
        &mut self,
        io: &mut W::Io,
        metrics: &Metrics,
        final_packet: Option<Bytes>,
    ) -> bool {
        if let Some(mut ticket) = self.connack_after.take() {
            self.connack_failed = ticket.wait().await.is_err();
        }
        if self.connack_failed {
            let _ = self.socket.shutdown(io).await;
            return false;
        }
        let parts = &mut self.bufs.get_or_insert_with(Box::default).parts;
        if let Some(packet) = final_packet {
            // The batch's parts were counted when it was taken.
            Metrics::add(&metrics.bytes_sent, packet.len() as u64);
            parts.push(packet);
        }
        let unfinished = self.writing || !parts.is_empty();
        if unfinished && self.socket.write_parts(io, parts).await.is_err() {
            return false;
        }
        self.socket.shutdown(io).await.is_ok()
    }
}

/// Counts a batch's bytes as sent before it is written (a failed write ends the connection).
fn count_sent(parts: &[Bytes], metrics: &Metrics) {
    let bytes: usize = parts.iter().map(Bytes::len).sum();
    Metrics::add(&metrics.bytes_sent, bytes as u64);
}
