//! The admin HTTP listener (`[http]`, `--http ADDR`), on the broker's tokio runtime:
//! - `GET /metrics` (Prometheus text), `GET /healthz` (the process is up), `GET /readyz`
//!   (recovery done and the MQTT listener open: 503 before);
//! - `/api/v1/...` JSON lists and actions ([`api`]);
//! - with `[cluster]` (`HttpState::set_cluster`): `/api/v1/cluster` and its actions
//!   ([`cluster`]), `tern_cluster_*` families on `/metrics` ([`cluster_metrics`]), and
//!   `/readyz` asks the cluster instead of the broker (a follower runs no broker);
//! - `GET /` the dashboard, embedded in the binary (`dashboard.html`).
//!
//! It starts before the store is recovered, so that `/healthz` answers and `/readyz` says
//! "not yet" during a long recovery; until then the other routes answer 503.
//!
//! # Invariants
//! - Actions (DELETE, POST) always need `Authorization: Bearer <token>`; with no token
//!   configured they are refused. On a non-loopback bind every request needs it except `/`,
//!   `/healthz` and `/readyz`, which reveal nothing (the page asks for the token, probes send
//!   no headers).
//! - Every error is a JSON body `{"error": "..."}` with its status.

mod api;
pub mod cluster;
mod cluster_metrics;
pub mod cluster_node;
#[cfg(test)]
mod cluster_tests;
pub mod config;

use std::sync::{Arc, OnceLock};

use parking_lot::RwLock;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use tern_broker::Broker;
use tern_broker::ListenerContext;
use tokio::net::TcpListener;

pub use cluster::ClusterControl;
pub use config::{HttpSection, HttpSettings};

/// The dashboard page (HTML, CSS and JS in one file, no external resources).
const DASHBOARD_HTML: &str = include_str!("dashboard.html");

/// What the handlers share.
pub struct HttpState {
    settings: HttpSettings,
    /// The broker serving now: set once recovery is done and the MQTT listener is bound. In a
    /// cluster it comes and goes with leadership (a new broker each term this node leads).
    served: RwLock<Option<Arc<Served>>>,
    /// Set once when the node is in a cluster; never on a single node.
    cluster: OnceLock<Arc<dyn ClusterControl>>,
    /// Set when the process runs with `[cluster]`, before the node is handed over: until
    /// then the cluster routes answer 503 ("starting"), not 404 ("no cluster").
    cluster_expected: std::sync::atomic::AtomicBool,
}

struct Served {
    broker: Broker,
    /// The MQTT listeners: one sample each of the connections gauge.
    listeners: Vec<Arc<ListenerContext>>,
}

impl HttpState {
    /// Hands the broker to the HTTP side once it is built and its listener bound; replaces
    /// the one set before, if any (a cluster node's broker of an earlier term).
    pub fn set_broker(&self, broker: Broker, listeners: Vec<Arc<ListenerContext>>) {
        *self.served.write() = Some(Arc::new(Served { broker, listeners }));
    }

    /// Forgets the broker: a cluster node stopped leading and its broker stopped. The lists
    /// answer 503 and `/metrics` shows the cluster's families alone until the next
    /// [`set_broker`](Self::set_broker).
    pub fn clear_broker(&self) {
        *self.served.write() = None;
    }

    /// The broker serving now, if any (cloned out: no lock is held across an await).
    fn served(&self) -> Option<Arc<Served>> {
        self.served.read().clone()
    }

    /// Hands the cluster this node belongs to to the HTTP side (once; later calls are
    /// ignored). From then on `/readyz` asks the cluster, not the broker.
    /// This process runs with `[cluster]`; its node comes with [`HttpState::set_cluster`].
    pub fn expect_cluster(&self) {
        self.cluster_expected
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn set_cluster(&self, cluster: Arc<dyn ClusterControl>) {
        let _ = self.cluster.set(cluster);
    }

    fn new(settings: HttpSettings) -> HttpState {
        HttpState {
            settings,
            served: RwLock::new(None),
            cluster: OnceLock::new(),
            cluster_expected: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn broker(&self) -> Result<Broker, ApiError> {
        self.served().map(|s| s.broker.clone()).ok_or_else(|| {
            let message = match self.cluster.get().map(|c| c.status()) {
                Some(s) if s.role != tern_raft::Role::Leader => format!(
                    "this node runs no broker: it is a {} and the leader (node {}) serves the lists",
                    cluster::role_name(s.role),
                    s.leader.map_or("unknown".to_string(), |l| l.to_string()),
                ),
                _ => "the broker is starting".to_string(),
            };
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message)
        })
    }
}

/// An error answer: its status and a JSON body `{"error": message}`.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        error(self.status, &self.message)
    }
}

