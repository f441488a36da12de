//! The transport is injectable: three nodes started with `RaftNode::start_with` on an
//! in-process network (what a turmoil simulator will provide), answering through
//! `RaftNode::handle`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use openraft::BasicNode;
use openraft::error::{InstallSnapshotError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use tern_raft::network::{Request, Response};
use tern_raft::types::TypeConfig;
use tern_raft::{Consensus, NodeConfig, NodeId, RaftNode, Role};

use crate::harness::{Applied, Recorder, id, op, wait_until};

/// The nodes reachable on the in-process network.
type Registry = Arc<Mutex<HashMap<NodeId, Arc<RaftNode>>>>;

struct LocalNet(Registry);

struct LocalClient {
    reg: Registry,
    target: NodeId,
}

impl RaftNetworkFactory<TypeConfig> for LocalNet {
    type Network = LocalClient;

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> LocalClient {
        LocalClient {
            reg: self.0.clone(),
            target,
        }
    }
}

fn down() -> Unreachable {
    Unreachable::new(&std::io::Error::other("peer down"))
}

impl LocalClient {
    async fn call(&self, req: Request) -> Result<Response, Unreachable> {
        let node = self.reg.lock().unwrap().get(&self.target).cloned();
        match node {
            Some(n) => Ok(n.handle(req).await),
            None => Err(down()),
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
    let reg = Registry::default();
    // Addresses are names only here: nothing binds them.
    let addrs: Vec<SocketAddr> = (0..3)
        .map(|i| format!("127.0.0.1:{}", 1 + i).parse().unwrap())
        .collect();
    let peers: Vec<_> = (0..3).map(|i| (id(i), addrs[i])).collect();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let applied: Vec<Applied> = (0..3).map(|_| Applied::default()).collect();
    // Highest id first: the lowest forms the cluster once the others are there to vote.
    for i in (0..3).rev() {
        let mut cfg = NodeConfig::new(id(i), addrs[i], peers.clone(), dirs[i].path().into());
        cfg.heartbeat_interval_ms = 100;
        cfg.election_timeout_min_ms = 800;
        cfg.election_timeout_max_ms = 1600;
        let node = RaftNode::start_with(
            cfg,
            Box::new(Recorder(applied[i].clone())),
            LocalNet(reg.clone()),
            None,
        )
        .await
        .expect("start");
        reg.lock().unwrap().insert(id(i), Arc::new(node));
    }
    let node = |i: usize| reg.lock().unwrap()[&id(i)].clone();
    let leader = wait_until("a leader", || {
        (0..3).find(|&i| node(i).status().role == Role::Leader)
    })
    .await;
    node(leader)
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
