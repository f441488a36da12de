//! The simulator's subscribers: persistent sessions (single, or members of a share group)
//! whose MQTT session state (the QoS 2 received set, held messages) lives in the client and
//! survives every fault; they stall, leave and come back as their spec says.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use parking_lot::Mutex;
use tern_wire::{
    Disconnect, Packet, Properties, Protocol, QoS, ReasonCode, Subscribe, SubscriptionOptions,
};

use super::client::{Conn, Net, POLL, ack, parse, reconnect, s, stall};
use super::exchanges::{Incoming, OpenIds};
use super::offline::{Offline, Stage, stay_away};

/// When a subscriber hands a QoS 2 message to its application.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deliver {
    /// At the first PUBLISH of a packet id, which is then held until PUBREL (Method B).
    AtPublish,
    /// At PUBREL: the message is kept under its packet id until then (paho's way).
    AtPubrel,
}

#[derive(Debug, Clone)]
pub struct SubSpec {
    pub index: usize,
    pub protocol: Protocol,
    pub qos: u8,
    pub filter: String,
    pub deliver: Deliver,
    /// A member of this share group (`$share/{group}/{filter}`, MQTT 5).
    pub share: Option<&'static str>,
    /// Receive Maximum in CONNECT (v5): what the broker may have in flight to it.
    pub receive_maximum: Option<u16>,
    /// The client leaves after this many PUBLISHes received on a connection (DISCONNECT or
    /// a closed socket, by `leave_cleanly`) and comes back after `pause_ms`.
    pub leave_after: Option<u64>,
    pub leave_cleanly: bool,
    pub pause_ms: u64,
    /// Stalled client (see [`PubSpec::stall`]); the reply to the packet it stalls at waits
    /// too, so a QoS 2 exchange stays open meanwhile.
    pub stall: Option<(u64, u64)>,
    /// Leaves at a chosen stage of its exchanges and stays away across faults
    /// (`offline.rs`, issue 25).
    pub offline: Option<Offline>,
}

impl SubSpec {
    pub fn client_id(&self) -> String {
        format!("sim-sub-{}", self.index)
    }

    /// The filter it subscribes with.
    pub fn subscription(&self) -> String {
        match self.share {
            Some(group) => format!("$share/{group}/{}", self.filter),
            None => self.filter.clone(),
        }
    }
}

/// One message handed to the application.
#[derive(Debug, Clone, Copy)]
pub struct Delivery {
    pub publisher: usize,
    pub number: u64,
    /// The QoS of the PUBLISH that carried it.
    pub qos: u8,
    /// Which connection of the subscriber (1 = first).
    pub connection: u64,
}

/// A PUBLISH that came: what the checker's reports show of it.
#[derive(Debug, Clone, Copy)]
pub struct Seen {
    pub publisher: usize,
    pub number: u64,
    pub connection: u64,
    pub dup: bool,
    pub qos: u8,
    pub packet_id: u16,
    /// The broker's boot when the connection was made (0 = first).
    pub boot: u64,
    /// Virtual time.
    pub at: Duration,
}

#[derive(Default)]
pub struct SubState {
    /// The SUBACK came (the subscription is durable).
    pub subscribed: bool,
    /// QoS 2 packet ids received and not yet released, with the held message (AtPubrel).
    pub received: BTreeMap<u16, Option<(usize, u64)>>,
    pub got: Vec<Delivery>,
    /// Every PUBLISH that came, for the log.
    pub seen: Vec<Seen>,
    /// Exchanges open at the subscriber, and violations of the packet-id rule
    /// (`exchanges.rs`).
    pub open_ids: OpenIds,
    /// What the subscriber saw and did (printed for share-group members and for subscribers
    /// left with open exchanges).
    pub trace: Vec<String>,
    /// Payloads that are none of ours.
    pub foreign: Vec<String>,
    /// Reconnects after the SUBACK answered with Session Present = 0.
    pub sessions_lost: u64,
    pub connections: u64,
    /// The broker's boot when the current connection was made.
    pub boot: u64,
    /// Refused or unexpected SUBACKs.
    pub bad_subacks: Vec<String>,
}

impl SubState {
    fn deliver(&mut self, m: (usize, u64), qos: u8) {
        let connection = self.connections;
        self.got.push(Delivery {
            publisher: m.0,
            number: m.1,
            qos,
            connection,
        });
    }

