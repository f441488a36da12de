//! The cluster's HTTP surface against a fake [`ClusterControl`], the router driven in-process:
//! the JSON of `/api/v1/cluster`, the token rules on its actions, input checks, `/readyz` in
//! both modes, and the `tern_cluster_*` families read by the end-to-end tests' strict
//! Prometheus parser.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use futures_util::future::BoxFuture;
use parking_lot::Mutex;
use serde_json::Value;
use tern_broker::{Broker, BrokerConfig};
use tern_raft::{ClusterStatus, NodeId, PeerReplication, Role};
use tower::ServiceExt;

use super::cluster::{ClusterActionError, ClusterControl, ClusterResult};
use super::{HttpSettings, HttpState, router};

mod actions;
mod browser;
mod node;
mod probes;

#[allow(
    dead_code,
    reason = "the e2e tests' parser, of which these tests use a part"
)]
#[path = "../../../tests/common/prom.rs"]
mod prom;

const TOKEN: &str = "test-token-0123456789";
/// The election timeout the fake reports: an older quorum acknowledgement is a lost quorum.
const QUORUM_ACK_MAX_AGE_MS: u64 = 300;

/// What the fake answers to the next actions.
#[derive(Clone, Copy)]
enum Answer {
    Ok,
    NotLeader(Option<u64>),
    Unavailable,
}

struct Fake {
    status: Mutex<ClusterStatus>,
    addrs: Mutex<Vec<(NodeId, SocketAddr)>>,
    answer: Mutex<Answer>,
    /// The actions that reached the fake, in order.
    calls: Mutex<Vec<String>>,
}

impl Fake {
    fn new(status: ClusterStatus) -> Arc<Fake> {
        let addrs = (1..=3)
            .map(|i| (NodeId(i), addr(&format!("127.0.0.1:700{i}"))))
            .collect();
        Arc::new(Fake {
            status: Mutex::new(status),
            addrs: Mutex::new(addrs),
            answer: Mutex::new(Answer::Ok),
            calls: Mutex::new(Vec::new()),
        })
    }

    fn act(&self, call: String) -> BoxFuture<'static, ClusterResult> {
        self.calls.lock().push(call);
        let result = match *self.answer.lock() {
            Answer::Ok => Ok(()),
            Answer::NotLeader(leader) => Err(ClusterActionError::NotLeader {
                leader: leader.map(NodeId),
            }),
            Answer::Unavailable => Err(ClusterActionError::Unavailable("no quorum".into())),
        };
        Box::pin(async move { result })
    }
}

impl ClusterControl for Fake {
    fn status(&self) -> ClusterStatus {
        self.status.lock().clone()
    }
    fn member_addrs(&self) -> Vec<(NodeId, SocketAddr)> {
        self.addrs.lock().clone()
    }
    fn forwarded_connections(&self) -> u64 {
        7
    }
    fn refused_connections(&self) -> tern_cluster::RefusedConnections {
        tern_cluster::RefusedConnections {
            forwarded_connections: 1,
            forward_queue: 2,
            accept_queue: 3,
        }
    }
    fn add_member(&self, id: NodeId, addr: SocketAddr) -> BoxFuture<'static, ClusterResult> {
        self.act(format!("add {id} {addr}"))
    }
    fn remove_member(&self, id: NodeId) -> BoxFuture<'static, ClusterResult> {
        self.act(format!("remove {id}"))
    }
    fn transfer_leader(&self, to: NodeId) -> BoxFuture<'static, ClusterResult> {
        // What openraft 0.9 gives (tern_raft's transfer_leader), through the From mapping.
        self.calls.lock().push(format!("transfer {to}"));
        let e = tern_raft::ConsensusError::Unsupported("leader transfer: openraft 0.9 has none");
        Box::pin(async move { Err(e.into()) })
    }
}

fn addr(s: &str) -> SocketAddr {
    s.parse().expect("test address")
}

/// Node 1, a follower of node 2 in term 5, voters 1..=3.
fn follower() -> ClusterStatus {
    ClusterStatus {
        node_id: NodeId(1),
        role: Role::Follower,
        term: 5,
        leader: Some(NodeId(2)),
        last_log_index: Some(42),
        applied_index: Some(40),
        snapshot_index: Some(30),
        purged_index: None,
        voters: vec![NodeId(1), NodeId(2), NodeId(3)],
        learners: vec![],
        replication: vec![],
        quorum_ack_age_ms: None,
        elections_started: 2,
        quorum_ack_max_age_ms: QUORUM_ACK_MAX_AGE_MS,
    }
}

/// Node 1 leading voters 1..=3: node 2 has everything, node 3 lags 12 entries.
fn leader(quorum_ack_age_ms: Option<u64>) -> ClusterStatus {
    ClusterStatus {
        role: Role::Leader,
        leader: Some(NodeId(1)),
        applied_index: Some(42),
        replication: vec![
            PeerReplication {
                id: NodeId(3),
                matched_index: Some(30),
                lag_entries: 12,
            },
            PeerReplication {
                id: NodeId(2),
                matched_index: Some(42),
                lag_entries: 0,
            },
        ],
        quorum_ack_age_ms,
        ..follower()
    }
}

/// A candidate of term 6: no leader.
fn candidate() -> ClusterStatus {
    ClusterStatus {
        role: Role::Candidate,
        term: 6,
        leader: None,
        ..follower()
    }
}

fn state(bind: &str, token: Option<&str>) -> Arc<HttpState> {
    Arc::new(HttpState::new(HttpSettings {
        bind: addr(bind),
        token: token.map(Into::into),
    }))
}

/// A loopback HTTP side with the token configured and `fake` as its cluster.
fn app(fake: &Arc<Fake>) -> (Arc<HttpState>, Router) {
    let state = state("127.0.0.1:0", Some(TOKEN));
    state.set_cluster(fake.clone());
    (state.clone(), router(state))
}

struct Answered {
    status: StatusCode,
    body: String,
}

impl Answered {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", self.status, self.body))
    }
}

async fn call(app: &Router, method: &str, path: &str, token: Option<&str>, body: &str) -> Answered {
    let mut request = Request::builder().method(method).uri(path);
    if let Some(token) = token {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    if !body.is_empty() {
        request = request.header(header::CONTENT_TYPE, "application/json");
    }
    let request = request.body(Body::from(body.to_string())).expect("request");
    let response = app.clone().oneshot(request).await.expect("infallible");
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .expect("body");
    let body = String::from_utf8(bytes.to_vec()).expect("UTF-8 body");
    Answered { status, body }
}

async fn get(app: &Router, path: &str) -> Answered {
    call(app, "GET", path, None, "").await
}

async fn post(app: &Router, path: &str, body: &str) -> Answered {
    call(app, "POST", path, Some(TOKEN), body).await
}
