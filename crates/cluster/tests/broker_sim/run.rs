//! One seed: the cluster up, persistent subscribers subscribed, publishers publishing while
//! the plan's faults strike one after another, then every node back and the network healed,
//! the publishers' last messages, and the checker.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tern_store::sim::SimRng;
use tern_wire::{Protocol, QoS};

use crate::check::{self, PubView, SubView};
use crate::client::{Method, PubState, Publisher, SubState, Subscriber};
use crate::conn::{Shared, TAKEOVER_WAIT};
use crate::plan::{Fault, Plan, Target};
use crate::world::{NODES, World, id};

/// Most log lines kept per seed.
const MAX_LOG_LINES: usize = 4000;
/// How long the cluster may take to serve the subscribers at the start, and the publishers
/// to finish once every fault is over.
const SERVE_WAIT: Duration = Duration::from_secs(60);
/// How long the subscribers may take to receive the last acknowledged messages.
const DRAIN_WAIT: Duration = Duration::from_secs(20);

/// A seed's log: what the controller and the clients did, with the time since the start.
#[derive(Clone)]
pub struct Log {
    start: Instant,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Log {
    fn new() -> Log {
        Log {
            start: Instant::now(),
            lines: Arc::default(),
        }
    }

    pub fn line(&self, text: String) {
        let mut l = self.lines.lock().unwrap();
        if l.len() < MAX_LOG_LINES {
            l.push(format!(
                "[{:>6}ms] {text}",
                self.start.elapsed().as_millis()
            ));
        }
    }

    fn take(&self) -> Vec<String> {
        std::mem::take(&mut self.lines.lock().unwrap())
    }
}

pub struct Outcome {
    pub acked: u64,
    pub violations: Vec<String>,
    pub log: Vec<String>,
    pub plan: String,
}

fn wait_until(deadline: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    done()
}

pub fn run_seed(seed: u64) -> Outcome {
    let plan = Plan::new(seed);
    let log = Log::new();
    let mut violations = Vec::new();
    let mut acked = 0;
    match World::new(seed, log.clone()) {
        Ok(world) => {
            let (v, a) = run_world(seed, &plan, world, &log);
            violations = v;
            acked = a;
        }
        Err(e) => violations.push(format!("the cluster could not be set up: {e}")),
    }
    Outcome {
        acked,
        violations,
        log: log.take(),
        plan: plan.to_string(),
    }
}

type Pubs = Vec<(usize, QoS, Arc<Mutex<PubState>>)>;
type Subs = Vec<(usize, QoS, Arc<Mutex<SubState>>)>;

fn run_world(seed: u64, plan: &Plan, mut world: World, log: &Log) -> (Vec<String>, u64) {
    world.snapshots = plan.snapshots;
    {
        let mut l = world.net.links.lock().unwrap();
        l.drop_pct = plan.drop_pct;
        l.max_delay_ms = plan.max_delay_ms;
    }
    for i in 0..NODES {
        world.start(i);
    }
    let clients = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .thread_name("clients")
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return (vec![format!("no client runtime: {e}")], 0),
    };
    let shared = Arc::new(Shared {
        addrs: world.addrs.clone(),
        stop: Default::default(),
        epoch: Default::default(),
        watchers: Default::default(),
        faults_over: Default::default(),
        log: log.clone(),
        violations: Mutex::default(),
    });
    let mut violations = Vec::new();
    let subs = spawn_subscribers(&clients, &shared, seed, plan);
    let subscribed = wait_until(SERVE_WAIT, || {
        subs.iter().all(|(_, _, s)| s.lock().unwrap().established)
    });
    if !subscribed {
        violations.push("availability: the subscribers never got their SUBACKs".to_string());
    }
    let pubs = spawn_publishers(&clients, &shared, seed, plan);
    if subscribed {
        let mut rng = SimRng::keyed(&[seed, 0x6661756c74]);
        for &(gap, fault) in &plan.faults {
            std::thread::sleep(Duration::from_millis(gap));
            strike(&mut world, fault, &mut rng);
            shared.epoch.fetch_add(1, Ordering::Relaxed);
        }
    }
    for i in 0..NODES {
        if !world.is_up(i) {
            world.start(i);
        }
    }
    log.line("every fault over: all nodes up, network healed".into());
    shared.faults_over.store(true, Ordering::Relaxed);
    settle(&pubs, &subs, &mut violations);
    // Connections given up at the last fault get their verdict.
    wait_until(TAKEOVER_WAIT + Duration::from_secs(1), || {
        shared.watchers.load(Ordering::Relaxed) == 0
    });
    shared.stop.store(true, Ordering::Relaxed);
    clients.shutdown_timeout(Duration::from_secs(2));
    world.stop();
    violations.extend(shared.violations.lock().unwrap().drain(..));
    let acked = verdict(&pubs, &subs, &mut violations);
    (violations, acked)
}

/// The persistent subscribers: v5 QoS 2 (Method B), v3.1.1 QoS 2 (Method A), v5 QoS 1, and
/// one that comes and goes (v5 QoS 2, Method B; the plan's times).
fn spawn_subscribers(
    clients: &tokio::runtime::Runtime,
    shared: &Arc<Shared>,
    seed: u64,
    plan: &Plan,
) -> Subs {
    let subs = [
        (Protocol::V5, QoS::ExactlyOnce, Method::B, None),
        (Protocol::V3_1_1, QoS::ExactlyOnce, Method::A, None),
        (Protocol::V5, QoS::AtLeastOnce, Method::B, None),
        (
            Protocol::V5,
            QoS::ExactlyOnce,
            Method::B,
            Some(plan.intermittent),
        ),
    ];
    subs.iter()
        .enumerate()
        .map(|(index, &(protocol, qos, method, intermittent))| {
            let state = Arc::new(Mutex::new(SubState::default()));
            let s = Subscriber {
                index,
                protocol,
                qos,
                method,
                intermittent,
                state: state.clone(),
            };
            clients.spawn(s.run(shared.clone(), seed));
            (index, qos, state)
        })
        .collect()
}