    /// A new connection (its CONNACK's Session Present): whether to subscribe.
    fn connected(&mut self, boot: u64, session_present: bool) -> bool {
        self.connections += 1;
        self.boot = boot;
        let at = turmoil::sim_elapsed().unwrap_or_default();
        let entry = format!("c{}:boot{boot}@{}us", self.connections, at.as_micros());
        self.trace.push(entry);
        if !session_present {
            // A new session: the broker may use any packet id again.
            self.open_ids.reset();
        }
        if self.subscribed && !session_present {
            // The subscription was acknowledged: the session must have survived.
            self.sessions_lost += 1;
            self.subscribed = false;
        }
        !self.subscribed
    }

    /// Notes a PUBLISH of ours and checks it against the open exchanges.
    fn note(&mut self, p: &tern_wire::Publish, m: (usize, u64)) -> Incoming {
        let incoming = Incoming {
            packet_id: p.packet_id,
            message: m,
            qos: p.qos as u8,
            dup: p.dup,
            connection: self.connections,
            boot: self.boot,
            at: turmoil::sim_elapsed().unwrap_or_default(),
        };
        self.seen.push(Seen {
            publisher: m.0,
            number: m.1,
            connection: incoming.connection,
            dup: p.dup,
            qos: incoming.qos,
            packet_id: p.packet_id,
            boot: incoming.boot,
            at: incoming.at,
        });
        let dup = if p.dup { "d" } else { "" };
        let entry = format!(
            "c{}:P{}q{}{dup}={}/{}@{}",
            incoming.connection,
            p.packet_id,
            incoming.qos,
            m.0,
            m.1,
            incoming.at.as_micros()
        );
        self.trace.push(entry);
        if p.qos != QoS::AtMostOnce {
            self.open_ids.check(&incoming);
        }
        incoming
    }

    /// Handles a packet (the subscriber's application and MQTT session state): the reply.
    /// `incoming`: what [`SubState::note`] made of it, if it is a PUBLISH of ours.
    fn handle(
        &mut self,
        spec: &SubSpec,
        packet: Packet,
        incoming: Option<Incoming>,
    ) -> Option<Packet> {
        match packet {
            Packet::SubAck(sa) => {
                if sa.reasons == vec![ReasonCode(spec.qos)] {
                    self.subscribed = true;
                } else {
                    self.bad_subacks.push(format!("{:?}", sa.reasons));
                }
                None
            }
            Packet::Publish(p) => {
                let Some(m) = parse(&p.payload) else {
                    self.foreign
                        .push(String::from_utf8_lossy(&p.payload).into_owned());
                    return None;
                };
                self.handle_publish(spec, &p, m, incoming)
            }
            Packet::PubRel(a) => {
                let entry = format!("c{}:R{}", self.connections, a.packet_id);
                self.trace.push(entry);
                if let Some(Some(m)) = self.received.remove(&a.packet_id) {
                    self.deliver(m, 2);
                }
                Some(Packet::PubComp(ack(a.packet_id)))
            }
            _ => None,
        }
    }

    fn handle_publish(
        &mut self,
        spec: &SubSpec,
        p: &tern_wire::Publish,
        m: (usize, u64),
        incoming: Option<Incoming>,
    ) -> Option<Packet> {
        if let Some(i) = incoming.filter(|_| p.qos != QoS::AtMostOnce) {
            self.open_ids.open(&i);
        }
        match p.qos {
            QoS::AtMostOnce => {
                self.deliver(m, 0);
                None
            }
            QoS::AtLeastOnce => {
                self.deliver(m, 1);
                Some(Packet::PubAck(ack(p.packet_id)))
            }
            QoS::ExactlyOnce => {
                // A packet id already held: the same message again.
                if let Entry::Vacant(e) = self.received.entry(p.packet_id) {
                    match spec.deliver {
                        Deliver::AtPublish => {
                            e.insert(None);
                            self.deliver(m, 2);
                        }
                        Deliver::AtPubrel => {
                            e.insert(Some(m));
                        }
                    }
                }
                Some(Packet::PubRec(ack(p.packet_id)))
            }
        }
    }

    fn note_leave(&mut self) {
        let entry = format!("c{}:leave", self.connections);
        self.trace.push(entry);
    }
}

/// Whether an offline subscriber leaves now, at its stage: `packet` came and `reply` is
/// what would answer it. (Leave at `Unacked` / `AtPubrel`: before the reply; at
/// `AfterPubrec`: once it is sent.)
fn leaves_at(o: &Offline, publishes_here: u64, reply: Option<&Packet>) -> Option<Stage> {
    if publishes_here < o.after_publishes {
        return None;
    }
    let at = match (o.stage, reply?) {
        (Stage::Unacked, Packet::PubAck(_) | Packet::PubRec(_)) => Stage::Unacked,
        (Stage::AfterPubrec, Packet::PubRec(_)) => Stage::AfterPubrec,
        (Stage::AtPubrel, Packet::PubComp(_)) => Stage::AtPubrel,
        _ => return None,
    };
    Some(at)
}

