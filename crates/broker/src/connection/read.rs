//! Reading the socket: readiness through the connection's read slot (ARCHITECTURE §2.1), reads
//! through a stack chunk, and [`settle`] after a read.

use std::future::poll_fn;
use std::io;
use std::sync::Arc;
use std::task::{Context, Poll};

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
        poll_fn(|cx| reader.poll_readable(cx)).await?;
        match try_read_chunk(reader, buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            other => return other,
        }
    }
}

/// The socket's readiness, polled through the connection's slot: the driver's wake takes a
/// ticket, in driver order (ARCHITECTURE §2.1). Once it returned `Pending` the connection stays
/// registered with the driver (also while it handles a batch) until it is ready or reading
/// stops ([`ReadSlot::not_reading`]).
pub(super) fn poll_ordered<R: TransportRead>(
    reader: &R,
    slot: &Arc<ReadSlot>,
    cx: &mut Context<'_>,
) -> Poll<io::Result<()>> {
    slot.poll_readable(cx, R::READY_WITH_WAKE, |cx| reader.poll_readable(cx))
}

/// What [`settle`] found after a read.
pub(super) struct Settled {
    /// More bytes (they join the batch and its ticket).
    pub(super) more: usize,
    /// The peer closed (or the socket failed) after the bytes read so far.
    pub(super) ended: bool,
}

/// After a read, before its packets are handled: reads what else is there and, once the socket
/// is empty (which clears tokio's readiness), registers with the driver through `slot`.
/// Whatever arrives while the batch is handled then comes with a wake, and so with a ticket in
/// driver order, instead of being found by the next read with a ticket taken only then. Stops
/// reading at [`SETTLE_MAX_BYTES`] in the buffer (a connection that always has more is ordered
/// by its reads).
/// `cx` registers the connection (the caller's task) for the readiness; nothing here waits, so
/// no future of its own is kept in the connection's state.
pub(super) fn settle<R: TransportRead>(
    reader: &R,
    buf: &mut BytesMut,
    slot: &Arc<ReadSlot>,
    cx: &mut Context<'_>,
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
                match poll_ordered(reader, slot, cx) {
                    Poll::Pending => {} // registered
                    // Data came in between: read it too.
                    Poll::Ready(Ok(())) => continue,
                    Poll::Ready(Err(_)) => settled.ended = true,
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
