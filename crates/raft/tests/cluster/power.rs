//! Acknowledge only what a majority has on disk: after a power loss of every node at once,
//! each acknowledged batch is in the logs of a majority.

use std::collections::BTreeMap;

use bytes::Bytes;
use openraft::{EntryPayload, RaftLogReader, storage::RaftLogStorage};
use tern_raft::log_store::LogStore;
use tern_raft::{Consensus, LogIndex};
use tern_store::{Store, SyncPolicy};

use crate::harness::{Cluster, op};

/// The batches in a node's log as its disk holds them (opened as the next boot would).
async fn log_on_disk(c: &Cluster, i: usize) -> BTreeMap<LogIndex, Vec<Bytes>> {
    let disk = &c.disks.as_ref().expect("sim disks")[i];
    let store = Store::open_with_vfs(c.dirs[i].path(), disk.vfs()).expect("reopen store");
    let mut log = LogStore::open(&store, SyncPolicy::Always).expect("reopen log");
    let last = log.get_log_state().await.expect("state").last_log_id;
    let Some(last) = last else {
        return BTreeMap::new();
    };
    log.try_get_log_entries(0..=last.index)
        .await
        .expect("read log")
        .into_iter()
        .filter_map(|e| match e.payload {
            EntryPayload::Normal(b) => Some((e.log_id.index, b.0)),
            _ => None,
        })
        .collect()
}

/// Under `SyncPolicy::Always` every acknowledged batch survives; the same run with the log
/// under `SyncPolicy::Never` (acknowledging page-cache writes) loses some: checked by hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_acknowledged_batch_is_on_a_majority_of_disks_after_a_cluster_power_loss() {
    for seed in 0..4 {
        let mut c = Cluster::start_sim(3, seed, |cfg| cfg.sync = SyncPolicy::Always).await;
        let leader = c.leader().await;
        let mut acked = Vec::new();
        for k in 0..20 {
            let ops = vec![op(&format!("seed{seed}-w{k}"))];
            let done = c.node(leader).propose(ops.clone()).await.expect("propose");
            acked.push((done.index, ops));
        }
        for d in c.disks.as_ref().expect("sim disks") {
            d.power_loss();
        }
        for i in 0..3 {
            c.kill(i).await;
        }
        let mut logs = Vec::new();
        for i in 0..3 {
            logs.push(log_on_disk(&c, i).await);
        }
        for (index, ops) in &acked {
            let copies = logs.iter().filter(|l| l.get(index) == Some(ops)).count();
            assert!(
                copies >= 2,
                "seed {seed}: acknowledged batch at {index} is on {copies} of 3 disks"
            );
        }
    }
}
