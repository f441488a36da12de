//! The cluster simulator at the consensus layer (issue 23, item 7; docs/simulation.md,
//! "Cluster seeds"): N tern-raft nodes on simulated disks and a simulated network, one
//! thread and tokio's paused clock per seed, with crashes, power losses, partitions, pauses,
//! lost and delayed messages, and a checker. `scripts/sim.sh --cluster` runs it.
//!
//! Environment: TERN_CSIM_SEEDS (default 6), TERN_CSIM_SEED_BASE, TERN_CSIM_SEED (one seed),
//! TERN_CSIM_INJECT (a bug of `tern_raft::inject`), TERN_CSIM_JOBS, TERN_CSIM_VERBOSE,
//! TERN_CSIM_STOP_AT_FIRST. Last line: `sim: seeds=N violations=V`.

mod app;
mod check;
mod plan;
mod run;
mod world;

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tern_raft::inject::{self, Bug};

fn var_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0")
}

fn bug(name: &str) -> Option<Bug> {
    match name {
        "" => None,
        "ack-before-commit" => Some(Bug::AckBeforeCommit),
        "vote-not-synced" => Some(Bug::VoteNotSynced),
        "deliver-uncommitted" => Some(Bug::DeliverUncommitted),
        "flush-before-sync" => Some(Bug::FlushBeforeSync),
        other => panic!("unknown cluster bug {other:?}"),
    }
}

/// Runs one seed on a runtime of its own: one thread, the clock paused (it jumps to the next
/// timer whenever every task waits).
fn one(seed: u64) -> Result<run::Outcome, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .map_err(|e| e.to_string())?;
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        rt.block_on(run::run_seed(seed))
    }));
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
            "  replay: scripts/sim.sh --cluster --seed {seed}{inject}"
        );
    }
    (!violations.is_empty(), out)
}

#[test]
fn cluster_seeds() {
    let inject_name = std::env::var("TERN_CSIM_INJECT").unwrap_or_default();
    inject::set(bug(&inject_name));
    let (base, count) = match var_u64("TERN_CSIM_SEED") {
        Some(s) => (s, 1),
        None => (
            var_u64("TERN_CSIM_SEED_BASE").unwrap_or(0),
            var_u64("TERN_CSIM_SEEDS").unwrap_or(6),
        ),
    };
    let verbose = flag("TERN_CSIM_VERBOSE");
    let stop_at_first = flag("TERN_CSIM_STOP_AT_FIRST");
    let jobs = var_u64("TERN_CSIM_JOBS")
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
        "cluster: {ran} seeds in {:.1}s ({:.2}s per seed, {jobs} jobs)",
        started.elapsed().as_secs_f64(),
        started.elapsed().as_secs_f64() * jobs as f64 / ran.max(1) as f64
    );
    println!("sim: seeds={ran} violations={v}");
    assert_eq!(v, 0, "{v} seeds violated a guarantee");
}