/// The publishers: v5 QoS 2, v3.1.1 QoS 2, v5 QoS 1.
fn spawn_publishers(
    clients: &tokio::runtime::Runtime,
    shared: &Arc<Shared>,
    seed: u64,
    plan: &Plan,
) -> Pubs {
    let pubs = [
        (Protocol::V5, QoS::ExactlyOnce),
        (Protocol::V3_1_1, QoS::ExactlyOnce),
        (Protocol::V5, QoS::AtLeastOnce),
    ];
    pubs.iter()
        .enumerate()
        .map(|(index, &(protocol, qos))| {
            let state = Arc::new(Mutex::new(PubState::default()));
            let p = Publisher {
                index,
                protocol,
                qos,
                tail: plan.msgs[index],
                pace_ms: plan.pace_ms,
                state: state.clone(),
            };
            clients.spawn(p.run(shared.clone(), seed));
            (index, qos, state)
        })
        .collect()
}

/// Waits for the publishers to finish (else an availability violation each), then for every
/// acknowledged message to reach every subscriber (or the drain times out: the checker says
/// which are missing).
fn settle(pubs: &Pubs, subs: &Subs, violations: &mut Vec<String>) {
    let finished = wait_until(SERVE_WAIT, || {
        pubs.iter().all(|(_, _, s)| s.lock().unwrap().done)
    });
    for (index, _, s) in pubs {
        let s = s.lock().unwrap();
        if !s.done {
            violations.push(format!(
                "availability: pub{index} did not finish within {}s of the last fault (sent {}, \
                 acknowledged {})",
                SERVE_WAIT.as_secs(),
                s.sent,
                s.acked.len()
            ));
        }
    }
    if !finished {
        return;
    }
    wait_until(DRAIN_WAIT, || {
        let views: Vec<_> = pubs.iter().map(|(_, _, s)| s.lock().unwrap()).collect();
        subs.iter().all(|(_, _, s)| {
            let s = s.lock().unwrap();
            views.iter().enumerate().all(|(p, v)| {
                v.acked.iter().all(|seq| {
                    s.delivered
                        .iter()
                        .any(|d| d.publisher == p && d.seq == *seq)
                })
            })
        })
    });
}

/// Runs the checker over what the clients saw; returns the messages acknowledged.
fn verdict(pubs: &Pubs, subs: &Subs, violations: &mut Vec<String>) -> u64 {
    let pub_guards: Vec<_> = pubs
        .iter()
        .map(|(i, q, s)| (*i, *q, s.lock().unwrap()))
        .collect();
    let sub_guards: Vec<_> = subs
        .iter()
        .map(|(i, q, s)| (*i, *q, s.lock().unwrap()))
        .collect();
    let pv: Vec<PubView<'_>> = pub_guards
        .iter()
        .map(|(index, qos, s)| PubView {
            index: *index,
            qos: *qos,
            state: s,
        })
        .collect();
    let sv: Vec<SubView<'_>> = sub_guards
        .iter()
        .map(|(index, qos, s)| SubView {
            index: *index,
            qos: *qos,
            state: s,
        })
        .collect();
    violations.extend(check::check(&pv, &sv));
    pv.iter().map(|p| p.state.acked.len() as u64).sum()
}

/// The node a fault aimed at `target` strikes: the leader, or another node that is up.
fn pick(world: &World, target: Target, rng: &mut SimRng) -> Option<usize> {
    let leader = world.leader();
    let up: Vec<usize> = (0..NODES).filter(|&i| world.is_up(i)).collect();
    match (target, leader) {
        (Target::Leader, Some(l)) => Some(l),
        _ => {
            let others: Vec<usize> = up.iter().copied().filter(|&i| Some(i) != leader).collect();
            if others.is_empty() {
                up.first().copied()
            } else {
                Some(*rng.pick(&others))
            }
        }
    }
}

fn strike(world: &mut World, fault: Fault, rng: &mut SimRng) {
    let leader = world.leader();
    world.log.line(format!(
        "FAULT {fault:?} (leader: {})",
        leader.map_or("none".into(), |l| id(l).to_string())
    ));
    match fault {
        Fault::Crash { target, down_ms } | Fault::PowerLoss { target, down_ms } => {
            let Some(i) = pick(world, target, rng) else {
                return;
            };
            world.kill(i, matches!(fault, Fault::PowerLoss { .. }));
            std::thread::sleep(Duration::from_millis(down_ms));
            world.start(i);
        }
        Fault::PowerLossAll { down_ms } => {
            for i in 0..NODES {
                world.kill(i, true);
            }
            std::thread::sleep(Duration::from_millis(down_ms));
            for i in 0..NODES {
                world.start(i);
            }
        }
        Fault::PartitionLeader { ms } => {
            let Some(l) = leader else { return };
            world.net.links.lock().unwrap().side.insert(id(l), 1);
            std::thread::sleep(Duration::from_millis(ms));
            world.net.links.lock().unwrap().side.clear();
            world.log.line("partition healed".into());
        }
        Fault::Pause { target, ms } => {
            let Some(i) = pick(world, target, rng) else {
                return;
            };
            world.net.links.lock().unwrap().paused.insert(id(i), true);
            std::thread::sleep(Duration::from_millis(ms));
            world.net.links.lock().unwrap().paused.clear();
            world.log.line(format!("node {} resumed", id(i)));
        }
    }
}
