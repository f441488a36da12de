//! The transport seam: what a connection reads from and writes to.
//!
//! A connection is generic over [`Transport`], monomorphized twice: plain TCP
//! ([`tokio::net::TcpStream`]) and [`StreamTransport`], any `AsyncRead + AsyncWrite` byte stream
//! (TLS, WebSocket, TLS under WebSocket, the in-memory [`duplex`]). Plain TCP keeps the path it
//! had before the seam: readiness through the connection's `ReadSlot`, `try_read` into a stack
//! chunk, `write_vectored` of the writer's parts, and no buffer of its own (an idle connection
//! holds none).
//!
//! # Read order for stream transports (ARCHITECTURE §2.1)
//! [`TransportRead::readable`] is polled with the connection's `ReadSlot` as waker. A stream
//! transport reads in `readable` itself (an `AsyncRead` has no readiness without a read), so
//! the waker reaches the socket under it (TLS and WebSocket wrap a `TcpStream`): the driver's
//! wake still takes the ticket in driver order. What differs from plain TCP: a wake for bytes
//! that do not complete a TLS record or a WebSocket frame finds nothing to hand over, and the
//! ticket is taken again at the next wake (so such a connection is ordered by the wake that
//! completed its record, which is when its packet could first be read anyway).
//!
//! # Invariants
//! - [`TransportRead::try_read`] never registers a waker: after `WouldBlock` the caller polls
//!   `readable` before it waits, so the waker registered is always the slot's.
//! - A stream transport holds a read buffer only while bytes it read wait for `try_read`, and
//!   a write buffer only during a write.

mod context;
mod listener;
mod stream;

use std::future::Future;
use std::io::{self, IoSlice};

use bytes::{Buf, Bytes};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

pub use context::{ConnectionInfo, ListenerContext, TransportKind};
pub(crate) use listener::poll_accept_any;
pub use listener::{Listener, Upgrade, UpgradeFuture, Upgraded};
pub use stream::{ByteStream, StreamRead, StreamTransport, StreamWrite, duplex};

/// At most this many parts go into one `write_vectored` call (Linux's `IOV_MAX` is 1024).
pub(crate) const MAX_IO_SLICES: usize = 512;

/// A connected byte stream, split into the reader's and the writer's half.
pub trait Transport: Send + 'static {
    type Read: TransportRead;
    type Write: TransportWrite;
    fn split(self) -> (Self::Read, Self::Write);
}

/// The reading half, shared by reference with the read loop's readiness future.
pub trait TransportRead: Send + Sync + 'static {
    /// Resolves once [`TransportRead::try_read`] may return data, end of stream or an error.
    /// Polled with the connection's `ReadSlot` as waker (module doc).
    fn readable(&self) -> impl Future<Output = io::Result<()>> + Send + '_;
    /// Reads what is there without waiting: `WouldBlock` when nothing is, `Ok(0)` at the end.
    fn try_read(&self, buf: &mut [u8]) -> io::Result<usize>;
}

/// The writing half, owned by the connection's writer task.
pub trait TransportWrite: Send + 'static {
    /// Writes every part, in order; on return `parts` is empty.
    fn write_parts<'a>(
        &'a mut self,
        parts: &'a mut Vec<Bytes>,
    ) -> impl Future<Output = io::Result<()>> + Send + 'a;
    /// Flushes and closes the writing direction.
    fn shutdown(&mut self) -> impl Future<Output = io::Result<()>> + Send + '_;
}

impl Transport for TcpStream {
    type Read = OwnedReadHalf;
    type Write = OwnedWriteHalf;
    fn split(self) -> (OwnedReadHalf, OwnedWriteHalf) {
        let _ = self.set_nodelay(true);
        self.into_split()
    }
}

impl TransportRead for OwnedReadHalf {
    fn readable(&self) -> impl Future<Output = io::Result<()>> + Send + '_ {
        OwnedReadHalf::readable(self)
    }
    fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        OwnedReadHalf::try_read(self, buf)
    }
}

impl TransportWrite for OwnedWriteHalf {
    fn write_parts<'a>(
        &'a mut self,
        parts: &'a mut Vec<Bytes>,
    ) -> impl Future<Output = io::Result<()>> + Send + 'a {
        write_vectored_all(self, parts)
    }
    fn shutdown(&mut self) -> impl Future<Output = io::Result<()>> + Send + '_ {
        AsyncWriteExt::shutdown(self)
    }
}

/// Writes `parts` with as few `write_vectored` calls as the socket takes.
async fn write_vectored_all(socket: &mut OwnedWriteHalf, parts: &mut Vec<Bytes>) -> io::Result<()> {
    let mut first = 0;
    while first < parts.len() {
        let end = parts.len().min(first + MAX_IO_SLICES);
        let slices: Vec<IoSlice<'_>> = parts[first..end].iter().map(|b| IoSlice::new(b)).collect();
        let mut written = socket.write_vectored(&slices).await?;
        drop(slices);
        if written == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
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
    }
    parts.clear();
    Ok(())
}
