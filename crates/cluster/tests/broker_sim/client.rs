//! The simulator's MQTT clients: publishers and persistent subscribers whose client-side
//! session state (packet ids in flight, a QoS 2 subscriber's open exchanges) lives here and
//! survives every fault. Each runs as a task that reconnects whenever its connection dies,
//! stalls or is given up (`conn.rs`), and resends what the spec says it must.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tern_store::sim::SimRng;
use tern_wire::{Packet, Properties, Protocol, Publish, QoS, Subscribe, SubscriptionOptions};

use crate::conn::{CONNACK_WAIT, Conn, STALL, Session, Shared, ack, s};

/// Messages a publisher has in flight at once.
const WINDOW: usize = 4;

/// How a connection's turn ended.
enum End {
    /// Every message sent and acknowledged.
    Done,
    /// The connection died (or the clients stop).
    Dead,
    /// The client gave it up, open ([`Session::abandon`]).
    GaveUp(&'static str),
}

/// A publisher's state, read by the controller and the checker.
#[derive(Default)]
pub struct PubState {
    /// Sequence numbers acknowledged (PUBACK, or PUBREC for QoS 2, with success).
    pub acked: BTreeSet<u64>,
    /// Refused by the broker (an error reason code): not acknowledged, not resent.
    pub refused: BTreeSet<u64>,
    pub sent: u64,
    pub done: bool,
}

pub struct Publisher {
    pub index: usize,
    pub protocol: Protocol,
    pub qos: QoS,
    /// Messages published once the faults are over (it publishes from the start).
    pub tail: u64,
    /// At most one new message per this many ms.
    pub pace_ms: u64,
    pub state: Arc<Mutex<PubState>>,
}

pub fn topic(publisher: usize) -> String {
    format!("t/p{publisher}")
}

fn payload(publisher: usize, seq: u64) -> Bytes {
    Bytes::from(format!("{publisher}:{seq}"))
}

/// (publisher, seq) from a payload.
fn parse(payload: &[u8]) -> Option<(usize, u64)> {
    let text = std::str::from_utf8(payload).ok()?;
    let (p, s) = text.split_once(':')?;
    Some((p.parse().ok()?, s.parse().ok()?))
}

/// One message in flight: its sequence number and whether the PUBREC came (QoS 2).
#[derive(Clone, Copy)]
struct Flight {
    seq: u64,
    released: bool,
}

/// A publisher's client-side session state.
struct Flow {
    inflight: BTreeMap<u16, Flight>,
    next_seq: u64,
    next_id: u16,
    /// The sequence number it stops before, once known.
    end: Option<u64>,
}

impl Flow {
    /// The next message's packet id (one not in flight) and sequence number, now in flight.
    fn next(&mut self) -> (u16, u64) {
        while self.inflight.contains_key(&self.next_id) {
            self.next_id = self.next_id.checked_add(1).unwrap_or(1);
        }
        let (id, seq) = (self.next_id, self.next_seq);
        self.next_id = self.next_id.checked_add(1).unwrap_or(1);
        self.next_seq += 1;
        let released = false;
        self.inflight.insert(id, Flight { seq, released });
        (id, seq)
    }
}

impl Publisher {
    fn publish(&self, id: u16, seq: u64, dup: bool) -> Packet {
        Packet::Publish(Publish {
            dup,
            qos: self.qos,
            retain: false,
            topic: s(&topic(self.index)),
            packet_id: id,
            properties: Properties::default(),
            payload: payload(self.index, seq),
        })
    }

    pub async fn run(self, shared: Arc<Shared>, seed: u64) {
        let rng = SimRng::keyed(&[seed, 0x707562, self.index as u64]);
        let mut session = Session::new(format!("pub{}", self.index), self.protocol, rng);
        let mut flow = Flow {
            inflight: BTreeMap::new(),
            next_seq: 0,
            next_id: 1,
            end: None,
        };
        while let Some(mut conn) = session.connect(&shared).await {
            match self
                .serve(&mut conn, &mut flow, &mut session, &shared)
                .await
            {
                End::Done => {
                    self.state.lock().unwrap().done = true;
                    return;
                }
                End::Dead => {}
                End::GaveUp(why) => session.abandon(conn, why, &shared),
            }
        }
    }

