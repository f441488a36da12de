//! The hot loops: one publisher or subscriber per task, each driving its own socket.
//!
//! Every loop waits on a read and (when it has bytes to send) a write of the same socket at once,
//! so one task reads acknowledgements while its writes are pending and can never deadlock against
//! a broker that stops reading while it cannot write. Publishers copy a pre-encoded PUBLISH per message and
//! patch packet id and bench header in place; writes go out in batches of up to
//! [`OUT_HIGH_WATER_BYTES`]. Each read takes up to [`READ_CHUNK_BYTES`] and decodes every whole
//! packet in it. The clock is read once per batch, not per message.
//!
//! # Invariants
//! - A publisher has at most `window` QoS>0 messages unacknowledged, and `window` is below the
//!   65,535 packet ids, so a free id always exists when the window has room.
//! - Counters shared between tasks ([`Shared`]) are updated once per batch, not per message.
//! - `out` grows past [`OUT_HIGH_WATER_BYTES`] only by acknowledgements owed for packets already
//!   read, which the read size bounds.

use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

use crate::checker::{Counts, StreamCheck};
use crate::cli::Qos;
use crate::mqtt::{
    AckKind, AckTemplate, Conn, MAX_PACKET_BYTES, MqttError, PublishTemplate, READ_CHUNK_BYTES,
};
use crate::payload::Header;
use crate::stats::Latency;
use crate::tls::BenchStream;

/// A publisher stops filling its write buffer at this size and waits for the socket.
pub const OUT_HIGH_WATER_BYTES: usize = 64 * 1024;
/// Packet id space: 1..=65535.
const PACKET_IDS: usize = 65_536;
const FREE: u64 = u64::MAX;

/// The run's monotonic clock; every timestamp in payloads is ns since `epoch`.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    epoch: Instant,
}

impl Clock {
    pub fn new() -> Clock {
        Clock {
            epoch: Instant::now(),
        }
    }

    #[inline]
    pub fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    pub fn instant(&self, at_ns: u64) -> Instant {
        self.epoch + Duration::from_nanos(at_ns)
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

/// Live counters for the progress line and the drain logic.
///
/// The latency histograms are shared too (a histogram is ~0.5 MiB; one per subscriber would cost
/// hundreds of MiB in a 1,000-subscriber fan-out); each task records a whole read's worth of
/// samples per lock.
#[derive(Debug, Default)]
pub struct Shared {
    pub sent: AtomicU64,
    pub acked: AtomicU64,
    pub delivered: AtomicU64,
    pub e2e_latency: Mutex<Latency>,
    pub ack_latency: Mutex<Latency>,
}

/// Records a batch of samples into a shared histogram and empties the batch.
fn flush_samples(histogram: &Mutex<Latency>, samples: &mut Vec<u64>) {
    if samples.is_empty() {
        return;
    }
    // A poisoned lock only means another task panicked mid-record; the counts are still usable.
    let mut histogram = histogram
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    for &sample in samples.iter() {
        histogram.record_ns(sample);
    }
    samples.clear();
}

mod publisher;
mod subscriber;

pub use publisher::{Pace, PublisherPlan, PublisherResult, run_publisher};
pub use subscriber::{SubscriberPlan, SubscriberResult, run_subscriber};

/// Ensures room for a large read without reallocating on every read: decoded packets are frozen
/// slices of `inbuf`, so once they are dropped the buffer is unique again and `reserve` moves the
/// partial packet left over to the front instead of allocating (allocating 64 KiB+ per read
/// costs a fresh, page-faulting mmap each time).
#[inline]
fn make_read_room(inbuf: &mut BytesMut) {
    if inbuf.capacity() - inbuf.len() < READ_CHUNK_BYTES / 4 {
        inbuf.reserve(READ_CHUNK_BYTES);
    }
}

/// What woke a load loop.
enum Event {
    Read(usize),
    Wrote(usize),
    Flushed(()),
    Wake,
}

/// Writes from `out` (`Some(bytes written)`), or flushes when it is empty (`None`).
async fn write_or_flush<W: AsyncWrite + Unpin>(
    writer: &mut W,
    out: &[u8],
) -> std::io::Result<Option<usize>> {
    if out.is_empty() {
        writer.flush().await.map(|()| None)
    } else {
        writer.write(out).await.map(Some)
    }
}

fn consume(out: &mut BytesMut, written: usize) {
    if written >= out.len() {
        out.clear();
    } else {
        out.advance(written);
    }
}
