//! [`ClusterControl`] for a running `tern_cluster::ClusterNode`: what `tern serve` with
//! `[cluster]` hands to `HttpState::set_cluster`.
//!
//! Adding a member is the two steps of issue 23 §5: the learner is added (it receives the log
//! and snapshots, and does not vote), then promoted once it is at most
//! [`PROMOTE_MAX_LAG_ENTRIES`] behind, waited for on the node's status changes (no polling),
//! for at most [`CATCH_UP_MAX_WAIT_S`]. A request that gives up (or is dropped by its client)
//! leaves a learner; sending the same request again resumes it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tern_cluster::ClusterNode;
use tern_raft::consensus::PROMOTE_MAX_LAG_ENTRIES;
use tern_raft::{ClusterStatus, Consensus, ConsensusError, NodeId, RaftNode, Role};

use super::cluster::{ClusterActionError, ClusterControl, ClusterResult};

/// Longest wait for a new learner to catch up before its promotion (a snapshot of a large
/// store over a slow link takes minutes).
pub const CATCH_UP_MAX_WAIT_S: u64 = 600;

/// `ClusterNode::run`'s `started` hook: hands the node to the HTTP side, if there is one.
pub fn attach(http: Option<&super::HttpState>, node: ClusterNode) {
    if let Some(http) = http {
        http.set_cluster(Arc::new(NodeControl::new(node)));
    }
}

/// The HTTP side's handle on this node's cluster.
pub struct NodeControl {
    node: ClusterNode,
}

impl NodeControl {
    pub fn new(node: ClusterNode) -> NodeControl {
        NodeControl { node }
    }

    fn raft(&self) -> Arc<RaftNode> {
        self.node.raft().clone()
    }
}

impl ClusterControl for NodeControl {
    fn status(&self) -> ClusterStatus {
        self.node.status()
    }

    fn member_addrs(&self) -> Vec<(NodeId, SocketAddr)> {
        self.node
            .raft()
            .members()
            .into_iter()
            .filter_map(|m| m.addr.map(|addr| (m.id, addr)))
            .collect()
    }

    fn forwarded_connections(&self) -> u64 {
        self.node.forwarded_connections()
    }

    fn refused_connections(&self) -> tern_cluster::RefusedConnections {
        self.node.refused_connections()
    }

    fn add_member(&self, id: NodeId, addr: SocketAddr) -> BoxFuture<'static, ClusterResult> {
        let wait = Duration::from_secs(CATCH_UP_MAX_WAIT_S);
        Box::pin(add_and_promote(self.raft(), id, addr, wait))
    }

    fn remove_member(&self, id: NodeId) -> BoxFuture<'static, ClusterResult> {
        let raft = self.raft();
        Box::pin(async move { Ok(raft.remove(id).await?) })
    }

    fn transfer_leader(&self, to: NodeId) -> BoxFuture<'static, ClusterResult> {
        let node = self.node.clone();
        Box::pin(async move {
            node.transfer_leader(to).await.map_err(|e| match e {
                tern_cluster::ClusterError::Consensus(c) => c.into(),
                other => ClusterActionError::Internal(other.to_string()),
            })
        })
    }
}

/// Adds `id` as a learner, waits (at most `max_wait`) until it has caught up, promotes it.
pub(super) async fn add_and_promote(
    raft: Arc<RaftNode>,
    id: NodeId,
    addr: SocketAddr,
    max_wait: Duration,
) -> ClusterResult {
    raft.add_learner(id, addr).await?;
    let deadline = tokio::time::Instant::now() + max_wait;
    loop {
        // Only the wait is bounded: a promotion once begun is a membership change in the
        // log, which completes or fails on its own.
        tokio::time::timeout_at(deadline, caught_up(&raft, id))
            .await
            .map_err(|_| {
                ClusterActionError::Unavailable(format!(
                    "node {id} was added as a learner but did not catch up within {} s; it \
                     stays a learner: send the request again to go on waiting, or remove it",
                    max_wait.as_secs_f64()
                ))
            })??;
        // The lag may grow again between the look and the promotion (under load): the
        // promotion is refused then, and the wait resumes.
        match raft.promote(id).await {
            Err(ConsensusError::Membership(why)) if !is_caught_up(&raft.status(), id) => {
                tracing::debug!(%id, %why, "cluster: the learner fell behind before its promotion");
            }
            result => return Ok(result?),
        }
    }
}

/// The leader has heard from peer `id` (a matched index), and it lacks at most
/// [`PROMOTE_MAX_LAG_ENTRIES`]. The match is required: a learner never reached "lacks" only
/// the few entries of a young log, and promoting it would make a voter of a node that is
/// not there (with one voter before, a cluster that cannot commit any more).
fn is_caught_up(status: &ClusterStatus, id: NodeId) -> bool {
    status.replication.iter().any(|p| {
        p.id == id && p.matched_index.is_some() && p.lag_entries <= PROMOTE_MAX_LAG_ENTRIES
    })
}

/// Resolves once learner `id` is close enough to the leader's log to be promoted; fails if
/// this node stops leading or stops.
async fn caught_up(raft: &RaftNode, id: NodeId) -> ClusterResult {
    // Subscribed before the first look: a change between the look and the wait still wakes.
    let mut changes = raft.status_changes();
    loop {
        let status = raft.status();
        if status.role != Role::Leader {
            return Err(ClusterActionError::NotLeader {
                leader: status.leader,
            });
        }
        if is_caught_up(&status, id) {
            return Ok(());
        }
        if !changes.changed().await {
            return Err(ClusterActionError::Unavailable(
                "the consensus node stopped".into(),
            ));
        }
    }
}
