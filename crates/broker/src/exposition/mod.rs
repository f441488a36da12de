//! `/metrics`: the broker's counters in the Prometheus text format. [`render`] reads the same
//! [`Metrics`] counters as `$SYS/broker/...` ([`crate::engine::sys`]) plus the store's per-stream
//! numbers; [`text`] is the format.
//!
//! # Invariants
//! - A scrape costs O(streams + families), never O(connections or sessions): it reads
//!   broker-wide atomics, the registry's length (one short lock) and each stream's block list.

pub(crate) mod text;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::time::Instant;

use crate::engine::Shared;
use crate::metrics::Metrics;
use crate::model::StreamStats;
use crate::transport::ListenerContext;
use text::{Kind, TextEncoder};

const QOS_LABELS: [&str; 3] = ["0", "1", "2"];

/// The whole `/metrics` page.
pub(crate) fn render(shared: &Shared, listeners: &[Arc<ListenerContext>]) -> String {
    let mut e = TextEncoder::default();
    clients(&mut e, shared, listeners);
    closes(&mut e, shared);
    messages(&mut e, &shared.metrics);
    drops(&mut e, &shared.metrics);
    security(&mut e, &shared.metrics);
    store(&mut e, shared, &shared.store.admin.stream_stats());
    e.finish()
}

fn clients(e: &mut TextEncoder, shared: &Shared, listeners: &[Arc<ListenerContext>]) {
    let m = &shared.metrics;
    // Millisecond precision: the dashboard takes its rates' time base from it (the broker's
    // clock, not the browser's).
    let uptime_ms = Instant::now()
        .saturating_duration_since(shared.started_at)
        .as_millis();
    e.family(
        "uptime_seconds",
        Kind::Gauge,
        "Seconds since the broker started.",
    );
    e.sample_f64("uptime_seconds", &[], uptime_ms as f64 / 1e3);
    // Rendered on the broker's runtime (the HTTP listener's handler); a render outside one
    // (a unit test's) leaves it out.
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        e.single(
            "runtime_worker_threads",
            Kind::Gauge,
            "The async runtime's worker threads ([runtime] worker_threads; one per core unset).",
            runtime.metrics().num_workers() as u64,
        );
    }
    e.family(
        "connections",
        Kind::Gauge,
        "Live connections past CONNECT, by listener (the measure of max_connections).",
    );
    for listener in listeners {
        let connected = listener.connected() as u64;
        e.sample("connections", &[("listener", &listener.name)], connected);
    }
    e.single(
        "connections_refused_total",
        Kind::Counter,
        "CONNECTs refused at max_connections.",
        Metrics::get(&m.connections_refused),
    );
    let online = Metrics::get(&m.clients_connected);
    let sessions = shared.sessions.len() as u64;
    e.family(
        "sessions",
        Kind::Gauge,
        "Sessions by state: online (connected) or offline.",
    );
    e.sample("sessions", &[("state", "online")], online);
    e.sample(
        "sessions",
        &[("state", "offline")],
        sessions.saturating_sub(online),
    );
    e.single(
        "subscriptions",
        Kind::Gauge,
        "Subscriptions of every session (shared ones included).",
        Metrics::get(&m.subscriptions),
    );
    e.single(
        "retained_messages",
        Kind::Gauge,
        "Retained messages held.",
        shared.retained.read().len() as u64,
    );
}

/// The lingering closes of `connection::linger` (issue 24 item 1).
fn closes(e: &mut TextEncoder, shared: &Shared) {
    let m = &shared.metrics;
    e.family(
        "close_lingers_total",
        Kind::Counter,
        "Closes the broker started (after a DISCONNECT or a refusing CONNACK), by outcome: \
         lingered (read to the client's end of stream, at most CLOSE_LINGER_MS, so that the \
         client reads the reason) or over_limit (closed at once: MAX_LINGERING_CLOSES sockets \
         lingered already; the client may lose the reason to a reset).",
    );
    let outcomes = [
        ("lingered", &m.closes_lingered),
        ("over_limit", &m.closes_not_lingered),
    ];
    for (outcome, counter) in outcomes {
        let value = Metrics::get(counter);
        e.sample("close_lingers_total", &[("outcome", outcome)], value);
    }
    e.single(
        "close_lingering",
        Kind::Gauge,
        "Sockets lingering now (at most MAX_LINGERING_CLOSES).",
        shared.lingering.alive() as u64,
    );
}

