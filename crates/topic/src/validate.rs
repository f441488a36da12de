//! Validation of topic names, topic filters and shared subscriptions, plus the reference
//! (one filter against one topic) matcher.
//!
//! # Invariants
//! - Validation never normalises: `a//b`, `/a` and `a/` are valid and distinct from `a/b`,
//!   `a` and `a` respectively [MQTT-4.7.3-4].
//! - A string that passes [`validate_topic_filter`] has every `#` alone in the last level
//!   and every `+` alone in its level; the trie relies on this when it maps levels to nodes.
//! - [`filter_matches`] is the specification of matching: the trie must agree with it for
//!   every valid filter and topic (checked by the crate's property tests).

use crate::error::{ShareNameError, SharedFilterError, TopicFilterError, TopicNameError};

/// Longest topic name or filter the spec allows, in bytes [MQTT-4.7.3-3].
pub const MAX_TOPIC_BYTES: usize = 65_535;

/// Prefix of a shared subscription filter [MQTT-4.8.2-1].
pub const SHARE_PREFIX: &str = "$share/";

/// Checks a topic name (PUBLISH topic, will topic).
///
/// Rules: non-empty [MQTT-4.7.3-1], no `+` or `#` [MQTT-4.7.1-1], no U+0000
/// [MQTT-4.7.3-2], at most 65,535 bytes [MQTT-4.7.3-3].
pub fn validate_topic_name(topic: &str) -> Result<(), TopicNameError> {
    if topic.is_empty() {
        return Err(TopicNameError::Empty);
    }
    if topic.len() > MAX_TOPIC_BYTES {
        return Err(TopicNameError::TooLong {
            len_bytes: topic.len(),
        });
    }
    match topic
        .bytes()
        .enumerate()
        .find(|&(_, b)| matches!(b, b'+' | b'#' | 0))
    {
        None => Ok(()),
        Some((offset, 0)) => Err(TopicNameError::Nul { offset }),
        Some((offset, b)) => Err(TopicNameError::Wildcard {
            wildcard: char::from(b),
            offset,
        }),
    }
}

/// Checks a topic filter (SUBSCRIBE / UNSUBSCRIBE), without the `$share/` prefix.
///
/// Rules: non-empty [MQTT-4.7.3-1], no U+0000 [MQTT-4.7.3-2], at most 65,535 bytes
/// [MQTT-4.7.3-3], `#` alone in the last level [MQTT-4.7.1-2], `+` alone in its level
/// [MQTT-4.7.1-3].
pub fn validate_topic_filter(filter: &str) -> Result<(), TopicFilterError> {
    if filter.is_empty() {
        return Err(TopicFilterError::Empty);
    }
    if filter.len() > MAX_TOPIC_BYTES {
        return Err(TopicFilterError::TooLong {
            len_bytes: filter.len(),
        });
    }
    let bytes = filter.as_bytes();
    let mut level_start = 0;
    for (offset, &b) in bytes.iter().enumerate() {
        match b {
            0 => return Err(TopicFilterError::Nul { offset }),
            b'#' => {
                let alone_at_start = offset == level_start;
                let is_last_char = offset + 1 == bytes.len();
                if !(alone_at_start && is_last_char) {
                    return Err(TopicFilterError::MultiLevelWildcard { offset });
                }
            }
            b'+' => {
                let alone_at_start = offset == level_start;
                let level_ends = offset + 1 == bytes.len() || bytes[offset + 1] == b'/';
                if !(alone_at_start && level_ends) {
                    return Err(TopicFilterError::SingleLevelWildcard { offset });
                }
            }
            b'/' => level_start = offset + 1,
            _ => {}
        }
    }
    Ok(())
}

/// Checks a ShareName: non-empty [MQTT-4.8.2-1], no `/`, `+`, `#` [MQTT-4.8.2-2], no U+0000.
pub fn validate_share_name(name: &str) -> Result<(), ShareNameError> {
    if name.is_empty() {
        return Err(ShareNameError::Empty);
    }
    match name
        .bytes()
        .enumerate()
        .find(|&(_, b)| matches!(b, b'/' | b'+' | b'#' | 0))
    {
        None => Ok(()),
        Some((offset, 0)) => Err(ShareNameError::Nul { offset }),
        Some((offset, b)) => Err(ShareNameError::InvalidChar {
            ch: char::from(b),
            offset,
        }),
    }
}

