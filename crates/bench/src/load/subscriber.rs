//! One subscriber: every delivery acknowledged and checked against its publisher's
//! sequence.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::BytesMut;
use tern_wire::{Packet, QoS};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};

use super::*;

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

/// A subscriber's state between wake-ups: a check of each publisher's sequence, the
/// acknowledgements waiting for the socket.
struct Subscriber {
    env: SubscriberEnv,
    checks: Vec<StreamCheck>,
    /// Publishers whose every message has not yet arrived.
    incomplete: usize,
    out: BytesMut,
    result: SubscriberResult,
    malformed_payloads: u64,
    samples: Vec<u64>,
}

impl Subscriber {
    fn new(env: SubscriberEnv) -> Subscriber {
        let checks: Vec<StreamCheck> = (0..env.plan.publishers)
            .map(|_| StreamCheck::new(env.plan.messages_per_publisher))
            .collect();
        let incomplete = checks.iter().filter(|check| !check.complete()).count();
        Subscriber {
            env,
            checks,
            incomplete,
            out: BytesMut::new(),
            result: SubscriberResult::default(),
            malformed_payloads: 0,
            samples: Vec::new(),
        }
    }

    /// Every message of every publisher arrived, every acknowledgement written.
    fn finished(&self) -> bool {
        self.incomplete == 0 && self.out.is_empty()
    }

    /// Handles every whole packet in `inbuf`: deliveries are acknowledged and checked, a
    /// PUBREL is answered with a PUBCOMP.
    fn read(&mut self, inbuf: &mut BytesMut) -> Result<(), MqttError> {
        let now_ns = self.env.clock.now_ns();
        let deliveries_before = self.result.deliveries;
        while let Some(packet) = tern_wire::decode(inbuf, self.env.protocol, MAX_PACKET_BYTES)? {
            match packet {
                Packet::Publish(publish) => self.delivered(&publish, now_ns),
                Packet::PubRel(ack) => self.env.acks[2].push(ack.packet_id, &mut self.out),
                Packet::PingResp => {}
                Packet::Disconnect(_) => return Err(MqttError::Closed),
                _ => return Err(MqttError::Unexpected("packet", "subscribing")),
            }
        }
        flush_samples(&self.env.shared.e2e_latency, &mut self.samples);
        if self.result.deliveries > deliveries_before {
            self.result.last_delivery_ns = now_ns;
            let delivered = self.result.deliveries - deliveries_before;
            self.env
                .shared
                .delivered
                .fetch_add(delivered, Ordering::Relaxed);
        }
        Ok(())
    }

    /// One delivery at `now_ns`: acknowledged (PUBACK or PUBREC), its QoS and its place in
    /// its publisher's sequence checked, its latency sampled when it is new.
    fn delivered(&mut self, publish: &tern_wire::Publish, now_ns: u64) {
        self.result.deliveries += 1;
        match publish.qos {
            QoS::AtMostOnce => {}
            QoS::AtLeastOnce => self.env.acks[0].push(publish.packet_id, &mut self.out),
            QoS::ExactlyOnce => self.env.acks[1].push(publish.packet_id, &mut self.out),
        }
        if Qos::from_wire(publish.qos) != self.env.qos {
            self.result.qos_mismatches += 1;
        }
        let Ok(header) = Header::read(&publish.payload) else {
            self.malformed_payloads += 1;
            return;
        };
        let Some(check) = self.checks.get_mut(header.publisher_id as usize) else {
            self.malformed_payloads += 1;
            return;
        };
        let was_complete = check.complete();
        if check.record(header.seq) {
            self.samples
                .push(now_ns.saturating_sub(header.send_time_ns));
        }
        if !was_complete && check.complete() {
            self.incomplete -= 1;
        }
    }

    fn into_result(mut self) -> SubscriberResult {
        for check in &self.checks {
            self.result.counts.add(&check.counts());
        }
        self.result.counts.out_of_range += self.malformed_payloads;
        self.result
    }
}

/// The subscriber's loop on either transport.
async fn subscribe_on<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    mut reader: R,
    mut writer: W,
    mut inbuf: BytesMut,
    env: SubscriberEnv,
    mut stop: watch::Receiver<bool>,
) -> Result<SubscriberResult, MqttError> {
    let mut s = Subscriber::new(env);
    let mut unflushed = false;
    while !s.finished() {
        make_read_room(&mut inbuf);
        let out = &s.out;
        let event = tokio::select! {
            read = reader.read_buf(&mut inbuf) => Event::Read(read?),
            // One arm for both: they borrow the writer. A flush is a no-op on plain TCP.
            io = write_or_flush(&mut writer, out), if !out.is_empty() || unflushed => match io? {
                Some(written) => Event::Wrote(written),
                None => Event::Flushed(()),
            },
            _ = stop.changed() => break,
        };
        match event {
            Event::Read(0) => return Err(MqttError::Closed),
            Event::Read(_) => s.read(&mut inbuf)?,
            Event::Wrote(written) => {
                consume(&mut s.out, written);
                unflushed = true;
            }
            Event::Flushed(()) => unflushed = false,
            Event::Wake => {}
        }
    }
    Ok(s.into_result())
}
