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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use tern_wire::{Packet, QoS};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
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

/// Open-loop schedule: message `seq` is due at `start_ns + seq * interval_ns`.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    pub start_ns: u64,
    pub interval_ns: f64,
}

impl Pace {
    #[inline]
    pub fn due_ns(&self, seq: u64) -> u64 {
        self.start_ns + (seq as f64 * self.interval_ns) as u64
    }
}

pub struct PublisherPlan {
    pub id: u32,
    pub qos: Qos,
    pub messages: u64,
    pub window: u32,
    pub template: PublishTemplate,
    pub pace: Option<Pace>,
}

#[derive(Debug, Default)]
pub struct PublisherResult {
    pub sent: u64,
    pub acked: u64,
    pub first_send_ns: Option<u64>,
    pub last_ack_ns: u64,
    /// Open loop: messages stamped with their due time because back-pressure held them.
    pub delayed_by_backpressure: u64,
}

/// Publishes `plan.messages` messages and waits for every acknowledgement.
pub async fn run_publisher(
    conn: Conn,
    plan: PublisherPlan,
    clock: Clock,
    shared: Arc<Shared>,
) -> Result<PublisherResult, MqttError> {
    let window = match conn.limits.receive_maximum {
        Some(max) => plan.window.min(u32::from(max)),
        None => plan.window,
    }
    .max(1);
    let pubrel = AckTemplate::new(conn.protocol, AckKind::PubRel)?;
    let Conn {
        stream,
        inbuf,
        protocol,
        ..
    } = conn;
    let env = PublisherEnv {
        window,
        pubrel,
        protocol,
        plan,
        clock,
        shared,
    };
    match stream {
        BenchStream::Tcp(mut tcp) => {
            let (reader, writer) = tcp.split();
            publish_on(reader, writer, inbuf, env).await
        }
        BenchStream::Tls(tls) => {
            let (reader, writer) = tokio::io::split(*tls);
            publish_on(reader, writer, inbuf, env).await
        }
    }
}

/// What [`publish_on`] needs besides the socket halves.
struct PublisherEnv {
    window: u32,
    pubrel: AckTemplate,
    protocol: tern_wire::Protocol,
    plan: PublisherPlan,
    clock: Clock,
    shared: Arc<Shared>,
}

