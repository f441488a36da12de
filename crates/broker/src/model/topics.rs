//! The topic spaces the broker reserves, named once: every test of a reserved prefix in the
//! crate goes through these functions (issue 22: the tests were spelled six ways).
//!
//! - `$`-topics: a filter starting with a wildcard never matches them (MQTT-4.7.2-1), and a
//!   will is never published to one.
//! - `$SYS`: the broker's statistics (`$SYS` and `$SYS/...`); clients may not publish there.
//! - `$tern/`: the store's control records (QoS 2 received and released, session resets),
//!   kept in the message streams beside the messages; clients may not publish there.
//! - `$share/{group}/{filter}`: a shared subscription's filter (MQTT 5 §4.8.2).

/// The store's control records, under the message streams' own topics.
pub(crate) const INTERNAL_PREFIX: &str = "$tern/";
/// "(session, pi) received" (`$tern/rx/{client}`).
pub(crate) const QOS2_RECEIVED_PREFIX: &str = "$tern/rx/";
/// "(session, pi) released" (`$tern/rel/{client}`).
pub(crate) const QOS2_RELEASED_PREFIX: &str = "$tern/rel/";
/// "The session started afresh" (`$tern/reset/{client}`): its older rx records are void.
pub(crate) const SESSION_RESET_PREFIX: &str = "$tern/reset/";
/// The filter that reads every control record.
pub(crate) const INTERNAL_FILTER: &str = "$tern/#";
/// A shared subscription's filter starts with this.
pub(crate) const SHARE_PREFIX: &str = "$share/";

/// A server-reserved `$`-topic: leading wildcards do not match it (MQTT-4.7.2-1).
#[inline]
pub(crate) fn is_dollar(topic: &str) -> bool {
    tern_topic::is_sys_topic(topic)
}

/// `$SYS` or below it: the broker's statistics.
#[inline]
pub(crate) fn is_sys(topic: &str) -> bool {
    topic == "$SYS" || topic.starts_with("$SYS/")
}

/// The store's control records.
#[inline]
pub(crate) fn is_internal(topic: &[u8]) -> bool {
    topic.starts_with(INTERNAL_PREFIX.as_bytes())
}

/// A topic clients may not publish to (acknowledged, never routed nor stored): `$SYS` and
/// the store's control records.
#[inline]
pub(crate) fn is_reserved(topic: &str) -> bool {
    is_sys(topic) || is_internal(topic.as_bytes())
}

/// A shared subscription's filter (`$share/...`).
#[inline]
pub(crate) fn is_shared_filter(filter: &str) -> bool {
    filter.starts_with(SHARE_PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_spaces() {
        assert!(is_sys("$SYS") && is_sys("$SYS/broker/uptime"));
        assert!(!is_sys("$SYSTEM") && !is_sys("SYS/x"));
        assert!(is_internal(b"$tern/rx/c") && !is_internal(b"$ternx"));
        assert!(is_reserved("$tern/rel/c") && is_reserved("$SYS/x") && !is_reserved("$other"));
        assert!(is_dollar("$other") && !is_dollar("a/$"));
        assert!(is_shared_filter("$share/g/t") && !is_shared_filter("$shared/g"));
        for prefix in [
            QOS2_RECEIVED_PREFIX,
            QOS2_RELEASED_PREFIX,
            SESSION_RESET_PREFIX,
        ] {
            assert!(is_internal(prefix.as_bytes()), "{prefix}");
        }
        assert!(tern_topic::filter_matches(INTERNAL_FILTER, "$tern/rx/c"));
    }
}
