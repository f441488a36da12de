//! One seed: the plan drawn from it, the broker's boots on the simulated disk, the faults,
//! and the checker, in one turmoil simulation: the broker is the host [`BROKER_HOST`], every
//! client a turmoil client of its own, the network turmoil's and the clock virtual (1 ms a
//! step, [`TICK`]). The controller is the step loop: it steps until a condition holds (so
//! many messages acknowledged, every subscriber subscribed), then strikes a fault. The store
//! has no threads (`SimConfig::stepped_writers`): the broker host's disk task runs one writer
//! turn per stream every disk tick, and the store's clock is the simulation's. Everything
//! runs on the seed's thread, in an order the seed decides: a seed is one execution.

use std::fmt::Write as _;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tern_broker::transport::{ConnectionInfo, ListenerContext, StreamTransport, TransportKind};
use tern_broker::{Broker, BrokerConfig, DurableConfig, DurableStore, StreamSpec};
use tern_store::sim::{FaultAction, ScriptedFault, SimConfig, SimDisk};
use tern_wire::Protocol;

use super::check::{self, Context};
use super::client::{BROKER_HOST, BROKER_PORT, Endpoint, Net, PubSpec, PubState, run_publisher};
use super::plan::{Fault, Features, Injected, plan};
use super::subscriber::{SubSpec, SubState, run_subscriber};

/// Virtual time per simulation step.
const TICK: Duration = Duration::from_millis(1);
/// The disk task's period without latency: a commit takes at least this long.
const DISK_TICK: Duration = Duration::from_millis(1);
/// Virtual time a seed may take at most (turmoil fails the step past it).
const SIM_LIMIT: Duration = Duration::from_secs(600);

/// The wall clock of the simulated world at its start (ns since the Unix epoch,
/// 2026-01-01): the store's and the broker's record times read it plus the virtual time.
const EPOCH_NS: u64 = 1_767_225_600 * 1_000_000_000;

/// A client's software.
pub(super) type Task = Pin<Box<dyn Future<Output = ()>>>;

/// The broker host's software: opens the store on the disk (recovery), starts the broker,
/// and serves every turmoil connection through the stream transport. Called again by
/// turmoil on every restart (bounce).
/// `disk_tick`: how often the disk task steps the store's writers (a commit takes that
/// long in virtual time).
fn broker_software(
    disk: SimDisk,
    dir: PathBuf,
    config: DurableConfig,
    net: Arc<Net>,
    disk_tick: Duration,
) -> impl Fn() -> Pin<Box<dyn Future<Output = turmoil::Result>>> {
    move || {
        let (disk, dir, config, net) = (disk.clone(), dir.clone(), config.clone(), net.clone());
        Box::pin(async move {
            let store = Arc::new(open_store(&disk, &dir, &config)?);
            // The disk task: one writer turn per stream with work, every disk tick. It runs
            // on the broker host, so a crash stops it with everything else.
            let writers = store.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(disk_tick).await;
                    writers.step_writers();
                }
            });
            let broker =
                Broker::with_store(BrokerConfig::default(), store).map_err(|e| e.to_string())?;
            let listener = turmoil::net::TcpListener::bind(("0.0.0.0", BROKER_PORT)).await?;
            // The sender stays alive as long as the host: a crash, not a shutdown, ends it.
            let (_stop_tx, stop) = tokio::sync::watch::channel(false);
            let _background = broker.start_background(stop.clone());
            let context = Arc::new(ListenerContext::new(0, "sim", TransportKind::Memory));
            net.boot.store(disk.boot(), Ordering::Relaxed);
            if let Endpoint::Sim(up) = &net.endpoint {
                up.store(true, Ordering::Relaxed);
            }
            loop {
                let (stream, peer) = listener.accept().await?;
                let broker = broker.clone();
                let info = ConnectionInfo::new(context.clone(), peer);
                let stop = stop.clone();
                tokio::spawn(async move {
                    let transport = StreamTransport::new(stream);
                    broker.run_connection(transport, info, stop).await;
                });
            }
        })
    }
}

fn open_store(disk: &SimDisk, dir: &Path, config: &DurableConfig) -> Result<DurableStore, String> {
    // With stepped writers the old process's store is gone once its host crashed: no thread
    // of it holds the lock.
    DurableStore::open_with_vfs(dir, config.clone(), disk.vfs())
        .map_err(|e| format!("store does not open: {e}"))
}

/// The simulation and the controller's view of it.
pub(super) struct Run<'a> {
    sim: turmoil::Sim<'a>,
    net: Arc<Net>,
    /// The store's clock: [`EPOCH_NS`] plus the virtual time, set before every step.
    clock_ns: Arc<AtomicU64>,
    /// The broker host failed (its store did not open): the error, once.
    failed: Option<String>,
}

