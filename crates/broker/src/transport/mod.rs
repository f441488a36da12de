//! The transport seam: what a connection reads from and writes to.
//!
//! A connection is generic over [`Transport`], monomorphized twice: plain TCP
//! ([`tokio::net::TcpStream`]) and [`StreamTransport`], any `AsyncRead + AsyncWrite` byte stream
//! (TLS, WebSocket, TLS under WebSocket, the in-memory [`duplex`]). Plain TCP keeps the path it
//! had before the seam: readiness through the connection's `ReadSlot`, `try_read` into a stack
//! chunk, `write_vectored` of the outbound batch's parts, and no buffer of its own (an idle
//! connection holds none).
//!
//! Plain TCP is not split into two owners: its reading half is the whole `TcpStream` and its
//! writing half ([`TcpWrite`]) holds nothing, writing through the reading half it is given
//! ([`TransportWrite::Io`]). tokio's `into_split` shares the socket in an `Arc`: a 48 B block
//! in every idle connection (issue 15, BENCHMARKS "Session 7").
//!
//! # Read order for stream transports (ARCHITECTURE §2.1)
//! [`TransportRead::poll_readable`] is polled with the connection's `ReadSlot` as waker. A stream
//! transport reads in `poll_readable` itself (an `AsyncRead` has no readiness without a read), so
//! the waker reaches the socket under it (TLS and WebSocket wrap a `TcpStream`): the driver's
//! wake still takes the ticket in driver order. What differs from plain TCP: a wake for bytes
//! that do not complete a TLS record or a WebSocket frame finds nothing to hand over, and the
//! ticket is taken again at the next wake (so such a connection is ordered by the wake that
//! completed its record, which is when its packet could first be read anyway).
//!
//! # Invariants
//! - [`TransportRead::try_read`] never registers a waker: after `WouldBlock` the caller polls
//!   `poll_readable` before it waits, so the waker registered is always the slot's.
//! - A stream transport holds a read buffer only while bytes it read wait for `try_read`, and
//!   a write buffer only during a write.

mod context;
mod listener;
mod stream;

use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

pub use context::{ConnectionInfo, ListenerContext, TransportKind};
pub(crate) use listener::poll_accept_any;
pub use listener::{
    AcceptedSocket, CertificateCheck, ClientCertificate, Listener, Upgrade, UpgradeFuture, Upgraded,
};
pub use stream::{ByteStream, StreamRead, StreamTransport, StreamWrite, duplex};

/// At most this many parts go into one `write_vectored` call (Linux's `IOV_MAX` is 1024).
pub(crate) const MAX_IO_SLICES: usize = 512;

/// A connected byte stream, split into its reading and its writing half (both driven by the
/// connection's one task).
pub trait Transport: Send + 'static {
    type Read: TransportRead;
    type Write: TransportWrite<Io = Self::Read>;
    fn split(self) -> (Self::Read, Self::Write);
}

/// The reading half, shared by reference with the read loop's readiness future.
pub trait TransportRead: Send + Sync + 'static {
    /// `Ready` once [`TransportRead::try_read`] may return data, end of stream or an error;
    /// `Pending` registers `cx`'s waker (the connection's `ReadSlot`, module doc) with the
    /// socket. A poll, not a future: the connection waits for it without keeping a future.
    fn poll_readable(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
    /// Reads what is there without waiting: `WouldBlock` when nothing is, `Ok(0)` at the end.
    fn try_read(&self, buf: &mut [u8]) -> io::Result<usize>;
    /// [`TransportRead::poll_readable`] turns ready only with a wake of the waker it last
    /// registered, which follows (a socket's readiness, set by the I/O driver before it wakes):
    /// the connection's `ReadSlot` then waits for that wake, which orders the read (module doc).
    /// Not for a stream transport: its readiness is data it read, which its writing half may
    /// have read too (TLS, WebSocket), with no wake to come.
    const READY_WITH_WAKE: bool = false;
}

