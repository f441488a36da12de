//! The cluster simulator at the consensus layer (issue 23, item 7; docs/simulation.md,
//! "Cluster seeds"): N tern-raft nodes on simulated disks and a simulated network, one
//! thread and tokio's paused clock per seed, with crashes, power losses, partitions, pauses,
//! lost and delayed messages, and a checker. `scripts/sim.sh --cluster` runs it.
//!
//! Environment: TERN_CSIM_SEEDS (default 6), TERN_CSIM_SEED_BASE, TERN_CSIM_SEED (one seed),
//! TERN_CSIM_INJECT (a bug of `tern_raft::inject`), TERN_CSIM_JOBS, TERN_CSIM_VERBOSE,
//! TERN_CSIM_STOP_AT_FIRST, TERN_CSIM_TRACE (the faults as they strike), TERN_CSIM_LOG (an
//! env-filter for the nodes' log lines, openraft's included). Last line: `sim: seeds=N
//! violations=V`.

mod app;
mod check;
mod plan;
mod run;
mod world;

use tern_raft::inject::{self, Bug};
use tern_raft::sim_seeds::{Campaign, SeedReport};

fn bug(name: &str) -> Option<Bug> {
    match name {
        "" => None,
        "ack-before-commit" => Some(Bug::AckBeforeCommit),
        "vote-not-synced" => Some(Bug::VoteNotSynced),
        "deliver-uncommitted" => Some(Bug::DeliverUncommitted),
        "flush-before-sync" => Some(Bug::FlushBeforeSync),
        "purge-before-record" => Some(Bug::PurgeBeforeRecord),
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

fn init_log() {
    if let Ok(filter) = std::env::var("TERN_CSIM_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .try_init();
    }
}

#[test]
fn cluster_seeds() {
    init_log();
    let inject_name = std::env::var("TERN_CSIM_INJECT").unwrap_or_default();
    inject::set(bug(&inject_name));
    let campaign = Campaign {
        env_prefix: "TERN_CSIM",
        default_seeds: 6,
        sim_flag: "--cluster",
        name: "cluster",
        inject_name: &inject_name,
    };
    let violating = campaign.run(|seed| {
        one(seed).map(|o| SeedReport {
            acked: o.acked as u64,
            plan: o.plan.to_string(),
            violations: o.violations,
            log: o.log,
        })
    });
    assert_eq!(violating, 0, "{violating} seeds violated a guarantee");
}