impl Run<'_> {
    /// Starts `task` as a turmoil client named `name`.
    pub(super) fn client(&mut self, name: &str, task: Task) {
        self.sim.client(name, async move {
            task.await;
            Ok(())
        });
    }

    /// Virtual time since the start.
    pub(super) fn now(&self) -> Duration {
        self.sim.elapsed()
    }

    /// Steps until `f(now)` holds or `timeout` of virtual time passed; whether it held.
    pub(super) fn step_until(
        &mut self,
        timeout: Duration,
        mut f: impl FnMut(Duration) -> bool,
    ) -> bool {
        let deadline = self.sim.elapsed() + timeout;
        loop {
            if f(self.sim.elapsed()) {
                return true;
            }
            if self.sim.elapsed() >= deadline {
                return false;
            }
            self.clock_ns.store(
                EPOCH_NS + self.sim.elapsed().as_nanos() as u64,
                Ordering::Relaxed,
            );
            if let Err(e) = self.sim.step() {
                self.failed.get_or_insert_with(|| e.to_string());
            }
        }
    }

    /// Steps for `d` of virtual time.
    pub(super) fn step_for(&mut self, d: Duration) {
        self.step_until(d, |_| false);
    }

    fn set_up(&self, up: bool) {
        if let Endpoint::Sim(flag) = &self.net.endpoint {
            flag.store(up, Ordering::Relaxed);
        }
    }

    /// Kills the broker process abruptly (no clean shutdown, no last checkpoint) and starts
    /// it again on what the disk kept.
    fn restart(&mut self) {
        self.set_up(false);
        self.sim.crash(BROKER_HOST);
        self.sim.bounce(BROKER_HOST);
    }
}

/// The outcome of one seed.
pub struct Outcome {
    pub violations: Vec<String>,
    /// The plan, the faults as they happened and the disk's last events.
    pub log: String,
    pub elapsed: Duration,
    /// The disk's trace digest and the clients' event digest: equal for equal runs.
    pub digest: u64,
}

