//! The randomized power-loss checker (issue 12): from a seed, a workload of appends, batches,
//! group commits, flushes, retention removals (remove_below, delete, purge, expire, limits),
//! compactions, seals, reopens and reads over one to three streams (sync always / interval /
//! never, blocks of 4-16 KiB) runs on a [`SimDisk`]; power losses strike between steps and
//! inside I/O calls, processes crash, writes and syncs fail with EIO. After every recovery,
//! and at random points in between, what the store serves is checked against what it
//! promised:
//!
//! - a record is there, byte for byte, unless its removal was requested, if its ticket
//!   completed under `always`/`interval`, a completed `flush` or removal covered it, a read
//!   served it under `always`/`interval` (readers only see durable records), or it was
//!   there after a power loss (whatever survives one is durable);
//! - every record served is one that was appended (topic, payload, time), in sequence order,
//!   with no record missing before it (no holes), a batch all or nothing, and `get` and
//!   filtered reads agree with the full read;
//! - a removal acknowledged under `always`/`interval` is never undone;
//! - sequence numbers are never reused: new ones are above every record ever durable;
//! - a stream that saw a write or sync error refuses writes and removals until reopened;
//! - recovery fails only because of an injected fault, and never quarantines a block (the
//!   simulated disk never rots, so a damaged block could only be the store's own doing).
//!
//! Records that were never acknowledged may or may not be there.
//!
//! A failing seed prints itself with the steps and disk events that led to it.
//! `TERN_SIM_SEED=n` replays one seed with its log, `TERN_SIM_SEEDS=n` runs more seeds (from
//! `TERN_SIM_SEED_BASE`, default 0), `TERN_SIM_STEPS=n` makes each run longer (default 120),
//! `TERN_SIM_OPLOG=file` writes the disk's call trace (to diff two runs of a seed).
//!
//! Also here: the seeds that found store bugs, a replay check, and the sensitivity tests:
//! bugs injected into the store (`tern_store::sim::Bugs`) are found, and the same workload
//! with process crashes only (what `kill -9` tests can do) finds none of them.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tern_store::sim::{Bugs, MetadataOrder, SimConfig, SimDisk, SimRng, SyncErrorModel};
use tern_store::{
    Discard, FilterSet, Limits, NewRecord, Record, Store, StoreError, Stream, StreamConfig,
    SyncPolicy, Ticket, topic_matches,
};

const TOPICS: [&str; 4] = ["a/x", "a/y", "b", "c/d/e"];
const FILTERS: [&str; 4] = ["a/+", "b", "#", "c/#"];
const MAX_AGE_NS: u64 = 4000;
/// Interval syncs happen only on flushes, removals and rolls: a timer would make the run
/// depend on wall-clock time.
const INTERVAL: Duration = Duration::from_secs(3600);

pub(crate) type R<T = ()> = Result<T, String>;
/// Which records a removal asked for.
pub(crate) type Pred = Box<dyn Fn(u64, &Rec) -> bool>;

macro_rules! fail {
    ($($t:tt)*) => { return Err(format!($($t)*)) };
}

mod check;
mod model;
mod recover;
mod sim;

use model::*;
use sim::*;

fn run_seed(seed: u64, opts: Opts) -> Result<Summary, String> {
    let mut sim = Sim::new(seed, opts);
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sim.run()));
    if let Ok(p) = std::env::var("TERN_SIM_OPLOG") {
        let _ = std::fs::write(p, sim.disk.op_log().join("\n"));
    }
    match res {
        Ok(Ok(())) => Ok(sim.sum.clone()),
        Ok(Err(e)) => {
            sim.disk.release();
            let r = sim.report(&e);
            sim.shutdown();
            Err(r)
        }
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            sim.disk.release();
            Err(sim.report(&format!("panic: {msg}")))
        }
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn steps() -> usize {
    env_u64("TERN_SIM_STEPS").unwrap_or(120) as usize
}

