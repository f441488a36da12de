//! The cluster simulator with the broker on top (issue 23, item 7; docs/simulation.md,
//! "Cluster broker seeds"): three nodes, each a real tern-raft node on the simulated network
//! (`tern_raft::sim_net`) with its Raft log on a simulated disk, a real `Replica`, and the
//! real lifecycle (`ClusterNode::run_on`), which runs the real broker on a `ReplicatedDisk`
//! on the leader; raw MQTT clients (QoS 2 publishers v5 and 3.1.1, a QoS 1 publisher,
//! persistent QoS 2 subscribers with Method A and B, a QoS 1 subscriber) connect to any node
//! and are forwarded to the leader; leader and follower crashes, power losses of one node and
//! of all, partitions of the leader and paused nodes strike while they publish; a checker
//! (`check.rs`) reads what the clients saw. `scripts/sim.sh --cluster-broker` runs it.
//!
//! Not one execution per seed: the broker's store runs its writer threads (its fsync blocks
//! on the `ReplicatedDisk` until a majority committed, which stepped writers on a simulated
//! clock cannot wait for), so each node is a tokio runtime of its own and time is real. A
//! seed's plan (faults, workload, network weather) is the seed's; its interleaving is not.
//!
//! Environment: TERN_CBSIM_SEEDS (default 2), TERN_CBSIM_SEED_BASE, TERN_CBSIM_SEED (one
//! seed), TERN_CBSIM_INJECT (a bug, below), TERN_CBSIM_JOBS, TERN_CBSIM_VERBOSE,
//! TERN_CBSIM_STOP_AT_FIRST, TERN_CBSIM_LOG (an env-filter for the nodes' log lines). Last
//! line: `sim: seeds=N violations=V`.

mod check;
mod client;
mod conn;
mod plan;
mod run;
mod world;

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

fn var_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Switches on the injected bug `name` (docs/simulation.md, "Cluster broker seeds").
fn inject(name: &str) {
    use tern_broker::__internal::inject as broker;
    use tern_cluster::inject as cluster;
    match name {
        "" => {}
        // The QoS 2 received set as if it lived only in the memory of the engine that built
        // it: every engine a leader starts restores its sessions without it.
        "dedupe-on-leader-only" => broker::set(Some(broker::Bug::IgnoreReceivedSetAfterRestart)),
        "lose-ownership-on-takeover" => cluster::set(Some(cluster::Bug::LoseOwnershipOnTakeover)),
        // The order check at cluster level: a PUBREL jumps ahead of PUBRELs queued before it,
        // so receivers that take a QoS 2 message at its PUBREL see it out of order.
        "random-pubrel-order" => broker::set(Some(broker::Bug::RandomPubrelOrder)),
        other => panic!("unknown cluster broker bug {other:?}"),
    }
}

/// Runs one seed, a panic turned into a violation.
fn one(seed: u64) -> Result<run::Outcome, String> {
    let r = std::panic::catch_unwind(|| run::run_seed(seed));
    r.map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panic".into())
    })
}
/// Runs `seed`; returns whether it violated a guarantee, and what to print for it: its plan,
/// log and violations (with the replay command) if it failed or `verbose`, else nothing.
fn run_and_report(seed: u64, verbose: bool, inject_name: &str) -> (bool, String) {
    use std::fmt::Write;
    let t = std::time::Instant::now();
    let (violations, line, details) = match one(seed) {
        Ok(o) => (
            o.violations.clone(),
            format!(
                "seed {seed}: acked={} violations={} ({:.2}s) {}",
                o.acked,
                o.violations.len(),
                t.elapsed().as_secs_f64(),
                o.plan
            ),
            o.log,
        ),
        Err(p) => (
            vec![format!("panic: {p}")],
            format!("seed {seed}: panicked"),
            Vec::new(),
        ),
    };
    let mut out = String::new();
    if !verbose && violations.is_empty() {
        return (false, out);
    }
    let _ = writeln!(out, "{line}");
    for d in &details {
        let _ = writeln!(out, "    {d}");
    }
    for v in violations.iter().take(10) {
        let _ = writeln!(out, "  VIOLATION {v}");
    }
    if violations.len() > 10 {
        let _ = writeln!(out, "  ... and {} more", violations.len() - 10);
    }
    if !violations.is_empty() {
        let inject = if inject_name.is_empty() {
            String::new()
        } else {
            format!(" --inject {inject_name}")
        };
        let _ = writeln!(
            out,
            "  replay: scripts/sim.sh --cluster-broker --seed {seed}{inject}"
        );
    }
    (!violations.is_empty(), out)
}

#[test]
fn cluster_broker_seeds() {
    let inject_name = std::env::var("TERN_CBSIM_INJECT").unwrap_or_default();
    init_log();
    inject(&inject_name);
    let (base, count) = match var_u64("TERN_CBSIM_SEED") {
        Some(s) => (s, 1),
        None => (
            var_u64("TERN_CBSIM_SEED_BASE").unwrap_or(0),
            var_u64("TERN_CBSIM_SEEDS").unwrap_or(2),
        ),
    };
    let verbose = flag("TERN_CBSIM_VERBOSE");
    let stop_at_first = flag("TERN_CBSIM_STOP_AT_FIRST");
    let jobs = var_u64("TERN_CBSIM_JOBS")
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u64))
        .max(1);
    let next = AtomicU64::new(base);
    let failing = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let first: Mutex<Option<u64>> = Mutex::new(None);
    let out = Mutex::new(());
    let started = std::time::Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            scope.spawn(|| {
                loop {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= base + count {
                        return;
                    }
                    let (failed, report) = run_and_report(seed, verbose, &inject_name);
                    {
                        // One seed's lines together.
                        let _g = out.lock().unwrap();
                        print!("{report}");
                    }
                    if failed {
                        failing.fetch_add(1, Ordering::Relaxed);
                        let mut f = first.lock().unwrap();
                        if f.is_none_or(|s| seed < s) {
                            *f = Some(seed);
                        }
                        if stop_at_first {
                            stop.store(true, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    });
    let ran = next.load(Ordering::Relaxed).min(base + count) - base;
    let v = failing.load(Ordering::Relaxed);
    if let Some(s) = *first.lock().unwrap() {
        println!("sim: first failing seed {s}");
    }
    println!(
        "cluster-broker: {ran} seeds in {:.1}s ({:.2}s per seed, {jobs} jobs)",
        started.elapsed().as_secs_f64(),
        started.elapsed().as_secs_f64() * jobs as f64 / ran.max(1) as f64
    );
    println!("sim: seeds={ran} violations={v}");
    assert_eq!(v, 0, "{v} seeds violated a guarantee");
}

fn init_log() {
    if let Ok(filter) = std::env::var("TERN_CBSIM_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .try_init();
    }
}
