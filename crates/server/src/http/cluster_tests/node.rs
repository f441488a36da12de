//! [`NodeControl`](crate::http::cluster_node)'s membership steps against real tern-raft nodes
//! on loopback: a learner is added, waited for on status changes, and promoted; a learner that
//! never catches up is left a learner with a 503 that says so; the engine's lack of leader
//! transfer answers 501 through the HTTP error mapping.

use std::time::Duration;

use axum::http::StatusCode;
use axum::response::IntoResponse;
use bytes::Bytes;
use tempfile::TempDir;
use tern_raft::{Applier, ApplyError, Consensus, LogIndex, NodeConfig, RaftNode};
use tokio::net::TcpListener;

use super::*;
use crate::http::cluster_node::add_and_promote;

/// Bound on the waits for what must happen (a loaded machine; conditions, not speed).
const MUST_WAIT: Duration = Duration::from_secs(60);

/// An application state of nothing: these tests look at membership only.
struct Nothing;

impl Applier for Nothing {
    fn apply(&mut self, _index: LogIndex, _ops: &[Bytes]) -> Result<(), ApplyError> {
        Ok(())
    }
    fn snapshot(&mut self) -> Result<Vec<u8>, ApplyError> {
        Ok(Vec::new())
    }
    fn install_snapshot(&mut self, _index: LogIndex, _data: &[u8]) -> Result<(), ApplyError> {
        Ok(())
    }

    /// This state outlives restarts by itself (it stands for state kept with its own
    /// applied point): nothing to make durable.
    fn persist(&mut self) -> Result<(), ApplyError> {
        Ok(())
    }
}

/// Starts node `id` on `listener`; the initial voters are `voters`.
async fn start(
    id: u64,
    listener: TcpListener,
    voters: &[(NodeId, SocketAddr)],
    dir: &TempDir,
) -> Arc<RaftNode> {
    let bind = listener.local_addr().expect("address");
    let mut config = NodeConfig::new(NodeId(id), bind, voters.to_vec(), dir.path().into());
    // Slower than the defaults: a loaded test machine must not elect on every hiccup.
    config.heartbeat_interval_ms = 100;
    config.election_timeout_min_ms = 800;
    config.election_timeout_max_ms = 1600;
    let node = RaftNode::start_on(config, listener, Box::new(Nothing), None)
        .await
        .expect("start node");
    Arc::new(node)
}

async fn loopback() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").await.expect("bind")
}

/// Waits until `node` leads (a one-voter cluster elects itself).
async fn leads(node: &RaftNode) {
    let mut changes = node.status_changes();
    let wait = async {
        while node.status().role != Role::Leader {
            assert!(changes.changed().await, "the node stopped");
        }
    };
    tokio::time::timeout(MUST_WAIT, wait)
        .await
        .expect("node 1 never led");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_is_added_waited_for_and_promoted() {
    let dirs = [TempDir::new().expect("dir"), TempDir::new().expect("dir")];
    let (l1, l2) = (loopback().await, loopback().await);
    let (a1, a2) = (l1.local_addr().expect("a1"), l2.local_addr().expect("a2"));
    let voters = [(NodeId(1), a1)];
    let leader = start(1, l1, &voters, &dirs[0]).await;
    leads(&leader).await;
    for k in 0..20u8 {
        leader
            .propose(vec![Bytes::from(vec![k])])
            .await
            .expect("propose");
    }
    // Node 2 is not among the initial voters: it waits to be added.
    let spare = start(2, l2, &voters, &dirs[1]).await;
    add_and_promote(leader.clone(), NodeId(2), a2, MUST_WAIT)
        .await
        .expect("added and promoted");
    let status = leader.status();
    assert_eq!(status.voters, vec![NodeId(1), NodeId(2)]);
    assert!(status.learners.is_empty(), "{status:?}");
    let members: Vec<_> = leader
        .members()
        .into_iter()
        .map(|m| (m.id, m.addr))
        .collect();
    assert_eq!(members, vec![(NodeId(1), Some(a1)), (NodeId(2), Some(a2))]);
    // Node 2 ran until here.
    drop(spare);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_that_never_catches_up_stays_a_learner_and_says_so() {
    let dir = TempDir::new().expect("dir");
    let l1 = loopback().await;
    let voters = [(NodeId(1), l1.local_addr().expect("a1"))];
    let leader = start(1, l1, &voters, &dir).await;
    leads(&leader).await;
    // Nobody listens there: the learner never receives the log.
    let gone = loopback().await;
    let nowhere = gone.local_addr().expect("address");
    drop(gone);
    let error = add_and_promote(
        leader.clone(),
        NodeId(3),
        nowhere,
        Duration::from_millis(500),
    )
    .await
    .expect_err("cannot catch up");
    let shown = error.to_string();
    assert!(shown.contains("stays a learner"), "{shown}");
    assert_eq!(
        error.into_response().status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    let status = leader.status();
    assert_eq!(
        (status.voters, status.learners),
        (vec![NodeId(1)], vec![NodeId(3)])
    );
    // Removing it; a transfer to a node that is no voter is a conflict (409).
    leader.remove(NodeId(3)).await.expect("remove the learner");
    assert!(leader.status().learners.is_empty());
    let transfer: ClusterActionError = leader
        .transfer_leader(NodeId(3))
        .await
        .expect_err("not a voter")
        .into();
    assert_eq!(transfer.into_response().status(), StatusCode::CONFLICT);
}
