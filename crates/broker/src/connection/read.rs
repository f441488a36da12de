//! Reading the socket: readiness through the connection's read slot (ARCHITECTURE §2.1), reads
//! through a stack chunk, and [`settle`] after a read.

use std::future::{Future, poll_fn};
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use bytes::BytesMut;

use crate::read_order::ReadSlot;
use crate::transport::TransportRead;

/// Largest single socket read.
const READ_CHUNK_BYTES: usize = 8 * 1024;

/// After a read, [`settle`] reads on until the socket is empty, at most up to this much in the
/// buffer.
const SETTLE_MAX_BYTES: usize = 4 * READ_CHUNK_BYTES;

/// Waits until the socket is readable, then appends what is there to `buf`.
///
/// Reads through a stack chunk and copies into `buf`, so `buf` grows only by what arrived:
/// packets decoded from it are zero-copy slices that may outlive the read (queued and
/// retained messages), and a fixed-size reservation per read would pin a whole chunk for a
/// few bytes (measured: ~6 KiB of RSS per idle connection with 8 KiB reservations).
pub(super) async fn read_some<R: TransportRead>(
    reader: &R,
    buf: &mut BytesMut,
) -> io::Result<usize> {
    loop {
        reader.readable().await?;
        match try_read_chunk(reader, buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            other => return other,
        }
    }
}

/// The socket's readiness, polled through the connection's slot: the driver's wake takes a
/// ticket, in driver order (ARCHITECTURE §2.1). The read loop keeps one alive while it reads, so
/// that it stays registered with the driver while it handles a batch.
pub(super) async fn ordered_readable<R: TransportRead>(
    reader: &R,
    slot: &Arc<ReadSlot>,
) -> io::Result<()> {
    let readable = reader.readable();
    tokio::pin!(readable);
    slot.readable(|cx| readable.as_mut().poll(cx)).await
}

/// What [`settle`] found after a read.
pub(super) struct Settled {
    /// More bytes (they join the batch and its ticket).
    pub(super) more: usize,
    /// The peer closed (or the socket failed) after the bytes read so far.
    pub(super) ended: bool,
}

/// After a read, before its packets are handled: reads what else is there and, once the socket
/// is empty (which clears tokio's readiness), registers `readable` with the driver. Whatever
/// arrives while the batch is handled then comes with a wake, and so with a ticket in driver
/// order, instead of being found by the next read with a ticket taken only then. Stops reading
/// at [`SETTLE_MAX_BYTES`] in the buffer (a connection that always has more is ordered by its
/// reads). `fresh` makes a new `readable` when the old one completed.
pub(super) async fn settle<R: TransportRead, F: Future<Output = io::Result<()>>>(
    reader: &R,
    buf: &mut BytesMut,
    mut readable: Pin<&mut F>,
    fresh: &impl Fn() -> F,
) -> Settled {
    let mut settled = Settled {
        more: 0,
        ended: false,
    };
    while buf.len() < SETTLE_MAX_BYTES {
        match try_read_chunk(reader, buf) {
            Ok(0) => settled.ended = true,
            Ok(n) => {
                settled.more += n;
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                match poll_fn(|cx| Poll::Ready(readable.as_mut().poll(cx))).await {
                    Poll::Pending => {} // registered
                    Poll::Ready(Ok(())) => {
                        // Data came in between: read it too.
                        readable.set(fresh());
                        continue;
                    }
                    Poll::Ready(Err(_)) => {
                        readable.set(fresh());
                        settled.ended = true;
                    }
                }
            }
            Err(_) => settled.ended = true,
        }
        break;
    }
    settled
}

pub(super) fn try_read_chunk<R: TransportRead>(
    reader: &R,
    buf: &mut BytesMut,
) -> io::Result<usize> {
    let mut chunk = [0u8; READ_CHUNK_BYTES];
    let n = reader.try_read(&mut chunk)?;
    buf.extend_from_slice(&chunk[..n]);
    Ok(n)
}
