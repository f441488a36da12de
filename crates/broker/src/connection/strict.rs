//! Strict string rules and topic limits, applied to topic names, topic filters, client ids and
//! usernames as they arrive (MQTT 5 §1.5.4 and 3.1.1 §1.5.3 let a server treat control
//! characters as malformed; mosquitto does).
//!
//! One pass over the bytes: UTF-8 was checked by the decoder, so U+0001..U+001F and U+007F are
//! the bytes 0x01..0x1F and 0x7F, and U+0080..U+009F are 0xC2 followed by 0x80..0x9F (a 0xC2
//! byte is always a lead byte in valid UTF-8).

use tern_wire::ReasonCode;

use super::{Close, Conn};
use crate::config::BrokerConfig;
use crate::metrics::Metrics;

/// Why a topic name or filter is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TopicRefusal {
    /// A control character while `reject_control_chars` is on: malformed (0x81).
    ControlChar,
    /// Over `max_topic_levels` or `max_topic_length_bytes`.
    Limit,
}

/// True if `s` holds U+0001..U+001F or U+007F..U+009F.
pub(crate) fn has_control_chars(s: &str) -> bool {
    let bytes = s.as_bytes();
    // A branch-free pass first (it vectorizes): any candidate byte at all? 0xC2 is only a
    // candidate; what follows it decides.
    let candidate = bytes
        .iter()
        .fold(false, |c, &b| c | (b < 0x20) | (b == 0x7F) | (b == 0xC2));
    candidate
        && bytes.iter().enumerate().any(|(i, &b)| {
            b < 0x20 || b == 0x7F || (b == 0xC2 && bytes.get(i + 1).is_some_and(|n| *n <= 0x9F))
        })
}

/// Checks a topic name or filter against the strict rule and the limits (on every PUBLISH:
/// the cheap tests first, the level count only when the length could exceed the limit).
pub(crate) fn check_topic(config: &BrokerConfig, topic: &str) -> Result<(), TopicRefusal> {
    if config.reject_control_chars && has_control_chars(topic) {
        return Err(TopicRefusal::ControlChar);
    }
    if topic.len() > config.max_topic_length_bytes {
        return Err(TopicRefusal::Limit);
    }
    // n bytes hold at most n + 1 levels (`//` is an empty level): short topics never need
    // the count.
    if topic.len() + 1 > config.max_topic_levels {
        let levels = topic.bytes().filter(|&b| b == b'/').count() + 1;
        if levels > config.max_topic_levels {
            return Err(TopicRefusal::Limit);
        }
    }
    Ok(())
}

/// A client id or username under the strict rule.
pub(crate) fn string_ok(config: &BrokerConfig, s: &str) -> bool {
    !(config.reject_control_chars && has_control_chars(s))
}

impl Conn {
    /// The strict rules on a topic name or filter from the client: empty (filters; MQTT-4.7.3-1)
    /// or holding a control character: malformed, the connection closes (0x81); over a topic
    /// limit: `Close::Protocol(over_limit)` (the caller closes, or refuses the one filter).
    /// Refusals are counted.
    pub(super) fn check_strict(&self, topic: &str, over_limit: ReasonCode) -> Result<(), Close> {
        if topic.is_empty() {
            return Err(Close::Protocol(ReasonCode::MALFORMED_PACKET));
        }
        let metrics = &self.shared.metrics;
        match check_topic(&self.shared.config, topic) {
            Ok(()) => Ok(()),
            Err(TopicRefusal::ControlChar) => {
                Metrics::add(&metrics.control_chars_refused, 1);
                Err(Close::Protocol(ReasonCode::MALFORMED_PACKET))
            }
            Err(TopicRefusal::Limit) => {
                let n = Metrics::add_get(&metrics.topics_refused_limit, 1);
                if n.is_power_of_two() {
                    tracing::info!(client_id = %self.session.client_id, count = n, "topic over max_topic_levels / max_topic_length_bytes");
                }
                Err(Close::Protocol(over_limit))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_found_in_one_and_two_byte_forms() {
        for bad in ["\u{1}", "a\u{1f}", "\u{7f}", "x\u{80}", "\u{85}y", "\u{9f}"] {
            assert!(has_control_chars(bad), "{bad:?}");
        }
        for good in ["", "a/b", "\u{a0}", "é", "\u{100}", "日本", "\u{20}"] {
            assert!(!has_control_chars(good), "{good:?}");
        }
    }

    #[test]
    fn limits_count_levels_and_bytes() {
        let config = BrokerConfig {
            max_topic_levels: 2,
            max_topic_length_bytes: 5,
            ..BrokerConfig::default()
        };
        assert_eq!(check_topic(&config, "a/b"), Ok(()));
        assert_eq!(check_topic(&config, "a/b/c"), Err(TopicRefusal::Limit));
        assert_eq!(check_topic(&config, "abcdef"), Err(TopicRefusal::Limit));
        // Empty levels count: `//` is three levels in two bytes.
        assert_eq!(check_topic(&config, "//"), Err(TopicRefusal::Limit));
        assert_eq!(check_topic(&config, "/"), Ok(()));
        assert_eq!(
            check_topic(&config, "a\u{1}"),
            Err(TopicRefusal::ControlChar)
        );
        let lax = BrokerConfig {
            reject_control_chars: false,
            ..config
        };
        assert_eq!(check_topic(&lax, "a\u{1}"), Ok(()));
    }
}
