//! tern-topic: MQTT topic names, topic filters, the subscription trie and `$share` groups.
//!
//! The broker calls into this crate on every SUBSCRIBE, UNSUBSCRIBE and PUBLISH. It is a
//! leaf: no I/O, no async, no other Tern crate. The store uses its matcher
//! ([`filter_matches_bytes`]): one implementation of the rule.
//!
//! - [`validate`]: spec checks for topic names, filters and `$share/{ShareName}/{filter}`,
//!   the `$`-topic rule, and [`filter_matches`], the one-filter reference matcher.
//! - [`trie`]: [`SubscriptionTrie`], subscriptions by filter; [`SubscriptionTrie::for_each_match`]
//!   visits every matching subscription and share group without allocating.
//! - [`shared`]: [`SharedGroup`], the members of one share group, with a deterministic
//!   round-robin pick that can skip members the caller rejects.
//! - [`error`]: typed errors naming the conformance statements they enforce.
//! - `hybrid_map` (private): the vector-then-hash-map used for node children.
//! - `subscribers` (private): the dense subscriber list of one filter, indexed once large.
//!
//! ```
//! use tern_topic::{Match, SubscriptionTrie};
//!
//! let mut trie: SubscriptionTrie<u64, u8> = SubscriptionTrie::new();
//! trie.subscribe("site/+/temp", 1, 0).unwrap();
//! trie.subscribe_shared("workers", "site/#", 2, 1).unwrap();
//! trie.subscribe_shared("workers", "site/#", 3, 1).unwrap();
//! let mut direct = Vec::new();
//! trie.for_each_match("site/7/temp", |m| match m {
//!     Match::Subscription { key, .. } => direct.push(*key),
//!     Match::Shared(group) => {
//!         let (member, _qos) = group.next_member().unwrap();
//!         direct.push(*member);
//!     }
//! });
//! direct.sort();
//! assert_eq!(direct, vec![1, 2]);
//! ```

pub mod error;
mod hybrid_map;
pub mod shared;
mod subscribers;
pub mod trie;
pub mod validate;

pub use error::{
    ShareNameError, SharedFilterError, SubscribeError, TopicFilterError, TopicNameError,
};
pub use shared::SharedGroup;
pub use trie::{DEFAULT_MAX_FILTER_LEVELS, DEFAULT_MAX_SUBSCRIPTIONS, Match, SubscriptionTrie};
pub use validate::{
    FilterKind, FilterKindError, MAX_TOPIC_BYTES, SHARE_PREFIX, classify_filter, filter_matches,
    filter_matches_bytes, is_sys_topic, parse_shared_filter, validate_share_name,
    validate_topic_filter, validate_topic_name,
};
