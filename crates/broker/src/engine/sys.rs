//! `$SYS/broker/...`: broker statistics published as retained messages every
//! `sys_interval_s` seconds (0 disables). Also purges expired retained messages.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tern_wire::{Properties, QoS, Str};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::engine::Shared;
use crate::engine::route;
use crate::metrics::Metrics;
use crate::model::message::Message;

pub(crate) async fn run(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let interval_s = shared.config.sys_interval_s;
    if interval_s == 0 {
        return;
    }
    // The first values go out one interval after start, when they have something to say.
    let period = Duration::from_secs(interval_s);
    let mut ticker = tokio::time::interval_at(Instant::now() + period, period);
    loop {
        tokio::select! {
            biased;
            _ = ticker.tick() => publish_all(&shared),
            _ = stop.changed() => return,
        }
    }
}

/// Where a `$SYS` topic's counter is.
type Counter = fn(&Metrics) -> &AtomicU64;

/// The `$SYS` topics that publish one counter as it stands.
const COUNTERS: &[(&str, Counter)] = &[
    ("$SYS/broker/clients/connected", |m| &m.clients_connected),
    ("$SYS/broker/messages/dropped", |m| &m.messages_dropped),
    ("$SYS/broker/messages/dropped/queue_limit", |m| {
        &m.messages_dropped_queue_limit
    }),
    ("$SYS/broker/messages/dropped/memory_limit", |m| {
        &m.messages_dropped_memory_limit
    }),
    ("$SYS/broker/messages/dropped/disk_budget", |m| {
        &m.messages_dropped_disk_budget
    }),
    ("$SYS/broker/messages/inflight_exposed/retention", |m| {
        &m.inflight_exposed_retention
    }),
    ("$SYS/broker/messages/refused/memory_limit", |m| {
        &m.publishes_refused_memory_limit
    }),
    ("$SYS/broker/messages/refused/disk_budget", |m| {
        &m.publishes_refused_disk_budget
    }),
    ("$SYS/broker/clients/refused/max_connections", |m| {
        &m.connections_refused
    }),
    (
        "$SYS/broker/clients/refused/listener_max_connections",
        |m| &m.connections_refused_listener,
    ),
    ("$SYS/broker/clients/handshakes/failed", |m| {
        &m.transport_handshakes_failed
    }),
    ("$SYS/broker/clients/closes/lingered", |m| {
        &m.closes_lingered
    }),
    ("$SYS/broker/clients/closes/not_lingered", |m| {
        &m.closes_not_lingered
    }),
    ("$SYS/broker/bytes/received", |m| &m.bytes_received),
    ("$SYS/broker/bytes/sent", |m| &m.bytes_sent),
];

/// The current `(topic, value)` pairs.
pub(crate) fn snapshot(shared: &Shared) -> Vec<(&'static str, String)> {
    let m = &shared.metrics;
    let uptime_s = Instant::now()
        .saturating_duration_since(shared.started_at)
        .as_secs();
    let mut values = vec![
        (
            "$SYS/broker/version",
            format!("tern {}", env!("CARGO_PKG_VERSION")),
        ),
        ("$SYS/broker/uptime", format!("{uptime_s} seconds")),
        (
            "$SYS/broker/clients/total",
            shared.sessions.len().to_string(),
        ),
        (
            "$SYS/broker/messages/received",
            m.messages_received().to_string(),
        ),
        ("$SYS/broker/messages/sent", m.messages_sent().to_string()),
        (
            "$SYS/broker/messages/queued/bytes",
            m.queued.bytes.load(Ordering::Relaxed).to_string(),
        ),
        (
            "$SYS/broker/subscriptions/count",
            shared.router.read().len().to_string(),
        ),
        (
            "$SYS/broker/retained messages/count",
            shared.retained.read().len().to_string(),
        ),
    ];
    values.extend(
        COUNTERS
            .iter()
            .map(|(topic, counter)| (*topic, Metrics::get(counter(m)).to_string())),
    );
    if let Some((used, budget)) = shared.store.admin.disk_usage() {
        values.push(("$SYS/broker/store/disk/bytes", used.to_string()));
        values.push(("$SYS/broker/store/disk/budget", budget.to_string()));
    }
    values
}

pub(crate) fn publish_all(shared: &Shared) {
    let now = Instant::now();
    shared.retained.write().purge_expired(now);
    for (topic, value) in snapshot(shared) {
        let message = Message::new(
            Str::from_static(topic),
            Bytes::from(value),
            QoS::AtMostOnce,
            true,
            Properties::default(),
            None,
            now,
        );
        route::publish(shared, Arc::new(message));
    }
}
