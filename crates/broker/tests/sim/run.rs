//! One seed: the plan drawn from it, the broker's boots on the simulated disk, the faults,
//! and the checker.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tern_broker::inject::Bug as InjectBug;
use tern_broker::{Broker, BrokerConfig, DurableConfig, DurableStore, StreamSpec, SyncPolicy};
use tern_store::sim::{
    Bugs, FaultAction, MetadataOrder, OpKind, ScriptedFault, SimConfig, SimDisk, SimRng,
};
use tern_wire::Protocol;
use tokio::net::TcpListener;

use super::client::{
    Deliver, Net, PubSpec, PubState, SubSpec, SubState, run_publisher, run_subscriber,
};

/// Bugs the simulator can inject (`scripts/sim.sh --inject NAME`), with what they do.
pub const BUGS: [(&str, &str); 7] = [
    (
        "ack-before-fsync",
        "the store completes tickets (so the broker acks) before the commit's fdatasync",
    ),
    (
        "skip-dir-sync-on-roll",
        "the store creates a new block file without fsyncing its directory",
    ),
    (
        "skip-sync-on-roll",
        "the store seals a block without syncing it (matters under sync = interval only)",
    ),
    (
        "ignore-received-set-after-restart",
        "the broker forgets the QoS 2 received set of a session it restores at start-up",
    ),
    (
        "random-pubrel-order",
        "the broker releases a PUBREL ahead of some PUBRELs queued before it",
    ),
    (
        "retention-removes-open-qos2",
        "retention limits may remove the records of open QoS 2 exchanges (no retention floor)",
    ),
    (
        "drop-share-queue-on-leave",
        "a share-group member that leaves drops the group's messages queued for it",
    ),
];

/// The bugs to inject: into the store (the sim disk's `Bugs`) or into the broker
/// (`tern_broker::inject`, process-wide: seeds run one at a time).
#[derive(Debug, Clone, Copy)]
pub struct Injected {
    pub store: Bugs,
    pub broker: Option<InjectBug>,
}

