//! The transport is injectable: three nodes started with `RaftNode::start_with` on an
//! in-process network (what a turmoil simulator will provide), answering through
//! `RaftNode::handle`.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use openraft::BasicNode;
use openraft::error::{InstallSnapshotError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use tern_raft::network::{Request, Response};
use tern_raft::types::TypeConfig;
use tern_raft::{Consensus, ConsensusError, NodeConfig, NodeId, RaftNode, Role};

use crate::harness::{Applied, Recorder, id, op, wait_until};

/// The nodes on the in-process network, and those cut off from the others.
#[derive(Clone, Default)]
struct Net {
    nodes: Arc<Mutex<HashMap<NodeId, Arc<RaftNode>>>>,
    cut: Arc<Mutex<HashSet<NodeId>>>,
}

impl Net {
    fn node(&self, i: usize) -> Arc<RaftNode> {
        self.nodes.lock().unwrap()[&id(i)].clone()
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
            let net = LocalNet {
                net: self.clone(),
                me: id(i),
            };
            let node = RaftNode::start_with(cfg, Box::new(Recorder(applied[i].clone())), net, None)
                .await
                .expect("start");
            self.nodes.lock().unwrap().insert(id(i), Arc::new(node));
        }
        applied
    }
}

struct LocalNet {
    net: Net,
    me: NodeId,
}

struct LocalClient {
    net: Net,
    me: NodeId,
    target: NodeId,
}

impl RaftNetworkFactory<TypeConfig> for LocalNet {
    type Network = LocalClient;

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> LocalClient {
        LocalClient {
            net: self.net.clone(),
            me: self.me,
            target,
        }
    }
}

fn down() -> Unreachable {
    Unreachable::new(&std::io::Error::other("peer down"))
}

impl LocalClient {
    async fn call(&self, req: Request) -> Result<Response, Unreachable> {
        let cut = {
            let cut = self.net.cut.lock().unwrap();
            cut.contains(&self.me) || cut.contains(&self.target)
        };
        let node = self.net.nodes.lock().unwrap().get(&self.target).cloned();
        match node {
            Some(n) if !cut => Ok(n.handle(req).await),
            _ => Err(down()),
        }
    }
}

type E = RaftError<NodeId>;

impl RaftNetwork<TypeConfig> for LocalClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _o: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, E>> {
        match self.call(Request::Append(rpc)).await? {
            Response::Append(r) => r.map_err(|e| RemoteError::new(self.target, e).into()),
            _ => Err(down().into()),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        _o: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, E>> {
        match self.call(Request::Vote(rpc)).await? {
            Response::Vote(r) => r.map_err(|e| RemoteError::new(self.target, e).into()),
            _ => Err(down().into()),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        _o: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        match self.call(Request::Snapshot(rpc)).await? {
            Response::Snapshot(r) => r.map_err(|e| RemoteError::new(self.target, e).into()),
            _ => Err(down().into()),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nodes_on_an_injected_network_form_a_cluster_and_commit() {
    let net = Net::default();
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
    let net = Net::default();
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

    net.cut.lock().unwrap().insert(id(old));
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

    net.cut.lock().unwrap().clear();
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
