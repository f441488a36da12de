//! `/api/v1`: JSON lists (paged by `?limit=&after=`, `after` being the previous page's
//! `next_after`) and the actions (token required, see the module doc of `http`).

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::Router;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use serde::Deserialize;
use serde_json::{Value, json};
use tern_broker::Broker;
use tern_broker::{ActionError, Page, StreamStats, page, page_limit};

use super::{ApiError, HttpState};

/// Page size when `limit` is not given.
const DEFAULT_PAGE_LIMIT: usize = 100;

pub fn routes() -> Router<Arc<HttpState>> {
    Router::new()
        .route("/api/v1/clients", get(clients))
        .route("/api/v1/clients/:id", delete(disconnect))
        .route("/api/v1/sessions", get(sessions))
        .route("/api/v1/sessions/:id", delete(remove_session))
        .route("/api/v1/subscriptions", get(subscriptions))
        .route("/api/v1/streams", get(streams))
        .route("/api/v1/streams/:name/purge", post(purge))
        .route("/api/v1/retained", get(retained))
        .route("/api/v1/backup", post(backup))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    limit: Option<usize>,
    after: Option<String>,
    /// Only for `retained`: a topic filter.
    filter: Option<String>,
}

/// The query of a list, or why it could not be parsed.
type ListParams = Result<Query<ListQuery>, QueryRejection>;

fn list_query(query: ListParams) -> Result<ListQuery, ApiError> {
    query
        .map(|Query(q)| q)
        .map_err(|rejection| ApiError::new(StatusCode::BAD_REQUEST, rejection.body_text()))
}

fn unix_ms(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// One page of a broker list (`?limit=&after=`) as JSON, each item through `item`.
fn list<T>(
    state: &HttpState,
    query: ListParams,
    fetch: impl FnOnce(&Broker, Option<&str>, usize) -> Page<T>,
    item: impl Fn(&T) -> Value,
) -> Result<Response, ApiError> {
    let broker = state.broker()?;
    let q = list_query(query)?;
    let page = fetch(
        &broker,
        q.after.as_deref(),
        page_limit(q.limit, DEFAULT_PAGE_LIMIT),
    );
    Ok(Json(page_json(page, item)).into_response())
}

fn page_json<T>(page: Page<T>, item: impl Fn(&T) -> Value) -> Value {
    json!({
        "items": page.items().iter().map(item).collect::<Vec<_>>(),
        "next_after": page.next_after(),
    })
}

async fn clients(
    State(state): State<Arc<HttpState>>,
    query: ListParams,
) -> Result<Response, ApiError> {
    list(&state, query, Broker::clients, |c| {
        json!({
            "client_id": c.client_id,
            "peer": c.peer.map(|p| p.to_string()),
            "protocol": c.protocol,
            "keep_alive_s": c.keep_alive_s,
            "inflight": c.inflight,
            "queued": c.queued,
            "connected_since_unix_ms": c.connected_since.map(unix_ms),
        })
    })
}

async fn sessions(
    State(state): State<Arc<HttpState>>,
    query: ListParams,
) -> Result<Response, ApiError> {
    list(&state, query, Broker::sessions, |s| {
        json!({
            "client_id": s.client_id,
            "online": s.online,
            "protocol": s.protocol,
            "expiry_interval_s": s.expiry_interval_s,
            "subscriptions": s.subscriptions,
            "inflight": s.inflight,
            "queued": s.queued,
        })
    })
}

async fn subscriptions(
    State(state): State<Arc<HttpState>>,
    query: ListParams,
) -> Result<Response, ApiError> {
    list(&state, query, Broker::subscriptions, |s| {
        json!({
            "client_id": s.client_id,
            "filter": s.filter,
            "qos": s.qos,
            "subscription_id": s.subscription_id,
        })
    })
}

fn stream_json(s: &StreamStats) -> Value {
    json!({
        "name": s.name,
        "kind": s.kind,
        "filters": s.filters,
        "records": s.info.msgs,
        "bytes": s.info.bytes,
        "disk_bytes": s.info.disk_bytes,
        "first_seq": s.info.first_seq,
        "last_seq": s.info.last_seq,
        "blocks": s.info.blocks,
        "failed": s.info.failed,
        "appends": s.metrics.records,
        "retention": {
            "max_age_s": s.max_age_s,
            "max_msgs": s.max_msgs,
            "max_bytes": s.max_bytes,
            "keep": s.keep,
        },
    })
}

async fn streams(
    State(state): State<Arc<HttpState>>,
    query: ListParams,
) -> Result<Response, ApiError> {
    let broker = state.broker()?;
    let q = list_query(query)?;
    let limit = page_limit(q.limit, DEFAULT_PAGE_LIMIT);
    let page = page(
        broker.streams(),
        |s| s.name.as_str(),
        q.after.as_deref(),
        limit,
    );
    Ok(Json(page_json(page, stream_json)).into_response())
}

async fn retained(
    State(state): State<Arc<HttpState>>,
    query: ListParams,
) -> Result<Response, ApiError> {
    let broker = state.broker()?;
    let q = list_query(query)?;
    let limit = page_limit(q.limit, DEFAULT_PAGE_LIMIT);
    let (count, page) = broker
        .retained(q.filter.as_deref(), q.after.as_deref(), limit)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("filter: {e}")))?;
    let mut body = page_json(
        page,
        |r| json!({ "topic": r.topic, "payload_bytes": r.payload_bytes, "qos": r.qos }),
    );
    body["count"] = json!(count);
    Ok(Json(body).into_response())
}

async fn disconnect(
    State(state): State<Arc<HttpState>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    if !state.broker()?.disconnect_client(&id) {
        let message = format!("no connected client {id}");
        return Err(ApiError::new(StatusCode::NOT_FOUND, message));
    }
    Ok(Json(json!({ "disconnected": id })).into_response())
}

async fn remove_session(
    State(state): State<Arc<HttpState>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let ticket = state.broker()?.remove_session(&id).map_err(action_error)?;
    if let Some(mut ticket) = ticket {
        ticket.wait().await.map_err(|e| {
            let message = format!("the session is removed, but its deletion is not durable: {e}");
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, message)
        })?;
    }
    Ok(Json(json!({ "removed": id })).into_response())
}

async fn purge(
    State(state): State<Arc<HttpState>>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    // The purge waits for the stream's writer (a removal and a directory fsync).
    let worker = state.broker()?;
    let removed = tokio::task::spawn_blocking(move || worker.purge_stream(&name))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(action_error)?;
    Ok(Json(json!({ "removed": removed })).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BackupQuery {
    /// Name of the copy under `<data dir>/backups/` (default `backup-<unix ms>`).
    label: Option<String>,
}

async fn backup(
    State(state): State<Arc<HttpState>>,
    query: Result<Query<BackupQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query.map_err(|r| ApiError::new(StatusCode::BAD_REQUEST, r.body_text()))?;
    let label = q
        .label
        .unwrap_or_else(|| format!("backup-{}", unix_ms(SystemTime::now())));
    // Waits for each stream's writer to take its copy between two group commits.
    let worker = state.broker()?;
    let path = tokio::task::spawn_blocking(move || worker.backup(&label))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(action_error)?;
    Ok(Json(json!({ "path": path.display().to_string() })).into_response())
}

fn action_error(e: ActionError) -> ApiError {
    let status = match e {
        ActionError::NotFound { .. } => StatusCode::NOT_FOUND,
        ActionError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
        ActionError::Invalid(_) => StatusCode::BAD_REQUEST,
    };
    ApiError::new(status, e.to_string())
}