/// Runs seeds on a few threads; returns the failing seeds' reports (by seed) and the totals
/// of the passing ones. With `stop`, hands out no more seeds after a failure.
fn run_many(seeds: std::ops::Range<u64>, opts: Opts, stop: bool) -> (Vec<(u64, String)>, Summary) {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU64, Ordering};
    let next = AtomicU64::new(seeds.start);
    let failed: Mutex<Vec<(u64, String)>> = Mutex::new(Vec::new());
    let total = Mutex::new(Summary::default());
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 4));
    std::thread::scope(|sc| {
        for _ in 0..threads {
            sc.spawn(|| {
                loop {
                    let seed = next.fetch_add(1, Ordering::SeqCst);
                    if seed >= seeds.end || (stop && !failed.lock().unwrap().is_empty()) {
                        return;
                    }
                    match run_seed(seed, opts) {
                        Ok(s) => {
                            let mut t = total.lock().unwrap();
                            t.steps += s.steps;
                            t.appended += s.appended;
                            t.recoveries += s.recoveries;
                            t.power_losses += s.power_losses;
                            t.failures_seen += s.failures_seen;
                            t.durable_checked += s.durable_checked;
                        }
                        Err(r) => failed.lock().unwrap().push((seed, r)),
                    }
                }
            });
        }
    });
    let mut failed = failed.into_inner().unwrap();
    failed.sort_by_key(|f| f.0);
    (failed, total.into_inner().unwrap())
}

/// Runs seeds `base..base+n` (or `TERN_SIM_SEED` alone, verbosely) and fails with the first
/// failing seed's report.
fn run_seeds(default_n: u64, opts: Opts) {
    if let Some(seed) = env_u64("TERN_SIM_SEED") {
        let opts = Opts {
            verbose: true,
            ..opts
        };
        match run_seed(seed, opts) {
            Ok(s) => eprintln!("seed {seed} passed: {s:?}"),
            Err(r) => panic!("{r}"),
        }
        return;
    }
    let n = env_u64("TERN_SIM_SEEDS").unwrap_or(default_n);
    let base = env_u64("TERN_SIM_SEED_BASE").unwrap_or(0);
    let start = Instant::now();
    let (failed, total) = run_many(base..base + n, opts, true);
    if let Some((_, r)) = failed.first() {
        panic!("{r}");
    }
    eprintln!(
        "power_loss: {n} seeds from {base} in {:.1?}: {} steps, {} records appended, {} recoveries ({} power losses), {} stream failures, {} durable records checked",
        start.elapsed(),
        total.steps,
        total.appended,
        total.recoveries,
        total.power_losses,
        total.failures_seen,
        total.durable_checked
    );
}

#[test]
fn power_loss_checker() {
    run_seeds(200, Opts::new(steps()));
}

/// Seeds (and run lengths) that found store bugs, each also a scenario of its own in
/// `tests/sim_regressions/`: 3 a new block's unsynced header, 34 `never` sealing without a
/// sync, 62 recovery building on an unsynced block name, 134 compaction's index and rename
/// order, 138 and 428 a failed fsync's dropped pages, 140 `seal()` replying before its
/// roll, 286 compaction leaving a dangling batch flag, 5066 a batch of block removals
/// undoing a delete, 23150 a new block's header only the page cache held, 40242
/// compaction dropping a marker before the dead block it targets was gone, 40939 recovery
/// removing dead blocks before the active block's name was durable. 149 found a gap in the
/// checker itself.
const REGRESSION_SEEDS: [(u64, usize); 13] = [
    (3, 120),
    (34, 120),
    (62, 120),
    (134, 120),
    (138, 120),
    (140, 120),
    (149, 120),
    (286, 120),
    (428, 120),
    (5066, 600),
    (23150, 120),
    (40242, 1000),
    (40939, 1000),
];

#[test]
fn regression_seeds() {
    for (seed, steps) in REGRESSION_SEEDS {
        if let Err(r) = run_seed(seed, Opts::new(steps)) {
            panic!("{r}");
        }
    }
}

