//! Broker limits (the `[limits]` and `[sys]` tables of the server contract), with validation
//! that names the offending field.
//!
//! # Invariants
//! - A `BrokerConfig` that passed [`BrokerConfig::validate`] has every limit > 0 where 0 would
//!   make the broker unusable, `max_inflight_messages <= 65_535` (packet ids must stay unique),
//!   `max_queued_messages <= u32::MAX` (a session counts them in a u32) and
//!   `receive_maximum >= 1` (MQTT 5 forbids a Receive Maximum of 0).

use std::time::Duration;

/// Every limit the broker enforces. Defaults are the contract's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerConfig {
    /// Largest packet accepted from a client (v5: CONNACK Maximum Packet Size).
    pub max_packet_size_bytes: u32,
    /// QoS>0 PUBLISHes a client may have unacknowledged (v5: CONNACK Receive Maximum).
    pub receive_maximum: u16,
    /// Client-to-server topic aliases accepted; 0 disables them.
    pub topic_alias_maximum: u16,
    /// Longest keep alive granted; a v5 client asking for more (or 0) is told this.
    pub max_keep_alive_s: u16,
    /// A connection that sends no CONNECT within this time is closed.
    pub connect_timeout_ms: u64,
    /// Outbound QoS>0 messages in flight per session (also capped by the client's Receive Maximum).
    pub max_inflight_messages: u16,
    /// Per session, QoS>0 messages waiting beyond the in-flight window; the oldest is dropped.
    pub max_queued_messages: usize,
    /// Per session, bytes of QoS>0 messages waiting beyond the in-flight window (topic +
    /// payload + a fixed overhead per message); the oldest are dropped to make room. A single
    /// message larger than the limit is still kept, alone.
    pub max_queued_bytes: usize,
    /// Broker-wide, bytes queued in every session's outbound queue (same measure). At it, QoS 0
    /// deliveries are dropped and new QoS>0 PUBLISHes are refused at the publisher (v5 PUBACK /
    /// PUBREC 0x97, 3.1.1: the connection is closed without an ack); messages already accepted
    /// are still queued, each session within its own `max_queued_*`.
    pub max_queued_bytes_total: usize,
    /// Live client connections; a CONNECT beyond it is refused (v5 CONNACK 0x97 Quota exceeded,
    /// 3.1.1 return code 3) unless it takes over a connected client id.
    pub max_connections: usize,
    /// Longest session expiry interval granted.
    pub max_session_expiry_interval_s: u32,
    pub max_subscriptions_per_session: usize,
    /// Sessions (live and offline persistent ones) kept at most; a CONNECT that would create one
    /// more is refused with Server busy (v5 0x89, 3.1.1 return code 3). A reconnect under a
    /// client id that has a session (resume or takeover) is never refused by it.
    pub max_sessions: usize,
    pub max_retained_messages: usize,
    pub max_client_id_len: usize,
    /// Per connection; QoS 0 messages are dropped (and counted) while the queue is over it.
    pub outbound_queue_max_bytes: usize,
    pub outbound_queue_max_messages: usize,
    /// A subscriber whose outbound queue stays full this long is disconnected (v5 0x97).
    pub slow_subscriber_timeout_ms: u64,
    /// `$SYS/broker/...` publish interval; 0 disables.
    pub sys_interval_s: u64,
    /// Topic levels (`/`-separated) of a topic name or filter at most; beyond: PUBLISH closes
    /// the connection (v5 0x90), SUBSCRIBE gets 0x8F / 0x80.
    pub max_topic_levels: usize,
    /// Bytes of a topic name or filter at most, same refusals.
    pub max_topic_length_bytes: usize,
    /// CONNECTs per second per source IP address (token bucket); 0: no limit. Beyond: v5
    /// CONNACK 0x9F, 3.1.1 return code 3.
    pub max_connect_rate_per_ip: u32,
    /// CONNECTs a source address may make at once before `max_connect_rate_per_ip` applies.
    pub connect_rate_burst: u32,
    /// U+0001..U+001F and U+007F..U+009F in topics, filters, client ids and usernames are
    /// malformed (connection closed), as in mosquitto. MQTT 5 §1.5.4 allows either.
    pub reject_control_chars: bool,
    /// Every inbound message is delivered onward only once its write is durable, and so is
    /// every message behind it from the same connection (the order holds). The single node
    /// delivers QoS 0 and 1 at once and QoS 2 after its write (ARCHITECTURE §3); a cluster
    /// sets this, so that nothing is delivered that a majority has not committed (a failover
    /// would otherwise show a subscriber a message the cluster then does not have).
    pub deliver_after_durable: bool,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            max_packet_size_bytes: 1_048_576,
            receive_maximum: 1024,
            topic_alias_maximum: 64,
            max_keep_alive_s: 3600,
            connect_timeout_ms: 10_000,
            max_inflight_messages: 1024,
            max_queued_messages: 100_000,
            max_queued_bytes: 64 * 1024 * 1024,
            max_queued_bytes_total: 1024 * 1024 * 1024,
            max_connections: 100_000,
            max_session_expiry_interval_s: u32::MAX,
            max_subscriptions_per_session: 10_000,
            max_sessions: 1_000_000,
            max_retained_messages: 1_000_000,
            max_client_id_len: 256,
            outbound_queue_max_bytes: 8_388_608,
            outbound_queue_max_messages: 100_000,
            slow_subscriber_timeout_ms: 30_000,
            sys_interval_s: 10,
            max_topic_levels: 128,
            max_topic_length_bytes: 4096,
            max_connect_rate_per_ip: 0,
            connect_rate_burst: 10,
            reject_control_chars: true,
            deliver_after_durable: false,
        }
    }
}

