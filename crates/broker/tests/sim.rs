//! Sim v0 (issue 12): the whole broker, in process, on the simulated disk
//! (`tern_store::sim::SimDisk`), through power losses and process crashes, checked for its
//! delivery guarantees with real clients.
//!
//! # A run
//! From a seed (`run::plan`): 2-3 publishers and 2-3 subscribers with persistent sessions
//! (MQTT 3.1.1 and 5), QoS 1 and 2, one topic per publisher, subscribers on `sim/#`,
//! `sim/+` or one publisher's topic, delivering QoS 2 to their application at PUBLISH
//! (holding the packet id until PUBREL) or at PUBREL; the message stream's block size and
//! sync policy (`always`, or `interval` of a few ms), the disk's latency and metadata order;
//! and 1-3 faults, each at a seeded number of acknowledged messages: a **power loss** (the
//! sim disk's `power_loss()`: what was not durable is lost or torn, as its model says; or,
//! for four in ten of them, inside the 1st-3rd next write or fdatasync of the message stream
//! or of `tern.sessions`, through a scripted fault: a torn write, a partial write-back) or a
//! **process crash** (`crash()`: the page cache survives). Either way the broker dies at
//! once: its runtime is shut down (serve task, connections, writers, timers, checkpointer
//! dropped; no clean shutdown, no last checkpoint), the store dropped, and a new
//! `DurableStore::open_with_vfs` on the same disk (the production open path) recovers from
//! what survived, under a new `Broker::with_store` serving on a new port. The clients (raw
//! tern-wire, `client.rs`) keep their session state across reconnects and resend as the spec
//! says (PUBLISH with DUP, or PUBREL). After the last fault the workload runs to its end
//! and `run::check` checks: every message acknowledged to its publisher (PUBACK, PUBREC)
//! reached every subscriber (all subscribed, with a durable SUBACK, before the first
//! PUBLISH): QoS 1 at least once, QoS 2 exactly once to the application; first deliveries
//! keep each publisher's order; nothing invented; subscriptions survive every fault.
//!
//! # Determinism: what v0 has and lacks
//! The seed fixes the workload, the fault schedule (as counts of acknowledged messages) and
//! every choice the disk makes for a given sequence of calls per path. It does not fix the
//! interleaving: the broker and the clients talk over real loopback TCP on tokio's
//! multi-threaded runtimes, the store's writer threads and the broker's timers (checkpointer
//! every 25 ms, reclamation) run on real time, and the disk's latency sleeps real time. So a
//! seed replays the same scenario, not the same execution: a failure may need a few runs of
//! its seed to show again. A fully deterministic simulator needs seams for the network (an
//! in-memory transport the simulator schedules, with faults: resets, stalls, partitions) and
//! the clock (virtual time for keep-alive, expiry, the checkpointer and `now_ns`), one
//! scheduler thread for everything, and the store-side items listed in
//! `crates/store/src/sim/mod.rs` (writer threads stepped by the simulator, see
//! `SimDisk::hold_next_write`; the reaper's unlinks).
//!
//! # Running
//! `cargo test -p tern-broker --test sim` runs `TERN_SIM_SEEDS` seeds (default 40) from
//! `TERN_SIM_SEED_BASE` (default 0), or the one seed `TERN_SIM_SEED`, with the bug
//! `TERN_SIM_INJECT` injected (`run::BUGS`), and a sensitivity test: ack-before-fsync is found
//! within the first 20 seeds (it stops at the first failing one). About 10 s in debug. `scripts/sim.sh` runs the same in release; it ends with
//! `sim: seeds=N violations=V` and names the first failing seed. `TERN_SIM_VERBOSE=1` prints
//! every seed's plan and fault log; `TERN_SIM_CRASH_ONLY=1` (`--crash-only`) turns every
//! power loss into a process crash, which is all a `kill -9` test can do;
//! `TERN_SIM_LINGER=1` (`--linger`) lets clients reconnect to a broker whose disk has just
//! died, until the controller kills it (a disk failing under a running broker).
//!
//! # What it found (2026-12-01)
//! - Sensitivity, release, seeds 0-39 (`scripts/sim.sh --seeds 40 --inject BUG`):
//!   `ack-before-fsync` fails 12 of 40 seeds, the first at seed 2 (acknowledged QoS 1 and 2
//!   messages lost, QoS 2 delivered twice); `skip-dir-sync-on-roll` 17 of 40, the first at
//!   seed 0; `skip-sync-on-roll` 2 of 40 (seeds 13 and 30: it needs `sync = interval`, a
//!   quarter of the plans). The same 40 seeds pass without a bug, and with `--crash-only`
//!   (every fault a `kill -9`) none of the three bugs is found in them: the crash tests
//!   could not have seen them. Which seeds fail varies a little from run to run (the
//!   interleaving is not seeded yet).
//! - Without a bug: seeds 0-299 (release, 54 s), 1000-1999 (release, 172 s) and 0-199
//!   (debug, 41 s) passed before power losses inside calls were added; since then seeds
//!   0-999 pass in release (189 s).
//! - **A broker bug, fixed** (seed 9 with `--linger`, 10 of 30 runs in debug): a QoS 2
//!   PUBLISH whose store write fails leaves its packet id in the session's received set
//!   (`connection/publish.rs` inserts it before `append_publish`). The connection is closed
//!   without PUBREC, as §5 says; the client resends on a new connection to the same process,
//!   the PUBLISH is taken for a retry (§3) and PUBREC'd at once (`ticket: None`):
//!   acknowledged, but never stored nor delivered. The seed shows it when a power loss
//!   strikes inside an fdatasync and clients reconnect to the broker before it is killed,
//!   which is what any write error does to a running broker. It is also reachable without
//!   any error: `qos2_retry_is_not_acknowledged_before_its_write_is_durable` holds the first write pending in the sim disk, drops the connection and resends
//!   on a new one: the PUBREC comes before the write is durable, so a power loss then loses
//!   an acknowledged QoS 2 message (sim v0 has no network faults, so its reconnects all
//!   follow a broker death and the seeds do not reach this without `--linger`). **Fixed**:
//!   a retry's PUBREC waits for the original's write (`MessageStore::qos2_retry`: a second
//!   ticket for the rx record's sequence), and fails with it, so a failed write is never
//!   acknowledged; the received set and the write change together under the session lock. Without `--linger` no client reaches a broker whose disk died,
//!   as with a real power loss.

