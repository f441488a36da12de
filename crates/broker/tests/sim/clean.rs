//! Clean sessions (MQTT 3.1.1 clean session 1, MQTT 5 clean start with session expiry 0) and
//! QoS 0 publishers, beside the persistent workload, on their own topic (`side/clean`): one
//! clean publisher (QoS 0, 1 or 2) and one clean subscriber (QoS 0, 1 or 2) that leaves now
//! and then, cleanly or by vanishing, and comes back as a new session.
//!
//! Their guarantees hold while a connection lives and nothing after it ends (the broker
//! writes no QoS 2 received/released records for sessions with expiry 0, ARCHITECTURE §3):
//! - every CONNACK says Session Present = 0 (MQTT-3.2.2-1, MQTT-3.2.2-2);
//! - nothing is invented, and a message arrives at the lower of the publication's and the
//!   subscription's QoS;
//! - a message at QoS 0 or 2 reaches the application at most once (QoS 0 is never resent;
//!   a QoS 2 exchange of an ended session is never resumed);
//! - a subscriber connection gets nothing its session was not subscribed to: no message
//!   acknowledged to the publisher before that connection sent its SUBSCRIBE;
//! - first deliveries on one subscriber connection keep the order the publisher sent them in
//!   on one of its connections;
//! - the subscriber connection alive at the end got every message (subscription QoS 1 or 2)
//!   that the publisher sent after that connection's SUBACK and had acknowledged: at least
//!   once, QoS 2 exactly once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use parking_lot::Mutex;
use tern_store::sim::SimRng;
use tern_wire::{
    Disconnect, Packet, Properties, Protocol, Publish, QoS, ReasonCode, Subscribe,
    SubscriptionOptions,
};

use super::client::{Conn, Net, POLL, ack, clean_connect, parse, payload, s};
use super::run::Task;

/// When something happened, as [`Net::stamp`] orders it.
type Stamp = u64;

/// The payloads' publisher number (`90:n:`), apart from the persistent publishers'.
const PUBLISHER: usize = 90;
const TOPIC: &str = "side/clean";

#[derive(Debug, Clone)]
pub struct CleanSpec {
    pub pub_protocol: Protocol,
    pub sub_protocol: Protocol,
    pub pub_qos: u8,
    pub sub_qos: u8,
    pub limit: u64,
    pub window: usize,
    /// Pause after each PUBLISH, so that the traffic spans the faults.
    pub gap_us: u64,
    /// The subscriber leaves after this many PUBLISHes on a connection (DISCONNECT or a
    /// vanished socket, by `leave_cleanly`) and comes back as a new session.
    pub leave_after: Option<u64>,
    pub leave_cleanly: bool,
}

/// In 6 seeds of 10, from its own generator (the other draws of the seed stay the same).
pub fn draw(seed: u64) -> Option<CleanSpec> {
    let mut r = SimRng::keyed(&[seed, 0xc1ea]);
    if !r.chance(0.6) {
        return None;
    }
    let proto = |r: &mut SimRng| {
        if r.chance(0.5) {
            Protocol::V5
        } else {
            Protocol::V3_1_1
        }
    };
    Some(CleanSpec {
        pub_protocol: proto(&mut r),
        sub_protocol: proto(&mut r),
        pub_qos: r.range(0, 2) as u8,
        sub_qos: r.range(0, 2) as u8,
        limit: r.range(30, 120),
        window: r.range(1, 8) as usize,
        gap_us: r.range(500, 4000),
        leave_after: r.chance(0.5).then(|| r.range(5, 30)),
        leave_cleanly: r.chance(0.5),
    })
}

#[derive(Default)]
pub struct CleanPub {
    pub next: u64,
    /// Number → (the publisher's connection, when its PUBLISH was sent).
    sent: BTreeMap<u64, (u64, Stamp)>,
    /// Number → when its PUBACK / PUBREC came.
    acked: BTreeMap<u64, Stamp>,
    connections: u64,
    session_present: u64,
    /// Every message sent and every exchange on the last connection ended.
    finished: bool,
}

/// One subscriber connection.
#[derive(Default)]
struct SubConn {
    subscribe_sent: Option<Stamp>,
    suback: Option<Stamp>,
    ended: bool,
    /// (number, QoS) handed to the application, in order.
    got: Vec<(u64, u8)>,
}

