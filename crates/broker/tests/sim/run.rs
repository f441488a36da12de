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
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tern_broker::{BrokerConfig, DurableConfig, StreamSpec};
use tern_store::sim::{FaultAction, ScriptedFault, SimConfig, SimDisk};

use super::bounds::Gauges;
use super::check::{self, Context};
use super::client::{BROKER_HOST, Endpoint, Net};
use super::host::{broker_software, writer_threads};
use super::plan::{Fault, Features, Injected, Plan, plan};
use super::publisher::{PubSpec, PubState, run_publisher};
use super::settle::{check_retained, settle};
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

/// The simulation and the controller's view of it.
pub(super) struct Run<'a> {
    sim: turmoil::Sim<'a>,
    net: Arc<Net>,
    /// The store's clock: [`EPOCH_NS`] plus the virtual time, set before every step.
    clock_ns: Arc<AtomicU64>,
    /// The broker host failed (its store did not open): the error, once.
    failed: Option<String>,
    /// The resource bounds' gauges, read after every step.
    gauges: Arc<Gauges>,
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
            self.gauges.sample(self.net.acks.load(Ordering::Relaxed));
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

/// One seed's simulation: its plan, disk, network, turmoil run, log and violations.
struct SeedRun {
    plan: Plan,
    disk: SimDisk,
    /// The directory the disk is mounted at (removed with the run).
    _dir: tempfile::TempDir,
    net: Arc<Net>,
    run: Run<'static>,
    log: String,
    violations: Vec<String>,
}

/// The seed's clients and what they saw.
struct Clients {
    subs: Vec<(SubSpec, Arc<Mutex<SubState>>)>,
    pubs: Vec<(PubSpec, Arc<Mutex<PubState>>)>,
    clean: Option<super::clean::Clean>,
    timers: Option<super::timers::Timers>,
}

impl Clients {
    fn pubs_done(&self) -> bool {
        self.pubs.iter().all(|(p, s)| s.lock().done(p.limit))
    }
}

/// Runs one seed; with `crash_only` every fault is a process crash (the draws stay the same);
/// with `linger` clients may reconnect to a broker whose disk died until it is killed.
/// The broker's injected bug (`injected.broker`) is set by the caller, process-wide.
pub fn run_seed(seed: u64, injected: Injected, crash_only: bool, linger: bool) -> Outcome {
    let started = Instant::now();
    let mut s = SeedRun::new(seed, injected, crash_only, linger);
    if !s.step_until_up() {
        let failed = s.run.failed.take();
        s.violations.push(format!("first boot: {failed:?}"));
    }
    let clients = s.start_clients(seed);
    let alive = s.run.failed.is_none() && s.strike_faults(&clients);
    if let Some(t) = &clients.timers {
        t.go();
    }
    let finished = alive && s.finish(&clients);
    s.stop_clients(&clients);
    let digest = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (s.disk.trace_digest(), s.net.events_digest()).hash(&mut h);
        h.finish()
    };
    let (violations, log) = s.check(&clients, finished);
    Outcome {
        violations,
        log,
        elapsed: started.elapsed(),
        digest,
    }
}

/// Runs `seed` without letting the workload finish: the clients are stopped right after the
/// faults, while the publishers still publish and the broker still feeds the subscribers.
/// Returns the QoS 2 exchanges left open at a subscriber (client id, packet ids): the stop
/// itself must leave none (finding 9 in docs/simulation.md, the checker's).
pub fn stop_mid_flow(seed: u64) -> Vec<(String, Vec<u16>)> {
    let injected = super::plan::bugs(None).expect("no bug");
    let mut s = SeedRun::new(seed, injected, false, false);
    assert!(s.step_until_up(), "seed {seed}: the broker did not start");
    let clients = s.start_clients(seed);
    assert!(s.strike_faults(&clients), "seed {seed}: a restart failed");
    s.run
        .step_until(Duration::from_secs(30), |_| clients.pubs_done());
    s.stop_clients(&clients);
    clients
        .subs
        .iter()
        .filter_map(|(spec, st)| {
            let open: Vec<u16> = st.lock().received.keys().copied().collect();
            (!open.is_empty()).then(|| (spec.client_id(), open))
        })
        .collect()
}