/// The publisher's loop on either transport (plain TCP keeps its borrowed split halves).
async fn publish_on<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    mut reader: R,
    mut writer: W,
    mut inbuf: BytesMut,
    env: PublisherEnv,
) -> Result<PublisherResult, MqttError> {
    let PublisherEnv {
        window,
        pubrel,
        protocol,
        plan,
        clock,
        shared,
    } = env;
    let qos = plan.qos;
    // TLS buffers what a write could not send yet: flushed once `out` is empty.
    let mut unflushed = false;
    let template = &plan.template;
    let mut since_ns = if qos == Qos::AtMostOnce {
        Vec::new()
    } else {
        vec![FREE; PACKET_IDS]
    };
    let mut next_packet_id: usize = 1;
    let mut inflight: u32 = 0;
    let mut seq: u64 = 0;
    let mut out = BytesMut::with_capacity(OUT_HIGH_WATER_BYTES + template.bytes.len());
    let mut result = PublisherResult::default();
    let mut samples: Vec<u64> = Vec::new();
    // Open loop: set while a due message could not be queued because of back-pressure.
    let mut held_back = false;

    loop {
        let now_ns = clock.now_ns();
        let mut wake_at_ns = None;
        let sent_before = seq;
        while seq < plan.messages {
            let window_full = qos != Qos::AtMostOnce && inflight >= window;
            if window_full || out.len() >= OUT_HIGH_WATER_BYTES {
                held_back = plan.pace.is_some_and(|pace| pace.due_ns(seq) <= now_ns);
                break;
            }
            let send_ns = match plan.pace {
                Some(pace) => {
                    let due_ns = pace.due_ns(seq);
                    if due_ns > now_ns {
                        held_back = false;
                        wake_at_ns = Some(due_ns);
                        break;
                    }
                    // A message the timer merely woke late for is stamped with the real send
                    // time; one that back-pressure held keeps its due time, so the wait counts.
                    if held_back {
                        result.delayed_by_backpressure += 1;
                        due_ns
                    } else {
                        now_ns
                    }
                }
                None => now_ns,
            };
            let start = out.len();
            out.extend_from_slice(&template.bytes);
            if let Some(at) = template.packet_id_at {
                while since_ns[next_packet_id] != FREE {
                    next_packet_id = next_packet_id % (PACKET_IDS - 1) + 1;
                }
                let id = next_packet_id as u16;
                out[start + at..start + at + 2].copy_from_slice(&id.to_be_bytes());
                since_ns[next_packet_id] = send_ns;
                next_packet_id = next_packet_id % (PACKET_IDS - 1) + 1;
                inflight += 1;
            }
            let header = Header {
                publisher_id: plan.id,
                seq,
                send_time_ns: send_ns,
            };
            // The template's payload is at least HEADER_BYTES long (checked by the CLI).
            let _ = header.write(&mut out[start + template.payload_at..]);
            result.first_send_ns.get_or_insert(send_ns);
            seq += 1;
        }
        if seq > sent_before {
            shared.sent.fetch_add(seq - sent_before, Ordering::Relaxed);
        }
        if seq == plan.messages && inflight == 0 && out.is_empty() {
            break;
        }

        make_read_room(&mut inbuf);
        let wake = async {
            match wake_at_ns {
                Some(at_ns) => tokio::time::sleep_until(clock.instant(at_ns).into()).await,
                None => std::future::pending().await,
            }
        };
        let event = tokio::select! {
            read = reader.read_buf(&mut inbuf) => Event::Read(read?),
            // One arm for both: they borrow the writer. A flush is a no-op on plain TCP.
            io = write_or_flush(&mut writer, &out), if !out.is_empty() || unflushed => match io? {
                Some(written) => Event::Wrote(written),
                None => Event::Flushed(()),
            },
            _ = wake, if out.is_empty() && !unflushed => Event::Wake,
        };
        match event {
            Event::Read(0) => return Err(MqttError::Closed),
            Event::Read(_) => {
                let now_ns = clock.now_ns();
                let acked_before = result.acked;
                while let Some(packet) = tern_wire::decode(&mut inbuf, protocol, MAX_PACKET_BYTES)?
                {
                    let completed = match (&packet, qos) {
                        (Packet::PubAck(ack), Qos::AtLeastOnce) => Some(ack.packet_id),
                        (Packet::PubComp(ack), Qos::ExactlyOnce) => Some(ack.packet_id),
                        (Packet::PubRec(ack), Qos::ExactlyOnce) => {
                            if !ack.reason.is_success() {
                                return Err(MqttError::Refused(ack.reason.0));
                            }
                            pubrel.push(ack.packet_id, &mut out);
                            None
                        }
                        (Packet::Disconnect(_), _) => return Err(MqttError::Closed),
                        (Packet::PingResp, _) => None,
                        _ => return Err(MqttError::Unexpected("packet", "publishing")),
                    };
                    if let Some(id) = completed {
                        let slot = &mut since_ns[usize::from(id)];
                        if *slot == FREE {
                            return Err(MqttError::Unexpected(
                                "ack for a packet id not in flight",
                                "publishing",
                            ));
                        }
                        samples.push(now_ns.saturating_sub(*slot));
                        *slot = FREE;
                        inflight -= 1;
                        result.acked += 1;
                        result.last_ack_ns = now_ns;
                    }
                }
                flush_samples(&shared.ack_latency, &mut samples);
                if result.acked > acked_before {
                    shared
                        .acked
                        .fetch_add(result.acked - acked_before, Ordering::Relaxed);
                }
            }
            Event::Wrote(written) => {
                consume(&mut out, written);
                unflushed = true;
            }
            Event::Flushed(()) => unflushed = false,
            Event::Wake => {}
        }
    }
    result.sent = seq;
    Ok(result)
}

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

pub struct SubscriberPlan {
    pub publishers: u32,
    pub messages_per_publisher: u64,
}

#[derive(Debug, Default)]
pub struct SubscriberResult {
    pub counts: Counts,
    /// Every PUBLISH received, duplicates included.
    pub deliveries: u64,
    pub last_delivery_ns: u64,
    /// Deliveries whose QoS was not the QoS subscribed at (the broker downgraded or upgraded).
    pub qos_mismatches: u64,
}

/// Receives until every publisher's every message arrived, or until `stop` says so.
pub async fn run_subscriber(
    conn: Conn,
    plan: SubscriberPlan,
    qos: Qos,
    clock: Clock,
    shared: Arc<Shared>,
    stop: watch::Receiver<bool>,
) -> Result<SubscriberResult, MqttError> {
    let puback = AckTemplate::new(conn.protocol, AckKind::PubAck)?;
    let pubrec = AckTemplate::new(conn.protocol, AckKind::PubRec)?;
    let pubcomp = AckTemplate::new(conn.protocol, AckKind::PubComp)?;
    let Conn {
        stream,
        inbuf,
        protocol,
        ..
    } = conn;
    let env = SubscriberEnv {
        acks: [puback, pubrec, pubcomp],
        protocol,
        plan,
        qos,
        clock,
        shared,
    };
    match stream {
        BenchStream::Tcp(mut tcp) => {
            let (reader, writer) = tcp.split();
            subscribe_on(reader, writer, inbuf, env, stop).await
        }
        BenchStream::Tls(tls) => {
            let (reader, writer) = tokio::io::split(*tls);
            subscribe_on(reader, writer, inbuf, env, stop).await
        }
    }
}

