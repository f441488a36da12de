//! Raw tern-wire clients with persistent sessions and kill points: a publisher (QoS 1 or 2,
//! [`WINDOW`] in flight) and a subscriber that delivers a QoS 2 message on its first PUBLISH
//! (the spec's Method B, MQTT 3.1.1 Figure 4.3: keep the packet id until PUBREL, drop a repeated
//! PUBLISH of it). Each `run` lasts one broker life: it returns when the connection dies (the
//! broker was killed) or the harness says stop, and keeps its session state for the next run.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tern_wire::{Packet, Properties, Protocol, Publish, QoS};
use tokio::sync::mpsc::UnboundedSender;

use super::{KillAt, Shared};
use crate::common::durable::{Conn, WINDOW, persistent_connect};
use crate::common::raw::{ack, opts, s, subscribe};

const POLL: Duration = Duration::from_millis(20);
/// How long a run keeps trying to connect (the broker was just restarted, so it is there).
const CONNECT_FOR: Duration = Duration::from_secs(10);

/// What a run is told by the harness.
#[derive(Clone)]
pub struct Ctl {
    pub shared: Shared,
    /// Ends the run at the next poll.
    pub stop: Arc<AtomicBool>,
    /// The kill point this client watches for, armed by the harness at a random moment.
    pub trap: Option<Trap>,
}

#[derive(Clone)]
pub struct Trap {
    pub at: KillAt,
    pub armed: Arc<AtomicBool>,
    /// Told the moment the point is reached; the harness kills the broker.
    pub hit: UnboundedSender<String>,
}

