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

use tern_raft::sim_seeds::{Campaign, SeedReport};

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
        // The store's pipelined commit acknowledges at its sync's start (a PUBACK before the
        // majority commit): what the real-process check (scripts/cluster-check.sh) rarely
        // hits, ~1 ms of exposure per failover.
        "ack-at-sync-start" => cluster::set(Some(cluster::Bug::AckAtSyncStart)),
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
#[test]
fn cluster_broker_seeds() {
    let inject_name = std::env::var("TERN_CBSIM_INJECT").unwrap_or_default();
    init_log();
    inject(&inject_name);
    let campaign = Campaign {
        env_prefix: "TERN_CBSIM",
        default_seeds: 2,
        sim_flag: "--cluster-broker",
        name: "cluster-broker",
        inject_name: &inject_name,
    };
    let violating = campaign.run(|seed| {
        one(seed).map(|o| SeedReport {
            acked: o.acked,
            plan: o.plan,
            violations: o.violations,
            log: o.log,
        })
    });
    assert_eq!(violating, 0, "{violating} seeds violated a guarantee");
}

fn init_log() {
    if let Ok(filter) = std::env::var("TERN_CBSIM_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .try_init();
    }
}