#[derive(Default)]
pub struct CleanSub {
    conns: Vec<SubConn>,
    held: BTreeSet<u16>,
    foreign: Vec<String>,
    session_present: u64,
    bad_subacks: Vec<String>,
}

pub struct Clean {
    pub spec: CleanSpec,
    pub publisher: Arc<Mutex<CleanPub>>,
    pub subscriber: Arc<Mutex<CleanSub>>,
}

impl Clean {
    pub fn new(spec: CleanSpec) -> Clean {
        Clean {
            spec,
            publisher: Arc::default(),
            subscriber: Arc::default(),
        }
    }

    /// The clients' software: (turmoil client name, task).
    pub fn tasks(&self, net: &Arc<Net>) -> Vec<(&'static str, Task)> {
        vec![
            (
                "sim-clean-sub",
                Box::pin(run_sub(
                    self.spec.clone(),
                    self.subscriber.clone(),
                    net.clone(),
                )),
            ),
            (
                "sim-clean-pub",
                Box::pin(run_pub(
                    self.spec.clone(),
                    self.publisher.clone(),
                    net.clone(),
                )),
            ),
        ]
    }

    /// The publisher is done, and the live subscriber connection holds what it is owed.
    pub fn settled(&self) -> bool {
        let p = self.publisher.lock();
        p.finished && self.owed_missing(&p, &self.subscriber.lock()).is_empty()
    }

    fn owed_missing(&self, p: &CleanPub, s: &CleanSub) -> Vec<u64> {
        if self.spec.sub_qos == 0 || self.spec.pub_qos == 0 {
            return Vec::new();
        }
        let Some(last) = s.conns.last().filter(|c| !c.ended) else {
            return Vec::new();
        };
        let Some(suback) = last.suback else {
            return Vec::new();
        };
        let got: BTreeSet<u64> = last.got.iter().map(|g| g.0).collect();
        p.acked
            .keys()
            .filter(|n| p.sent.get(n).is_some_and(|&(_, at)| at > suback))
            .filter(|n| !got.contains(n))
            .copied()
            .collect()
    }

    /// For the seed's log: what was sent, acknowledged and delivered.
    pub fn summary(&self) -> String {
        let p = self.publisher.lock();
        let s = self.subscriber.lock();
        let got: Vec<usize> = s.conns.iter().map(|c| c.got.len()).collect();
        format!(
            "clean sessions: sent {} on {} connections, acknowledged {}; delivered per subscriber connection {got:?}",
            p.sent.len(),
            p.connections,
            p.acked.len()
        )
    }

    pub fn check(&self, violations: &mut Vec<String>) {
        let spec = &self.spec;
        let who = format!(
            "clean sessions (pub {:?} QoS {}, sub {:?} QoS {})",
            spec.pub_protocol, spec.pub_qos, spec.sub_protocol, spec.sub_qos
        );
        let p = self.publisher.lock();
        let s = self.subscriber.lock();
        let mut v = Vec::new();
        if p.session_present + s.session_present > 0 {
            v.push(format!(
                "Session Present = 1 on {} clean-start CONNACKs (MQTT-3.2.2-1/-2)",
                p.session_present + s.session_present
            ));
        }
        if !s.foreign.is_empty() || !s.bad_subacks.is_empty() {
            v.push(format!(
                "foreign payloads {:?}, bad SUBACKs {:?}",
                s.foreign, s.bad_subacks
            ));
        }
        let want_qos = spec.pub_qos.min(spec.sub_qos);
        let mut seen: BTreeMap<u64, usize> = BTreeMap::new();
        for (k, c) in s.conns.iter().enumerate() {
            let mut last_per_conn: BTreeMap<u64, u64> = BTreeMap::new();
            let mut first = BTreeSet::new();
            for &(n, qos) in &c.got {
                *seen.entry(n).or_default() += 1;
                if !p.sent.contains_key(&n) {
                    v.push(format!("connection {}: message {n} never published", k + 1));
                    continue;
                }
                if qos != want_qos {
                    v.push(format!(
                        "connection {}: message {n} at QoS {qos}, not {want_qos}",
                        k + 1
                    ));
                }
                let subscribed = c.subscribe_sent.unwrap_or(Stamp::MAX);
                if p.acked.get(&n).is_some_and(|&at| at < subscribed) {
                    v.push(format!("connection {}: message {n}, acknowledged before it subscribed, delivered to the new session", k + 1));
                }
                if first.insert(n) {
                    let pub_conn = p.sent[&n].0;
                    if let Some(&before) = last_per_conn.get(&pub_conn) {
                        if before > n {
                            v.push(format!("connection {}: {n} after {before} (publisher connection {pub_conn})", k + 1));
                        }
                    }
                    last_per_conn.insert(pub_conn, n);
                }
            }
        }
        if want_qos != 1 {
            let twice: Vec<u64> = seen
                .iter()
                .filter(|(_, c)| **c > 1)
                .map(|(n, _)| *n)
                .collect();
            if !twice.is_empty() {
                v.push(format!(
                    "delivered more than once at QoS {want_qos}: {twice:?}"
                ));
            }
        }
        let missing = self.owed_missing(&p, &s);
        if !missing.is_empty() {
            v.push(format!("{} acknowledged messages sent after the live subscription's SUBACK lost: {missing:?}", missing.len()));
        }
        violations.extend(v.into_iter().map(|e| format!("{who}: {e}")));
    }
}

