//! The simulated network of the cluster simulators (tern-raft's `tests/sim`, at the
//! consensus layer, and tern-cluster's `tests/broker_sim`, the broker on top; feature `sim`): every RPC is a message that a seeded RNG delays (so messages
//! overtake one another), drops, or holds while an endpoint is paused; partitions cut links.
//! It also watches the traffic for the checker: which vote each node has answered a candidate
//! with (a vote a node has shown must survive its power loss), and who sent AppendEntries as
//! leader of which term.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::network::{Request, Response, handle};
use crate::types::{NodeId, Raft, TypeConfig, Vote};
use openraft::BasicNode;
use openraft::error::{InstallSnapshotError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use tern_store::sim::SimRng;

/// What the fault plan sets, read by every message.
#[derive(Default)]
pub struct Links {
    /// The side of a partition each node is on (absent: side 0); messages cross no sides.
    pub side: BTreeMap<NodeId, u8>,
    /// Paused nodes: their messages wait until they resume.
    pub paused: BTreeMap<NodeId, bool>,
    /// Chance that a message is lost (per direction), in percent.
    pub drop_pct: u64,
    /// Longest one-way delay, in ms.
    pub max_delay_ms: u64,
    /// Shortest one-way delay, in ms (a long link: every message takes at least this; the
    /// delay is then drawn up to `max_delay_ms` or equals this if that is smaller).
    pub min_delay_ms: u64,
}

/// What the network saw, for the checker.
#[derive(Default)]
pub struct Seen {
    /// Term -> the nodes that sent AppendEntries as its leader. openraft 0.9 (without its
    /// `single-term-leader` feature, as tern-raft builds it) identifies a leader by (term,
    /// node id): several leaders in one term are legal there, one per node id.
    pub leaders: BTreeMap<u64, Vec<NodeId>>,
    /// Per node, the highest vote it answered a VoteRequest with (delivered to the candidate),
    /// in openraft's order of votes.
    pub votes_shown: BTreeMap<NodeId, Vote>,
    pub messages: u64,
    pub dropped: u64,
}

#[derive(Clone)]
pub struct Net {
    pub handlers: Arc<Mutex<BTreeMap<NodeId, Raft>>>,
    pub links: Arc<Mutex<Links>>,
    pub seen: Arc<Mutex<Seen>>,
    rng: Arc<Mutex<SimRng>>,
}

fn down(why: &str) -> Unreachable {
    Unreachable::new(&std::io::Error::other(why.to_string()))
}

impl Net {
    pub fn new(seed: u64) -> Net {
        Net {
            handlers: Arc::default(),
            links: Arc::default(),
            seen: Arc::default(),
            rng: Arc::new(Mutex::new(SimRng::keyed(&[seed, 0x6e6574]))),
        }
    }

    fn linked(&self, a: NodeId, b: NodeId) -> bool {
        let l = self.links.lock().unwrap();
        l.side.get(&a).copied().unwrap_or(0) == l.side.get(&b).copied().unwrap_or(0)
    }

    fn paused(&self, n: NodeId) -> bool {
        self.links
            .lock()
            .unwrap()
            .paused
            .get(&n)
            .copied()
            .unwrap_or(false)
    }

    /// One direction of a message: delay, hold while an end is paused, maybe drop.
    async fn travel(&self, from: NodeId, to: NodeId) -> Result<(), Unreachable> {
        let (delay_ms, lost) = {
            let l = self.links.lock().unwrap();
            let mut r = self.rng.lock().unwrap();
            let spread = l.max_delay_ms.saturating_sub(l.min_delay_ms);
            let delay = l.min_delay_ms + r.below(spread + 1);
            (delay, r.below(100) < l.drop_pct)
        };
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        while self.paused(from) || self.paused(to) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut seen = self.seen.lock().unwrap();
        seen.messages += 1;
        if lost || !self.linked(from, to) {
            seen.dropped += 1;
            return Err(down("lost"));
        }
        Ok(())
    }

    async fn call(&self, from: NodeId, to: NodeId, req: Request) -> Result<Response, Unreachable> {
        self.travel(from, to).await?;
        let raft = self.handlers.lock().unwrap().get(&to).cloned();
        let Some(raft) = raft else {
            // Nothing listens: a refused connection, after a little while.
            tokio::time::sleep(Duration::from_millis(10)).await;
            return Err(down("peer down"));
        };
        let resp = handle(&raft, req).await;
        self.travel(to, from).await?;
        Ok(resp)
    }
}

pub struct NetFactory {
    pub net: Net,
    pub me: NodeId,
}

pub struct Client {
    net: Net,
    me: NodeId,
    target: NodeId,
}

impl RaftNetworkFactory<TypeConfig> for NetFactory {
    type Network = Client;

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> Client {
        Client {
            net: self.net.clone(),
            me: self.me,
            target,
        }
    }
}

type E = RaftError<NodeId>;

impl RaftNetwork<TypeConfig> for Client {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _o: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, E>> {
        {
            let term = rpc.vote.leader_id().term;
            let mut seen = self.net.seen.lock().unwrap();
            let l = seen.leaders.entry(term).or_default();
            if !l.contains(&self.me) {
                l.push(self.me);
            }
        }
        match self
            .net
            .call(self.me, self.target, Request::Append(rpc))
            .await?
        {
            Response::Append(r) => r.map_err(|e| RemoteError::new(self.target, e).into()),
            _ => Err(down("wrong response").into()),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        _o: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, E>> {
        match self
            .net
            .call(self.me, self.target, Request::Vote(rpc))
            .await?
        {
            Response::Vote(Ok(r)) => {
                let mut seen = self.net.seen.lock().unwrap();
                // openraft 0.9's votes are totally ordered (term, then node id, then
                // committed): the highest one shown is what the node's disk must not be behind.
                let shown = seen.votes_shown.entry(self.target).or_insert(r.vote);
                if r.vote > *shown {
                    *shown = r.vote;
                }
                Ok(r)
            }
            Response::Vote(Err(e)) => Err(RemoteError::new(self.target, e).into()),
            _ => Err(down("wrong response").into()),
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
        match self
            .net
            .call(self.me, self.target, Request::Snapshot(rpc))
            .await?
        {
            Response::Snapshot(r) => r.map_err(|e| RemoteError::new(self.target, e).into()),
            _ => Err(down("wrong response").into()),
        }
    }
}