/// What [`subscribe_on`] needs besides the socket halves.
struct SubscriberEnv {
    /// PUBACK, PUBREC, PUBCOMP.
    acks: [AckTemplate; 3],
    protocol: tern_wire::Protocol,
    plan: SubscriberPlan,
    qos: Qos,
    clock: Clock,
    shared: Arc<Shared>,
}

/// The subscriber's loop on either transport.
async fn subscribe_on<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    mut reader: R,
    mut writer: W,
    mut inbuf: BytesMut,
    env: SubscriberEnv,
    mut stop: watch::Receiver<bool>,
) -> Result<SubscriberResult, MqttError> {
    let SubscriberEnv {
        acks: [puback, pubrec, pubcomp],
        protocol,
        plan,
        qos,
        clock,
        shared,
    } = env;
    let mut unflushed = false;
    let mut checks: Vec<StreamCheck> = (0..plan.publishers)
        .map(|_| StreamCheck::new(plan.messages_per_publisher))
        .collect();
    let mut incomplete = checks.iter().filter(|check| !check.complete()).count();
    let mut out = BytesMut::new();
    let mut result = SubscriberResult::default();
    let mut malformed_payloads = 0u64;
    let mut samples: Vec<u64> = Vec::new();

    loop {
        if incomplete == 0 && out.is_empty() {
            break;
        }
        make_read_room(&mut inbuf);
        let event = tokio::select! {
            read = reader.read_buf(&mut inbuf) => Event::Read(read?),
            // One arm for both: they borrow the writer. A flush is a no-op on plain TCP.
            io = write_or_flush(&mut writer, &out), if !out.is_empty() || unflushed => match io? {
                Some(written) => Event::Wrote(written),
                None => Event::Flushed(()),
            },
            _ = stop.changed() => break,
        };
        match event {
            Event::Read(0) => return Err(MqttError::Closed),
            Event::Read(_) => {
                let now_ns = clock.now_ns();
                let deliveries_before = result.deliveries;
                while let Some(packet) = tern_wire::decode(&mut inbuf, protocol, MAX_PACKET_BYTES)?
                {
                    match packet {
                        Packet::Publish(publish) => {
                            result.deliveries += 1;
                            match publish.qos {
                                QoS::AtMostOnce => {}
                                QoS::AtLeastOnce => puback.push(publish.packet_id, &mut out),
                                QoS::ExactlyOnce => pubrec.push(publish.packet_id, &mut out),
                            }
                            if Qos::from_wire(publish.qos) != qos {
                                result.qos_mismatches += 1;
                            }
                            let Ok(header) = Header::read(&publish.payload) else {
                                malformed_payloads += 1;
                                continue;
                            };
                            let Some(check) = checks.get_mut(header.publisher_id as usize) else {
                                malformed_payloads += 1;
                                continue;
                            };
                            let was_complete = check.complete();
                            if check.record(header.seq) {
                                samples.push(now_ns.saturating_sub(header.send_time_ns));
                            }
                            if !was_complete && check.complete() {
                                incomplete -= 1;
                            }
                        }
                        Packet::PubRel(ack) => pubcomp.push(ack.packet_id, &mut out),
                        Packet::PingResp => {}
                        Packet::Disconnect(_) => return Err(MqttError::Closed),
                        _ => return Err(MqttError::Unexpected("packet", "subscribing")),
                    }
                }
                flush_samples(&shared.e2e_latency, &mut samples);
                if result.deliveries > deliveries_before {
                    result.last_delivery_ns = now_ns;
                    shared
                        .delivered
                        .fetch_add(result.deliveries - deliveries_before, Ordering::Relaxed);
                }
            }
            Event::Wrote(written) => {
                consume(&mut out, written);
                unflushed = true;
            }
            Event::Flushed(()) => unflushed = false,
            Event::Wake => {}
        }
    }
    for check in &checks {
        result.counts.add(&check.counts());
    }
    result.counts.out_of_range += malformed_payloads;
    Ok(result)
}