/// A JSON error response.
pub(crate) fn error(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(serde_json::json!({ "error": message }))).into_response()
}

/// Binds the HTTP listener and serves it on the current runtime until the process ends.
/// Returns the shared state (to hand the broker over) and the bound address.
pub async fn start(
    settings: HttpSettings,
) -> anyhow::Result<(Arc<HttpState>, std::net::SocketAddr)> {
    use anyhow::Context;
    let listener = TcpListener::bind(settings.bind)
        .await
        .with_context(|| format!("cannot listen on {} (http)", settings.bind))?;
    let local = listener
        .local_addr()
        .context("http listener has no address")?;
    let state = Arc::new(HttpState::new(settings));
    let app = router(state.clone());
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::error!(%error, "http listener failed");
        }
    });
    Ok((state, local))
}

fn router(state: Arc<HttpState>) -> Router {
    Router::new()
        .route("/", get(dashboard))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .merge(api::routes())
        .merge(cluster::routes())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), authorize))
        .with_state(state)
}

/// The token rules of the module doc.
async fn authorize(State(state): State<Arc<HttpState>>, request: Request, next: Next) -> Response {
    let action = request.method() == Method::DELETE || request.method() == Method::POST;
    let open_path = matches!(request.uri().path(), "/" | "/healthz" | "/readyz");
    let needs_token = action || (state.settings.token_for_reads() && !open_path);
    if needs_token {
        let Some(token) = &state.settings.token else {
            return error(
                StatusCode::FORBIDDEN,
                "actions are disabled: set [http] token to enable them",
            );
        };
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if !given.is_some_and(|g| constant_time_eq(g.as_bytes(), token.as_bytes())) {
            let mut response = error(
                StatusCode::UNAUTHORIZED,
                "missing or wrong bearer token (Authorization: Bearer <token>)",
            );
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
            return response;
        }
    }
    next.run(request).await
}

/// Compares without an early exit on the first differing byte (the length is not secret).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn dashboard() -> Html<&'static str> {
    Html(DASHBOARD_HTML)
}

async fn healthz() -> Response {
    (
        StatusCode::OK,
        axum::Json(serde_json::json!({ "status": "ok" })),
    )
        .into_response()
}

/// Single node: the broker accepts. In a cluster: [`cluster::readiness`], whatever the broker
/// says.
async fn readyz(State(state): State<Arc<HttpState>>) -> Response {
    if let Some(cluster) = state.cluster.get() {
        let (ready, body) = cluster::readiness(cluster.as_ref());
        let status = if ready {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        return (status, axum::Json(body)).into_response();
    }
    let ready = state.served().is_some_and(|s| s.broker.is_ready());
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(serde_json::json!({ "ready": ready }))).into_response()
}

/// The broker's families, then the cluster's. A follower has no broker: its page is the
/// cluster's families alone. A single node without its broker yet answers 503.
async fn metrics(State(state): State<Arc<HttpState>>) -> Response {
    let served = state.served();
    let cluster = state.cluster.get();
    if served.is_none() && cluster.is_none() {
        return error(StatusCode::SERVICE_UNAVAILABLE, "the broker is starting");
    }
    let mut text = served.map_or_else(String::new, |s| s.broker.metrics_text(&s.listeners));
    if let Some(cluster) = cluster {
        text.push_str(&cluster_metrics::render(cluster.as_ref()));
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

async fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "no such route")
}

async fn method_not_allowed() -> Response {
    error(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed on this route",
    )
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn token_comparison() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }
}
