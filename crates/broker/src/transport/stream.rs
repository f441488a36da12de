//! [`StreamTransport`]: any `AsyncRead + AsyncWrite` byte stream as a [`Transport`] (TLS,
//! WebSocket, the in-memory [`duplex`]).

use std::future::Future;
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf, ReadHalf, WriteHalf};

use super::{Transport, TransportRead, TransportWrite};

/// What a stream transport wraps.
pub trait ByteStream: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> ByteStream for T {}

/// Largest single read from the stream.
const READ_CHUNK_BYTES: usize = 8 * 1024;

/// A write is copied into buffers of at most this size: TLS and WebSocket would otherwise
/// make a record or a frame of every part (a PUBLISH head of a few bytes, then its body), and
/// a vectored write of an `AsyncWrite` without native support writes one part per call.
const WRITE_COALESCE_BYTES: usize = 64 * 1024;

/// Bytes per duplex direction buffered by [`duplex`].
const DUPLEX_BUFFER_BYTES: usize = 64 * 1024;

/// A byte stream (boxed: one monomorphization of the connection for every stream kind).
pub struct StreamTransport(Box<dyn ByteStream>);

impl StreamTransport {
    pub fn new(stream: impl ByteStream) -> StreamTransport {
        StreamTransport(Box::new(stream))
    }

    /// A stream already boxed (not boxed twice).
    pub fn boxed(stream: Box<dyn ByteStream>) -> StreamTransport {
        StreamTransport(stream)
    }
}

/// An in-memory connection: the broker's end as a [`StreamTransport`], and the client's end.
/// For tests and the simulator: a whole MQTT session without a socket.
pub fn duplex() -> (StreamTransport, DuplexStream) {
    let (server, client) = tokio::io::duplex(DUPLEX_BUFFER_BYTES);
    (StreamTransport::new(server), client)
}

impl Transport for StreamTransport {
    type Read = StreamRead;
    type Write = StreamWrite;
    fn split(self) -> (StreamRead, StreamWrite) {
        let (read, write) = tokio::io::split(self.0);
        (
            StreamRead(Mutex::new(ReadState {
                half: read,
                pending: BytesMut::new(),
                ended: false,
            })),
            StreamWrite {
                half: write,
                out: BytesMut::new(),
            },
        )
    }
}

/// The reading half of a [`StreamTransport`].
pub struct StreamRead(Mutex<ReadState>);

struct ReadState {
    half: ReadHalf<Box<dyn ByteStream>>,
    /// Read by `poll_readable`, not yet taken by `try_read`; empty (no allocation) otherwise.
    pending: BytesMut,
    /// The stream ended (or failed) after `pending`.
    ended: bool,
}

impl TransportRead for StreamRead {
    fn poll_readable(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut state = self.0.lock();
        if !state.pending.is_empty() || state.ended {
            return Poll::Ready(Ok(()));
        }
        let mut chunk = [MaybeUninit::<u8>::uninit(); READ_CHUNK_BYTES];
        let mut read = ReadBuf::uninit(&mut chunk);
        match Pin::new(&mut state.half).poll_read(cx, &mut read) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(())) => {
                let filled = read.filled();
                if filled.is_empty() {
                    state.ended = true;
                } else {
                    state.pending.extend_from_slice(filled);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(error)) => {
                state.ended = true;
                Poll::Ready(Err(error))
            }
        }
    }

    fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        let mut state = self.0.lock();
        if state.pending.is_empty() {
            return if state.ended {
                Ok(0)
            } else {
                Err(io::ErrorKind::WouldBlock.into())
            };
        }
        let n = buf.len().min(state.pending.len());
        buf[..n].copy_from_slice(&state.pending[..n]);
        state.pending.advance(n);
        if state.pending.is_empty() {
            // Idle connections keep no read buffer.
            state.pending = BytesMut::new();
        }
        Ok(n)
    }
}

/// The writing half of a [`StreamTransport`].
pub struct StreamWrite {
    half: WriteHalf<Box<dyn ByteStream>>,
    /// Parts copied together, not yet taken by the stream; empty (no allocation) between
    /// batches.
    out: BytesMut,
}

impl TransportWrite for StreamWrite {
    /// Not used: the stream's halves are owned apart.
    type Io = StreamRead;
    fn poll_write_parts(
        &mut self,
        _io: &StreamRead,
        cx: &mut Context<'_>,
        parts: &mut Vec<Bytes>,
    ) -> Poll<io::Result<()>> {
        loop {
            if !self.out.is_empty() {
                let n = ready!(Pin::new(&mut self.half).poll_write(cx, &self.out))?;
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                self.out.advance(n);
                continue;
            }
            if let Some(part) = parts
                .first_mut()
                .filter(|p| p.len() >= WRITE_COALESCE_BYTES)
            {
                // Large enough to go as it is.
                let n = ready!(Pin::new(&mut self.half).poll_write(cx, part))?;
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                part.advance(n);
                if part.is_empty() {
                    parts.remove(0);
                }
                continue;
            }
            let mut taken = 0;
            for part in parts.iter() {
                let full = self.out.len() + part.len() > WRITE_COALESCE_BYTES;
                if part.len() >= WRITE_COALESCE_BYTES || (full && !self.out.is_empty()) {
                    break;
                }
                if self.out.capacity() == 0 {
                    let total: usize = parts.iter().map(Bytes::len).sum();
                    self.out.reserve(total.min(WRITE_COALESCE_BYTES));
                }
                self.out.extend_from_slice(part);
                taken += 1;
            }
            if taken > 0 {
                parts.drain(..taken);
                continue;
            }
            ready!(Pin::new(&mut self.half).poll_flush(cx))?;
            // Idle connections keep no write buffer.
            self.out = BytesMut::new();
            return Poll::Ready(Ok(()));
        }
    }

    fn shutdown<'a>(
        &'a mut self,
        _io: &'a mut StreamRead,
    ) -> impl Future<Output = io::Result<()>> + Send + 'a {
        AsyncWriteExt::shutdown(&mut self.half)
    }
}
