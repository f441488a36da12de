//! Typed errors for topic names, topic filters, shared subscriptions and the trie.
//!
//! Each variant names the MQTT conformance statement it enforces so that the broker can
//! log it and pick the matching reason code (v5: 0x90 Topic Name invalid, 0x8F Topic
//! Filter invalid, 0x9E Shared Subscriptions not supported, ...).

use thiserror::Error;

/// Why a topic name (the topic of a PUBLISH or a will) is invalid.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TopicNameError {
    /// [MQTT-4.7.3-1] A topic name must be at least one character long.
    #[error("topic name is empty [MQTT-4.7.3-1]")]
    Empty,
    /// [MQTT-4.7.3-3] A topic name must not encode to more than 65,535 bytes.
    #[error("topic name is {len_bytes} bytes, more than 65535 [MQTT-4.7.3-3]")]
    TooLong {
        /// Length of the offending name.
        len_bytes: usize,
    },
    /// [MQTT-4.7.1-1] / [MQTT-3.3.2-2] Wildcards must not be used within a topic name.
    #[error("topic name contains wildcard '{wildcard}' at byte {offset} [MQTT-4.7.1-1]")]
    Wildcard {
        /// `+` or `#`.
        wildcard: char,
        /// Byte offset of the wildcard.
        offset: usize,
    },
    /// [MQTT-4.7.3-2] A topic name must not include U+0000.
    #[error("topic name contains U+0000 at byte {offset} [MQTT-4.7.3-2]")]
    Nul {
        /// Byte offset of the NUL.
        offset: usize,
    },
}

/// Why a topic filter (the filter of a SUBSCRIBE or UNSUBSCRIBE) is invalid.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TopicFilterError {
    /// [MQTT-4.7.3-1] A topic filter must be at least one character long.
    #[error("topic filter is empty [MQTT-4.7.3-1]")]
    Empty,
    /// [MQTT-4.7.3-3] A topic filter must not encode to more than 65,535 bytes.
    #[error("topic filter is {len_bytes} bytes, more than 65535 [MQTT-4.7.3-3]")]
    TooLong {
        /// Length of the offending filter.
        len_bytes: usize,
    },
    /// [MQTT-4.7.3-2] A topic filter must not include U+0000.
    #[error("topic filter contains U+0000 at byte {offset} [MQTT-4.7.3-2]")]
    Nul {
        /// Byte offset of the NUL.
        offset: usize,
    },
    /// [MQTT-4.7.1-2] `#` must be alone in its level and be the last level.
    #[error("'#' at byte {offset} is not alone in the last level [MQTT-4.7.1-2]")]
    MultiLevelWildcard {
        /// Byte offset of the misplaced `#`.
        offset: usize,
    },
    /// [MQTT-4.7.1-3] `+` must occupy an entire level.
    #[error("'+' at byte {offset} does not occupy an entire level [MQTT-4.7.1-3]")]
    SingleLevelWildcard {
        /// Byte offset of the misplaced `+`.
        offset: usize,
    },
}

/// Why the ShareName of a shared subscription is invalid.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ShareNameError {
    /// [MQTT-4.8.2-1] The ShareName must be at least one character long.
    #[error("share name is empty [MQTT-4.8.2-1]")]
    Empty,
    /// [MQTT-4.8.2-2] The ShareName must not contain `/`, `+` or `#`.
    #[error("share name contains '{ch}' at byte {offset} [MQTT-4.8.2-2]")]
    InvalidChar {
        /// The forbidden character.
        ch: char,
        /// Byte offset inside the share name.
        offset: usize,
    },
    /// [MQTT-4.7.3-2] applies to every UTF-8 string: no U+0000.
    #[error("share name contains U+0000 at byte {offset} [MQTT-4.7.3-2]")]
    Nul {
        /// Byte offset inside the share name.
        offset: usize,
    },
}

/// Why a `$share/{ShareName}/{filter}` string is invalid.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SharedFilterError {
    /// [MQTT-4.8.2-2] The ShareName must be followed by `/` and a topic filter.
    #[error("shared subscription has no '/' and topic filter after the share name [MQTT-4.8.2-2]")]
    MissingFilter,
    /// The ShareName is invalid.
    #[error(transparent)]
    ShareName(#[from] ShareNameError),
    /// The topic filter after the ShareName is invalid.
    #[error(transparent)]
    Filter(#[from] TopicFilterError),
}

/// Why the trie refused a subscription.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SubscribeError {
    /// The topic filter is invalid per the spec.
    #[error(transparent)]
    Filter(#[from] TopicFilterError),
    /// The share group name is invalid per the spec.
    #[error(transparent)]
    ShareName(#[from] ShareNameError),
    /// The filter has more levels than the trie accepts. This is our limit, not the spec's:
    /// it bounds the trie depth and so the recursion depth of matching and pruning.
    #[error("topic filter has {levels} levels, more than the limit of {max_levels}")]
    TooManyLevels {
        /// Levels in the offending filter.
        levels: usize,
        /// The configured limit.
        max_levels: usize,
    },
    /// The trie already holds its maximum number of subscriptions (v5: 0x97 Quota
    /// exceeded). Replacing an existing subscription is always allowed.
    #[error("the trie holds its limit of {max_subscriptions} subscriptions")]
    TooManySubscriptions {
        /// The configured limit.
        max_subscriptions: usize,
    },
}
