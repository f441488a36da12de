//! One seed: the plan drawn from it, the broker's boots on the simulated disk, the faults,
//! and the checker.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tern_broker::{Broker, BrokerConfig, DurableConfig, DurableStore, StreamSpec};
use tern_store::sim::{FaultAction, ScriptedFault, SimConfig, SimDisk};
use tern_wire::Protocol;
use tokio::net::TcpListener;

use super::check::{self, Context};
use super::client::{Net, PubSpec, PubState, run_publisher};
use super::plan::{Fault, Features, Injected, plan};
use super::subscriber::{SubSpec, SubState, run_subscriber};

/// One broker "process": its own runtime, so that killing it drops every task it has
/// (connections, writers, timers, checkpointer) at once.
pub(super) struct Boot {
    rt: tokio::runtime::Runtime,
}

pub(super) fn boot(
    disk: &SimDisk,
    dir: &Path,
    config: &DurableConfig,
    net: &Net,
) -> Result<Boot, String> {
    // The old process's last references may take a moment to go (its store holds the lock).
    let started = Instant::now();
    let store = loop {
        match DurableStore::open_with_vfs(dir, config.clone(), disk.vfs()) {
            Ok(s) => break s,
            Err(e) if started.elapsed() > Duration::from_secs(5) => {
                return Err(format!("store does not open: {e}"));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let broker = {
        let _guard = rt.enter();
        Broker::with_store(BrokerConfig::default(), Arc::new(store)).map_err(|e| e.to_string())?
    };
    let listener = rt
        .block_on(TcpListener::bind("127.0.0.1:0"))
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    rt.spawn(async move {
        let _ = broker.serve(listener, std::future::pending::<()>()).await;
    });
    net.boot.store(disk.boot(), Ordering::Relaxed);
    *net.addr.lock() = Some(addr);
    Ok(Boot { rt })
}

/// Stops the process abruptly: no clean shutdown, no last checkpoint.
pub(super) fn kill(boot: Boot, net: &Net) {
    *net.addr.lock() = None;
    boot.rt.shutdown_timeout(Duration::from_secs(5));
}

/// The outcome of one seed.
pub struct Outcome {
    pub violations: Vec<String>,
    /// The plan, the faults as they happened and the disk's last events.
    pub log: String,
    pub elapsed: Duration,
}

/// Runs one seed; with `crash_only` every fault is a process crash (the draws stay the same);
/// with `linger` clients may reconnect to a broker whose disk died until it is killed.
/// The broker's injected bug (`injected.broker`) is set by the caller, process-wide.
pub fn run_seed(seed: u64, injected: Injected, crash_only: bool, linger: bool) -> Outcome {
    let started = Instant::now();
    let bugs = injected.store;
    let plan = plan(seed, crash_only, Features::from_env(injected.broker));
    let mut log = String::new();
    let _ = writeln!(log, "plan: {plan:#?}");
    let dir = tempfile::tempdir().expect("tempdir");
    let disk = SimDisk::new(
        dir.path(),
        seed,
        SimConfig {
            latency: (plan.latency_us > 0).then(|| Duration::from_micros(plan.latency_us)),
            metadata_order: plan.metadata_order,
            bugs,
            untraced_dirs: vec!["trash".into()],
            ..SimConfig::default()
        },
    );
    let mut spec = StreamSpec::default_stream();
    spec.store.block_size_bytes = plan.block_size;
    spec.store.sync = plan.sync;
    spec.store.limits.max_msgs = plan.max_msgs;
    let config = DurableConfig {
        streams: vec![spec],
        ..DurableConfig::default()
    };
    let net = Arc::new(Net {
        addr: Mutex::new(None),
        stop: AtomicBool::new(false),
        acks: AtomicU64::new(0),
        boot: AtomicU64::new(0),
        disk: disk.clone(),
        linger,
    });
    let clients = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("client runtime");
    let mut violations = Vec::new();
    let mut current = match boot(&disk, dir.path(), &config, &net) {
        Ok(b) => Some(b),
        Err(e) => {
            violations.push(format!("first boot: {e}"));
            None
        }
    };
    let subs: Vec<(SubSpec, Arc<Mutex<SubState>>)> = plan
        .subscribers
        .iter()
        .map(|s| (s.clone(), Arc::default()))
        .collect();
    let pubs: Vec<(PubSpec, Arc<Mutex<PubState>>)> = plan
        .publishers
        .iter()
        .map(|p| (p.clone(), Arc::default()))
        .collect();
    let mut tasks = Vec::new();
    for (spec, state) in &subs {
        tasks.push(clients.spawn(run_subscriber(spec.clone(), state.clone(), net.clone())));
    }
    // Every subscription is acknowledged (durable) before the first message is published.
    let all_subscribed = || subs.iter().all(|(_, s)| s.lock().subscribed);
    if !wait(Duration::from_secs(10), all_subscribed) {
        violations.push("subscribers got no SUBACK".into());
    }
    for (spec, state) in &pubs {
        tasks.push(clients.spawn(run_publisher(spec.clone(), state.clone(), net.clone())));
    }
    let pubs_done = || pubs.iter().all(|(p, s)| s.lock().done(p.limit));
    // Clean sessions and QoS 0 beside the persistent workload (`clean.rs`).
    let clean = super::clean::draw(seed).map(super::clean::Clean::new);
    if let Some(c) = &clean {
        let _ = writeln!(log, "clean sessions: {:?}", c.spec);
        tasks.extend(c.spawn(&clients, &net));
    }
    // Wills with a delay and session expiry (`timers.rs`), in one seed of ten each.
    let timers = super::timers::Timers::new(super::timers::draw(seed));
    if let Some(t) = &timers {
        let _ = writeln!(log, "timers: {:?}", t.spec);
        tasks.extend(t.spawn(&clients, &net));
    }
    for &(at, fault) in &plan.faults {
        if current.is_none() {
            break;
        }
        wait(Duration::from_secs(20), || {
            net.acks.load(Ordering::Relaxed) >= at || pubs_done()
        });
        let acks = net.acks.load(Ordering::Relaxed);
        strike(&disk, fault, &mut log);
        kill(current.take().expect("up"), &net);
        let _ = writeln!(
            log,
            "{fault:?} after {acks} acks (t={:?})",
            started.elapsed()
        );
        match boot(&disk, dir.path(), &config, &net) {
            Ok(b) => current = Some(b),
            Err(e) => violations.push(format!("restart after {fault:?}: {e}")),
        }
    }
    if let Some(t) = &timers {
        t.go();
    }
    // Let the workload finish: every message published and acknowledged, every subscriber
    // holding what it is owed with no QoS 2 exchange open.
    let mut finished = false;
    if current.is_some() {
        finished = wait(Duration::from_secs(30), pubs_done);
        if !finished {
            violations.push("publishers did not finish (stalled)".into());
        }
        settle(&pubs, &subs, plan.max_msgs.is_some());
        if let Some(c) = &clean {
            wait(Duration::from_secs(3), || c.settled());
        }
        if let Some(t) = &timers {
            wait(Duration::from_secs(6), || t.settled());
            t.end(&net);
        }
        for (p, st) in pubs.iter().filter(|(p, _)| p.retain) {
            let (acked, next) = {
                let st = st.lock();
                (st.acked.last().copied(), st.next)
            };
            if let Err(v) = clients.block_on(check_retained(&net, p, acked, next)) {
                violations.push(v);
            }
        }
    }
    net.stop.store(true, Ordering::Relaxed);
    if let Some(b) = current.take() {
        kill(b, &net);
    }
    for t in tasks {
        let _ = clients.block_on(t);
    }
    clients.shutdown_timeout(Duration::from_secs(2));
    let ctx = Context {
        retention: plan.max_msgs.is_some(),
        finished,
    };
    check::check(&pubs, &subs, &ctx, &mut violations);
    if let Some(c) = &clean {
        c.check(&mut violations);
        let _ = writeln!(log, "{}", c.summary());
    }
    if let Some(t) = &timers {
        t.check(plan.max_msgs.is_some(), &mut violations);
        let _ = writeln!(log, "{}", t.summary());
    }
    for (p, st) in &pubs {
        let st = st.lock();
        let _ = writeln!(
            log,
            "{}: connections to boots {:?}, reconnects without its session {}",
            p.client_id(),
            st.boots,
            st.sessions_lost
        );
    }
    for (s, st) in &subs {
        let st = st.lock();
        if s.share.is_some() || !st.received.is_empty() {
            let _ = writeln!(log, "{}: {}", s.client_id(), st.trace.join(" "));
        }
    }
    for e in disk.events() {
        let _ = writeln!(log, "disk: {e}");
    }
    Outcome {
        violations,
        log,
        elapsed: started.elapsed(),
    }
}

/// Makes `fault` happen to the disk (the caller then kills the broker).
fn strike(disk: &SimDisk, fault: Fault, log: &mut String) {
    let scripted = |op, path: &str, nth, action| {
        disk.update_config(|c| {
            c.faults.push(ScriptedFault {
                op,
                path_contains: path.into(),
                nth,
                action,
            })
        })
    };
    // Disarms the last scripted fault, so that it cannot strike a later boot unnoticed.
    let disarm = || {
        disk.update_config(|c| {
            if let Some(f) = c.faults.last_mut() {
                f.nth = u64::MAX;
            }
        })
    };
    match fault {
        Fault::PowerLoss => disk.power_loss(),
        Fault::Crash => disk.crash(),
        Fault::PowerLossIn(op, path, nth) => {
            let before = disk.power_losses();
            scripted(op, path, nth, FaultAction::PowerLoss);
            // The workload may be over and the disk idle: then the power fails anyway.
            if !wait(Duration::from_secs(2), || disk.power_losses() > before) {
                let _ = writeln!(log, "{fault:?} did not strike: power loss instead");
                disarm();
                disk.power_loss();
            }
        }
        Fault::EioIn(op, path, nth) => {
            let errors = || {
                let s = disk.stats();
                s.write_errors + s.sync_errors
            };
            let before = errors();
            scripted(op, path, nth, FaultAction::Eio);
            if wait(Duration::from_secs(2), || errors() > before) {
                // The broker runs on with the failed write; its clients see what it acks.
                std::thread::sleep(Duration::from_millis(50));
            } else {
                let _ = writeln!(log, "{fault:?} did not strike");
                disarm();
            }
            disk.power_loss();
        }
    }
}

/// The retained value of `p`'s topic, read by a new clean-start client, is the last message
/// acknowledged or a later one sent (`acked..next`): never an older one, never none.
async fn check_retained(
    net: &Net,
    p: &PubSpec,
    acked: Option<u64>,
    next: u64,
) -> Result<(), String> {
    use super::client::{Conn, clean_connect, parse, s};
    use tern_wire::{Packet, Properties, QoS, Subscribe, SubscriptionOptions};
    let Some(last) = acked else {
        return Ok(());
    };
    let who = format!(
        "{} (retained, {:?}, QoS {})",
        p.client_id(),
        p.protocol,
        p.qos
    );
    let Some(mut c) = Conn::connect(net, clean_connect(Protocol::V5, "sim-retained")).await else {
        return Err(format!("{who}: the retained check could not connect"));
    };
    let sub = Subscribe {
        packet_id: 1,
        properties: Properties::default(),
        filters: vec![(
            s(&p.topic),
            SubscriptionOptions {
                qos: QoS::AtMostOnce,
                ..SubscriptionOptions::default()
            },
        )],
    };
    if !c.send(&Packet::Subscribe(sub)).await {
        return Err(format!("{who}: the retained check could not subscribe"));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while tokio::time::Instant::now() < deadline {
        match c.recv(Duration::from_millis(50)).await {
            Ok(Some(Packet::Publish(m))) if m.retain => {
                return match parse(&m.payload) {
                    Some((_, n)) if n >= last && n < next => Ok(()),
                    got => Err(format!(
                        "{who}: retained value {got:?}, the last acknowledged is {last} (sent up to {})",
                        next - 1
                    )),
                };
            }
            Err(()) => break,
            _ => {}
        }
    }
    Err(format!(
        "{who}: no retained value, the last acknowledged is {last}"
    ))
}

/// Waits (5 s at most) until every receiver holds what it is owed with no QoS 2 exchange
/// open; under a retention limit, which may have removed some of it, until no exchange is
/// open and nothing arrived for 300 ms. With a share group, complete must also hold with
/// nothing arriving for [`GROUP_QUIET_MS`]: a group message one member got at QoS 1 may
/// still be on its way to another (given back by a member that left before handling it),
/// and an exchange that starts after the run stops would count as never released (campaign
/// 6, seed 565: finding 9 in docs/simulation.md).
fn settle(pubs: &check::Pubs, subs: &check::Subs, retention: bool) {
    let receivers = check::receivers(subs);
    let expected = check::expected(pubs, &receivers);
    let groups = receivers.iter().any(|r| r.group);
    let mut last = (usize::MAX, Instant::now());
    let mut quiet = (usize::MAX, Instant::now());
    wait(Duration::from_secs(5), || {
        if check::complete(subs, &receivers, &expected) {
            if !groups {
                return true;
            }
            let seen: usize = subs.iter().map(|(_, s)| s.lock().seen.len()).sum();
            if seen != quiet.0 {
                quiet = (seen, Instant::now());
            }
            if quiet.1.elapsed() > Duration::from_millis(GROUP_QUIET_MS) {
                return true;
            }
        } else {
            quiet.0 = usize::MAX;
        }
        if !retention {
            return false;
        }
        let got: usize = subs.iter().map(|(_, s)| s.lock().got.len()).sum();
        let open = subs.iter().any(|(_, s)| !s.lock().received.is_empty());
        if got != last.0 || open {
            last = (got, Instant::now());
        }
        last.1.elapsed() > Duration::from_millis(300)
    });
}

/// How long a run with a share group must stay complete, with nothing arriving, to end.
const GROUP_QUIET_MS: u64 = 100;

fn wait(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    f()
}
