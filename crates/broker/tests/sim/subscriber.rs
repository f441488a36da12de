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

use super::client::{Net, POLL, ack, parse, reconnect, s, stall};

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

#[derive(Default)]
pub struct SubState {
    /// The SUBACK came (the subscription is durable).
    pub subscribed: bool,
    /// QoS 2 packet ids received and not yet released, with the held message (AtPubrel).
    pub received: BTreeMap<u16, Option<(usize, u64)>>,
    pub got: Vec<Delivery>,
    /// Every PUBLISH that came, for the log: (publisher, number, connection, DUP, QoS).
    pub seen: Vec<(usize, u64, u64, bool, u8)>,
    /// What the subscriber saw and did (printed for share-group members and for subscribers
    /// left with open exchanges).
    pub trace: Vec<String>,
    /// Payloads that are none of ours.
    pub foreign: Vec<String>,
    /// Reconnects after the SUBACK answered with Session Present = 0.
    pub sessions_lost: u64,
    pub connections: u64,
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
}

pub async fn run_subscriber(spec: SubSpec, state: Arc<Mutex<SubState>>, net: Arc<Net>) {
    'connection: loop {
        let Some(mut c) =
            reconnect(&net, spec.protocol, &spec.client_id(), spec.receive_maximum).await
        else {
            return;
        };
        let mut publishes_here = 0u64;
        let mut received_here = 0u64;
        let subscribe = {
            let mut st = state.lock();
            st.connections += 1;
            let entry = format!(
                "c{}:boot{}",
                st.connections,
                net.boot.load(Ordering::Relaxed)
            );
            st.trace.push(entry);
            if st.subscribed && !c.session_present {
                // The subscription was acknowledged: the session must have survived.
                st.sessions_lost += 1;
                st.subscribed = false;
            }
            !st.subscribed
        };
        if subscribe {
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
            if !c.send(&Packet::Subscribe(sub)).await {
                continue 'connection;
            }
        }
        loop {
            if net.stop.load(Ordering::Relaxed) {
                return;
            }
            let packet = match c.recv(POLL).await {
                Err(()) => continue 'connection,
                Ok(None) => continue,
                Ok(Some(p)) => p,
            };
            received_here += 1;
            if let Packet::Publish(p) = &packet {
                if let Some((publisher, number)) = parse(&p.payload) {
                    let mut st = state.lock();
                    let connection = st.connections;
                    st.seen
                        .push((publisher, number, connection, p.dup, p.qos as u8));
                    {
                        let dup = if p.dup { "d" } else { "" };
                        let entry = format!(
                            "c{connection}:P{}q{}{dup}={publisher}/{number}",
                            p.packet_id, p.qos as u8
                        );
                        st.trace.push(entry);
                    }
                }
                publishes_here += 1;
                if spec.leave_after.is_some_and(|k| publishes_here > k) {
                    // Leaves before handling this PUBLISH (it is resent or goes elsewhere).
                    {
                        let mut st = state.lock();
                        let entry = format!("c{}:leave", st.connections);
                        st.trace.push(entry);
                    }
                    if spec.leave_cleanly {
                        let _ = c
                            .send(&Packet::Disconnect(Disconnect {
                                reason: ReasonCode::SUCCESS,
                                properties: Properties::default(),
                            }))
                            .await;
                    }
                    drop(c);
                    tokio::time::sleep(Duration::from_millis(spec.pause_ms)).await;
                    continue 'connection;
                }
            }
            let reply = {
                let mut st = state.lock();
                match packet {
                    Packet::SubAck(sa) => {
                        if sa.reasons == vec![ReasonCode(spec.qos)] {
                            st.subscribed = true;
                        } else {
                            st.bad_subacks.push(format!("{:?}", sa.reasons));
                        }
                        None
                    }
                    Packet::Publish(p) => {
                        let Some(m) = parse(&p.payload) else {
                            st.foreign
                                .push(String::from_utf8_lossy(&p.payload).into_owned());
                            continue;
                        };
                        match p.qos {
                            QoS::AtMostOnce => {
                                st.deliver(m, 0);
                                None
                            }
                            QoS::AtLeastOnce => {
                                st.deliver(m, 1);
                                Some(Packet::PubAck(ack(p.packet_id)))
                            }
                            QoS::ExactlyOnce => {
                                // A packet id already held: the same message again.
                                if let Entry::Vacant(e) = st.received.entry(p.packet_id) {
                                    match spec.deliver {
                                        Deliver::AtPublish => {
                                            e.insert(None);
                                            st.deliver(m, 2);
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
                    Packet::PubRel(a) => {
                        {
                            let entry = format!("c{}:R{}", st.connections, a.packet_id);
                            st.trace.push(entry);
                        }
                        if let Some(Some(m)) = st.received.remove(&a.packet_id) {
                            st.deliver(m, 2);
                        }
                        Some(Packet::PubComp(ack(a.packet_id)))
                    }
                    Packet::Disconnect(_) => continue 'connection,
                    _ => None,
                }
            };
            stall(spec.stall, received_here).await;
            if let Some(p) = reply {
                if !c.send(&p).await {
                    continue 'connection;
                }
                if let Packet::PubRec(a) = &p {
                    let mut st = state.lock();
                    let entry = format!("c{}:r{}", st.connections, a.packet_id);
                    st.trace.push(entry);
                }
            }
        }
    }
}
