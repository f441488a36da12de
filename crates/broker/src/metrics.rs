//! Broker-wide counters behind `$SYS/broker/...`. Relaxed atomics: they are statistics, not
//! synchronisation.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// What every session's outbound queue holds, together. Both counts in one block so that each
/// `Outbound` keeps one pointer to them (8 bytes of every session's block, issue 15).
#[derive(Debug, Default)]
pub struct QueuedTotals {
    /// Bytes (the measure of `max_queued_bytes_total`).
    pub(crate) bytes: AtomicUsize,
    /// Deliveries (beyond the in-flight window), kept with `bytes` by each `Outbound`.
    pub(crate) messages: AtomicUsize,
}

impl QueuedTotals {
    /// True while the queues together hold `max_queued_bytes_total` (`cap_bytes`) or more:
    /// the one rule of the cap (issue 24), for a QoS 0 push (dropped) and a QoS>0 PUBLISH
    /// (refused with 0x97) alike.
    pub(crate) fn at_cap(&self, cap_bytes: usize) -> bool {
        !crate::inject::on(crate::inject::Bug::IgnoreQueuedBytesTotal)
            && self.bytes.load(std::sync::atomic::Ordering::Relaxed) >= cap_bytes
    }
}

#[derive(Debug, Default)]
pub struct Metrics {
    pub(crate) clients_connected: AtomicU64,
    /// PUBLISHes received from clients, by QoS (index 0, 1, 2); one add per PUBLISH.
    pub(crate) messages_received_by_qos: [AtomicU64; 3],
    /// Deliveries taken from session queues to be sent, by QoS (resends not counted); added
    /// once per writer batch.
    pub(crate) messages_sent_by_qos: [AtomicU64; 3],
    pub(crate) messages_dropped: AtomicU64,
    /// Of `messages_dropped`: deliveries whose Message Expiry Interval passed while queued.
    pub(crate) messages_dropped_expired: AtomicU64,
    /// Of `messages_dropped`: queued deliveries whose stored records retention removed.
    pub(crate) messages_dropped_retention: AtomicU64,
    /// QoS 1 deliveries in flight to a persistent session whose stored records retention
    /// removed (not dropped: resent from memory while the broker runs, but a restart before
    /// their PUBACK cannot resend them; QoS 2 in flight is pinned instead).
    pub(crate) inflight_exposed_retention: AtomicU64,
    /// Of `messages_dropped`: QoS 0 refused because an online subscriber's outbound queue was
    /// at its byte or message limit (a slow subscriber).
    pub(crate) messages_dropped_queue_full: AtomicU64,
    /// Subscribers disconnected because their queue stayed full past
    /// `slow_subscriber_timeout_ms` (v5 DISCONNECT 0x97).
    pub(crate) slow_subscribers_disconnected: AtomicU64,
    /// Of `messages_dropped`: QoS>0 messages dropped (oldest first) from a session queue at
    /// `max_queued_messages` / `max_queued_bytes`, at run time or when restored at start-up.
    pub(crate) messages_dropped_queue_limit: AtomicU64,
    /// Of `messages_dropped`: QoS 0 deliveries dropped because every session's queues together
    /// held `max_queued_bytes_total`.
    pub(crate) messages_dropped_memory_limit: AtomicU64,
    /// Of `messages_dropped`: QoS 0 PUBLISHes that would have been written to the store while
    /// it was at `[store] max_disk_bytes`.
    pub(crate) messages_dropped_disk_budget: AtomicU64,
    /// QoS>0 PUBLISHes refused (v5 PUBACK / PUBREC 0x97; 3.1.1: connection closed without
    /// an ack) because the store was at `[store] max_disk_bytes`.
    pub(crate) publishes_refused_disk_budget: AtomicU64,
    /// QoS>0 PUBLISHes refused the same way because queues held `max_queued_bytes_total`.
    pub(crate) publishes_refused_memory_limit: AtomicU64,
    /// CONNECTs refused at `max_connections` (v5 CONNACK 0x97, 3.1.1 return code 3).
    pub(crate) connections_refused: AtomicU64,
    /// CONNECTs refused for a wrong or unknown username/password (v5 CONNACK 0x86, 3.1.1
    /// return code 4) or for no credentials where they are required (0x87 / 5).
    pub(crate) auth_failures: AtomicU64,
    /// PUBLISHes the ACL did not let the client write (v5 PUBACK/PUBREC 0x87; QoS 0 and
    /// 3.1.1: dropped without a word, as mosquitto does).
    pub(crate) acl_denied_publish: AtomicU64,
    /// SUBSCRIBE filters the ACL refused (SUBACK 0x80 in 3.1.1, 0x87 in v5).
    pub(crate) acl_denied_subscribe: AtomicU64,
    /// Deliveries not made because the subscriber may not read the message's topic (checked
    /// per message on its concrete topic, as mosquitto does).
    pub(crate) acl_denied_deliver: AtomicU64,
    /// CONNECTs refused by `max_connect_rate_per_ip` (v5 CONNACK 0x9F, 3.1.1 return code 3).
    pub(crate) connections_refused_rate: AtomicU64,
    /// Topic names and filters over `max_topic_levels` / `max_topic_length_bytes` (PUBLISH:
    /// connection closed, v5 DISCONNECT 0x90; SUBSCRIBE: SUBACK 0x8F / 0x80; will: CONNACK).
    pub(crate) topics_refused_limit: AtomicU64,
    /// Packets refused for a control character (U+0001..U+001F, U+007F..U+009F) in a topic,
    /// filter, client id or username while `reject_control_chars` is on (connection closed).
    pub(crate) control_chars_refused: AtomicU64,
    /// Bytes and deliveries queued in every session's outbound queue (shared with each
    /// session's `Outbound`).
    pub(crate) queued: Arc<QueuedTotals>,
    /// Live connections (past CONNECT, not yet closed), the measure of `max_connections`.
    pub(crate) connections: std::sync::atomic::AtomicUsize,
    /// Sockets closed at accept because their listener held its `max_connections`.
    pub(crate) connections_refused_listener: AtomicU64,
    /// TLS handshakes and WebSocket upgrades that failed or timed out.
    pub(crate) transport_handshakes_failed: AtomicU64,
    /// Closes the broker started whose socket lingered (read to the client's end of stream or
    /// `CLOSE_LINGER_MS`) so that the client could read the reason (`connection::linger`).
    pub(crate) closes_lingered: AtomicU64,
    /// Such closes done at once because `MAX_LINGERING_CLOSES` sockets lingered already: the
    /// client may lose the reason to a reset.
    pub(crate) closes_not_lingered: AtomicU64,
    pub(crate) bytes_received: AtomicU64,
    pub(crate) bytes_sent: AtomicU64,
    pub(crate) subscriptions: AtomicU64,
}