fn messages(e: &mut TextEncoder, m: &Metrics) {
    e.family(
        "messages_received_total",
        Kind::Counter,
        "PUBLISH packets received from clients, by QoS.",
    );
    for (qos, counter) in QOS_LABELS.iter().zip(&m.messages_received_by_qos) {
        e.sample(
            "messages_received_total",
            &[("qos", qos)],
            Metrics::get(counter),
        );
    }
    e.family(
        "messages_sent_total",
        Kind::Counter,
        "Deliveries sent to subscribers (first sends, resends not counted), by QoS.",
    );
    for (qos, counter) in QOS_LABELS.iter().zip(&m.messages_sent_by_qos) {
        e.sample(
            "messages_sent_total",
            &[("qos", qos)],
            Metrics::get(counter),
        );
    }
    e.single(
        "bytes_received_total",
        Kind::Counter,
        "Bytes read from client sockets.",
        Metrics::get(&m.bytes_received),
    );
    e.single(
        "bytes_sent_total",
        Kind::Counter,
        "Bytes written to client sockets.",
        Metrics::get(&m.bytes_sent),
    );
    e.single(
        "queued_messages",
        Kind::Gauge,
        "Deliveries waiting in session queues beyond the in-flight window.",
        m.queued.messages.load(Ordering::Relaxed) as u64,
    );
    e.single(
        "queued_bytes",
        Kind::Gauge,
        "Bytes of those (topic + payload + 64 each), the measure of max_queued_bytes_total.",
        m.queued.bytes.load(Ordering::Relaxed) as u64,
    );
}

fn drops(e: &mut TextEncoder, m: &Metrics) {
    e.single(
        "messages_dropped_total",
        Kind::Counter,
        "Deliveries dropped for any reason (tern_dropped_total breaks most of them down).",
        Metrics::get(&m.messages_dropped),
    );
    e.family(
        "dropped_total",
        Kind::Counter,
        "Messages dropped, by cause: queue_full (QoS 0 to a full subscriber queue), \
         queue_limit (oldest QoS>0 at max_queued_messages/bytes), memory_limit \
         (max_queued_bytes_total), disk_budget (QoS 0 at max_disk_bytes), expired (message \
         expiry while queued), retention (stored copies removed by retention), acl (refused \
         by an access rule).",
    );
    let causes = [
        ("queue_full", &m.messages_dropped_queue_full),
        ("queue_limit", &m.messages_dropped_queue_limit),
        ("memory_limit", &m.messages_dropped_memory_limit),
        ("disk_budget", &m.messages_dropped_disk_budget),
        ("expired", &m.messages_dropped_expired),
        ("retention", &m.messages_dropped_retention),
    ];
    for (cause, counter) in causes {
        e.sample("dropped_total", &[("cause", cause)], Metrics::get(counter));
    }
    // Refused PUBLISHes and deliveries filtered out by the ACL (not part of
    // `messages_dropped`).
    let acl = Metrics::get(&m.acl_denied_publish) + Metrics::get(&m.acl_denied_deliver);
    e.sample("dropped_total", &[("cause", "acl")], acl);
    e.family(
        "publishes_refused_total",
        Kind::Counter,
        "QoS>0 PUBLISHes refused (v5 0x97; 3.1.1 closed without an ack), by limit.",
    );
    e.sample(
        "publishes_refused_total",
        &[("cause", "memory_limit")],
        Metrics::get(&m.publishes_refused_memory_limit),
    );
    e.sample(
        "publishes_refused_total",
        &[("cause", "disk_budget")],
        Metrics::get(&m.publishes_refused_disk_budget),
    );
    e.single(
        "inflight_exposed_retention_total",
        Kind::Counter,
        "QoS 1 deliveries in flight to a persistent session whose stored records retention \
         removed: resent from memory while the broker runs, not after a restart.",
        Metrics::get(&m.inflight_exposed_retention),
    );
    e.single(
        "slow_subscribers_disconnected_total",
        Kind::Counter,
        "Subscribers disconnected because their queue stayed full past slow_subscriber_timeout_ms.",
        Metrics::get(&m.slow_subscribers_disconnected),
    );
}