/// Runs one seed; with `crash_only` every fault is a process crash (the draws stay the same);
/// with `linger` clients may reconnect to a broker whose disk died until it is killed.
/// The broker's injected bug (`injected.broker`) is set by the caller, process-wide.
pub fn run_seed(seed: u64, injected: Injected, crash_only: bool, linger: bool) -> Outcome {
    let started = Instant::now();
    let bugs = injected.store;
    let plan = plan(seed, crash_only, Features::from_env());
    let mut log = String::new();
    let _ = writeln!(log, "plan: {plan:#?}");
    let dir = tempfile::tempdir().expect("tempdir");
    let disk = SimDisk::new(
        dir.path(),
        seed,
        SimConfig {
            // No real sleeps: the plan's latency lengthens the disk tick instead.
            latency: None,
            metadata_order: plan.metadata_order,
            bugs,
            stepped_writers: true,
            ..SimConfig::default()
        },
    );
    let clock_ns = Arc::new(AtomicU64::new(EPOCH_NS));
    let clock = clock_ns.clone();
    disk.set_clock(Arc::new(move || clock.load(Ordering::Relaxed)));
    let disk_tick = DISK_TICK + Duration::from_micros(plan.latency_us);
    let mut spec = StreamSpec::default_stream();
    spec.store.block_size_bytes = plan.block_size;
    spec.store.sync = plan.sync;
    spec.store.limits.max_msgs = plan.max_msgs;
    let config = DurableConfig {
        streams: vec![spec],
        ..DurableConfig::default()
    };
    let net = Arc::new(Net::new(
        Endpoint::Sim(AtomicBool::new(false)),
        &disk,
        linger,
    ));
    let mut sim = turmoil::Builder::new()
        .rng_seed(seed)
        .tick_duration(TICK)
        .simulation_duration(SIM_LIMIT)
        .min_message_latency(Duration::ZERO)
        .max_message_latency(TICK)
        .build();
    sim.host(
        BROKER_HOST,
        broker_software(
            disk.clone(),
            dir.path().to_owned(),
            config,
            net.clone(),
            disk_tick,
        ),
    );
    let mut run = Run {
        sim,
        net: net.clone(),
        clock_ns,
        failed: None,
    };
    let mut violations = Vec::new();
    let up = |net: &Net| match &net.endpoint {
        Endpoint::Sim(up) => up.load(Ordering::Relaxed),
        Endpoint::Tcp(_) => false,
    };
    if !run.step_until(Duration::from_secs(10), |_| up(&net)) {
        violations.push(format!("first boot: {:?}", run.failed.take()));
    }
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
    for (spec, state) in &subs {
        let task = run_subscriber(spec.clone(), state.clone(), net.clone());
        run.client(&spec.client_id(), Box::pin(task));
    }
    // Every subscription is acknowledged (durable) before the first message is published.
    let all_subscribed = |_| subs.iter().all(|(_, s)| s.lock().subscribed);
    if !run.step_until(Duration::from_secs(10), all_subscribed) {
        violations.push("subscribers got no SUBACK".into());
    }
    for (spec, state) in &pubs {
        let task = run_publisher(spec.clone(), state.clone(), net.clone());
        run.client(&spec.client_id(), Box::pin(task));
    }
    let pubs_done = || pubs.iter().all(|(p, s)| s.lock().done(p.limit));
    // Clean sessions and QoS 0 beside the persistent workload (`clean.rs`).
    let clean = super::clean::draw(seed).map(super::clean::Clean::new);
    if let Some(c) = &clean {
        let _ = writeln!(log, "clean sessions: {:?}", c.spec);
        for (name, task) in c.tasks(&net) {
            run.client(name, task);
        }
    }
    // Wills with a delay and session expiry (`timers.rs`), in one seed of ten each.
    let timers = super::timers::Timers::new(super::timers::draw(seed));
    if let Some(t) = &timers {
        let _ = writeln!(log, "timers: {:?}", t.spec);
        for (name, task) in t.tasks(&net) {
            run.client(name, task);
        }
    }
    let mut alive = run.failed.is_none();
    for &(at, fault) in &plan.faults {
        if !alive {
            break;
        }
        run.step_until(Duration::from_secs(20), |_| {
            net.acks.load(Ordering::Relaxed) >= at || pubs_done()
        });
        let acks = net.acks.load(Ordering::Relaxed);
        strike(&mut run, &disk, fault, &mut log);
        run.restart();
        let _ = writeln!(log, "{fault:?} after {acks} acks (t={:?})", run.now());
        if !run.step_until(Duration::from_secs(10), |_| up(&net)) {
            violations.push(format!("restart after {fault:?}: {:?}", run.failed.take()));
            alive = false;
        }
    }
    if let Some(t) = &timers {
        t.go();
    }
    // Let the workload finish: every message published and acknowledged, every subscriber
    // holding what it is owed with no QoS 2 exchange open.
    let mut finished = false;
    if alive {
        finished = run.step_until(Duration::from_secs(30), |_| pubs_done());
        if !finished {
            violations.push("publishers did not finish (stalled)".into());
        }
        settle(&mut run, &pubs, &subs, plan.max_msgs.is_some());
        if let Some(c) = &clean {
            run.step_until(Duration::from_secs(3), |_| c.settled());
        }
        if let Some(t) = &timers {
            run.step_until(Duration::from_secs(6), |_| t.settled());
            t.end(&net);
        }
        for (p, st) in pubs.iter().filter(|(p, _)| p.retain) {
            let (acked, next) = {
                let st = st.lock();
                (st.acked.last().copied(), st.next)
            };
            let result: Arc<Mutex<Option<Result<(), String>>>> = Arc::default();
            let (n, p2, r) = (net.clone(), p.clone(), result.clone());
            run.client(
                &format!("retained-{}", p.index),
                Box::pin(async move {
                    let out = check_retained(&n, &p2, acked, next).await;
                    *r.lock() = Some(out);
                }),
            );
            run.step_until(Duration::from_secs(10), |_| result.lock().is_some());
            match result.lock().take() {
                Some(Ok(())) => {}
                Some(Err(v)) => violations.push(v),
                None => {
                    violations.push(format!("{}: the retained check did not end", p.client_id()))
                }
            }
        }
    }
    // The clients stop at a step boundary where no subscriber holds an open QoS 2 exchange:
    // one that started after the run was complete (a share group passing a message on while
    // its members come and go) finishes first; one the broker forgot stays open until the
    // timeout and is reported (finding 9 in docs/simulation.md).
    run.step_until(Duration::from_secs(5), |_| {
        let idle = subs.iter().all(|(_, s)| s.lock().received.is_empty());
        if idle {
            net.stop.store(true, Ordering::Relaxed);
        }
        idle
    });
    net.stop.store(true, Ordering::Relaxed);
    // Every client sees the stop within a poll interval or a reconnect back-off.
    run.step_for(Duration::from_millis(100));
    let digest = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (disk.trace_digest(), net.events_digest()).hash(&mut h);
        h.finish()
    };
    drop(run);
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
        digest,
    }
}

/// Makes `fault` happen to the disk (the caller then kills the broker).
fn strike(run: &mut Run, disk: &SimDisk, fault: Fault, log: &mut String) {
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
            if !run.step_until(Duration::from_secs(2), |_| disk.power_losses() > before) {
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
            if run.step_until(Duration::from_secs(2), |_| errors() > before) {
                // The broker runs on with the failed write; its clients see what it acks.
                run.step_for(Duration::from_millis(50));
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
    net: &Arc<Net>,
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
fn settle(run: &mut Run, pubs: &check::Pubs, subs: &check::Subs, retention: bool) {
    let receivers = check::receivers(subs);
    let expected = check::expected(pubs, &receivers);
    let groups = receivers.iter().any(|r| r.group);
    let mut last = (usize::MAX, run.now());
    let mut quiet = (usize::MAX, run.now());
    run.step_until(Duration::from_secs(5), |now| {
        if check::complete(subs, &receivers, &expected) {
            if !groups {
                return true;
            }
            let seen: usize = subs.iter().map(|(_, s)| s.lock().seen.len()).sum();
            if seen != quiet.0 {
                quiet = (seen, now);
            }
            if now - quiet.1 > Duration::from_millis(GROUP_QUIET_MS) {
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
            last = (got, now);
        }
        now - last.1 > Duration::from_millis(300)
    });
}

/// How long a run with a share group must stay complete, with nothing arriving, to end.
const GROUP_QUIET_MS: u64 = 100;
