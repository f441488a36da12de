//! The simulator's publishers: `limit` numbered messages on one topic with at most `window`
//! in flight, over a persistent session whose MQTT state (packet ids in flight, PUBRECs
//! received) lives here, outside the broker, and so survives every fault. A publisher
//! reconnects whenever its connection dies and resends what is in flight, in order.
//!
//! Its state sits behind a mutex the controller reads (progress, completion, the checker),
//! locked only between awaits.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use parking_lot::Mutex;
use tern_wire::{Packet, Properties, Protocol, Publish, QoS};

use super::client::{Conn, Net, POLL, ack, parse, payload, reconnect, s, stall};

#[derive(Debug, Clone)]
pub struct PubSpec {
    pub index: usize,
    pub protocol: Protocol,
    pub qos: u8,
    pub topic: String,
    pub limit: u64,
    pub window: usize,
    pub pad: usize,
    /// Network fault: the client closes its socket (no DISCONNECT) after this many packets
    /// received on a connection, and reconnects.
    pub drop_after: Option<u64>,
    /// Stalled client: after every `.0`-th packet received it stops reading for `.1` ms
    /// (its PUBRECs / PUBACKs wait in the socket meanwhile).
    pub stall: Option<(u64, u64)>,
    /// Every message retained: the topic's retained value must end as one of the last
    /// acknowledged or later messages.
    pub retain: bool,
}

impl PubSpec {
    pub fn client_id(&self) -> String {
        format!("sim-pub-{}", self.index)
    }
}

/// How long a publisher waits after a refused PUBLISH before it reconnects to resend it.
const REFUSED_BACKOFF: Duration = Duration::from_millis(20);

#[derive(Default)]
pub struct PubState {
    /// Next number to publish.
    pub next: u64,
    /// In flight: number → (packet id, PUBREC received).
    pub inflight: BTreeMap<u64, (u16, bool)>,
    by_packet_id: BTreeMap<u16, u64>,
    next_packet_id: u16,
    /// Numbers whose PUBACK (QoS 1) or PUBREC (QoS 2) arrived: the broker owes them.
    pub acked: BTreeSet<u64>,
    /// Numbers the broker may have refused (a PUBACK or PUBREC with a reason code of 0x80 or
    /// more: a failed write, a broker limit; and what was in flight behind it): resent on a
    /// later connection, so perhaps published after later numbers. Also what was in flight
    /// unacknowledged when a connection ended while the broker refused PUBLISHes at a bound
    /// (its refusal may sit unread in the socket the client dropped, or come after the
    /// drop, while later numbers of the same window were accepted: seed 676, finding 16).
    pub refused: BTreeSet<u64>,
    /// [`Net::refusals`] when the current connection was made.
    refusals_at_connect: u64,
    /// Number → (connection, broker boot) its PUBACK / PUBREC came on.
    pub acked_on: BTreeMap<u64, (u64, u64)>,
    /// Connection → the broker boot it was made to.
    pub boots: Vec<u64>,
    pub connections: u64,
    /// Reconnects answered with Session Present = 0 (noted, not a violation: the CONNACK
    /// does not wait for the session record).
    pub sessions_lost: u64,
    /// What the publisher sent and got, per connection (printed for a failing seed with
    /// `TERN_SIM_TRACE`): `c3:boot1` a connection, `P12/5d` PUBLISH of number 12 under
    /// id 5 (DUP), `R5` PUBREL, `a5` PUBACK / PUBREC, `x5:0x97` a refusal, `C5` PUBCOMP,
    /// `D5` the packet the connection was dropped at, unread.
    pub trace: Vec<String>,
}

impl PubState {
    pub fn done(&self, limit: u64) -> bool {
        self.next >= limit && self.inflight.is_empty()
    }

    /// A refusal: the client reconnects without reading the answers to what it sent after
    /// the refused number (the broker may have refused those too, or accepted them), and
    /// resends everything unacknowledged in flight on the next connection.
    fn note_refused(&mut self) {
        let unacked: Vec<u64> = self
            .inflight
            .iter()
            .filter(|(_, (_, released))| !released)
            .map(|(&n, _)| n)
            .collect();
        self.refused.extend(unacked);
    }