impl Ctl {
    /// Fires the trap if it is armed for `at`; true if it fired.
    fn fire(&self, at: KillAt, what: String) -> bool {
        match &self.trap {
            Some(t) if t.at == at && t.armed.swap(false, Ordering::SeqCst) => {
                let _ = t.hit.send(what);
                true
            }
            _ => false,
        }
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

/// Connects (retrying while the just-restarted broker may still refuse) with a persistent
/// session; counts a lost session (Session Present 0 after the first connection).
async fn connect(
    addr: SocketAddr,
    protocol: Protocol,
    id: &str,
    ctl: &Ctl,
    first: bool,
) -> Option<Conn> {
    let deadline = tokio::time::Instant::now() + CONNECT_FOR;
    loop {
        if let Some(c) = Conn::connect(addr, persistent_connect(protocol, id)).await {
            if !first && !c.session_present {
                ctl.shared.session_lost(id);
            }
            return Some(c);
        }
        if ctl.stopped() || tokio::time::Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A kill point that does not hold the client: did the broker's answer win the race?
struct Watch {
    packet_id: u16,
    what: String,
}

fn watched(watch: &mut Option<Watch>, packet_id: u16, notes: &mut Vec<String>, answer: &str) {
    if watch.as_ref().is_some_and(|w| w.packet_id == packet_id) {
        if let Some(w) = watch.take() {
            notes.push(format!("{}: {answer} arrived before the kill", w.what));
        }
    }
}

fn died(watch: Option<Watch>, notes: &mut Vec<String>) {
    if let Some(w) = watch {
        notes.push(format!("{}: killed before the answer", w.what));
    }
}

/// A publisher of `NAME:0`, `NAME:1`, ... on one topic.
pub struct RawPublisher {
    pub name: String,
    protocol: Protocol,
    qos: u8,
    topic: String,
    next: u64,
    /// Publish nothing new; done once nothing is in flight.
    pub finishing: bool,
    /// In flight: number → (packet id, PUBREC received so PUBREL owed).
    inflight: BTreeMap<u64, (u16, bool)>,
    by_packet_id: HashMap<u16, u64>,
    next_packet_id: u16,
    connected_once: bool,
    /// What the kill points saw, for the test's log.
    pub notes: Vec<String>,
}

impl RawPublisher {
    pub fn new(name: &str, protocol: Protocol, qos: u8, topic: &str) -> RawPublisher {
        RawPublisher {
            name: name.into(),
            protocol,
            qos,
            topic: topic.into(),
            next: 0,
            finishing: false,
            inflight: BTreeMap::new(),
            by_packet_id: HashMap::new(),
            next_packet_id: 0,
            connected_once: false,
            notes: Vec::new(),
        }
    }

    pub fn done(&self) -> bool {
        self.finishing && self.inflight.is_empty()
    }

    fn publish_packet(&self, number: u64, packet_id: u16, dup: bool) -> Packet {
        Packet::Publish(Publish {
            dup,
            qos: QoS::from_u8(self.qos).expect("qos"),
            retain: false,
            topic: s(&self.topic),
            packet_id,
            properties: Properties::default(),
            payload: Bytes::from(format!("{}:{number}", self.name)),
        })
    }

    fn allocate(&mut self) -> u16 {
        loop {
            self.next_packet_id = self.next_packet_id.wrapping_add(1);
            if self.next_packet_id != 0 && !self.by_packet_id.contains_key(&self.next_packet_id) {
                return self.next_packet_id;
            }
        }
    }

    /// One broker life (see the module doc).
    pub async fn run(mut self, addr: SocketAddr, ctl: Ctl) -> Self {
        let first = !self.connected_once;
        let Some(mut c) = connect(addr, self.protocol, &self.name, &ctl, first).await else {
            return self;
        };
        self.connected_once = true;
        // MQTT-4.4.0-1: resend what is in flight, in order (DUP PUBLISH, or PUBREL).
        let resend: Vec<(u64, u16, bool)> = self
            .inflight
            .iter()
            .map(|(&n, &(pi, rec))| (n, pi, rec))
            .collect();
        for (number, packet_id, rec) in resend {
            let packet = if rec {
                Packet::PubRel(ack(packet_id))
            } else {
                self.publish_packet(number, packet_id, true)
            };
            if !c.send(&packet).await {
                return self;
            }
        }
        let mut holding = false;
        let mut watch: Option<Watch> = None;
        loop {
            if ctl.stopped() {
                return self;
            }
            if self.done() {
                ctl.shared.set_done(&self.name, self.qos);
                return self;
            }
            let limit = ctl.shared.limit(&self.name);
            while !holding && !self.finishing && self.inflight.len() < WINDOW && self.next < limit {
                let number = self.next;
                let packet_id = self.allocate();
                self.next += 1;
                self.inflight.insert(number, (packet_id, false));
                self.by_packet_id.insert(packet_id, number);
                if !c.send(&self.publish_packet(number, packet_id, false)).await {
                    died(watch, &mut self.notes);
                    return self;
                }
            }
            let packet = match c.recv(POLL).await {
                Err(()) => {
                    died(watch, &mut self.notes);
                    return self;
                }
                Ok(None) => continue,
                Ok(Some(_)) if holding => continue, // frozen at the kill point
                Ok(Some(p)) => p,
            };
            let reply = self.on_packet(packet, &ctl, &mut holding, &mut watch);
            if let Some(reply) = reply {
                if !c.send(&reply).await {
                    died(watch, &mut self.notes);
                    return self;
                }
            }
        }
    }

    fn on_packet(
        &mut self,
        packet: Packet,
        ctl: &Ctl,
        holding: &mut bool,
        watch: &mut Option<Watch>,
    ) -> Option<Packet> {
        match packet {
            Packet::PubAck(a) => {
                let number = self.by_packet_id.remove(&a.packet_id)?;
                self.inflight.remove(&number);
                if a.reason.is_success() {
                    ctl.shared.acked(&self.name, self.qos, number);
                } else {
                    ctl.shared
                        .error(&self.name, format!("PUBACK {:?} for {number}", a.reason));
                }
                None
            }
            Packet::PubRec(a) => {
                let number = *self.by_packet_id.get(&a.packet_id)?;
                if !a.reason.is_success() {
                    // v5: a PUBREC with an error ends the exchange (MQTT-4.3.3-4 does not apply).
                    ctl.shared
                        .error(&self.name, format!("PUBREC {:?} for {number}", a.reason));
                    self.by_packet_id.remove(&a.packet_id);
                    self.inflight.remove(&number);
                    return None;
                }
                ctl.shared.acked(&self.name, self.qos, number);
                if let Some(entry) = self.inflight.get_mut(&number) {
                    entry.1 = true;
                }
                let what = format!("{}:{number} (id {})", self.name, a.packet_id);
                if ctl.fire(
                    KillAt::PubRecBeforePubRel,
                    format!("PUBREC for {what}, PUBREL held"),
                ) {
                    *holding = true;
                    return None;
                }
                if ctl.fire(
                    KillAt::PubRelBeforePubComp,
                    format!("PUBREL sent for {what}"),
                ) {
                    *watch = Some(Watch {
                        packet_id: a.packet_id,
                        what: format!("PUBREL for {what}"),
                    });
                }
                Some(Packet::PubRel(ack(a.packet_id)))
            }
            Packet::PubComp(a) => {
                watched(watch, a.packet_id, &mut self.notes, "PUBCOMP");
                let &number = self.by_packet_id.get(&a.packet_id)?;
                if self.inflight.get(&number).is_some_and(|e| e.1) {
                    self.by_packet_id.remove(&a.packet_id);
                    self.inflight.remove(&number);
                }
                None
            }
            other => {
                ctl.shared
                    .error(&self.name, format!("unexpected {other:?}"));
                None
            }
        }
    }
}

/// A subscriber that delivers QoS 2 at the first PUBLISH of a packet id (Method B).
pub struct RawSubscriber {
    pub name: String,
    protocol: Protocol,
    filter: String,
    /// QoS 2 packet ids delivered and not yet released, with their payloads.
    received: HashMap<u16, Bytes>,
    /// Packet ids released by a PUBREL, with the payload and the cycle: a PUBLISH of the same
    /// message under the id afterwards is the broker re-sending after its PUBREL.
    released: HashMap<u16, (Bytes, u32)>,
    connected_once: bool,
    pub notes: Vec<String>,
}

impl RawSubscriber {
    pub fn new(name: &str, protocol: Protocol, filter: &str) -> RawSubscriber {
        RawSubscriber {
            name: name.into(),
            protocol,
            filter: filter.into(),
            received: HashMap::new(),
            released: HashMap::new(),
            connected_once: false,
            notes: Vec::new(),
        }
    }

    /// One broker life (see the module doc).
    pub async fn run(mut self, addr: SocketAddr, ctl: Ctl) -> Self {
        let first = !self.connected_once;
        let Some(mut c) = connect(addr, self.protocol, &self.name, &ctl, first).await else {
            return self;
        };
        self.connected_once = true;
        if !c.session_present {
            let sub = subscribe(1, &[(self.filter.as_str(), opts(2))]);
            if !c.send(&Packet::Subscribe(sub)).await {
                return self;
            }
        }
        let mut holding = false;
        let mut watch: Option<Watch> = None;
        // Packet ids PUBREC'd on this connection, awaiting PUBREL, in PUBREC order.
        let mut pubrecs: VecDeque<u16> = VecDeque::new();
        loop {
            if ctl.stopped() {
                return self;
            }
            let packet = match c.recv(POLL).await {
                Err(()) => {
                    died(watch, &mut self.notes);
                    return self;
                }
                Ok(None) => continue,
                Ok(Some(_)) if holding => continue, // frozen at the kill point
                Ok(Some(p)) => p,
            };
            self.check_pubrel_order(&packet, &mut pubrecs, &ctl);
            let reply = self.on_packet(packet, &ctl, &mut holding, &mut watch);
            if let Some(reply) = reply {
                if !c.send(&reply).await {
                    died(watch, &mut self.notes);
                    return self;
                }
            }
        }
    }

    /// Method B: deliver unless the packet id is held (MQTT-4.3.3-2 (3.1.1) / -10 (v5) on our
    /// side), then PUBREC. The same message under an id we already released means the broker
    /// re-sent a PUBLISH after its PUBREL (MQTT-4.3.3-1 (3.1.1) / MQTT-4.3.3-6 (v5)).
    fn on_qos2_publish(&mut self, p: Publish, ctl: &Ctl, watch: &mut Option<Watch>) -> Packet {
        let id = p.packet_id;
        let text = String::from_utf8_lossy(&p.payload).into_owned();
        if !self.received.contains_key(&id) {
            if let Some((payload, cycle)) = self.released.remove(&id) {
                if payload == p.payload {
                    let what = format!(
                        "{text} (id {id}, DUP {}) again in cycle {}, after its PUBREL in cycle {cycle}",
                        p.dup,
                        ctl.shared.cycle()
                    );
                    ctl.shared.resent_by_broker(&self.name, &text, what);
                }
            }
            ctl.shared.deliver(&self.name, &p.payload, 2, p.dup, id);
            self.received.insert(id, p.payload.clone());
        }
        let what = format!("{} got {text} (id {id})", self.name);
        if ctl.fire(
            KillAt::SubPubRecBeforePubRel,
            format!("PUBREC sent: {what}"),
        ) {
            *watch = Some(Watch {
                packet_id: id,
                what: format!("PUBREC for {what}"),
            });
        }
        Packet::PubRec(ack(id))
    }

    /// MQTT-4.6.0-4: the broker sends PUBRELs in the order of our PUBRECs. Checked per
    /// connection (PUBRELs resent at reconnect answer PUBRECs of an earlier one).
    fn check_pubrel_order(&self, packet: &Packet, pubrecs: &mut VecDeque<u16>, ctl: &Ctl) {
        match packet {
            Packet::Publish(p) if p.qos == QoS::ExactlyOnce && !pubrecs.contains(&p.packet_id) => {
                pubrecs.push_back(p.packet_id);
            }
            Packet::PubRel(a) => {
                let Some(at) = pubrecs.iter().position(|&id| id == a.packet_id) else {
                    return;
                };
                if at > 0 {
                    ctl.shared.pubrel_out_of_order(
                        &self.name,
                        format!(
                            "PUBREL id {} came while {at} ids PUBREC'd before it still waited for \
                             theirs (the first: id {}), cycle {}",
                            a.packet_id,
                            pubrecs[0],
                            ctl.shared.cycle()
                        ),
                    );
                }
                pubrecs.remove(at);
            }
            _ => {}
        }
    }

    fn on_packet(
        &mut self,
        packet: Packet,
        ctl: &Ctl,
        holding: &mut bool,
        watch: &mut Option<Watch>,
    ) -> Option<Packet> {
        match packet {
            Packet::SubAck(sa) => {
                if sa.reasons.iter().all(|r| r.0 == 2) {
                    ctl.shared.lock().subscribed.insert(self.name.clone());
                } else {
                    ctl.shared
                        .error(&self.name, format!("SUBACK {:?}", sa.reasons));
                }
                None
            }
            Packet::Publish(p) => {
                let shared = &ctl.shared;
                match p.qos {
                    QoS::AtMostOnce => {
                        shared.deliver(&self.name, &p.payload, 0, p.dup, 0);
                        None
                    }
                    QoS::AtLeastOnce => {
                        shared.deliver(&self.name, &p.payload, 1, p.dup, p.packet_id);
                        Some(Packet::PubAck(ack(p.packet_id)))
                    }
                    QoS::ExactlyOnce => Some(self.on_qos2_publish(p, ctl, watch)),
                }
            }
            Packet::PubRel(a) => {
                watched(watch, a.packet_id, &mut self.notes, "PUBREL");
                if let Some(payload) = self.received.remove(&a.packet_id) {
                    let cycle = ctl.shared.cycle();
                    self.released.insert(a.packet_id, (payload, cycle));
                }
                let what = format!(
                    "{} got PUBREL (id {}), PUBCOMP held",
                    self.name, a.packet_id
                );
                if ctl.fire(KillAt::SubPubRelBeforePubComp, what) {
                    *holding = true;
                    return None;
                }
                Some(Packet::PubComp(ack(a.packet_id)))
            }
            other => {
                ctl.shared
                    .error(&self.name, format!("unexpected {other:?}"));
                None
            }
        }
    }
}
