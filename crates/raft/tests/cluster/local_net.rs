//! The transport is injectable: three nodes started with `RaftNode::start_with` on the
//! simulators' in-process network (`tern_raft::sim_net`), answering through
//! `network::handle` on `RaftNode::peer_handler`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tern_raft::sim_net::NetFactory;
use tern_raft::{Consensus, ConsensusError, NodeConfig, RaftNode, Role};

use crate::harness::{Applied, Recorder, id, op, wait_until};

/// Three nodes on the simulators' in-process network (`tern_raft::sim_net`, without delays
/// or losses here); a cut puts a node on a side of its own.
#[derive(Clone)]
struct Net {
    sim: tern_raft::sim_net::Net,
    nodes: Arc<Mutex<HashMap<usize, Arc<RaftNode>>>>,
}

impl Net {
    fn new() -> Net {
        Net {
            sim: tern_raft::sim_net::Net::new(0),
            nodes: Arc::default(),
        }
    }

    fn node(&self, i: usize) -> Arc<RaftNode> {
        self.nodes.lock().unwrap()[&i].clone()
    }

    fn cut(&self, i: usize, cut: bool) {
        let mut links = self.sim.links.lock().unwrap();
        if cut {
            links.side.insert(id(i), 1);
        } else {
            links.side.clear();
        }
    }

    /// Starts three nodes on this network; returns what each applies.
    async fn start_three(&self, dirs: &[tempfile::TempDir]) -> Vec<Applied> {
        // Addresses are names only here: nothing binds them.
        let addrs: Vec<SocketAddr> = (0..3)
            .map(|i| format!("127.0.0.1:{}", 1 + i).parse().unwrap())
            .collect();
        let peers: Vec<_> = (0..3).map(|i| (id(i), addrs[i])).collect();
        let applied: Vec<Applied> = (0..3).map(|_| Applied::default()).collect();
        // Highest id first: the lowest forms the cluster once the others are there to vote.
        for i in (0..3).rev() {
            let mut cfg = NodeConfig::new(id(i), addrs[i], peers.clone(), dirs[i].path().into());
            cfg.heartbeat_interval_ms = 100;
            cfg.election_timeout_min_ms = 800;
            cfg.election_timeout_max_ms = 1600;
            let net = NetFactory {
                net: self.sim.clone(),
                me: id(i),
            };
            let node = RaftNode::start_with(cfg, Box::new(Recorder(applied[i].clone())), net, None)
                .await
                .expect("start");
            self.sim
                .handlers
                .lock()
                .unwrap()
                .insert(id(i), node.peer_handler());
            self.nodes.lock().unwrap().insert(i, Arc::new(node));
        }
        applied
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nodes_on_an_injected_network_form_a_cluster_and_commit() {
    let net = Net::new();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let applied = net.start_three(&dirs).await;
    let leader = wait_until("a leader", || {
        (0..3).find(|&i| net.node(i).status().role == Role::Leader)
    })
    .await;
    net.node(leader)
        .propose(vec![op("over the injected network")])
        .await
        .expect("propose");
    for a in &applied {
        wait_until("every node applies", || {
            (a.lock().unwrap().len() == 1).then_some(())
        })
        .await;
    }
}

/// A leader cut off from the others cannot commit; they elect another. When the cut heals,
/// the old leader's uncommitted entry is truncated from its log (a conflicting suffix), its
/// proposal fails, and no node ever applies it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_isolated_leaders_uncommitted_entry_is_never_applied_and_is_truncated() {
    let net = Net::new();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let applied = net.start_three(&dirs).await;
    let ops = |i: usize| -> Vec<Bytes> {
        applied[i]
            .lock()
            .unwrap()
            .iter()
            .flat_map(|(_, o)| o.clone())
            .collect()
    };
    let old = wait_until("a leader", || {
        (0..3).find(|&i| net.node(i).status().role == Role::Leader)
    })
    .await;
    net.node(old).propose(vec![op("a")]).await.expect("propose");

    net.cut(old, true);
    let lost = {
        let node = net.node(old);
        tokio::spawn(async move { node.propose(vec![op("lost")]).await })
    };
    let new = wait_until("the others elect a new leader", || {
        (0..3).find(|&i| i != old && net.node(i).status().role == Role::Leader)
    })
    .await;
    net.node(new)
        .propose(vec![op("b")])
        .await
        .expect("propose on the majority side");
    assert!(
        !lost.is_finished(),
        "the cut-off leader completed a proposal"
    );

    net.cut(old, false);
    let outcome = tokio::time::timeout(crate::harness::WAIT_LIMIT, lost)
        .await
        .expect("the old leader answers once it hears of the new term")
        .expect("task");
    assert!(
        matches!(outcome, Err(ConsensusError::NotLeader { .. })),
        "want NotLeader, got {outcome:?}"
    );
    for i in 0..3 {
        wait_until("every node converges on the majority's log", || {
            (ops(i) == vec![op("a"), op("b")]).then_some(())
        })
        .await;
    }
}