pub fn bugs(name: Option<&str>) -> Result<Injected, String> {
    let mut b = Bugs::NONE;
    let mut broker = None;
    match name {
        None | Some("") | Some("none") => {}
        Some("ack-before-fsync") => b.ack_before_fsync = true,
        Some("skip-dir-sync-on-roll") => b.skip_dir_sync_on_roll = true,
        Some("skip-sync-on-roll") => b.skip_sync_on_roll = true,
        Some("ignore-received-set-after-restart") => {
            broker = Some(InjectBug::IgnoreReceivedSetAfterRestart)
        }
        Some("random-pubrel-order") => broker = Some(InjectBug::RandomPubrelOrder),
        Some("retention-removes-open-qos2") => broker = Some(InjectBug::RetentionRemovesOpenQos2),
        Some("drop-share-queue-on-leave") => broker = Some(InjectBug::DropShareQueueOnLeave),
        Some(other) => return Err(format!("unknown bug {other:?}")),
    }
    Ok(Injected { store: b, broker })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// The power fails: the disk keeps what was durable (and what its model lets survive).
    PowerLoss,
    /// The power fails inside the `nth` next call of this kind on a path containing the
    /// string (a torn write, a partial write-back); the broker is killed once it happened.
    PowerLossIn(OpKind, &'static str, u64),
    /// The process dies (`kill -9`): the page cache survives.
    Crash,
}

/// What a seed decides before anything runs.
#[derive(Debug)]
struct Plan {
    publishers: Vec<PubSpec>,
    subscribers: Vec<SubSpec>,
    /// (acknowledged messages that trigger it, fault).
    faults: Vec<(u64, Fault)>,
    block_size: u64,
    sync: SyncPolicy,
    latency_us: u64,
    metadata_order: MetadataOrder,
}

fn protocol(rng: &mut SimRng) -> Protocol {
    if rng.chance(0.5) {
        Protocol::V5
    } else {
        Protocol::V3_1_1
    }
}

fn plan(seed: u64, crash_only: bool) -> Plan {
    let mut rng = SimRng::keyed(&[seed, 0x5eed]);
    let publishers: Vec<PubSpec> = (0..rng.range(2, 3) as usize)
        .map(|index| PubSpec {
            index,
            protocol: protocol(&mut rng),
            qos: rng.range(1, 2) as u8,
            topic: format!("sim/p{index}"),
            limit: rng.range(40, 150),
            window: rng.range(1, 16) as usize,
            pad: *rng.pick(&[0, 16, 200, 1000]),
        })
        .collect();
    let n_pub = publishers.len() as u64;
    let subscribers = (0..rng.range(2, 3) as usize)
        .map(|index| SubSpec {
            index,
            protocol: protocol(&mut rng),
            qos: rng.range(1, 2) as u8,
            filter: match rng.below(3) {
                0 => "sim/#".to_string(),
                1 => "sim/+".to_string(),
                _ => format!("sim/p{}", rng.below(n_pub)),
            },
            deliver: if rng.chance(0.5) {
                Deliver::AtPublish
            } else {
                Deliver::AtPubrel
            },
        })
        .collect();
    let total: u64 = publishers.iter().map(|p| p.limit).sum();
    let n_faults = rng.range(1, 3);
    let faults = (1..=n_faults)
        .map(|k| {
            let at = total * k / (n_faults + 1);
            let jitter = rng.below(total / (2 * (n_faults + 1)) + 1);
            let fault = if rng.chance(0.75) && !crash_only {
                // Its own generator, so that the other draws of the plan stay as they were.
                let mut inner = SimRng::keyed(&[seed, 0xfa17, k]);
                if inner.chance(0.4) {
                    Fault::PowerLossIn(
                        *inner.pick(&[OpKind::Write, OpKind::Sync]),
                        if inner.chance(0.5) {
                            "streams/messages/"
                        } else {
                            "tern.sessions"
                        },
                        inner.range(1, 3),
                    )
                } else {
                    Fault::PowerLoss
                }
            } else {
                Fault::Crash
            };
            (at + jitter, fault)
        })
        .collect();
    Plan {
        publishers,
        subscribers,
        faults,
        block_size: *rng.pick(&[8192, 16384, 65536]),
        sync: if rng.chance(0.75) {
            SyncPolicy::Always
        } else {
            SyncPolicy::Interval(Duration::from_millis(rng.range(1, 5)))
        },
        latency_us: rng.range(0, 1500),
        metadata_order: if rng.chance(0.8) {
            MetadataOrder::Ordered
        } else {
            MetadataOrder::Unordered
        },
    }
}

/// One broker "process": its own runtime, so that killing it drops every task it has
/// (connections, writers, timers, checkpointer) at once.
struct Boot {
    rt: tokio::runtime::Runtime,
}

fn boot(disk: &SimDisk, dir: &Path, config: &DurableConfig, net: &Net) -> Result<Boot, String> {
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
fn kill(boot: Boot, net: &Net) {
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
pub fn run_seed(seed: u64, injected: Injected, crash_only: bool, linger: bool) -> Outcome {
    let started = Instant::now();
    tern_broker::inject::set(injected.broker);
    let bugs = injected.store;
    let plan = plan(seed, crash_only);
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
    for &(at, fault) in &plan.faults {
        if current.is_none() {
            break;
        }
        wait(Duration::from_secs(20), || {
            net.acks.load(Ordering::Relaxed) >= at || pubs_done()
        });
        let acks = net.acks.load(Ordering::Relaxed);
        match fault {
            Fault::PowerLoss => disk.power_loss(),
            Fault::Crash => disk.crash(),
            Fault::PowerLossIn(op, path, nth) => {
                let before = disk.power_losses();
                disk.update_config(|c| {
                    c.faults.push(ScriptedFault {
                        op,
                        path_contains: path.into(),
                        nth,
                        action: FaultAction::PowerLoss,
                    })
                });
                // The workload may be over and the disk idle: then the power fails anyway.
                if !wait(Duration::from_secs(2), || disk.power_losses() > before) {
                    let _ = writeln!(log, "{fault:?} did not strike: power loss instead");
                    // Disarmed, so that it cannot strike a later boot unnoticed.
                    disk.update_config(|c| {
                        if let Some(f) = c.faults.last_mut() {
                            f.nth = u64::MAX;
                        }
                    });
                    disk.power_loss();
                }
            }
        }
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
    // Let the workload finish: every message published and acknowledged, every subscriber
    // holding what it is owed with no QoS 2 exchange open.
    if current.is_some() {
        if !wait(Duration::from_secs(30), pubs_done) {
            violations.push("publishers did not finish (stalled)".into());
        }
        let expected = expected(&pubs, &subs);
        let complete = || {
            subs.iter().all(|(spec, st)| {
                let st = st.lock();
                st.received.is_empty()
                    && expected[&spec.index]
                        .iter()
                        .all(|(p, acked)| acked.iter().all(|n| st.has(*p, *n)))
            })
        };
        wait(Duration::from_secs(5), complete);
    }
    net.stop.store(true, Ordering::Relaxed);
    if let Some(b) = current.take() {
        kill(b, &net);
    }
    for t in tasks {
        let _ = clients.block_on(t);
    }
    clients.shutdown_timeout(Duration::from_secs(2));
    // What was acknowledged may have grown while the workload finished.
    let expected = self::expected(&pubs, &subs);
    check(&pubs, &subs, &expected, &mut violations);
    for (p, st) in &pubs {
        let _ = writeln!(
            log,
            "{}: connections to boots {:?}",
            p.client_id(),
            st.lock().boots
        );
    }
    for e in disk.events() {
        let _ = writeln!(log, "disk: {e}");
    }
    tern_broker::inject::set(None);
    Outcome {
        violations,
        log,
        elapsed: started.elapsed(),
    }
}

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

fn matches(filter: &str, topic: &str) -> bool {
    tern_store::topic_matches(filter.as_bytes(), topic.as_bytes())
}

/// Per subscriber, per publisher whose topic its filter matches: the numbers acknowledged to
/// that publisher. Every subscription was acknowledged before the first PUBLISH, so every
/// subscriber was subscribed when each of them was published.
fn expected(
    pubs: &[(PubSpec, Arc<Mutex<PubState>>)],
    subs: &[(SubSpec, Arc<Mutex<SubState>>)],
) -> HashMap<usize, BTreeMap<usize, Vec<u64>>> {
    subs.iter()
        .map(|(s, _)| {
            let per_pub = pubs
                .iter()
                .filter(|(p, _)| matches(&s.filter, &p.topic))
                .map(|(p, st)| (p.index, st.lock().acked.iter().copied().collect()))
                .collect();
            (s.index, per_pub)
        })
        .collect()
}

impl SubState {
    fn has(&self, publisher: usize, number: u64) -> bool {
        self.got
            .iter()
            .any(|d| d.publisher == publisher && d.number == number)
    }
}

const EXAMPLES: usize = 5;

fn examples<T: std::fmt::Debug>(v: &[T]) -> String {
    let shown: Vec<_> = v.iter().take(EXAMPLES).collect();
    if v.len() > EXAMPLES {
        format!("{shown:?} and {} more", v.len() - EXAMPLES)
    } else {
        format!("{shown:?}")
    }
}

/// The checker: per subscriber and publisher,
/// - lost: acknowledged to the publisher (PUBACK; PUBREC for QoS 2) and never handed to the
///   subscriber's application (QoS 1: at least once, QoS 2: exactly once);
/// - duplicated: handed over more than once though publisher and subscription are QoS 2;
/// - reordered: a first delivery below an earlier first delivery of the same publisher (one
///   topic per publisher: an Ordered Topic, MQTT-4.6.0-5 / -6; at a subscriber that delivers
///   at PUBREL this also catches PUBRELs out of order, MQTT-4.6.0-4);
/// - invented: a payload that is not ours, a number its publisher never sent, or a message
///   from a publisher the subscriber's filter does not match;
/// - and the subscriber's session: an acknowledged subscription must survive every fault
///   (Session Present = 1 on every reconnect), and SUBACKs grant what was asked.
fn check(
    pubs: &[(PubSpec, Arc<Mutex<PubState>>)],
    subs: &[(SubSpec, Arc<Mutex<SubState>>)],
    expected: &HashMap<usize, BTreeMap<usize, Vec<u64>>>,
    violations: &mut Vec<String>,
) {
    for (s, st) in subs {
        let st = st.lock();
        let who = format!(
            "{} ({:?}, QoS {}, {}, {:?})",
            s.client_id(),
            s.protocol,
            s.qos,
            s.filter,
            s.deliver
        );
        if st.sessions_lost > 0 {
            violations.push(format!(
                "{who}: session lost {} times after its SUBACK",
                st.sessions_lost
            ));
        }
        if !st.bad_subacks.is_empty() {
            violations.push(format!("{who}: SUBACKs {:?}", st.bad_subacks));
        }
        if !st.foreign.is_empty() {
            violations.push(format!(
                "{who}: invented payloads {}",
                examples(&st.foreign)
            ));
        }
        for (p, pst) in pubs {
            let pst = pst.lock();
            let mine: Vec<_> = st.got.iter().filter(|d| d.publisher == p.index).collect();
            let Some(acked) = expected[&s.index].get(&p.index) else {
                if !mine.is_empty() {
                    violations.push(format!(
                        "{who}: {} messages of {} whose topic it does not match",
                        mine.len(),
                        p.client_id()
                    ));
                }
                continue;
            };
            let pair = format!(
                "{who} <- {} ({:?}, QoS {})",
                p.client_id(),
                p.protocol,
                p.qos
            );
            let mut count: BTreeMap<u64, usize> = BTreeMap::new();
            for d in &mine {
                *count.entry(d.number).or_default() += 1;
            }
            let lost: Vec<u64> = acked
                .iter()
                .copied()
                .filter(|n| !count.contains_key(n))
                .collect();
            if !lost.is_empty() {
                let on: Vec<(u64, (u64, u64))> =
                    lost.iter().map(|n| (*n, pst.acked_on[n])).collect();
                violations.push(format!(
                    "{pair}: {} acknowledged messages lost (number, (publisher's connection, broker boot) it was acknowledged on): {}",
                    lost.len(),
                    examples(&on)
                ));
            }
            let invented: Vec<u64> = count.keys().copied().filter(|&n| n >= pst.next).collect();
            if !invented.is_empty() {
                violations.push(format!("{pair}: never published: {}", examples(&invented)));
            }
            let wrong_qos: Vec<(u64, u8)> = mine
                .iter()
                .filter(|d| d.qos != p.qos.min(s.qos))
                .map(|d| (d.number, d.qos))
                .collect();
            if !wrong_qos.is_empty() {
                violations.push(format!(
                    "{pair}: delivered at a QoS other than {} (number, QoS): {}",
                    p.qos.min(s.qos),
                    examples(&wrong_qos)
                ));
            }
            if p.qos == 2 && s.qos == 2 {
                let dup: Vec<(u64, usize)> = count
                    .iter()
                    .filter(|(_, c)| **c > 1)
                    .map(|(n, c)| (*n, *c))
                    .collect();
                if !dup.is_empty() {
                    violations.push(format!(
                        "{pair}: QoS 2 delivered more than once (number, times): {}",
                        examples(&dup)
                    ));
                }
            }
            let mut seen = std::collections::HashSet::new();
            let mut last: Option<u64> = None;
            let mut reordered = Vec::new();
            for d in &mine {
                if !seen.insert(d.number) {
                    continue;
                }
                if let Some(l) = last {
                    if d.number < l {
                        reordered.push((l, d.number, d.connection));
                    }
                }
                last = Some(d.number);
            }
            if !reordered.is_empty() {
                violations.push(format!(
                    "{pair}: first deliveries out of order (after, got, connection): {}",
                    examples(&reordered)
                ));
            }
        }
    }
}

/// Probe for the QoS 2 received-set bug without any disk error (see the module doc of
/// sim.rs): a QoS 2 PUBLISH whose write is held pending in the disk, its connection lost,
/// and the same PUBLISH resent (DUP) on a new connection. Returns whether the broker sent
/// PUBREC for the resend while the first write was still pending (not durable).
pub fn probe_retry_while_write_pending() -> bool {
    use super::client::{Conn, persistent_connect, s};
    use tern_wire::{Packet, Properties, Publish, QoS};
    let dir = tempfile::tempdir().expect("tempdir");
    let disk = SimDisk::new(dir.path(), 1, SimConfig::default());
    let net = Net {
        addr: Mutex::new(None),
        stop: AtomicBool::new(false),
        acks: AtomicU64::new(0),
        boot: AtomicU64::new(0),
        disk: disk.clone(),
        linger: false,
    };
    let b = boot(&disk, dir.path(), &DurableConfig::default(), &net).expect("boot");
    let clients = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let publish = |dup| {
        Packet::Publish(Publish {
            dup,
            qos: QoS::ExactlyOnce,
            retain: false,
            topic: s("probe/t"),
            packet_id: 7,
            properties: Properties::default(),
            payload: bytes::Bytes::from_static(b"0:0:"),
        })
    };
    let pubrec_while_pending = clients.block_on(async {
        let connect = || persistent_connect(Protocol::V5, "probe");
        let mut c = Conn::connect(&net, connect()).await.expect("connect");
        disk.hold_next_write(&dir.path().join("streams").join("messages"));
        assert!(c.send(&publish(false)).await);
        assert!(
            // Blocking is fine here: the broker runs on its own runtime.
            disk.wait_held(Duration::from_secs(2)),
            "the write was not held"
        );
        drop(c);
        let mut c = Conn::connect(&net, connect()).await.expect("reconnect");
        assert!(c.send(&publish(true)).await);
        let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
        loop {
            match c.recv(Duration::from_millis(50)).await {
                Ok(Some(Packet::PubRec(a))) if a.packet_id == 7 => break true,
                Err(()) => break false,
                _ if tokio::time::Instant::now() > deadline => break false,
                _ => {}
            }
        }
    });
    disk.release();
    kill(b, &net);
    pubrec_while_pending
}