async fn run_pub(spec: CleanSpec, st: Arc<Mutex<CleanPub>>, net: Arc<Net>) {
    loop {
        if net.stop.load(Ordering::Relaxed) {
            return;
        }
        if st.lock().next >= spec.limit {
            st.lock().finished = true;
            return;
        }
        let Some(mut c) =
            Conn::connect(&net, clean_connect(spec.pub_protocol, "sim-clean-pub")).await
        else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        // A clean session: what was in flight on the last connection is given up.
        let conn = {
            let mut st = st.lock();
            st.connections += 1;
            st.session_present += u64::from(c.session_present);
            st.connections
        };
        if publish_on(&spec, &st, &net, &mut c, conn).await {
            return;
        }
    }
}

/// Publishes on one connection; true once done (or stopped), false when the connection died.
async fn publish_on(
    spec: &CleanSpec,
    st: &Mutex<CleanPub>,
    net: &Net,
    c: &mut Conn,
    conn: u64,
) -> bool {
    let qos = QoS::from_u8(spec.pub_qos).expect("qos");
    let mut inflight: BTreeMap<u16, u64> = BTreeMap::new();
    let mut next_id = 0u16;
    loop {
        if net.stop.load(Ordering::Relaxed) {
            return true;
        }
        while inflight.len() < spec.window {
            let number = {
                let mut st = st.lock();
                if st.next >= spec.limit {
                    break;
                }
                let number = st.next;
                st.next += 1;
                st.sent.insert(number, (conn, net.stamp()));
                number
            };
            next_id = next_id.wrapping_add(1).max(1);
            if qos != QoS::AtMostOnce {
                inflight.insert(next_id, number);
            }
            let publish = Packet::Publish(Publish {
                dup: false,
                qos,
                retain: false,
                topic: s(TOPIC),
                packet_id: if qos == QoS::AtMostOnce { 0 } else { next_id },
                properties: Properties::default(),
                payload: payload(PUBLISHER, number, 8),
            });
            if !c.send(&publish).await {
                return false;
            }
            tokio::time::sleep(Duration::from_micros(spec.gap_us)).await;
        }
        if inflight.is_empty() && st.lock().next >= spec.limit {
            st.lock().finished = true;
            return true;
        }
        let reply = match c.recv(POLL).await {
            Err(()) => return false,
            Ok(None) => continue,
            Ok(Some(Packet::PubAck(a))) => {
                if let Some(n) = inflight.remove(&a.packet_id) {
                    if a.reason.is_success() {
                        st.lock().acked.insert(n, net.stamp());
                    }
                }
                None
            }
            Ok(Some(Packet::PubRec(a))) if !a.reason.is_success() => {
                // A PUBREC >= 0x80 ends the exchange, unacknowledged.
                inflight.remove(&a.packet_id);
                None
            }
            Ok(Some(Packet::PubRec(a))) => {
                if let Some(&n) = inflight.get(&a.packet_id) {
                    st.lock().acked.entry(n).or_insert_with(|| net.stamp());
                }
                Some(Packet::PubRel(ack(a.packet_id)))
            }
            Ok(Some(Packet::PubComp(a))) => {
                inflight.remove(&a.packet_id);
                None
            }
            Ok(Some(_)) => None,
        };
        if let Some(r) = reply {
            if !c.send(&r).await {
                return false;
            }
        }
    }
}