/// The same seed gives the same disk history (trace digest) and the same outcome.
#[test]
fn a_seed_replays_exactly() {
    if env_u64("TERN_SIM_SEED").is_some() {
        return;
    }
    for seed in [3, 17, 42] {
        let a = run_seed(seed, Opts::new(60)).unwrap_or_else(|r| panic!("{r}"));
        let b = run_seed(seed, Opts::new(60)).unwrap_or_else(|r| panic!("{r}"));
        assert_eq!(
            (a.digest, a.appended, a.power_losses),
            (b.digest, b.appended, b.power_losses),
            "seed {seed} did not replay"
        );
    }
}

const INJECTED: [(&str, Bugs); 3] = [
    (
        "ack-before-fsync",
        Bugs {
            ack_before_fsync: true,
            ..Bugs::NONE
        },
    ),
    (
        "skip-sync-on-roll",
        Bugs {
            skip_sync_on_roll: true,
            ..Bugs::NONE
        },
    ),
    (
        "skip-dir-sync-on-roll",
        Bugs {
            skip_dir_sync_on_roll: true,
            ..Bugs::NONE
        },
    ),
];

/// Seeds each sensitivity test runs.
const FIND_WITHIN: u64 = 40;

/// Sensitivity: with a known bug injected into the store, the checker fails, with a report
/// naming the broken promise. Prints how many of the first `FIND_WITHIN` seeds find each
/// bug; at least a quarter must.
#[test]
fn the_checker_finds_injected_bugs() {
    for (name, bugs) in INJECTED {
        let opts = Opts {
            bugs,
            ..Opts::new(steps())
        };
        let (failed, _) = run_many(0..FIND_WITHIN, opts, false);
        let Some((seed, report)) = failed.first() else {
            panic!("{name}: not found in {FIND_WITHIN} seeds");
        };
        let first = report.lines().next().unwrap_or_default();
        eprintln!(
            "{name}: found by {} of {FIND_WITHIN} seeds, first by seed {seed}: {first}",
            failed.len()
        );
        assert!(
            failed.len() as u64 >= FIND_WITHIN / 4,
            "{name}: found too rarely"
        );
    }
}

/// The point of the simulated power loss: the same workload with process crashes only
/// (`kill -9`: the page cache survives, as in `crash.rs`) and no I/O errors passes with
/// every injected bug, over the seeds that find them all above.
#[test]
fn kill_9_alone_finds_none_of_them() {
    for (name, bugs) in INJECTED {
        let opts = Opts {
            bugs,
            crashes: Crashes::ProcessOnly,
            errors: false,
            ..Opts::new(steps())
        };
        let (failed, total) = run_many(0..FIND_WITHIN, opts, true);
        if let Some((seed, r)) = failed.first() {
            panic!("{name}: a process crash found it (seed {seed}):\n{r}");
        }
        eprintln!(
            "{name}: {FIND_WITHIN} seeds with process crashes only pass ({} recoveries)",
            total.recoveries
        );
    }
}

/// The switch itself: with `ack_before_fsync` a ticket completes although its fsync fails.
#[test]
fn the_ack_before_fsync_switch_takes_effect() {
    use tern_store::sim::{FaultAction, OpKind, ScriptedFault};

    for bug in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let cfg = SimConfig {
            faults: vec![ScriptedFault {
                op: OpKind::Sync,
                path_contains: "streams/s/".into(),
                nth: 3,
                action: FaultAction::Eio,
            }],
            bugs: Bugs {
                ack_before_fsync: bug,
                ..Bugs::NONE
            },
            ..Default::default()
        };
        let disk = SimDisk::new(dir.path(), 1, cfg);
        let store = Store::open_with_vfs(dir.path(), disk.vfs()).unwrap();
        let s = store.stream("s", StreamConfig::default()).unwrap();
        // Syncs 1 and 2 are the new block's and recovery's; 3, this append's, fails.
        let res = s.append(b"t", b"", b"x").unwrap().wait();
        assert_eq!(res.is_ok(), bug, "bug {bug}: {res:?}");
        assert!(s.flush().is_err() && s.info().failed);
    }
}