mod sim {
    pub mod check;
    pub mod client;
    pub mod plan;
    pub mod probes;
    pub mod run;
}

use std::time::Instant;

use sim::plan::{BUGS, bugs};
use sim::run::run_seed;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))
    })
}

pub(crate) fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The broker's injected bugs are process-wide: one broker at a time in this binary.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `seeds`, printing each failing seed with its log; returns (violating seeds, first).
fn run_seeds(seeds: &[u64], bug: Option<&str>, stop_at_first: bool) -> (usize, Option<u64>) {
    let _one = one_at_a_time();
    let injected = bugs(bug).unwrap_or_else(|e| {
        let names: Vec<&str> = BUGS.iter().map(|b| b.0).collect();
        panic!("{e}; known: {names:?}")
    });
    let verbose = env_flag("TERN_SIM_VERBOSE");
    let crash_only = env_flag("TERN_SIM_CRASH_ONLY");
    let linger = env_flag("TERN_SIM_LINGER");
    let mut inject = bug.map(|b| format!(" --inject {b}")).unwrap_or_default();
    if crash_only {
        inject.push_str(" --crash-only");
    }
    if linger {
        inject.push_str(" --linger");
    }
    if env_flag("TERN_SIM_PUB_DROPS") {
        inject.push_str(" --pub-drops");
    }
    let mut bad = 0;
    let mut first = None;
    for &seed in seeds {
        let out = run_seed(seed, injected, crash_only, linger);
        if out.violations.is_empty() {
            println!("sim: seed {seed} ok ({:.1?})", out.elapsed);
            if verbose {
                println!("{}", out.log);
            }
            continue;
        }
        bad += 1;
        first.get_or_insert(seed);
        println!(
            "sim: seed {seed} FAILED ({:.1?}; replay: scripts/sim.sh --seed {seed}{inject})",
            out.elapsed
        );
        for v in &out.violations {
            println!("sim:   {v}");
        }
        println!("{}", out.log);
        if stop_at_first {
            break;
        }
    }
    (bad, first)
}