impl SeedRun {
    fn new(seed: u64, injected: Injected, crash_only: bool, linger: bool) -> SeedRun {
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
                bugs: injected.store,
                stepped_writers: !writer_threads(),
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
            max_disk_bytes: plan.disk_budget,
            ..DurableConfig::default()
        };
        let mut broker_config = BrokerConfig::default();
        if let Some(cap) = plan.memory_cap {
            broker_config.max_queued_bytes_total = cap;
            // It may not exceed the total (`BrokerConfig::validate`).
            broker_config.max_queued_bytes = broker_config.max_queued_bytes.min(cap);
        }
        let gauges = Arc::new(Gauges::new(&plan));
        let net = Arc::new(Net::new(
            Endpoint::Sim(AtomicBool::new(false)),
            &disk,
            linger,
        ));
        let counter = gauges.clone();
        *net.refusals.lock() = Some(Box::new(move || counter.refusals()));
        let mut sim = turmoil::Builder::new()
            .rng_seed(seed)
            .tick_duration(TICK)
            .simulation_duration(SIM_LIMIT)
            .min_message_latency(Duration::ZERO)
            .max_message_latency(TICK)
            .build();
        let software = broker_software(
            disk.clone(),
            dir.path().to_owned(),
            config,
            net.clone(),
            disk_tick,
            (broker_config, gauges.clone()),
        );
        sim.host(BROKER_HOST, software);
        let run = Run {
            sim,
            net: net.clone(),
            clock_ns,
            failed: None,
            gauges,
        };
        SeedRun {
            plan,
            disk,
            _dir: dir,
            net,
            run,
            log,
            violations: Vec::new(),
        }
    }

    /// Steps until the broker host listens (10 s at most).
    fn step_until_up(&mut self) -> bool {
        let net = self.net.clone();
        self.run
            .step_until(Duration::from_secs(10), |_| match &net.endpoint {
                Endpoint::Sim(up) => up.load(Ordering::Relaxed),
                Endpoint::Tcp(_) => false,
            })
    }

    /// Starts the subscribers, waits for their SUBACKs, then the publishers and the side
    /// parts (clean sessions, timers).
    fn start_clients(&mut self, seed: u64) -> Clients {
        let net = self.net.clone();
        let subs: Vec<(SubSpec, Arc<Mutex<SubState>>)> = self
            .plan
            .subscribers
            .iter()
            .map(|s| (s.clone(), Arc::default()))
            .collect();
        let pubs: Vec<(PubSpec, Arc<Mutex<PubState>>)> = self
            .plan
            .publishers
            .iter()
            .map(|p| (p.clone(), Arc::default()))
            .collect();
        for (spec, state) in &subs {
            let task = run_subscriber(spec.clone(), state.clone(), net.clone());
            self.run.client(&spec.client_id(), Box::pin(task));
        }
        // Every subscription is acknowledged (durable) before the first message is published.
        let all_subscribed = |_| subs.iter().all(|(_, s)| s.lock().subscribed);
        if !self.run.step_until(Duration::from_secs(10), all_subscribed) {
            self.violations.push("subscribers got no SUBACK".into());
        }
        for (spec, state) in &pubs {
            let task = run_publisher(spec.clone(), state.clone(), net.clone());
            self.run.client(&spec.client_id(), Box::pin(task));
        }
        // Clean sessions and QoS 0 beside the persistent workload (`clean.rs`).
        let clean = super::clean::draw(seed).map(super::clean::Clean::new);
        if let Some(c) = &clean {
            let _ = writeln!(self.log, "clean sessions: {:?}", c.spec);
            for (name, task) in c.tasks(&net) {
                self.run.client(name, task);
            }
        }
        // Wills with a delay and session expiry (`timers.rs`).
        let timers = super::timers::Timers::new(super::timers::draw(seed));
        if let Some(t) = &timers {
            let _ = writeln!(self.log, "timers: {:?}", t.spec);
            for (name, task) in t.tasks(&net) {
                self.run.client(name, task);
            }
        }
        Clients {
            subs,
            pubs,
            clean,
            timers,
        }
    }

    /// Strikes the plan's faults, each once its count of acknowledged messages is reached,
    /// and restarts the broker after each; false if a restart failed.
    fn strike_faults(&mut self, clients: &Clients) -> bool {
        let net = self.net.clone();
        let faults = self.plan.faults.clone();
        for (at, fault) in faults {
            let gauges = self.run.gauges.clone();
            self.run.step_until(Duration::from_secs(20), |_| {
                net.acks.load(Ordering::Relaxed) >= at
                    || clients.pubs_done()
                    || gauges.stalled_at_bound()
            });
            let acks = net.acks.load(Ordering::Relaxed);
            strike(&mut self.run, &self.disk, fault, &mut self.log);
            self.run.restart();
            let _ = writeln!(
                self.log,
                "{fault:?} after {acks} acks (t={:?})",
                self.run.now()
            );
            if !self.step_until_up() {
                let failed = self.run.failed.take();
                self.violations
                    .push(format!("restart after {fault:?}: {failed:?}"));
                return false;
            }
        }
        true
    }

    /// Lets the workload finish: every message published and acknowledged, every subscriber
    /// holding what it is owed with no QoS 2 exchange open; then the retained checks.
    /// Returns whether the publishers finished.
    fn finish(&mut self, clients: &Clients) -> bool {
        let gauges = self.run.gauges.clone();
        self.run.step_until(Duration::from_secs(30), |_| {
            clients.pubs_done() || gauges.stalled_at_bound()
        });
        let finished = clients.pubs_done();
        if !finished && gauges.stalled_at_bound() {
            // Documented: nothing is accepted while a bound holds (but see `note_stall`).
            gauges.note_stall();
            let _ = writeln!(self.log, "bounds: publishers stalled at a bound");
        } else if !finished {
            self.violations
                .push("publishers did not finish (stalled)".into());
        }
        let retention = self.plan.max_msgs.is_some();
        settle(&mut self.run, &clients.pubs, &clients.subs, retention);
        if let Some(c) = &clients.clean {
            self.run.step_until(Duration::from_secs(3), |_| c.settled());
        }
        if let Some(t) = &clients.timers {
            self.run.step_until(Duration::from_secs(6), |_| t.settled());
            t.end(&self.net);
        }
        for (p, st) in clients.pubs.iter().filter(|(p, _)| p.retain) {
            let (acked, next) = {
                let st = st.lock();
                (st.acked.last().copied(), st.next)
            };
            let result: Arc<Mutex<Option<Result<(), String>>>> = Arc::default();
            let (n, p2, r) = (self.net.clone(), p.clone(), result.clone());
            self.run.client(
                &format!("retained-{}", p.index),
                Box::pin(async move {
                    let out = check_retained(&n, &p2, acked, next).await;
                    *r.lock() = Some(out);
                }),
            );
            self.run
                .step_until(Duration::from_secs(10), |_| result.lock().is_some());
            match result.lock().take() {
                Some(Ok(())) => {}
                Some(Err(v)) => self.violations.push(v),
                None => self
                    .violations
                    .push(format!("{}: the retained check did not end", p.client_id())),
            }
        }
        finished
    }

    /// Stops the clients at a step boundary where no subscriber holds an open QoS 2
    /// exchange: one that started after the run was complete (a share group passing a
    /// message on while its members come and go) finishes first; one the broker forgot
    /// stays open until the timeout and is reported (finding 9 in docs/simulation.md).
    /// The broker may still be feeding a subscriber then (a backlog it drains at its
    /// Receive Maximum): a subscriber takes no delivery that comes after the stop, and
    /// leaves only once what it holds open is closed (`run_subscriber`), which is waited
    /// for here: a stopped client abandons no exchange (finding 9, the checker's).
    fn stop_clients(&mut self, clients: &Clients) {
        let net = self.net.clone();
        let idle = || {
            clients
                .subs
                .iter()
                .all(|(_, s)| s.lock().received.is_empty())
        };
        self.run.step_until(Duration::from_secs(5), |_| {
            let idle = idle();
            if idle {
                net.stop.store(true, Ordering::Relaxed);
            }
            idle
        });
        net.stop.store(true, Ordering::Relaxed);
        self.run.step_until(Duration::from_secs(5), |_| idle());
        // Every client sees the stop within a poll interval or a reconnect back-off.
        self.run.step_for(Duration::from_millis(100));
    }

    /// Ends the simulation (the broker and its store go), checks what the clients saw and
    /// completes the log: (violations, log).
    fn check(self, clients: &Clients, finished: bool) -> (Vec<String>, String) {
        let SeedRun {
            plan,
            disk,
            run,
            mut log,
            mut violations,
            ..
        } = self;
        let gauges = run.gauges.clone();
        drop(run);
        gauges.check(&plan, &mut violations, &mut log);
        let ctx = Context {
            retention: plan.max_msgs.is_some(),
            queue_drops: gauges.queue_limit_dropped(),
            finished,
        };
        check::check(&clients.pubs, &clients.subs, &ctx, &mut violations);
        if let Some(c) = &clients.clean {
            c.check(&mut violations);
            let _ = writeln!(log, "{}", c.summary());
        }
        if let Some(t) = &clients.timers {
            t.check(plan.max_msgs.is_some(), &mut violations);
            let _ = writeln!(log, "{}", t.summary());
        }
        let traces = std::env::var_os("TERN_SIM_TRACE").is_some();
        for (p, st) in &clients.pubs {
            let st = st.lock();
            let _ = writeln!(
                log,
                "{}: connections to boots {:?}, reconnects without its session {}",
                p.client_id(),
                st.boots,
                st.sessions_lost
            );
            if traces {
                let _ = writeln!(log, "{}: {}", p.client_id(), st.trace.join(" "));
            }
        }
        for (s, st) in &clients.subs {
            let st = st.lock();
            let reused = !st.open_ids.violations.is_empty();
            if traces
                || s.share.is_some()
                || s.offline.is_some()
                || !st.received.is_empty()
                || reused
            {
                let _ = writeln!(log, "{}: {}", s.client_id(), st.trace.join(" "));
            }
        }
        for e in disk.events() {
            let _ = writeln!(log, "disk: {e}");
        }
        (violations, log)
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