/// A limit with a value the broker cannot work with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid value for `{field}`: {reason}")]
pub struct ConfigError {
    /// The config key, as written in the `[limits]` / `[sys]` tables.
    pub field: &'static str,
    pub reason: &'static str,
}

/// Smallest packet size limit that still admits a CONNECT with a short client id.
pub(crate) const MIN_PACKET_SIZE_BYTES: u32 = 64;
/// MQTT's own ceiling on a packet (remaining length max + 5 bytes of fixed header).
pub(crate) const MAX_PACKET_SIZE_BYTES: u32 = 268_435_460;

impl BrokerConfig {
    /// Checks every limit, naming the first bad one.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |field, reason| Err(ConfigError { field, reason });
        if self.max_packet_size_bytes < MIN_PACKET_SIZE_BYTES {
            return err("max_packet_size_bytes", "must be at least 64");
        }
        if self.max_packet_size_bytes > MAX_PACKET_SIZE_BYTES {
            return err("max_packet_size_bytes", "must be at most 268435460");
        }
        if self.receive_maximum == 0 {
            return err("receive_maximum", "must be at least 1");
        }
        if self.max_keep_alive_s == 0 {
            return err("max_keep_alive_s", "must be at least 1");
        }
        if self.connect_timeout_ms == 0 {
            return err("connect_timeout_ms", "must be at least 1");
        }
        if self.max_inflight_messages == 0 || self.max_inflight_messages == u16::MAX {
            return err("max_inflight_messages", "must be between 1 and 65534");
        }
        // A session counts its queued QoS>0 messages in a u32 (its block stays in jemalloc's
        // 256 B class, issue 15); the limit keeps that count in range.
        if self.max_queued_messages == 0 || u32::try_from(self.max_queued_messages).is_err() {
            return err("max_queued_messages", "must be between 1 and 4294967295");
        }
        if self.max_queued_bytes == 0 {
            return err("max_queued_bytes", "must be at least 1");
        }
        if self.max_queued_bytes_total < self.max_queued_bytes {
            return err(
                "max_queued_bytes_total",
                "must be at least max_queued_bytes",
            );
        }
        if self.max_connections == 0 {
            return err("max_connections", "must be at least 1");
        }
        if self.max_subscriptions_per_session == 0 {
            return err("max_subscriptions_per_session", "must be at least 1");
        }
        if self.max_sessions == 0 {
            return err("max_sessions", "must be at least 1");
        }
        if self.max_client_id_len == 0 {
            return err("max_client_id_len", "must be at least 1");
        }
        if self.outbound_queue_max_bytes == 0 {
            return err("outbound_queue_max_bytes", "must be at least 1");
        }
        if self.outbound_queue_max_messages == 0 {
            return err("outbound_queue_max_messages", "must be at least 1");
        }
        if self.max_topic_levels == 0 {
            return err("max_topic_levels", "must be at least 1");
        }
        if self.max_topic_length_bytes == 0 {
            return err("max_topic_length_bytes", "must be at least 1");
        }
        if self.connect_rate_burst == 0 {
            return err("connect_rate_burst", "must be at least 1");
        }
        if self.slow_subscriber_timeout_ms == 0 {
            return err("slow_subscriber_timeout_ms", "must be at least 1");
        }
        Ok(())
    }

    pub(crate) fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }

    pub(crate) fn slow_subscriber_timeout(&self) -> Duration {
        Duration::from_millis(self.slow_subscriber_timeout_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        assert_eq!(BrokerConfig::default().validate(), Ok(()));
    }

    #[test]
    fn bad_values_name_their_field() {
        let config = BrokerConfig {
            receive_maximum: 0,
            ..BrokerConfig::default()
        };
        assert_eq!(config.validate().unwrap_err().field, "receive_maximum");
        let config = BrokerConfig {
            max_inflight_messages: u16::MAX,
            ..BrokerConfig::default()
        };
        assert_eq!(
            config.validate().unwrap_err().field,
            "max_inflight_messages"
        );
        let config = BrokerConfig {
            max_sessions: 0,
            ..BrokerConfig::default()
        };
        assert_eq!(config.validate().unwrap_err().field, "max_sessions");
        let config = BrokerConfig {
            max_queued_messages: usize::try_from(u64::from(u32::MAX) + 1).unwrap(),
            ..BrokerConfig::default()
        };
        assert_eq!(config.validate().unwrap_err().field, "max_queued_messages");
        let config = BrokerConfig {
            max_queued_bytes: 0,
            ..BrokerConfig::default()
        };
        assert_eq!(config.validate().unwrap_err().field, "max_queued_bytes");
        let config = BrokerConfig {
            max_queued_bytes_total: 1000,
            max_queued_bytes: 1001,
            ..BrokerConfig::default()
        };
        assert_eq!(
            config.validate().unwrap_err().field,
            "max_queued_bytes_total"
        );
        let config = BrokerConfig {
            max_connections: 0,
            ..BrokerConfig::default()
        };
        assert_eq!(config.validate().unwrap_err().field, "max_connections");
    }
}