    /// A new connection: if the broker refused any PUBLISH at a bound since the last one was
    /// made, what is still unacknowledged in flight may have been refused there unseen.
    fn connected(&mut self, refusals: u64) {
        if refusals > self.refusals_at_connect {
            self.note_refused();
        }
        self.refusals_at_connect = refusals;
    }

    fn note(&mut self, entry: String) {
        let at = turmoil::sim_elapsed().unwrap_or_default().as_micros();
        let entry = format!("c{}:{entry}@{at}", self.connections);
        self.trace.push(entry);
    }

    fn allocate(&mut self) -> u16 {
        loop {
            self.next_packet_id = self.next_packet_id.wrapping_add(1);
            if self.next_packet_id != 0 && !self.by_packet_id.contains_key(&self.next_packet_id) {
                return self.next_packet_id;
            }
        }
    }
}

/// A publisher's packet as its trace shows it (see [`PubState::trace`]).
fn describe(packet: &Packet) -> String {
    match packet {
        Packet::Publish(p) => {
            let n = parse(&p.payload).map_or(u64::MAX, |m| m.1);
            let dup = if p.dup { "d" } else { "" };
            format!("P{n}/{}{dup}", p.packet_id)
        }
        Packet::PubRel(a) => format!("R{}", a.packet_id),
        Packet::PubAck(a) | Packet::PubRec(a) if a.reason.is_success() => {
            format!("a{}", a.packet_id)
        }
        Packet::PubAck(a) | Packet::PubRec(a) => format!("x{}:{:#04x}", a.packet_id, a.reason.0),
        Packet::PubComp(a) => format!("C{}", a.packet_id),
        other => format!("{:?}", std::mem::discriminant(other)),
    }
}

fn publish_packet(spec: &PubSpec, number: u64, packet_id: u16, dup: bool) -> Packet {
    Packet::Publish(Publish {
        dup,
        qos: QoS::from_u8(spec.qos).expect("qos"),
        retain: spec.retain,
        topic: s(&spec.topic),
        packet_id,
        properties: Properties::default(),
        payload: payload(spec.index, number, spec.pad),
    })
}

/// What the publisher does after a packet from the broker.
enum Reaction {
    /// Goes on, sending this first if any.
    Continue(Option<Packet>),
    /// A refusal: backs off, then reconnects to resend.
    Refused,
    /// The broker disconnected: reconnects.
    Reconnect,
}

impl PubState {
    /// Number `n` acknowledged (a PUBACK or a successful PUBREC) on the current connection.
    fn acknowledged(&mut self, n: u64, net: &Net) {
        if self.acked.insert(n) {
            net.acks.fetch_add(1, Ordering::Relaxed);
            let c = (self.connections, self.boots.last().copied().unwrap_or(0));
            self.acked_on.insert(n, c);
        }
    }

    /// A connection to `boot` made: what to resend first, in order (the session resumed:
    /// PUBLISH with DUP, or PUBREL once its PUBREC came).
    fn resume(&mut self, spec: &PubSpec, c: &Conn, refusals: u64) -> Vec<Packet> {
        self.connected(refusals);
        self.connections += 1;
        self.boots.push(c.boot);
        self.note(format!("boot{}", c.boot));
        if self.connections > 1 && !c.session_present {
            self.sessions_lost += 1;
        }
        self.inflight
            .iter()
            .map(|(&n, &(pi, rel))| {
                if rel {
                    Packet::PubRel(ack(pi))
                } else {
                    publish_packet(spec, n, pi, true)
                }
            })
            .collect()
    }

    /// New numbers up to the window, as PUBLISH packets; `None` once all are done.
    fn fresh(&mut self, spec: &PubSpec) -> Option<Vec<Packet>> {
        if self.done(spec.limit) {
            return None;
        }
        let mut v = Vec::new();
        while self.inflight.len() < spec.window && self.next < spec.limit {
            let number = self.next;
            let pi = self.allocate();
            self.next += 1;
            self.inflight.insert(number, (pi, false));
            self.by_packet_id.insert(pi, number);
            let p = publish_packet(spec, number, pi, false);
            self.note(describe(&p));
            v.push(p);
        }
        Some(v)
    }

