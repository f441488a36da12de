//! The cluster's operator surface (`[cluster]`, issue 23 §5): `GET /api/v1/cluster`, the
//! membership and leadership actions, and what `/readyz` asks of the cluster. The HTTP side
//! sees the cluster only through [`ClusterControl`], so it is tested with a fake
//! (`cluster_tests.rs`) and the cluster crate implements it.
//!
//! # Invariants
//! - Without a cluster set (`HttpState::set_cluster`), every `/api/v1/cluster` route answers
//!   404 `{"error": ...}` and `/readyz` and `/metrics` behave as on a single node.
//! - Input is checked here before it reaches the cluster: ids are `>= 1`, an address is a
//!   dialable `IP:port` (not unspecified, port not 0). The obvious conflicts this node can see
//!   in [`ClusterControl::status`] are refused here with a clear answer (adding a voter
//!   again, a learner at another address or a taken address, removing a stranger,
//!   leadership to a non-voter); the implementation stays the authority, since the membership
//!   may change between that check and the action.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use futures_util::future::BoxFuture;
use serde::Deserialize;
use serde_json::{Value, json};
use tern_raft::{ClusterStatus, ConsensusError, NodeId, Role};

use super::HttpState;

/// What the HTTP layer needs from the cluster this node belongs to.
///
/// Contract for implementations:
/// - [`status`](Self::status), [`member_addrs`](Self::member_addrs),
///   [`forwarded_connections`](Self::forwarded_connections) and
///   [`refused_connections`](Self::refused_connections) do no I/O and do not block: they
///   are called on every `/readyz`, `/metrics` and `/api/v1/cluster` request.
/// - The actions run on this node and may be called on any node: one that cannot do it here
///   (not the leader) answers [`ClusterActionError::NotLeader`] naming the leader if it knows one,
///   or forwards the action to the leader itself. Their futures complete when the change is
///   committed (a membership change is in the Raft log on a majority), not when it was asked.
/// - [`add_member`](Self::add_member) adds `id` as a learner at `addr`, waits until it has
///   caught up, then promotes it to voter; it completes after the promotion is committed
///   (the HTTP request stays open that long). Called for a learner already at `addr` (a
///   request that gave up or was dropped), it resumes: the wait, then the promotion.
/// - [`transfer_leader`](Self::transfer_leader) answers [`ClusterActionError::Unsupported`] when the
///   consensus engine cannot transfer (openraft 0.9 has no leader transfer).
pub trait ClusterControl: Send + Sync + 'static {
    /// This node's view of the cluster (no I/O).
    fn status(&self) -> ClusterStatus;
    /// The current voters and learners with their cluster (Raft) addresses (no I/O).
    fn member_addrs(&self) -> Vec<(NodeId, SocketAddr)>;
    /// Client connections this node forwarded to the leader since it started (a counter).
    fn forwarded_connections(&self) -> u64;
    /// Client connections this node closed at a limit since it started (counters).
    fn refused_connections(&self) -> tern_cluster::RefusedConnections;
    /// Adds `id` at `addr` as a learner, then promotes it once it has caught up.
    fn add_member(&self, id: NodeId, addr: SocketAddr) -> BoxFuture<'static, ClusterResult>;
    /// Removes the voter or learner `id` from the cluster.
    fn remove_member(&self, id: NodeId) -> BoxFuture<'static, ClusterResult>;
    /// Hands leadership to the voter `to`.
    fn transfer_leader(&self, to: NodeId) -> BoxFuture<'static, ClusterResult>;
}

/// What a cluster action answers.
pub type ClusterResult = Result<(), ClusterActionError>;

/// Why a cluster action failed; each maps to one HTTP status ([`ClusterActionError::status`]).
#[derive(Debug, thiserror::Error)]
pub enum ClusterActionError {
    /// A bad argument (400).
    #[error("{0}")]
    Invalid(String),
    /// No such member (404).
    #[error("{0}")]
    NotFound(String),
    /// This node is not the leader and did not forward the action (409; the body names the
    /// leader as `leader_id` when known).
    #[error("this node is not the leader (leader: {})", leader.map_or("unknown".to_string(), |l| format!("node {l}")))]
    NotLeader { leader: Option<NodeId> },
    /// The membership does not allow it (409): a voter already, an address taken, ...
    #[error("{0}")]
    Conflict(String),
    /// The cluster cannot do it now (503): no quorum, the node is stopping.
    #[error("{0}")]
    Unavailable(String),
    /// The consensus engine cannot do it at all (501).
    #[error("{0}")]
    Unsupported(String),
    /// A storage or I/O failure on this node (500).
    #[error("{0}")]
    Internal(String),
}