/// A topic filter from a SUBSCRIBE, classified as plain or shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilterKind<'a> {
    /// A plain topic filter.
    Normal(&'a str),
    /// `$share/{group}/{filter}`.
    Shared {
        /// The ShareName.
        group: &'a str,
        /// The topic filter after the ShareName.
        filter: &'a str,
    },
}

/// Error from [`classify_filter`]: either kind of filter can be malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilterKindError {
    /// The plain filter is invalid.
    #[error(transparent)]
    Normal(#[from] TopicFilterError),
    /// The shared filter is invalid.
    #[error(transparent)]
    Shared(#[from] SharedFilterError),
}

/// Splits and validates a SUBSCRIBE filter: `$share/{ShareName}/{filter}` is shared, anything
/// else is a plain filter (so `$share` alone is a plain filter on the topic `$share`).
pub fn classify_filter(raw: &str) -> Result<FilterKind<'_>, FilterKindError> {
    match parse_shared_filter(raw) {
        Some(parsed) => {
            let (group, filter) = parsed?;
            Ok(FilterKind::Shared { group, filter })
        }
        None => {
            validate_topic_filter(raw)?;
            Ok(FilterKind::Normal(raw))
        }
    }
}

/// Parses `$share/{ShareName}/{filter}`. Returns `None` if `raw` does not start with
/// `$share/`, else the validated `(group, filter)` pair or the reason it is malformed
/// [MQTT-4.8.2-1], [MQTT-4.8.2-2].
pub fn parse_shared_filter(raw: &str) -> Option<Result<(&str, &str), SharedFilterError>> {
    let rest = raw.strip_prefix(SHARE_PREFIX)?;
    Some(split_shared(rest))
}

fn split_shared(rest: &str) -> Result<(&str, &str), SharedFilterError> {
    let Some((group, filter)) = rest.split_once('/') else {
        // No '/' at all: either an empty name or a name with no filter after it.
        validate_share_name(rest)?;
        return Err(SharedFilterError::MissingFilter);
    };
    validate_share_name(group)?;
    validate_topic_filter(filter)?;
    Ok((group, filter))
}

/// True if the topic is reserved for the server (`$SYS/...`, `$share` and the like):
/// filters starting with a wildcard must not match it [MQTT-4.7.2-1].
#[inline]
pub fn is_sys_topic(topic: &str) -> bool {
    topic.starts_with('$')
}

/// The reference matcher: does the valid `filter` match the valid topic name `topic`?
///
/// `+` matches exactly one level, empty levels included; `#` matches the parent level and
/// any number of child levels; a filter starting with a wildcard does not match a topic
/// starting with `$` [MQTT-4.7.2-1]. Useful for retained messages (one topic, many filters
/// would use the trie; one filter, many topics uses this) and as the oracle for the trie.
#[inline]
pub fn filter_matches(filter: &str, topic: &str) -> bool {
    filter_matches_bytes(filter.as_bytes(), topic.as_bytes())
}