async fn run_sub(spec: CleanSpec, st: Arc<Mutex<CleanSub>>, net: Arc<Net>) {
    loop {
        if net.stop.load(Ordering::Relaxed) {
            return;
        }
        let Some(mut c) =
            Conn::connect(&net, clean_connect(spec.sub_protocol, "sim-clean-sub")).await
        else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        {
            let mut st = st.lock();
            st.session_present += u64::from(c.session_present);
            st.held.clear();
            st.conns.push(SubConn::default());
        }
        let sub = Subscribe {
            packet_id: 1,
            properties: Properties::default(),
            filters: vec![(
                s(TOPIC),
                SubscriptionOptions {
                    qos: QoS::from_u8(spec.sub_qos).expect("qos"),
                    ..SubscriptionOptions::default()
                },
            )],
        };
        st.lock().conns.last_mut().expect("conn").subscribe_sent = Some(net.stamp());
        let mut publishes = 0u64;
        if c.send(&Packet::Subscribe(sub)).await {
            publishes = serve_sub(&spec, &st, &net, &mut c).await;
        }
        if !net.stop.load(Ordering::Relaxed) {
            // (At the stop the broker is killed after the flag is set: the connection that
            // lives then counts as alive at the end.)
            st.lock().conns.last_mut().expect("conn").ended = true;
        }
        if spec.leave_after.is_some_and(|k| publishes > k) && spec.leave_cleanly {
            let _ = c
                .send(&Packet::Disconnect(Disconnect {
                    reason: ReasonCode::SUCCESS,
                    properties: Properties::default(),
                }))
                .await;
        }
        drop(c);
    }
}

/// One connection's packets; returns the PUBLISHes received (it ends when the connection
/// does, or past `leave_after`).
async fn serve_sub(spec: &CleanSpec, st: &Mutex<CleanSub>, net: &Net, c: &mut Conn) -> u64 {
    let mut publishes = 0u64;
    loop {
        if net.stop.load(Ordering::Relaxed) {
            return publishes;
        }
        let reply = match c.recv(POLL).await {
            Err(()) => return publishes,
            Ok(None) => continue,
            Ok(Some(Packet::SubAck(sa))) => {
                let mut st = st.lock();
                if sa.reasons == vec![ReasonCode(spec.sub_qos)] {
                    st.conns.last_mut().expect("conn").suback = Some(net.stamp());
                } else {
                    st.bad_subacks.push(format!("{:?}", sa.reasons));
                }
                None
            }
            Ok(Some(Packet::Publish(p))) => {
                publishes += 1;
                if spec.leave_after.is_some_and(|k| publishes > k) {
                    return publishes;
                }
                let mut st = st.lock();
                let m = match parse(&p.payload) {
                    Some((PUBLISHER, n)) => n,
                    _ => {
                        st.foreign
                            .push(String::from_utf8_lossy(&p.payload).into_owned());
                        continue;
                    }
                };
                let qos = p.qos as u8;
                let fresh = p.qos != QoS::ExactlyOnce || st.held.insert(p.packet_id);
                if fresh {
                    st.conns.last_mut().expect("conn").got.push((m, qos));
                }
                match p.qos {
                    QoS::AtMostOnce => None,
                    QoS::AtLeastOnce => Some(Packet::PubAck(ack(p.packet_id))),
                    QoS::ExactlyOnce => Some(Packet::PubRec(ack(p.packet_id))),
                }
            }
            Ok(Some(Packet::PubRel(a))) => {
                st.lock().held.remove(&a.packet_id);
                Some(Packet::PubComp(ack(a.packet_id)))
            }
            Ok(Some(_)) => None,
        };
        if let Some(r) = reply {
            if !c.send(&r).await {
                return publishes;
            }
        }
    }
}