/// Leaves: DISCONNECT if `clean`, then the socket closes.
async fn leave(mut c: Conn, clean: bool, state: &Mutex<SubState>) {
    state.lock().note_leave();
    if clean {
        let _ = c
            .send(&Packet::Disconnect(Disconnect {
                reason: ReasonCode::SUCCESS,
                properties: Properties::default(),
            }))
            .await;
    }
    drop(c);
}

/// Sends a reply: an exchange closes as its PUBACK / PUBCOMP starts out.
async fn reply(c: &mut Conn, p: &Packet, state: &Mutex<SubState>) -> bool {
    if let Packet::PubAck(a) | Packet::PubComp(a) = p {
        state.lock().open_ids.close(a.packet_id);
    }
    if !c.send(p).await {
        return false;
    }
    if let Packet::PubRec(a) = p {
        let mut st = state.lock();
        let entry = format!("c{}:r{}", st.connections, a.packet_id);
        st.trace.push(entry);
    }
    true
}

pub async fn run_subscriber(spec: SubSpec, state: Arc<Mutex<SubState>>, net: Arc<Net>) {
    let mut absences = 0u64;
    'connection: loop {
        let Some(mut c) =
            reconnect(&net, spec.protocol, &spec.client_id(), spec.receive_maximum).await
        else {
            return;
        };
        let mut publishes_here = 0u64;
        let mut received_here = 0u64;
        let boot = net.boot.load(Ordering::Relaxed);
        if state.lock().connected(boot, c.session_present) && !subscribe(&mut c, &spec).await {
            continue 'connection;
        }
        // Away for long on this connection (issue 25)?
        let offline = spec.offline.filter(|o| absences < o.absences);
        loop {
            // The run is over: leave once no exchange is open here. One the broker never
            // releases keeps the subscriber waiting, and open, until the checker sees it.
            if net.stop.load(Ordering::Relaxed) && state.lock().received.is_empty() {
                return;
            }
            let packet = match c.recv(POLL).await {
                Err(()) => continue 'connection,
                Ok(None) => continue,
                Ok(Some(p)) => p,
            };
            if net.stop.load(Ordering::Relaxed) && starts_an_exchange(&packet, &state) {
                // A delivery that came after the stop (the broker still fed this subscriber):
                // not taken, as if the client had left just before it. Taken and answered
                // with PUBREC, the subscriber would leave with it open (finding 9: the
                // checker's).
                continue;
            }
            received_here += 1;
            let mut incoming = None;
            if let Packet::Publish(p) = &packet {
                incoming = parse(&p.payload).map(|m| state.lock().note(p, m));
                publishes_here += 1;
                if spec.leave_after.is_some_and(|k| publishes_here > k) {
                    // Leaves before handling this PUBLISH (it is resent or goes elsewhere).
                    leave(c, spec.leave_cleanly, &state).await;
                    tokio::time::sleep(Duration::from_millis(spec.pause_ms)).await;
                    continue 'connection;
                }
            }
            if let Packet::Disconnect(_) = packet {
                continue 'connection;
            }
            let answer = state.lock().handle(&spec, packet, incoming);
            stall(spec.stall, received_here).await;
            let stage = offline.and_then(|o| leaves_at(&o, publishes_here, answer.as_ref()));
            if let Some(p) = &answer {
                if stage != Some(Stage::Unacked)
                    && stage != Some(Stage::AtPubrel)
                    && !reply(&mut c, p, &state).await
                {
                    continue 'connection;
                }
            }
            if let (Some(o), Some(_)) = (offline, stage) {
                leave(c, o.clean, &state).await;
                absences += 1;
                if !stay_away(&net, &o).await {
                    return;
                }
                continue 'connection;
            }
        }
    }
}

/// A PUBLISH that is not a resend of an exchange this subscriber holds open.
fn starts_an_exchange(packet: &Packet, state: &Mutex<SubState>) -> bool {
    match packet {
        Packet::Publish(p) => {
            p.qos != QoS::ExactlyOnce || !state.lock().received.contains_key(&p.packet_id)
        }
        _ => false,
    }
}

async fn subscribe(c: &mut Conn, spec: &SubSpec) -> bool {
    let sub = Subscribe {
        packet_id: 1,
        properties: Properties::default(),
        filters: vec![(
            s(&spec.subscription()),
            SubscriptionOptions {
                qos: QoS::from_u8(spec.qos).expect("qos"),
                ..SubscriptionOptions::default()
            },
        )],
    };
    c.send(&Packet::Subscribe(sub)).await
}