/// [`filter_matches`] on raw bytes, for the store, which keeps topics as bytes. The same rule:
/// `/` is ASCII, so splitting UTF-8 on it byte by byte splits at the same places.
pub fn filter_matches_bytes(filter: &[u8], topic: &[u8]) -> bool {
    if topic.first() == Some(&b'$') && matches!(filter.first(), Some(b'+' | b'#')) {
        return false;
    }
    let mut filter_levels = filter.split(|&b| b == b'/');
    let mut topic_levels = topic.split(|&b| b == b'/');
    loop {
        match (filter_levels.next(), topic_levels.next()) {
            (Some(b"#"), _) => return true,
            (Some(b"+"), Some(_)) => {}
            (Some(f), Some(t)) if f == t => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_name_must_not_be_empty_mqtt_4_7_3_1() {
        assert_eq!(validate_topic_name(""), Err(TopicNameError::Empty));
        assert_eq!(validate_topic_filter(""), Err(TopicFilterError::Empty));
    }

    #[test]
    fn single_slash_and_empty_levels_are_valid_mqtt_4_7_3_1() {
        for t in ["/", "//", "a//b", "/a", "a/", " "] {
            assert_eq!(validate_topic_name(t), Ok(()), "{t:?}");
            assert_eq!(validate_topic_filter(t), Ok(()), "{t:?}");
        }
    }

    #[test]
    fn topic_name_rejects_wildcards_mqtt_4_7_1_1() {
        assert_eq!(
            validate_topic_name("a/+/b"),
            Err(TopicNameError::Wildcard {
                wildcard: '+',
                offset: 2
            })
        );
        assert_eq!(
            validate_topic_name("a/#"),
            Err(TopicNameError::Wildcard {
                wildcard: '#',
                offset: 2
            })
        );
        assert!(validate_topic_name("a+b").is_err());
        assert!(validate_topic_name("#").is_err());
    }

    #[test]
    fn nul_is_rejected_everywhere_mqtt_4_7_3_2() {
        assert_eq!(
            validate_topic_name("a\0b"),
            Err(TopicNameError::Nul { offset: 1 })
        );
        assert_eq!(
            validate_topic_filter("a/\0"),
            Err(TopicFilterError::Nul { offset: 2 })
        );
        assert_eq!(
            validate_share_name("g\0"),
            Err(ShareNameError::Nul { offset: 1 })
        );
    }

    #[test]
    fn length_limit_is_65535_bytes_mqtt_4_7_3_3() {
        let max = "a".repeat(MAX_TOPIC_BYTES);
        assert_eq!(validate_topic_name(&max), Ok(()));
        assert_eq!(validate_topic_filter(&max), Ok(()));
        let over = "a".repeat(MAX_TOPIC_BYTES + 1);
        assert_eq!(
            validate_topic_name(&over),
            Err(TopicNameError::TooLong {
                len_bytes: MAX_TOPIC_BYTES + 1
            })
        );
        assert!(matches!(
            validate_topic_filter(&over),
            Err(TopicFilterError::TooLong { .. })
        ));
        // Bytes, not chars: 'é' is two bytes.
        let multibyte = "é".repeat(MAX_TOPIC_BYTES / 2 + 1);
        assert!(validate_topic_name(&multibyte).is_err());
    }

    #[test]
    fn multi_level_wildcard_alone_and_last_mqtt_4_7_1_2() {
        for ok in ["#", "a/#", "/#", "a//#", "+/#"] {
            assert_eq!(validate_topic_filter(ok), Ok(()), "{ok:?}");
        }
        for (bad, offset) in [
            ("a#", 1),
            ("a/#/b", 2),
            ("#/", 0),
            ("a/b#", 3),
            ("##", 0),
            ("#a", 0),
        ] {
            assert_eq!(
                validate_topic_filter(bad),
                Err(TopicFilterError::MultiLevelWildcard { offset }),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn single_level_wildcard_occupies_whole_level_mqtt_4_7_1_3() {
        for ok in ["+", "+/+", "/+", "+/", "a/+/b", "+/#", "a/+"] {
            assert_eq!(validate_topic_filter(ok), Ok(()), "{ok:?}");
        }
        for (bad, offset) in [("a+", 1), ("+a", 0), ("a/b+/c", 3), ("++", 0)] {
            assert_eq!(
                validate_topic_filter(bad),
                Err(TopicFilterError::SingleLevelWildcard { offset }),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn shared_filter_syntax_mqtt_4_8_2_1_and_4_8_2_2() {
        assert_eq!(
            parse_shared_filter("$share/g/a/+/#"),
            Some(Ok(("g", "a/+/#")))
        );
        assert_eq!(parse_shared_filter("$share/g/#"), Some(Ok(("g", "#"))));
        assert_eq!(parse_shared_filter("a/b"), None);
        assert_eq!(parse_shared_filter("$share"), None);
        assert_eq!(parse_shared_filter("$SHARE/g/a"), None);
        // [MQTT-4.8.2-1] ShareName at least one character.
        assert_eq!(
            parse_shared_filter("$share//a"),
            Some(Err(ShareNameError::Empty.into()))
        );
        assert_eq!(
            parse_shared_filter("$share/"),
            Some(Err(ShareNameError::Empty.into()))
        );
        // [MQTT-4.8.2-2] No '+' or '#' in ShareName, '/' and a filter must follow.
        assert_eq!(
            parse_shared_filter("$share/g+/a"),
            Some(Err(
                ShareNameError::InvalidChar { ch: '+', offset: 1 }.into()
            ))
        );
        assert_eq!(
            parse_shared_filter("$share/#/a"),
            Some(Err(
                ShareNameError::InvalidChar { ch: '#', offset: 0 }.into()
            ))
        );
        assert_eq!(
            parse_shared_filter("$share/g"),
            Some(Err(SharedFilterError::MissingFilter))
        );
        assert_eq!(
            parse_shared_filter("$share/g/"),
            Some(Err(TopicFilterError::Empty.into()))
        );
        assert_eq!(
            parse_shared_filter("$share/g/a#"),
            Some(Err(
                TopicFilterError::MultiLevelWildcard { offset: 1 }.into()
            ))
        );
        assert_eq!(
            validate_share_name("a/b"),
            Err(ShareNameError::InvalidChar { ch: '/', offset: 1 })
        );
    }

    #[test]
    fn classify_filter_splits_kinds() {
        assert_eq!(classify_filter("a/+"), Ok(FilterKind::Normal("a/+")));
        assert_eq!(
            classify_filter("$share/g/a/+"),
            Ok(FilterKind::Shared {
                group: "g",
                filter: "a/+"
            })
        );
        assert!(matches!(
            classify_filter("a/#/b"),
            Err(FilterKindError::Normal(_))
        ));
        assert!(matches!(
            classify_filter("$share//a"),
            Err(FilterKindError::Shared(_))
        ));
    }

    #[test]
    fn plus_matches_exactly_one_level_including_empty() {
        assert!(filter_matches("sport/tennis/+", "sport/tennis/player1"));
        assert!(!filter_matches(
            "sport/tennis/+",
            "sport/tennis/player1/ranking"
        ));
        assert!(!filter_matches("sport/+", "sport"));
        assert!(filter_matches("sport/+", "sport/"));
        assert!(filter_matches("+/+", "/finance"));
        assert!(filter_matches("/+", "/finance"));
        assert!(!filter_matches("+", "/finance"));
        assert!(filter_matches("a/+/b", "a//b"));
        assert!(filter_matches("+", ""));
    }

    #[test]
    fn hash_matches_parent_and_children() {
        assert!(filter_matches("sport/#", "sport"));
        assert!(filter_matches("sport/#", "sport/"));
        assert!(filter_matches("sport/#", "sport/tennis/player1"));
        assert!(filter_matches("sport/tennis/#", "sport/tennis"));
        assert!(!filter_matches("sport/tennis/#", "sport"));
        assert!(!filter_matches("sport/#", "sports"));
        assert!(filter_matches("#", "a/b/c"));
        assert!(filter_matches("#", "/"));
    }

    #[test]
    fn no_normalisation_levels_are_distinct_mqtt_4_7_3_4() {
        assert!(!filter_matches("a/b", "a//b"));
        assert!(!filter_matches("a", "a/"));
        assert!(!filter_matches("a", "/a"));
        assert!(!filter_matches("A", "a"));
    }

    #[test]
    fn dollar_topics_skip_leading_wildcards_mqtt_4_7_2_1() {
        assert!(is_sys_topic("$SYS/broker"));
        assert!(!is_sys_topic("SYS/$x"));
        assert!(!filter_matches("#", "$SYS/broker"));
        assert!(!filter_matches("+/broker", "$SYS/broker"));
        assert!(!filter_matches("+", "$SYS"));
        assert!(filter_matches("$SYS/#", "$SYS/broker"));
        assert!(filter_matches("$SYS/+", "$SYS/broker"));
        // Only the first level is special.
        assert!(filter_matches("a/+", "a/$x"));
        assert!(filter_matches("a/#", "a/$x/y"));
    }
}