/// Authentication, access rules and hostile input (issue 13).
fn security(e: &mut TextEncoder, m: &Metrics) {
    e.single(
        "auth_failures_total",
        Kind::Counter,
        "CONNECTs refused for a bad username or password, or anonymous access off.",
        Metrics::get(&m.auth_failures),
    );
    e.family(
        "acl_denied_total",
        Kind::Counter,
        "Operations an access rule refused, by action (publish: PUBLISH or will topic; \
         subscribe: a SUBSCRIBE filter; deliver: a delivery filtered out).",
    );
    let actions = [
        ("publish", &m.acl_denied_publish),
        ("subscribe", &m.acl_denied_subscribe),
        ("deliver", &m.acl_denied_deliver),
    ];
    for (action, counter) in actions {
        e.sample(
            "acl_denied_total",
            &[("action", action)],
            Metrics::get(counter),
        );
    }
    e.family(
        "input_refused_total",
        Kind::Counter,
        "Connections or packets refused by a hostile-input limit, by cause (connect_rate: \
         max_connect_rate_per_ip; listener_full: a listener's max_connections; \
         handshake_failed: TLS handshake or WebSocket upgrade; topic_limit: \
         max_topic_levels / max_topic_length_bytes; control_chars: reject_control_chars).",
    );
    let causes = [
        ("connect_rate", &m.connections_refused_rate),
        ("listener_full", &m.connections_refused_listener),
        ("handshake_failed", &m.transport_handshakes_failed),
        ("topic_limit", &m.topics_refused_limit),
        ("control_chars", &m.control_chars_refused),
    ];
    for (cause, counter) in causes {
        e.sample(
            "input_refused_total",
            &[("cause", cause)],
            Metrics::get(counter),
        );
    }
}

/// A per-stream family: name, type, help, and how to read its value.
type PerStream = (&'static str, Kind, &'static str, fn(&StreamStats) -> u64);

/// The per-stream gauges and counters of `/metrics`.
const STORE_PER_STREAM: [PerStream; 6] = [
    (
        "store_disk_bytes",
        Kind::Gauge,
        "Bytes of the stream's block files on disk.",
        |s| s.info.disk_bytes,
    ),
    (
        "store_records",
        Kind::Gauge,
        "Live records in the stream.",
        |s| s.info.msgs,
    ),
    (
        "store_appends_total",
        Kind::Counter,
        "Records appended to the stream since it was opened.",
        |s| s.metrics.records,
    ),
    (
        "store_syncs_total",
        Kind::Counter,
        "fdatasync calls on the stream's block files.",
        |s| s.metrics.syncs,
    ),
    (
        "store_bytes_written_total",
        Kind::Counter,
        "Bytes written to the stream's block files.",
        |s| s.metrics.bytes_written,
    ),
    (
        "store_failed",
        Kind::Gauge,
        "1 if the stream failed a write or sync and refuses writes until restarted.",
        |s| u64::from(s.info.failed),
    ),
];

fn store(e: &mut TextEncoder, shared: &Shared, streams: &[StreamStats]) {
    for (name, kind, help, value) in STORE_PER_STREAM {
        e.family(name, kind, help);
        for s in streams {
            e.sample(name, &[("stream", &s.name)], value(s));
        }
    }
    store_histograms(e, streams);
    if let Some((used, budget)) = shared.store.admin.disk_usage() {
        e.single(
            "store_disk_budget_bytes",
            Kind::Gauge,
            "[store] max_disk_bytes.",
            budget,
        );
        e.single(
            "store_disk_used_bytes",
            Kind::Gauge,
            "Disk use as measured against the budget (the message streams; not the state streams, bounded by their compaction).",
            used,
        );
    }
}

/// The writers' fsync latency and group-commit size, per stream.
fn store_histograms(e: &mut TextEncoder, streams: &[StreamStats]) {
    e.family(
        "store_fsync_seconds",
        Kind::Histogram,
        "Duration of each fdatasync of a block file.",
    );
    for s in streams {
        e.histogram(
            "store_fsync_seconds",
            &[("stream", &s.name)],
            &s.fsync_us,
            1e6,
        );
    }
    e.family(
        "store_batch_records",
        Kind::Histogram,
        "Records made durable by one group commit of the stream's writer.",
    );
    for s in streams {
        e.histogram(
            "store_batch_records",
            &[("stream", &s.name)],
            &s.batch_records,
            1.0,
        );
    }
}
