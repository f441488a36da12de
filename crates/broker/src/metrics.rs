//! Broker-wide counters behind `$SYS/broker/...`. Relaxed atomics: they are statistics, not
//! synchronisation.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct Metrics {
    pub clients_connected: AtomicU64,
    pub messages_received: AtomicU64,
    pub messages_sent: AtomicU64,
    pub messages_dropped: AtomicU64,
    /// Of `messages_dropped`: QoS 0 refused because an online subscriber's outbound queue was
    /// at its byte or message limit (a slow subscriber).
    pub messages_dropped_queue_full: AtomicU64,
    /// Subscribers disconnected because their queue stayed full past
    /// `slow_subscriber_timeout_ms` (v5 DISCONNECT 0x97).
    pub slow_subscribers_disconnected: AtomicU64,
    pub bytes_received: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub subscriptions: AtomicU64,
}

impl Metrics {
    pub fn add(counter: &AtomicU64, value: u64) {
        counter.fetch_add(value, Ordering::Relaxed);
    }

    pub fn sub(counter: &AtomicU64, value: u64) {
        counter.fetch_sub(value, Ordering::Relaxed);
    }

    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}