/// The writing half, owned by the connection's task.
pub trait TransportWrite: Send + 'static {
    /// The reading half, given to every write: plain TCP writes through it (its halves are one
    /// socket, module doc); a stream transport's writing half has its own and ignores it.
    type Io: TransportRead;
    /// Writes `parts` in order, as far as the transport takes them without waiting: written
    /// parts leave `parts`, a part written in part is advanced. `Ready(Ok)` once every part was
    /// written (and flushed), with `parts` empty.
    fn poll_write_parts(
        &mut self,
        io: &Self::Io,
        cx: &mut Context<'_>,
        parts: &mut Vec<Bytes>,
    ) -> Poll<io::Result<()>>;
    /// Writes every part, waiting for the transport as needed (the handshake and the close).
    fn write_parts<'a>(
        &'a mut self,
        io: &'a Self::Io,
        parts: &'a mut Vec<Bytes>,
    ) -> impl Future<Output = io::Result<()>> + Send + 'a {
        std::future::poll_fn(move |cx| self.poll_write_parts(io, cx, parts))
    }
    /// Flushes and closes the writing direction.
    fn shutdown<'a>(
        &'a mut self,
        io: &'a mut Self::Io,
    ) -> impl Future<Output = io::Result<()>> + Send + 'a;
}

impl Transport for TcpStream {
    type Read = TcpStream;
    type Write = TcpWrite;
    fn split(self) -> (TcpStream, TcpWrite) {
        let _ = self.set_nodelay(true);
        (self, TcpWrite)
    }
}

impl TransportRead for TcpStream {
    fn poll_readable(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Outside the task's coop budget: with the budget spent, tokio answers `Pending` and
        // wakes the waker at once, and that waker is the slot's: it would take a read ticket
        // with no data reported (ARCHITECTURE §2.1).
        let mut ready =
            tokio::task::unconstrained(std::future::poll_fn(|cx| self.poll_read_ready(cx)));
        Pin::new(&mut ready).poll(cx)
    }
    fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        TcpStream::try_read(self, buf)
    }
    const READY_WITH_WAKE: bool = true;
}

/// Plain TCP's writing half: nothing of its own, it writes through the `TcpStream` its
/// connection reads from (module doc).
pub struct TcpWrite;

impl TransportWrite for TcpWrite {
    type Io = TcpStream;
    fn poll_write_parts(
        &mut self,
        io: &TcpStream,
        cx: &mut Context<'_>,
        parts: &mut Vec<Bytes>,
    ) -> Poll<io::Result<()>> {
        poll_write_vectored_all(io, cx, parts)
    }
    fn shutdown<'a>(
        &'a mut self,
        io: &'a mut TcpStream,
    ) -> impl Future<Output = io::Result<()>> + Send + 'a {
        AsyncWriteExt::shutdown(io)
    }
}

/// One `write_vectored` as tokio's `poll_write_vectored` does it, through a shared reference:
/// a write the socket refuses (`WouldBlock`) clears its write readiness, and the poll of the
/// readiness registers `cx` before `Pending`.
fn poll_write_vectored(
    socket: &TcpStream,
    cx: &mut Context<'_>,
    slices: &[IoSlice<'_>],
) -> Poll<io::Result<usize>> {
    loop {
        match socket.try_write_vectored(slices) {
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                ready!(socket.poll_write_ready(cx))?;
            }
            result => return Poll::Ready(result),
        }
    }
}

/// Writes `parts` with as few `write_vectored` calls as the socket takes.
fn poll_write_vectored_all(
    socket: &TcpStream,
    cx: &mut Context<'_>,
    parts: &mut Vec<Bytes>,
) -> Poll<io::Result<()>> {
    let mut first = 0;
    let result = loop {
        if first >= parts.len() {
            break Ok(());
        }
        let end = parts.len().min(first + MAX_IO_SLICES);
        let mut slices = [IoSlice::new(&[]); MAX_IO_SLICES];
        for (slice, part) in slices.iter_mut().zip(&parts[first..end]) {
            *slice = IoSlice::new(part);
        }
        let mut written = match poll_write_vectored(socket, cx, &slices[..end - first]) {
            Poll::Pending => {
                // What was written leaves the list; the rest waits for the socket.
                parts.drain(..first);
                return Poll::Pending;
            }
            Poll::Ready(Err(error)) => break Err(error),
            Poll::Ready(Ok(0)) => break Err(io::ErrorKind::WriteZero.into()),
            Poll::Ready(Ok(written)) => written,
        };
        while written > 0 {
            let Some(part) = parts.get_mut(first) else {
                break;
            };
            if written >= part.len() {
                written -= part.len();
                first += 1;
            } else {
                part.advance(written);
                written = 0;
            }
        }
        while parts.get(first).is_some_and(|p| p.is_empty()) {
            first += 1;
        }
    };
    parts.clear();
    Poll::Ready(result)
}
