//! One publisher: a pre-encoded PUBLISH copied per message, packet id and bench header
//! patched in place, at most `window` unacknowledged.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::BytesMut;
use tern_wire::Packet;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};

use super::*;

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

/// A publisher's state between wake-ups: its plan, the messages sent, the packet ids in flight
/// (with their send times) and the bytes waiting for the socket.
struct Publisher {
    env: PublisherEnv,
    /// Send time by packet id, [`FREE`] when the id is not in flight (empty at QoS 0).
    since_ns: Vec<u64>,
    next_packet_id: usize,
    inflight: u32,
    seq: u64,
    out: BytesMut,
    result: PublisherResult,
    samples: Vec<u64>,
    /// Open loop: set while a due message could not be queued because of back-pressure.
    held_back: bool,
}

impl Publisher {
    fn new(env: PublisherEnv) -> Publisher {
        let since_ns = if env.plan.qos == Qos::AtMostOnce {
            Vec::new()
        } else {
            vec![FREE; PACKET_IDS]
        };
        let out = BytesMut::with_capacity(OUT_HIGH_WATER_BYTES + env.plan.template.bytes.len());
        Publisher {
            env,
            since_ns,
            next_packet_id: 1,
            inflight: 0,
            seq: 0,
            out,
            result: PublisherResult::default(),
            samples: Vec::new(),
            held_back: false,
        }
    }

    /// Every message sent and acknowledged, every byte written.
    fn finished(&self) -> bool {
        self.seq == self.env.plan.messages && self.inflight == 0 && self.out.is_empty()
    }

    /// Queues the messages due by `now_ns` that the window and the write buffer have room for;
    /// returns when the next one is due, if a pace holds it back.
    fn fill(&mut self, now_ns: u64) -> Option<u64> {
        let plan = &self.env.plan;
        let (messages, qos, pace, window) = (plan.messages, plan.qos, plan.pace, self.env.window);
        let sent_before = self.seq;
        let mut wake_at_ns = None;
        while self.seq < messages {
            let window_full = qos != Qos::AtMostOnce && self.inflight >= window;
            if window_full || self.out.len() >= OUT_HIGH_WATER_BYTES {
                self.held_back = pace.is_some_and(|pace| pace.due_ns(self.seq) <= now_ns);
                break;
            }
            let send_ns = match pace {
                Some(pace) => {
                    let due_ns = pace.due_ns(self.seq);
                    if due_ns > now_ns {
                        self.held_back = false;
                        wake_at_ns = Some(due_ns);
                        break;
                    }
                    // A message the timer merely woke late for is stamped with the real send
                    // time; one that back-pressure held keeps its due time, so the wait counts.
                    if self.held_back {
                        self.result.delayed_by_backpressure += 1;
                        due_ns
                    } else {
                        now_ns
                    }
                }
                None => now_ns,
            };
            self.queue_one(send_ns);
        }
        if self.seq > sent_before {
            let sent = self.seq - sent_before;
            self.env.shared.sent.fetch_add(sent, Ordering::Relaxed);
        }
        wake_at_ns
    }

    /// Copies the template into `out`, with the next free packet id and the bench header.
    fn queue_one(&mut self, send_ns: u64) {
        let template = &self.env.plan.template;
        let start = self.out.len();
        self.out.extend_from_slice(&template.bytes);
        if let Some(at) = template.packet_id_at {
            while self.since_ns[self.next_packet_id] != FREE {
                self.next_packet_id = self.next_packet_id % (PACKET_IDS - 1) + 1;
            }
            let id = self.next_packet_id as u16;
            self.out[start + at..start + at + 2].copy_from_slice(&id.to_be_bytes());
            self.since_ns[self.next_packet_id] = send_ns;
            self.next_packet_id = self.next_packet_id % (PACKET_IDS - 1) + 1;
            self.inflight += 1;
        }
        let header = Header {
            publisher_id: self.env.plan.id,
            seq: self.seq,
            send_time_ns: send_ns,
        };
        // The template's payload is at least HEADER_BYTES long (checked by the CLI).
        let _ = header.write(&mut self.out[start + template.payload_at..]);
        self.result.first_send_ns.get_or_insert(send_ns);
        self.seq += 1;
    }

