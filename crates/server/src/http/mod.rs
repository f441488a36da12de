//! The admin HTTP listener (`[http]`, `--http ADDR`), on the broker's tokio runtime:
//! - `GET /metrics` (Prometheus text), `GET /healthz` (the process is up), `GET /readyz`
//!   (recovery done and the MQTT listener open: 503 before);
//! - `/api/v1/...` JSON lists and actions ([`api`]);
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
pub mod config;

use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use tern_broker::Broker;
use tern_broker::ListenerContext;
use tokio::net::TcpListener;

pub use config::{HttpSection, HttpSettings};

/// The dashboard page (HTML, CSS and JS in one file, no external resources).
const DASHBOARD_HTML: &str = include_str!("dashboard.html");

/// What the handlers share.
pub struct HttpState {
    settings: HttpSettings,
    /// Set once recovery is done and the MQTT listener is bound.
    served: OnceLock<Served>,
}

struct Served {
    broker: Broker,
    /// The MQTT listeners: one sample each of the connections gauge.
    listeners: Vec<Arc<ListenerContext>>,
}

impl HttpState {
    /// Hands the broker to the HTTP side once it is built and its listener bound.
    pub fn set_broker(&self, broker: Broker, listeners: Vec<Arc<ListenerContext>>) {
        let _ = self.served.set(Served { broker, listeners });
    }

    fn broker(&self) -> Result<&Broker, ApiError> {
        self.served
            .get()
            .map(|s| &s.broker)
            .ok_or_else(|| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the broker is starting"))
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
    let state = Arc::new(HttpState {
        settings,
        served: OnceLock::new(),
    });
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

async fn readyz(State(state): State<Arc<HttpState>>) -> Response {
    let ready = state.served.get().is_some_and(|s| s.broker.is_ready());
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(serde_json::json!({ "ready": ready }))).into_response()
}

async fn metrics(State(state): State<Arc<HttpState>>) -> Response {
    let Some(served) = state.served.get() else {
        return error(StatusCode::SERVICE_UNAVAILABLE, "the broker is starting");
    };
    let text = served.broker.metrics_text(&served.listeners);
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