    /// One connection's turn: resends in order what is in flight (PUBLISH with DUP for what
    /// has no PUBREC, PUBREL for what has), then publishes, `WINDOW` at a time.
    async fn serve(
        &self,
        conn: &mut Conn,
        flow: &mut Flow,
        session: &mut Session,
        shared: &Shared,
    ) -> End {
        let mut order: Vec<(u16, Flight)> = flow.inflight.iter().map(|(k, v)| (*k, *v)).collect();
        order.sort_by_key(|(_, f)| f.seq);
        for (id, f) in order {
            let p = if f.released {
                Packet::PubRel(ack(id))
            } else {
                self.publish(id, f.seq, true)
            };
            if !conn.send(&p).await {
                return End::Dead;
            }
        }
        let mut last_heard = tokio::time::Instant::now();
        let pace = Duration::from_millis(self.pace_ms);
        let mut last_sent = tokio::time::Instant::now() - pace;
        while !shared.stop.load(std::sync::atomic::Ordering::Relaxed) {
            if session.give_up(shared) {
                return End::GaveUp("its connection");
            }
            let more = self.wants_more(flow, shared);
            if more && flow.inflight.len() < WINDOW && last_sent.elapsed() >= pace {
                let (id, seq) = flow.next();
                last_sent = tokio::time::Instant::now();
                self.state.lock().unwrap().sent = flow.next_seq;
                if !conn.send(&self.publish(id, seq, false)).await {
                    return End::Dead;
                }
            } else if !more && flow.inflight.is_empty() {
                return End::Done;
            }
            // One message per pace at most, whatever the acknowledgements' speed: the
            // publishing spans the faults.
            let wait = pace.saturating_sub(last_sent.elapsed());
            let packet = match conn.recv(wait.max(Duration::from_millis(1))).await {
                Err(()) => return End::Dead,
                Ok(None) if !flow.inflight.is_empty() && last_heard.elapsed() > STALL => {
                    return End::GaveUp("a stalled connection");
                }
                Ok(None) => continue,
                Ok(Some(p)) => p,
            };
            last_heard = tokio::time::Instant::now();
            if let Some(reply) = self.on_packet(packet, flow, session, shared)
                && !conn.send(&reply).await
            {
                return End::Dead;
            }
        }
        End::Dead
    }

    /// Whether to publish more: until the faults are over ([`Shared::faults_over`]), then
    /// `tail` messages more.
    fn wants_more(&self, flow: &mut Flow, shared: &Shared) -> bool {
        if flow.end.is_none()
            && shared
                .faults_over
                .load(std::sync::atomic::Ordering::Relaxed)
        {
            flow.end = Some(flow.next_seq + self.tail);
        }
        flow.end.is_none_or(|end| flow.next_seq < end)
    }

    /// Takes in an acknowledgement; returns the PUBREL to send, if any.
    fn on_packet(
        &self,
        packet: Packet,
        flow: &mut Flow,
        session: &mut Session,
        shared: &Shared,
    ) -> Option<Packet> {
        match packet {
            Packet::PubAck(a) | Packet::PubRec(a) => {
                let f = flow.inflight.get_mut(&a.packet_id)?;
                let seq = f.seq;
                if a.reason.0 >= 0x80 {
                    flow.inflight.remove(&a.packet_id);
                    self.state.lock().unwrap().refused.insert(seq);
                    let (name, code) = (&session.name, a.reason.0);
                    shared
                        .log
                        .line(format!("{name}: {seq} refused with {code:#x}"));
                    return None;
                }
                self.state.lock().unwrap().acked.insert(seq);
                session.established();
                if self.qos == QoS::ExactlyOnce {
                    f.released = true;
                    return Some(Packet::PubRel(ack(a.packet_id)));
                }
                flow.inflight.remove(&a.packet_id);
                None
            }
            Packet::PubComp(a) => {
                if flow.inflight.get(&a.packet_id).is_some_and(|f| f.released) {
                    flow.inflight.remove(&a.packet_id);
                }
                None
            }
            _ => None,
        }
    }
}

/// One delivery a subscriber's application received.
#[derive(Clone, Copy, Debug)]
pub struct Delivery {
    pub publisher: usize,
    pub seq: u64,
}

#[derive(Default)]
pub struct SubState {
    /// In the order the application received them.
    pub delivered: Vec<Delivery>,
    pub established: bool,
}

/// How a QoS 2 subscriber hands a message to its application (MQTT 5.0 §4.3.3, figure 4.3):
/// Method A on the PUBLISH (and then refuses the packet id until the PUBREL), Method B on
/// the PUBREL.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Method {
    A,
    B,
}

pub struct Subscriber {
    pub index: usize,
    pub protocol: Protocol,
    pub qos: QoS,
    pub method: Method,
    /// (ms online, ms offline) for a subscriber that comes and goes: it drops each
    /// connection after the first and stays away for the second, its messages queued in its
    /// session meanwhile (what a failover must not lose even though nobody saw them yet).
    pub intermittent: Option<(u64, u64)>,
    pub state: Arc<Mutex<SubState>>,
}

