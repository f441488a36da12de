//! Wills with a delay and session expiry, beside the persistent workload, on their own
//! topics (`side/will`, `side/exp`). Both timers count whole seconds (MQTT 5), so each part
//! runs in four seeds of ten ([`TIMER_CHANCE`]), in virtual time.
//!
//! **Wills** (`sim-will`, v5, Will Delay Interval 1 s, QoS 2, session expiry 30 s): each
//! connection carries its own will (`91:k:` for connection k), then the client leaves: with
//! DISCONNECT 0x00, or vanishing and coming back within the delay, or vanishing for longer.
//! A persistent watcher (QoS 2, the received set kept in the client) subscribes first.
//! - a will reaches the watcher at most once (ARCHITECTURE: at most once across crashes);
//! - with no fault from its connection on: never after DISCONNECT 0x00 (MQTT-3.1.2-8), never
//!   when the client came back within the delay (MQTT-3.1.3-9);
//! - with no fault from its connection until the delay has passed: published (MQTT-3.1.2-8).
//!
//! **Session expiry** (`sim-exp`, v5, expiry 1 s, QoS 1 on `side/exp`): it subscribes, vanishes,
//! a clean publisher sends it five messages (acknowledged), and it comes back after 0.2 s or
//! after 1.8 s. With no fault in between: before expiry Session Present = 1 and every
//! acknowledged message arrives; after expiry Session Present = 0 and none of them does (the
//! expired session's queue is gone, MQTT-3.1.2-11 / v5 §3.1.2.11.2).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use parking_lot::Mutex;
use tern_store::sim::SimRng;
use tern_wire::{
    Connect, Disconnect, Packet, Properties, Protocol, Publish, QoS, ReasonCode, Subscribe,
    SubscriptionOptions, Will,
};

use super::client::{Conn, Net, POLL, ack, clean_connect, parse, payload, reconnect, s};
use super::run::Task;

const WILL_TOPIC: &str = "side/will";
const WILL_PUBLISHER: usize = 91;
const EXP_TOPIC: &str = "side/exp";
const EXP_PUBLISHER: usize = 92;
const WILL_DELAY_S: u32 = 1;
const EXP_MESSAGES: u64 = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leave {
    /// DISCONNECT 0x00: the will is deleted.
    Clean,
    /// Vanishes and comes back after this many ms (within the delay).
    Return(u64),
    /// Vanishes for longer than the delay.
    Away,
}

#[derive(Debug, Clone)]
pub struct TimerSpec {
    /// How each will connection ends (the last one always ends with DISCONNECT 0x00).
    pub wills: Option<Vec<Leave>>,
    /// Session expiry: come back before expiry (true) or after.
    pub expiry_return_early: Option<bool>,
    /// Start once the seed's faults are over (so that the strict rules, which need a
    /// window without a fault, apply), rather than with the workload.
    pub late: bool,
}

/// The share of seeds with wills, and of seeds with session expiry: 4 in 10 each, now that
/// their seconds are virtual (1 in 10 while each cost two seconds of real time).
const TIMER_CHANCE: f64 = 0.4;

pub fn draw(seed: u64) -> TimerSpec {
    let mut r = SimRng::keyed(&[seed, 0x7133]);
    let wills = r.chance(TIMER_CHANCE).then(|| {
        (0..r.range(1, 2))
            .map(|_| match r.below(3) {
                0 => Leave::Clean,
                1 => Leave::Return(r.range(100, 300)),
                _ => Leave::Away,
            })
            .collect()
    });
    let expiry_return_early = r.chance(TIMER_CHANCE).then(|| r.chance(0.5));
    TimerSpec {
        wills,
        expiry_return_early,
        late: r.chance(0.5),
    }
}

/// One will connection: how it ended and the broker boots around it.
#[derive(Debug, Clone, Default)]
struct WillConn {
    leave: Option<Leave>,
    /// Boot at its CONNACK, and at the end of its delay (`Away`) or of its return (`Return`).
    boot_connected: u64,
    boot_after: Option<u64>,
    /// `Return`: the next CONNACK came within the delay with Session Present = 1.
    returned_in_time: bool,
}

#[derive(Default)]
pub struct TimerState {
    /// The parts may start (at once, or after the faults: [`TimerSpec::late`]).
    go: bool,
    will_conns: Vec<WillConn>,
    wills_done: bool,
    watcher_subscribed: bool,
    received: BTreeSet<u16>,
    /// Will instance → deliveries to the watcher's application.
    wills_seen: BTreeMap<u64, u32>,
    exp: Option<ExpOutcome>,
    final_boot: u64,
}