    /// Handles every whole packet in `inbuf`: acknowledgements end messages (their latency
    /// sampled), a PUBREC is answered with a PUBREL.
    fn read(&mut self, inbuf: &mut BytesMut) -> Result<(), MqttError> {
        let now_ns = self.env.clock.now_ns();
        let acked_before = self.result.acked;
        let (protocol, qos) = (self.env.protocol, self.env.plan.qos);
        while let Some(packet) = tern_wire::decode(inbuf, protocol, MAX_PACKET_BYTES)? {
            let completed = match (&packet, qos) {
                (Packet::PubAck(ack), Qos::AtLeastOnce) => Some(ack.packet_id),
                (Packet::PubComp(ack), Qos::ExactlyOnce) => Some(ack.packet_id),
                (Packet::PubRec(ack), Qos::ExactlyOnce) => {
                    if !ack.reason.is_success() {
                        return Err(MqttError::Refused(ack.reason.0));
                    }
                    self.env.pubrel.push(ack.packet_id, &mut self.out);
                    None
                }
                (Packet::Disconnect(_), _) => return Err(MqttError::Closed),
                (Packet::PingResp, _) => None,
                _ => return Err(MqttError::Unexpected("packet", "publishing")),
            };
            if let Some(id) = completed {
                self.acknowledged(id, now_ns)?;
            }
        }
        flush_samples(&self.env.shared.ack_latency, &mut self.samples);
        if self.result.acked > acked_before {
            let acked = self.result.acked - acked_before;
            self.env.shared.acked.fetch_add(acked, Ordering::Relaxed);
        }
        Ok(())
    }

    /// The message sent with packet id `id` is acknowledged at `now_ns`.
    fn acknowledged(&mut self, id: u16, now_ns: u64) -> Result<(), MqttError> {
        let slot = &mut self.since_ns[usize::from(id)];
        if *slot == FREE {
            return Err(MqttError::Unexpected(
                "ack for a packet id not in flight",
                "publishing",
            ));
        }
        self.samples.push(now_ns.saturating_sub(*slot));
        *slot = FREE;
        self.inflight -= 1;
        self.result.acked += 1;
        self.result.last_ack_ns = now_ns;
        Ok(())
    }
}

/// The publisher's loop on either transport (plain TCP keeps its borrowed split halves).
async fn publish_on<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    mut reader: R,
    mut writer: W,
    mut inbuf: BytesMut,
    env: PublisherEnv,
) -> Result<PublisherResult, MqttError> {
    let mut p = Publisher::new(env);
    // TLS buffers what a write could not send yet: flushed once `out` is empty.
    let mut unflushed = false;
    loop {
        let wake_at_ns = p.fill(p.env.clock.now_ns());
        if p.finished() {
            break;
        }
        make_read_room(&mut inbuf);
        let clock = &p.env.clock;
        let wake = async {
            match wake_at_ns {
                Some(at_ns) => tokio::time::sleep_until(clock.instant(at_ns).into()).await,
                None => std::future::pending().await,
            }
        };
        let out = &p.out;
        let event = tokio::select! {
            read = reader.read_buf(&mut inbuf) => Event::Read(read?),
            // One arm for both: they borrow the writer. A flush is a no-op on plain TCP.
            io = write_or_flush(&mut writer, out), if !out.is_empty() || unflushed => match io? {
                Some(written) => Event::Wrote(written),
                None => Event::Flushed(()),
            },
            _ = wake, if out.is_empty() && !unflushed => Event::Wake,
        };
        match event {
            Event::Read(0) => return Err(MqttError::Closed),
            Event::Read(_) => p.read(&mut inbuf)?,
            Event::Wrote(written) => {
                consume(&mut p.out, written);
                unflushed = true;
            }
            Event::Flushed(()) => unflushed = false,
            Event::Wake => {}
        }
    }
    p.result.sent = p.seq;
    Ok(p.result)
}