impl Subscriber {
    fn deliver(&self, payload: &[u8]) {
        if let Some((publisher, seq)) = parse(payload) {
            let mut st = self.state.lock().unwrap();
            st.delivered.push(Delivery { publisher, seq });
        }
    }

    pub async fn run(self, shared: Arc<Shared>, seed: u64) {
        let rng = SimRng::keyed(&[seed, 0x737562, self.index as u64]);
        let mut session = Session::new(format!("sub{}", self.index), self.protocol, rng);
        // Method B: PUBLISHes awaiting their PUBREL; Method A: ids delivered, awaiting it.
        let mut held: BTreeMap<u16, Bytes> = BTreeMap::new();
        while let Some(mut conn) = session.connect(&shared).await {
            if !conn.session_present {
                // The client discards its session state with the server's [MQTT-4.1.0-1].
                held.clear();
                if !self.subscribe(&mut conn).await {
                    continue;
                }
                session.established();
                self.state.lock().unwrap().established = true;
            }
            match self
                .serve(&mut conn, &mut held, &mut session, &shared)
                .await
            {
                End::GaveUp(why) => session.abandon(conn, why, &shared),
                End::Dead => {}
                End::Done => {
                    drop(conn);
                    if let Some((_, offline_ms)) = self.intermittent {
                        tokio::time::sleep(Duration::from_millis(offline_ms)).await;
                    }
                }
            }
        }
    }

    async fn serve(
        &self,
        conn: &mut Conn,
        held: &mut BTreeMap<u16, Bytes>,
        session: &mut Session,
        shared: &Shared,
    ) -> End {
        let mut last_heard = tokio::time::Instant::now();
        let online = tokio::time::Instant::now();
        while !shared.stop.load(std::sync::atomic::Ordering::Relaxed) {
            if session.give_up(shared) {
                return End::GaveUp("its connection");
            }
            if let Some((online_ms, _)) = self.intermittent
                && online.elapsed() > Duration::from_millis(online_ms)
            {
                // Goes offline: the connection is dropped, the session stays.
                return End::Done;
            }
            let packet = match conn.recv(Duration::from_millis(200)).await {
                Err(()) => return End::Dead,
                Ok(None) if last_heard.elapsed() > 2 * STALL => {
                    return End::GaveUp("a silent connection");
                }
                Ok(None) => continue,
                Ok(Some(p)) => p,
            };
            last_heard = tokio::time::Instant::now();
            if let Some(reply) = self.on_packet(packet, held)
                && !conn.send(&reply).await
            {
                return End::Dead;
            }
        }
        End::Dead
    }

    /// Takes in a PUBLISH or PUBREL; returns the acknowledgement to send.
    fn on_packet(&self, packet: Packet, held: &mut BTreeMap<u16, Bytes>) -> Option<Packet> {
        match packet {
            Packet::Publish(p) => match p.qos {
                QoS::AtMostOnce => {
                    self.deliver(&p.payload);
                    None
                }
                QoS::AtLeastOnce => {
                    self.deliver(&p.payload);
                    Some(Packet::PubAck(ack(p.packet_id)))
                }
                QoS::ExactlyOnce => {
                    match (self.method, held.entry(p.packet_id)) {
                        // A resent PUBLISH (DUP) replaces the one held.
                        (Method::B, Entry::Occupied(mut e)) => {
                            e.insert(p.payload);
                        }
                        (Method::B, Entry::Vacant(e)) => {
                            e.insert(p.payload);
                        }
                        (Method::A, Entry::Vacant(e)) => {
                            self.deliver(&p.payload);
                            e.insert(Bytes::new());
                        }
                        (Method::A, Entry::Occupied(_)) => {}
                    }
                    Some(Packet::PubRec(ack(p.packet_id)))
                }
            },
            Packet::PubRel(a) => {
                if let Some(payload) = held.remove(&a.packet_id)
                    && self.method == Method::B
                {
                    self.deliver(&payload);
                }
                Some(Packet::PubComp(ack(a.packet_id)))
            }
            _ => None,
        }
    }

    async fn subscribe(&self, conn: &mut Conn) -> bool {
        let options = SubscriptionOptions {
            qos: self.qos,
            ..SubscriptionOptions::default()
        };
        let sub = Packet::Subscribe(Subscribe {
            packet_id: 1,
            properties: Properties::default(),
            filters: vec![(s("t/#"), options)],
        });
        if !conn.send(&sub).await {
            return false;
        }
        let deadline = tokio::time::Instant::now() + CONNACK_WAIT;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match conn.recv(left).await {
                Ok(Some(Packet::SubAck(a))) => {
                    return a.reasons.first().is_some_and(|r| r.0 < 0x80);
                }
                Ok(Some(_)) => {}
                _ => return false,
            }
        }
    }
}