    /// The publisher's side of a PUBACK, PUBREC, PUBCOMP or DISCONNECT.
    fn react(&mut self, spec: &PubSpec, packet: Packet, net: &Net) -> Reaction {
        match packet {
            Packet::PubAck(a) if spec.qos == 1 && !a.reason.is_success() => {
                // Refused (a broker limit, a failed write): not acknowledged, sent again on
                // the next connection.
                if self.by_packet_id.contains_key(&a.packet_id) {
                    self.note_refused();
                }
                Reaction::Refused
            }
            Packet::PubAck(a) if spec.qos == 1 => {
                if let Some(n) = self.by_packet_id.remove(&a.packet_id) {
                    self.inflight.remove(&n);
                    self.acknowledged(n, net);
                }
                Reaction::Continue(None)
            }
            Packet::PubRec(a) if spec.qos == 2 => match self.by_packet_id.get(&a.packet_id) {
                Some(&n) if a.reason.is_success() => {
                    self.acknowledged(n, net);
                    if let Some(e) = self.inflight.get_mut(&n) {
                        e.1 = true;
                    }
                    Reaction::Continue(Some(Packet::PubRel(ack(a.packet_id))))
                }
                // Refused (e.g. a failed write): sent again on the next connection.
                Some(_) => {
                    self.note_refused();
                    Reaction::Refused
                }
                None => Reaction::Continue(None),
            },
            Packet::PubComp(a) if spec.qos == 2 => {
                let released = self
                    .by_packet_id
                    .get(&a.packet_id)
                    .and_then(|n| self.inflight.get(n))
                    .is_some_and(|e| e.1);
                if released && let Some(n) = self.by_packet_id.remove(&a.packet_id) {
                    self.inflight.remove(&n);
                }
                Reaction::Continue(None)
            }
            Packet::Disconnect(_) => Reaction::Reconnect,
            _ => Reaction::Continue(None),
        }
    }
}

/// A publisher of `limit` numbered messages on one topic, `window` in flight at most.
pub async fn run_publisher(spec: PubSpec, state: Arc<Mutex<PubState>>, net: Arc<Net>) {
    loop {
        if state.lock().done(spec.limit) {
            return;
        }
        let Some(c) = reconnect(&net, spec.protocol, &spec.client_id(), None).await else {
            return;
        };
        if let Ended::Done = run_connection(&spec, &state, &net, c).await {
            return;
        }
    }
}

/// How one connection of a publisher ended.
enum Ended {
    /// Every number is acknowledged and complete, or the run is stopping.
    Done,
    /// The connection dropped or was dropped: the publisher reconnects.
    Reconnect,
}

/// One connection: resends what is in flight, then publishes up to the window and handles
/// the broker's answers until the connection ends.
async fn run_connection(spec: &PubSpec, state: &Mutex<PubState>, net: &Net, mut c: Conn) -> Ended {
    let resend = state.lock().resume(spec, &c, net.refusals());
    for p in resend {
        state.lock().note(describe(&p));
        if !c.send(&p).await {
            return Ended::Reconnect;
        }
    }
    let mut received_here = 0u64;
    loop {
        if net.stop.load(Ordering::Relaxed) {
            return Ended::Done;
        }
        let Some(fresh) = state.lock().fresh(spec) else {
            return Ended::Done;
        };
        for p in fresh {
            if !c.send(&p).await {
                return Ended::Reconnect;
            }
        }
        let packet = match c.recv(POLL).await {
            Err(()) => return Ended::Reconnect,
            Ok(None) => continue,
            Ok(Some(p)) => p,
        };
        received_here += 1;
        if spec.drop_after.is_some_and(|k| received_here >= k) {
            // Dropped at a packet boundary: this packet is never read.
            state.lock().note(format!("D{}", describe(&packet)));
            return Ended::Reconnect;
        }
        state.lock().note(describe(&packet));
        stall(spec.stall, received_here).await;
        let reaction = state.lock().react(spec, packet, net);
        match reaction {
            Reaction::Continue(None) => {}
            Reaction::Continue(Some(p)) => {
                state.lock().note(describe(&p));
                if !c.send(&p).await {
                    return Ended::Reconnect;
                }
            }
            Reaction::Refused => {
                // A real client backs off before it tries again (and the sim's reconnects
                // would otherwise fill the state streams with session records).
                tokio::time::sleep(REFUSED_BACKOFF).await;
                return Ended::Reconnect;
            }
            Reaction::Reconnect => return Ended::Reconnect,
        }
    }
}