#[derive(Debug, Clone, Default)]
struct ExpOutcome {
    boot_before: u64,
    boot_after: u64,
    acked: u64,
    session_present: bool,
    got: Vec<u64>,
    done: bool,
}

pub struct Timers {
    pub spec: TimerSpec,
    state: Arc<Mutex<TimerState>>,
}

impl Timers {
    pub fn new(spec: TimerSpec) -> Option<Timers> {
        let state = TimerState {
            go: !spec.late,
            ..TimerState::default()
        };
        (spec.wills.is_some() || spec.expiry_return_early.is_some()).then(|| Timers {
            spec,
            state: Arc::new(Mutex::new(state)),
        })
    }

    /// The clients' software: (turmoil client name, task).
    pub fn tasks(&self, net: &Arc<Net>) -> Vec<(&'static str, Task)> {
        let mut tasks: Vec<(&'static str, Task)> = Vec::new();
        if let Some(leaves) = self.spec.wills.clone() {
            tasks.push((
                "sim-will-watch",
                Box::pin(watch(self.state.clone(), net.clone())),
            ));
            tasks.push((
                "sim-will",
                Box::pin(run_will(leaves, self.state.clone(), net.clone())),
            ));
        }
        if let Some(early) = self.spec.expiry_return_early {
            tasks.push((
                "sim-exp",
                Box::pin(run_expiry(early, self.state.clone(), net.clone())),
            ));
        }
        tasks
    }

    /// Every part ran its course (and a will owed had time to arrive).
    pub fn settled(&self) -> bool {
        let st = self.state.lock();
        let wills = self.spec.wills.is_none()
            || (st.wills_done
                && st.will_conns.iter().enumerate().all(|(k, c)| {
                    c.leave != Some(Leave::Away) || st.wills_seen.contains_key(&(k as u64))
                }));
        let exp =
            self.spec.expiry_return_early.is_none() || st.exp.as_ref().is_some_and(|e| e.done);
        wills && exp
    }

    /// For the seed's log.
    pub fn summary(&self) -> String {
        let st = self.state.lock();
        format!(
            "timers: will connections {:?}, wills seen {:?}, final boot {}, expiry {:?}",
            st.will_conns, st.wills_seen, st.final_boot, st.exp
        )
    }

    /// The seed's faults are over: late parts start.
    pub fn go(&self) {
        self.state.lock().go = true;
    }

    /// Notes the boot the run ended on (called before the broker is killed).
    pub fn end(&self, net: &Net) {
        self.state.lock().final_boot = net.boot.load(Ordering::Relaxed);
    }

    /// `retention`: the message stream has a `max_msgs` limit, which may remove messages
    /// queued for the offline expiry session (a documented loss, as for the main workload).
    pub fn check(&self, retention: bool, violations: &mut Vec<String>) {
        let st = self.state.lock();
        for (&k, &n) in &st.wills_seen {
            if n > 1 {
                violations.push(format!("wills: will {k} published {n} times"));
            }
            if st.will_conns.get(k as usize).is_none() {
                violations.push(format!("wills: will {k} of a connection never made"));
            }
        }
        for (k, c) in st.will_conns.iter().enumerate() {
            let seen = st.wills_seen.contains_key(&(k as u64));
            let quiet_to_end = c.boot_connected == st.final_boot;
            match c.leave {
                Some(Leave::Clean) if quiet_to_end && seen => violations.push(format!(
                    "wills: will {k} published after DISCONNECT 0x00 (MQTT-3.1.2-8)"
                )),
                Some(Leave::Return(_)) if quiet_to_end && c.returned_in_time && seen => {
                    violations.push(format!(
                        "wills: will {k} published though the client came back within the delay (MQTT-3.1.3-9)"
                    ))
                }
                Some(Leave::Away) if c.boot_after == Some(c.boot_connected) && st.wills_done && !seen => {
                    violations.push(format!(
                        "wills: will {k} never published, though its client stayed away past the delay"
                    ))
                }
                _ => {}
            }
        }
        if let (Some(early), Some(e)) = (self.spec.expiry_return_early, &st.exp) {
            if e.done && e.boot_before == e.boot_after {
                let who = if early { "before" } else { "after" };
                if e.session_present != early {
                    violations.push(format!(
                        "session expiry: back {who} expiry, Session Present = {}",
                        u8::from(e.session_present)
                    ));
                }
                let got: BTreeSet<u64> = e.got.iter().copied().collect();
                if early && !retention && (0..e.acked).any(|n| !got.contains(&n)) {
                    violations.push(format!(
                        "session expiry: back before expiry, got {:?} of {} acknowledged messages",
                        e.got, e.acked
                    ));
                }
                if e.got.iter().any(|&n| n >= EXP_MESSAGES) {
                    violations.push(format!(
                        "session expiry: got {:?}, never published by its publisher",
                        e.got
                    ));
                }
                if !early && !e.got.is_empty() {
                    violations.push(format!(
                        "session expiry: the expired session's queue delivered {:?}",
                        e.got
                    ));
                }
            }
        }
    }
}

fn v5_connect(client_id: &str, expiry_s: u32, will: Option<Will>) -> Connect {
    let properties: Properties = tern_wire::PropertyValues {
        session_expiry_interval_s: Some(expiry_s),
        ..tern_wire::PropertyValues::default()
    }
    .into();
    Connect {
        protocol: Protocol::V5,
        clean_start: false,
        keep_alive_s: 0,
        properties,
        client_id: s(client_id),
        will,
        username: None,
        password: None,
    }
}

async fn connect_until(net: &Arc<Net>, make: impl Fn() -> Connect) -> Option<Conn> {
    while !net.stop.load(Ordering::Relaxed) {
        if let Some(c) = Conn::connect(net, make()).await {
            return Some(c);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

fn disconnect() -> Packet {
    Packet::Disconnect(Disconnect {
        reason: ReasonCode::SUCCESS,
        properties: Properties::default(),
    })
}

/// Waits for the go (`TimerSpec::late`); false once stopped.
async fn start(st: &Mutex<TimerState>, net: &Arc<Net>) -> bool {
    while !st.lock().go {
        if net.stop.load(Ordering::Relaxed) {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    true
}

async fn run_will(leaves: Vec<Leave>, st: Arc<Mutex<TimerState>>, net: Arc<Net>) {
    if !start(&st, &net).await {
        return;
    }
    // The watcher subscribes first.
    while !st.lock().watcher_subscribed {
        if net.stop.load(Ordering::Relaxed) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let boot = || net.boot.load(Ordering::Relaxed);
    let plan: Vec<Leave> = leaves.into_iter().chain([Leave::Clean]).collect();
    for (k, leave) in plan.into_iter().enumerate() {
        let will_props: Properties = tern_wire::PropertyValues {
            will_delay_interval_s: Some(WILL_DELAY_S),
            ..tern_wire::PropertyValues::default()
        }
        .into();
        let will = Will {
            topic: s(WILL_TOPIC),
            payload: payload(WILL_PUBLISHER, k as u64, 0),
            qos: QoS::ExactlyOnce,
            retain: false,
            properties: will_props,
        };
        let connect = || v5_connect("sim-will", 30, Some(will.clone()));
        let Some(mut c) = connect_until(&net, connect).await else {
            return;
        };
        {
            st.lock().will_conns.push(WillConn {
                leave: Some(leave),
                boot_connected: boot(),
                ..WillConn::default()
            });
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
        let left = tokio::time::Instant::now();
        match leave {
            Leave::Clean => {
                let _ = c.send(&disconnect()).await;
                drop(c);
            }
            Leave::Return(ms) => {
                drop(c);
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            Leave::Away => {
                drop(c);
                tokio::time::sleep(Duration::from_millis(1600)).await;
                st.lock().will_conns.last_mut().expect("conn").boot_after = Some(boot());
            }
        }
        if let Leave::Return(_) = leave {
            // Back within the delay (with a margin) if this CONNACK, resuming the session,
            // comes before the deadline; the connection then leaves cleanly (its own will,
            // the same one, is deleted) and the next turn connects with the next will.
            let deadline = left + Duration::from_millis(u64::from(WILL_DELAY_S) * 1000 - 300);
            let resumed = tokio::time::timeout_at(deadline, Conn::connect(&net, connect())).await;
            if let Ok(Some(mut c)) = resumed {
                let in_time = c.session_present;
                st.lock()
                    .will_conns
                    .last_mut()
                    .expect("conn")
                    .returned_in_time = in_time;
                // This connection's own will is the previous one's: leave it cleanly.
                let _ = c.send(&disconnect()).await;
            }
        }
    }
    st.lock().wills_done = true;
}

/// The persistent QoS 2 watcher of `side/will`: hands each will to its application once per
/// exchange (its received set lives here and survives every fault).
async fn watch(st: Arc<Mutex<TimerState>>, net: Arc<Net>) {
    loop {
        let Some(mut c) = reconnect(&net, Protocol::V5, "sim-will-watch", None).await else {
            return;
        };
        if !st.lock().watcher_subscribed {
            let sub = Subscribe {
                packet_id: 1,
                properties: Properties::default(),
                filters: vec![(
                    s(WILL_TOPIC),
                    SubscriptionOptions {
                        qos: QoS::ExactlyOnce,
                        ..SubscriptionOptions::default()
                    },
                )],
            };
            if !c.send(&Packet::Subscribe(sub)).await {
                continue;
            }
        }
        loop {
            if net.stop.load(Ordering::Relaxed) {
                return;
            }
            let reply = match c.recv(POLL).await {
                Err(()) => break,
                Ok(None) => continue,
                Ok(Some(Packet::SubAck(_))) => {
                    st.lock().watcher_subscribed = true;
                    None
                }
                Ok(Some(Packet::Publish(p))) => {
                    let mut st = st.lock();
                    if st.received.insert(p.packet_id) {
                        let k = match parse(&p.payload) {
                            Some((WILL_PUBLISHER, k)) => k,
                            _ => u64::MAX,
                        };
                        *st.wills_seen.entry(k).or_default() += 1;
                    }
                    Some(Packet::PubRec(ack(p.packet_id)))
                }
                Ok(Some(Packet::PubRel(a))) => {
                    st.lock().received.remove(&a.packet_id);
                    Some(Packet::PubComp(ack(a.packet_id)))
                }
                Ok(Some(_)) => None,
            };
            if let Some(r) = reply {
                if !c.send(&r).await {
                    break;
                }
            }
        }
    }
}

async fn run_expiry(early: bool, st: Arc<Mutex<TimerState>>, net: Arc<Net>) {
    let boot = || net.boot.load(Ordering::Relaxed);
    let connect = || v5_connect("sim-exp", 1, None);
    if !start(&st, &net).await {
        return;
    }
    // Subscribe (until a SUBACK), then vanish.
    let boot_before = loop {
        let Some(mut c) = connect_until(&net, connect).await else {
            return;
        };
        let sub = Subscribe {
            packet_id: 1,
            properties: Properties::default(),
            filters: vec![(
                s(EXP_TOPIC),
                SubscriptionOptions {
                    qos: QoS::AtLeastOnce,
                    ..SubscriptionOptions::default()
                },
            )],
        };
        if c.send(&Packet::Subscribe(sub)).await
            && matches!(
                c.recv(Duration::from_secs(1)).await,
                Ok(Some(Packet::SubAck(_)))
            )
        {
            break boot();
        }
    };
    let vanished = tokio::time::Instant::now();
    let acked = feed(&net).await;
    let back_after = Duration::from_millis(if early { 200 } else { 1800 });
    tokio::time::sleep_until(vanished + back_after).await;
    let Some(mut c) = Conn::connect(&net, connect()).await else {
        // The broker is down (a fault struck): nothing to check.
        st.lock().exp = Some(ExpOutcome {
            boot_before,
            boot_after: u64::MAX,
            done: true,
            ..ExpOutcome::default()
        });
        return;
    };
    // Back early only if the CONNACK came well within the expiry (a slow feeder on a loaded
    // machine may delay it): otherwise nothing is checked.
    let late = early && vanished.elapsed() > Duration::from_millis(700);
    let mut out = ExpOutcome {
        boot_before: if late { u64::MAX } else { boot_before },
        acked,
        session_present: c.session_present,
        ..ExpOutcome::default()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
    while tokio::time::Instant::now() < deadline {
        match c.recv(Duration::from_millis(50)).await {
            Ok(Some(Packet::Publish(p))) => {
                if let Some((EXP_PUBLISHER, n)) = parse(&p.payload) {
                    out.got.push(n);
                }
                let _ = c.send(&Packet::PubAck(ack(p.packet_id))).await;
            }
            Err(()) => break,
            _ => {}
        }
    }
    out.boot_after = boot();
    out.done = true;
    let _ = c.send(&disconnect()).await;
    st.lock().exp = Some(out);
}

/// A clean publisher queues [`EXP_MESSAGES`] QoS 1 messages for the absent session; returns
/// how many were acknowledged (in order, from the first).
async fn feed(net: &Arc<Net>) -> u64 {
    let mut acked = 0;
    if let Some(mut p) = Conn::connect(net, clean_connect(Protocol::V5, "sim-exp-feed")).await {
        for n in 0..EXP_MESSAGES {
            let publish = Packet::Publish(Publish {
                dup: false,
                qos: QoS::AtLeastOnce,
                retain: false,
                topic: s(EXP_TOPIC),
                packet_id: n as u16 + 1,
                properties: Properties::default(),
                payload: payload(EXP_PUBLISHER, n, 0),
            });
            if !p.send(&publish).await {
                break;
            }
            match p.recv(Duration::from_millis(150)).await {
                Ok(Some(Packet::PubAck(a))) if a.reason.is_success() => acked += 1,
                _ => break,
            }
        }
    }
    acked
}