/// The seeds of this run (`TERN_SIM_SEED`, or `TERN_SIM_SEEDS` from `TERN_SIM_SEED_BASE`).
fn seeds(default_count: u64) -> Vec<u64> {
    if let Some(seed) = env_u64("TERN_SIM_SEED") {
        return vec![seed];
    }
    let base = env_u64("TERN_SIM_SEED_BASE").unwrap_or(0);
    let count = env_u64("TERN_SIM_SEEDS").unwrap_or(default_count);
    (base..base + count).collect()
}

#[test]
fn sim_seeds() {
    let started = Instant::now();
    let seeds = seeds(40);
    let bug = std::env::var("TERN_SIM_INJECT")
        .ok()
        .filter(|b| !b.is_empty());
    let stop_at_first = env_flag("TERN_SIM_STOP_AT_FIRST");
    let (bad, first) = run_seeds(&seeds, bug.as_deref(), stop_at_first);
    if let Some(seed) = first {
        println!("sim: first failing seed {seed}");
    }
    println!(
        "sim: {} seeds in {:.1?}{}",
        seeds.len(),
        started.elapsed(),
        bug.as_deref()
            .map(|b| format!(", injected {b}"))
            .unwrap_or_default()
    );
    println!("sim: seeds={} violations={bad}", seeds.len());
    assert_eq!(
        bad,
        0,
        "sim: {bad} of {} seeds violated a guarantee",
        seeds.len()
    );
}

/// The simulator is sensitive: with acknowledgements before the fsync, power losses lose
/// acknowledged messages within a few seeds (the same seeds pass without the bug:
/// `sim_seeds` runs the first of them).
#[test]
fn sim_finds_ack_before_fsync() {
    if std::env::var("TERN_SIM_SEED").is_ok()
        || std::env::var("TERN_SIM_INJECT").is_ok()
        || env_flag("TERN_SIM_CRASH_ONLY")
        || env_flag("TERN_SIM_LINGER")
    {
        return; // A replay or a scripted run: sim_seeds does the work.
    }
    let seeds: Vec<u64> = (0..20).collect();
    let (bad, first) = run_seeds(&seeds, Some("ack-before-fsync"), true);
    assert!(
        bad > 0,
        "ack-before-fsync not found in {} seeds",
        seeds.len()
    );
    println!("sim: ack-before-fsync found at seed {}", first.unwrap());
}

/// The QoS 2 received-set bug (module doc) without any disk error: a retry on a new
/// connection was PUBREC'd while the original write was still pending. Fixed: the retry's
/// PUBREC waits for the original's write (`MessageStore::qos2_retry`).
#[test]
fn qos2_retry_is_not_acknowledged_before_its_write_is_durable() {
    let _one = one_at_a_time();
    assert!(
        !sim::probes::probe_retry_while_write_pending(),
        "PUBREC for a QoS 2 retry while the original write was not durable"
    );
}

/// Found by seed 60 (share groups, members leaving, a power loss): a group's QoS 2 message in
/// flight to a member whose own cursor had passed it was dropped at start-up as a stale
/// exchange, and skipped by the group's replay: lost, its packet id never released. Fixed:
/// an exchange is stale only below the member's groups' cursors too
/// (`DurableStore::lowered_by_groups`).
#[test]
fn group_message_in_flight_survives_a_crash_before_the_checkpoint() {
    let _one = one_at_a_time();
    assert!(
        sim::probes::probe_group_message_in_flight_survives_restart(),
        "the group's message in flight was not resent after the restart"
    );
}