/// The drop and refusal counters this workspace's tests read ([`Metrics::count`]; `__internal`).
#[cfg(feature = "__internal")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    MessagesDropped,
    MessagesDroppedExpired,
    MessagesDroppedRetention,
    MessagesDroppedQueueFull,
    MessagesDroppedQueueLimit,
    MessagesDroppedMemoryLimit,
    MessagesDroppedDiskBudget,
    SlowSubscribersDisconnected,
    PublishesRefusedDiskBudget,
    PublishesRefusedMemoryLimit,
}

/// Read-only views for the tests and benches (`__internal`): only the broker adds to the
/// counters, and the "Of `messages_dropped`" parts are kept with their total by its methods.
#[cfg(feature = "__internal")]
impl Metrics {
    /// A counter's value now.
    pub fn count(&self, counter: Counter) -> u64 {
        let counter = match counter {
            Counter::MessagesDropped => &self.messages_dropped,
            Counter::MessagesDroppedExpired => &self.messages_dropped_expired,
            Counter::MessagesDroppedRetention => &self.messages_dropped_retention,
            Counter::MessagesDroppedQueueFull => &self.messages_dropped_queue_full,
            Counter::MessagesDroppedQueueLimit => &self.messages_dropped_queue_limit,
            Counter::MessagesDroppedMemoryLimit => &self.messages_dropped_memory_limit,
            Counter::MessagesDroppedDiskBudget => &self.messages_dropped_disk_budget,
            Counter::SlowSubscribersDisconnected => &self.slow_subscribers_disconnected,
            Counter::PublishesRefusedDiskBudget => &self.publishes_refused_disk_budget,
            Counter::PublishesRefusedMemoryLimit => &self.publishes_refused_memory_limit,
        };
        counter.load(Ordering::Relaxed)
    }

    /// Bytes every session's queues hold together (the measure of `max_queued_bytes_total`).
    pub fn queued_bytes(&self) -> usize {
        self.queued.bytes.load(Ordering::Relaxed)
    }

    /// The broker-wide totals, for a queue built outside the registry (benches).
    pub fn queued_totals(&self) -> Arc<QueuedTotals> {
        self.queued.clone()
    }
}

impl Metrics {
    pub(crate) fn add(counter: &AtomicU64, value: u64) {
        counter.fetch_add(value, Ordering::Relaxed);
    }

    /// `n` QoS>0 deliveries dropped, oldest first, at `max_queued_messages` /
    /// `max_queued_bytes` (a session's queue, a share group's, or a session restored at
    /// start-up): the one count of the rule.
    pub(crate) fn dropped_at_queue_limit(&self, n: u64) {
        Metrics::add(&self.messages_dropped, n);
        Metrics::add(&self.messages_dropped_queue_limit, n);
    }

    /// `n` queued deliveries whose stored records a retention limit removed.
    pub(crate) fn dropped_by_retention(&self, n: u64) {
        Metrics::add(&self.messages_dropped, n);
        Metrics::add(&self.messages_dropped_retention, n);
    }

    /// Adds and returns the new value.
    pub(crate) fn add_get(counter: &AtomicU64, value: u64) -> u64 {
        counter.fetch_add(value, Ordering::Relaxed) + value
    }

    pub(crate) fn sub(counter: &AtomicU64, value: u64) {
        counter.fetch_sub(value, Ordering::Relaxed);
    }

    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    /// PUBLISHes received, all QoS.
    pub(crate) fn messages_received(&self) -> u64 {
        self.messages_received_by_qos.iter().map(Metrics::get).sum()
    }

    /// Deliveries sent, all QoS.
    pub(crate) fn messages_sent(&self) -> u64 {
        self.messages_sent_by_qos.iter().map(Metrics::get).sum()
    }
}