impl ClusterActionError {
    fn status(&self) -> StatusCode {
        match self {
            ClusterActionError::Invalid(_) => StatusCode::BAD_REQUEST,
            ClusterActionError::NotFound(_) => StatusCode::NOT_FOUND,
            ClusterActionError::NotLeader { .. } | ClusterActionError::Conflict(_) => {
                StatusCode::CONFLICT
            }
            ClusterActionError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ClusterActionError::Unsupported(_) => StatusCode::NOT_IMPLEMENTED,
            ClusterActionError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl From<ConsensusError> for ClusterActionError {
    fn from(e: ConsensusError) -> Self {
        let message = e.to_string();
        match e {
            ConsensusError::NotLeader { leader } => ClusterActionError::NotLeader {
                leader: leader.map(|(id, _)| id),
            },
            ConsensusError::Membership(_) => ClusterActionError::Conflict(message),
            ConsensusError::Unsupported(_) => ClusterActionError::Unsupported(message),
            ConsensusError::Invalid(_) => ClusterActionError::Invalid(message),
            ConsensusError::Shutdown(_) | ConsensusError::TransferTimedOut(_) => {
                ClusterActionError::Unavailable(message)
            }
            ConsensusError::Storage(_)
            | ConsensusError::Io { .. }
            | ConsensusError::DiskLost(_) => ClusterActionError::Internal(message),
        }
    }
}

impl IntoResponse for ClusterActionError {
    fn into_response(self) -> Response {
        let mut body = json!({ "error": self.to_string() });
        if let ClusterActionError::NotLeader { leader } = &self {
            body["leader_id"] = json!(leader.map(|l| l.0));
        }
        (self.status(), Json(body)).into_response()
    }
}

pub(super) fn routes() -> Router<Arc<HttpState>> {
    Router::new()
        .route("/api/v1/cluster", get(cluster))
        .route("/api/v1/cluster/members", post(add_member))
        .route("/api/v1/cluster/members/:id", delete(remove_member))
        .route("/api/v1/cluster/leader", post(transfer_leader))
}

/// `/readyz` in cluster mode: a leader is known and reachable by a quorum. The broker's own
/// readiness is not asked: only the leader runs the MQTT engine, and a follower forwards its
/// clients to the leader, so a follower is ready with no broker at all.
pub(super) fn readiness(cluster: &dyn ClusterControl) -> (bool, Value) {
    let status = cluster.status();
    let quorum = status.quorum_reachable();
    let ready = status.has_leader() && quorum;
    let body = json!({
        "ready": ready,
        "role": role_name(status.role),
        "leader_id": status.leader.map(|l| l.0),
        "quorum_reachable": quorum,
    });
    (ready, body)
}

/// The name of a role in JSON and in the `role` label of `tern_cluster_role`.
pub(super) fn role_name(role: Role) -> &'static str {
    match role {
        Role::Leader => "leader",
        Role::Follower => "follower",
        Role::Candidate => "candidate",
        Role::Learner => "learner",
        Role::Stopped => "stopped",
    }
}

/// Every role, in the order `tern_cluster_role` lists them.
pub(super) const ROLES: [Role; 5] = [
    Role::Leader,
    Role::Follower,
    Role::Candidate,
    Role::Learner,
    Role::Stopped,
];

impl HttpState {
    fn cluster(&self) -> Result<&Arc<dyn ClusterControl>, ClusterActionError> {
        self.cluster.get().ok_or_else(|| {
            if self
                .cluster_expected
                .load(std::sync::atomic::Ordering::Relaxed)
            {
                return ClusterActionError::Unavailable("the cluster node is starting".into());
            }
            ClusterActionError::NotFound(
                "this node runs without [cluster]: there is no cluster to show or change".into(),
            )
        })
    }
}

/// `GET /api/v1/cluster`: the JSON, plus `lag_entries` per member (the leader's
/// count of entries the member lacks, for the dashboard).
async fn cluster(State(state): State<Arc<HttpState>>) -> Result<Json<Value>, ClusterActionError> {
    let cluster = state.cluster()?;
    Ok(Json(cluster_json(
        &cluster.status(),
        &cluster.member_addrs(),
    )))
}

/// The body of `GET /api/v1/cluster`.
///
/// `commit_index`: openraft 0.9's metrics carry no commit index, so it is the applied index,
/// a lower bound of the commit index on every node (only committed entries are applied).
/// `match_index` and `lag_entries` are known on the leader only (null elsewhere); the
/// leader's own are its last log index and 0.
fn cluster_json(status: &ClusterStatus, addrs: &[(NodeId, SocketAddr)]) -> Value {
    let mut ids: Vec<NodeId> = status
        .voters
        .iter()
        .chain(&status.learners)
        .copied()
        .chain(addrs.iter().map(|(id, _)| *id))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    let members: Vec<Value> = ids
        .into_iter()
        .map(|id| member_json(status, addrs, id))
        .collect();
    json!({
        "node_id": status.node_id.0,
        "leader_id": status.leader.map(|l| l.0),
        "term": status.term,
        "role": role_name(status.role),
        "commit_index": status.applied_index,
        "applied_index": status.applied_index,
        "members": members,
    })
}

fn member_json(status: &ClusterStatus, addrs: &[(NodeId, SocketAddr)], id: NodeId) -> Value {
    let addr = addrs
        .iter()
        .find(|(a, _)| *a == id)
        .map(|(_, addr)| addr.to_string());
    let (match_index, lag_entries) = if status.role != Role::Leader {
        (None, None)
    } else if id == status.node_id {
        (status.last_log_index, Some(0))
    } else {
        status
            .replication
            .iter()
            .find(|p| p.id == id)
            .map_or((None, None), |p| (p.matched_index, Some(p.lag_entries)))
    };
    json!({
        "id": id.0,
        "addr": addr,
        "voter": status.voters.contains(&id),
        "match_index": match_index,
        "lag_entries": lag_entries,
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AddMember {
    id: u64,
    addr: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TransferLeader {
    id: u64,
}

fn body<T>(body: Result<Json<T>, JsonRejection>) -> Result<T, ClusterActionError> {
    body.map(|Json(b)| b)
        .map_err(|r| ClusterActionError::Invalid(format!("body: {}", r.body_text())))
}

/// A node id as given: `>= 1` (`[cluster] node_id`'s rule).
fn node_id(id: u64) -> Result<NodeId, ClusterActionError> {
    if id == 0 {
        return Err(ClusterActionError::Invalid(
            "id: node ids start at 1".into(),
        ));
    }
    Ok(NodeId(id))
}

/// A cluster address other nodes can dial.
fn cluster_addr(addr: &str) -> Result<SocketAddr, ClusterActionError> {
    let parsed: SocketAddr = addr.parse().map_err(|_| {
        ClusterActionError::Invalid(format!(
            "addr: `{addr}` is not an address like 127.0.0.1:7004"
        ))
    })?;
    if parsed.ip().is_unspecified() || parsed.port() == 0 {
        return Err(ClusterActionError::Invalid(format!(
            "addr: {parsed} cannot be dialed (give the node's own IP and its [cluster] bind port)"
        )));
    }
    Ok(parsed)
}

async fn add_member(
    State(state): State<Arc<HttpState>>,
    request: Result<Json<AddMember>, JsonRejection>,
) -> Result<Json<Value>, ClusterActionError> {
    let cluster = state.cluster()?;
    let request = body(request)?;
    let id = node_id(request.id)?;
    let addr = cluster_addr(&request.addr)?;
    let status = cluster.status();
    let members = cluster.member_addrs();
    if status.voters.contains(&id) {
        return Err(ClusterActionError::Conflict(format!(
            "node {id} is a voter already"
        )));
    }
    // A learner at the same address is let through: a request dropped while its learner
    // caught up is resumed by sending it again.
    if let Some((other, _)) = members.iter().find(|(o, a)| (*a == addr) != (*o == id)) {
        if *other == id {
            return Err(ClusterActionError::Conflict(format!(
                "node {id} is a learner at another address; remove it first"
            )));
        }
        return Err(ClusterActionError::Conflict(format!(
            "{addr} is node {other}'s address"
        )));
    }
    cluster.add_member(id, addr).await?;
    Ok(Json(json!({ "added": id.0, "addr": addr.to_string() })))
}

async fn remove_member(
    State(state): State<Arc<HttpState>>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ClusterActionError> {
    let cluster = state.cluster()?;
    let Path(id) = id.map_err(|r| ClusterActionError::Invalid(r.body_text()))?;
    let id = id
        .parse::<u64>()
        .map_err(|_| ClusterActionError::Invalid(format!("id: `{id}` is not a node id")))
        .and_then(node_id)?;
    let status = cluster.status();
    if !status.voters.contains(&id) && !status.learners.contains(&id) {
        return Err(ClusterActionError::NotFound(format!(
            "node {id} is not a member"
        )));
    }
    cluster.remove_member(id).await?;
    Ok(Json(json!({ "removed": id.0 })))
}

async fn transfer_leader(
    State(state): State<Arc<HttpState>>,
    request: Result<Json<TransferLeader>, JsonRejection>,
) -> Result<Json<Value>, ClusterActionError> {
    let cluster = state.cluster()?;
    let to = node_id(body(request)?.id)?;
    if !cluster.status().voters.contains(&to) {
        return Err(ClusterActionError::Conflict(format!(
            "node {to} is not a voter: only a voter can lead"
        )));
    }
    cluster.transfer_leader(to).await?;
    Ok(Json(json!({ "leader_id": to.0 })))
}
