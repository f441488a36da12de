//! Retained messages: one per topic, replaced by a newer one, cleared by an empty payload
//! [MQTT-3.3.1-5..-7], bounded by `max_retained_messages`.
//!
//! # Invariants
//! - The tree never holds an empty-payload message nor more than `max_retained_messages`
//!   messages; a new topic beyond the limit is not retained (logged), replacing one always is.
//! - No node is left without a message and without children (cleared branches are pruned).
//! - The tree is at most [`MAX_RETAINED_TOPIC_LEVELS`] deep.

use std::sync::Arc;

use tokio::time::Instant;

use crate::hash::Map;
use crate::model::message::Message;

/// Deepest topic retained: bounds the tree depth, hence the recursion of lookups (the same
/// bound the subscription trie puts on filters).
pub(crate) const MAX_RETAINED_TOPIC_LEVELS: usize = tern_topic::DEFAULT_MAX_FILTER_LEVELS;

/// One topic level of the retained tree.
#[derive(Debug, Default)]
struct Node {
    children: Map<Box<str>, Node>,
    message: Option<Arc<Message>>,
}

impl Node {
    fn is_empty(&self) -> bool {
        self.message.is_none() && self.children.is_empty()
    }

    /// Removes the message at `levels`; prunes nodes left empty. Returns the removed message.
    fn remove(&mut self, levels: &[&str]) -> Option<Arc<Message>> {
        let Some((first, rest)) = levels.split_first() else {
            return self.message.take();
        };
        let child = self.children.get_mut(*first)?;
        let removed = child.remove(rest);
        if child.is_empty() {
            self.children.remove(*first);
        }
        removed
    }

    /// Pushes every message at or below this node (`#`); `at_root` skips `$` topics.
    fn collect_all(&self, at_root: bool, now: Instant, out: &mut Vec<Arc<Message>>) {
        if let Some(m) = &self.message {
            if !m.is_expired(now) {
                out.push(m.clone());
            }
        }
        for (name, child) in &self.children {
            if at_root && crate::model::topics::is_dollar(name) {
                continue;
            }
            child.collect_all(false, now, out);
        }
    }

    fn collect(&self, filter: &[&str], at_root: bool, now: Instant, out: &mut Vec<Arc<Message>>) {
        let Some((first, rest)) = filter.split_first() else {
            if let Some(m) = &self.message {
                if !m.is_expired(now) {
                    out.push(m.clone());
                }
            }
            return;
        };
        match *first {
            // `#` also matches the parent level (MQTT-4.7.1-2).
            "#" => self.collect_all(at_root, now, out),
            "+" => {
                for (name, child) in &self.children {
                    // MQTT-4.7.2-1: leading wildcards do not match `$` topics.
                    if at_root && crate::model::topics::is_dollar(name) {
                        continue;
                    }
                    child.collect(rest, false, now, out);
                }
            }
            literal => {
                if let Some(child) = self.children.get(literal) {
                    child.collect(rest, false, now, out);
                }
            }
        }
    }

    /// Drops expired messages below this node; returns how many.
    fn purge(&mut self, now: Instant) -> usize {
        let mut purged = 0;
        if self.message.as_ref().is_some_and(|m| m.is_expired(now)) {
            self.message = None;
            purged += 1;
        }
        self.children.retain(|_, child| {
            purged += child.purge(now);
            !child.is_empty()
        });
        purged
    }
}

/// Retained messages in a tree of topic levels, so a wildcard SUBSCRIBE visits only the
/// branches its filter can match instead of every retained message.
#[derive(Debug, Default)]
pub(crate) struct Retained {
    root: Node,
    len: usize,
}

impl Retained {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Stores or clears the retained message of `message.topic`. False if refused (full).
    pub(crate) fn set(&mut self, message: &Arc<Message>, max_messages: usize) -> bool {
        let levels: Vec<&str> = message.topic.split('/').collect();
        if levels.len() > MAX_RETAINED_TOPIC_LEVELS {
            // Nothing that deep is stored, so there is nothing to clear either.
            return message.payload.is_empty();
        }
        if message.payload.is_empty() {
            if self.root.remove(&levels).is_some() {
                self.len -= 1;
            }
            return true;
        }
        let node = levels.iter().fold(&mut self.root, |node, level| {
            node.children.entry((*level).into()).or_default()
        });
        if node.message.is_none() && self.len >= max_messages {
            // Undo the path we may just have created for nothing.
            self.root.remove(&levels);
            return false;
        }
        // Retained messages live long: copy them out of the read buffer they were decoded
        // into, which would otherwise stay pinned whole by a few bytes.
        let copy = Message::compacted(message);
        // Delivered to every future subscriber of its topic: one shared encoding.
        copy.mark_fan_out();
        if node.message.replace(Arc::new(copy)).is_none() {
            self.len += 1;
        }
        true
    }

    /// Unexpired retained messages matching `filter` (a plain filter, no `$share/`).
    pub(crate) fn matching(&self, filter: &str, now: Instant) -> Vec<Arc<Message>> {
        let levels: Vec<&str> = filter.split('/').collect();
        let mut out = Vec::new();
        self.root.collect(&levels, true, now, &mut out);
        out
    }

    /// Drops expired retained messages (called from the `$SYS` tick).
    pub(crate) fn purge_expired(&mut self, now: Instant) {
        let purged = self.root.purge(now);
        self.len -= purged;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use proptest::strategy::Strategy;
    use std::time::Duration;
    use tern_wire::{Properties, PropertyValues, QoS, Str};

    fn msg(topic: &'static str, payload: &'static [u8]) -> Arc<Message> {
        Arc::new(Message::new(
            Str::from_static(topic),
            Bytes::from_static(payload),
            QoS::AtMostOnce,
            true,
            Properties::default(),
            None,
            Instant::now(),
        ))
    }

    #[tokio::test]
    async fn set_replace_clear_mqtt_3_3_1_5_to_7() {
        let mut r = Retained::default();
        let now = Instant::now();
        assert!(r.set(&msg("a/b", b"1"), 10));
        assert!(r.set(&msg("a/b", b"2"), 10));
        assert_eq!(r.len(), 1);
        assert_eq!(&r.matching("a/+", now)[0].payload[..], b"2");
        assert_eq!(r.matching("a/b", now).len(), 1);
        assert!(r.set(&msg("a/b", b""), 10));
        assert!(r.is_empty());
    }

    #[tokio::test]
    async fn wildcards_follow_the_matching_rules_mqtt_4_7() {
        let mut r = Retained::default();
        let now = Instant::now();
        for topic in ["a", "a/b", "a/b/c", "a//c", "/x", "$SYS/up", "b"] {
            let m = Arc::new(Message::new(
                Str::copy_from(topic).unwrap(),
                Bytes::from_static(b"1"),
                QoS::AtMostOnce,
                true,
                Properties::default(),
                None,
                now,
            ));
            assert!(r.set(&m, 100));
        }
        let topics = |filter: &str| {
            let mut t: Vec<String> = r
                .matching(filter, now)
                .iter()
                .map(|m| m.topic.to_string())
                .collect();
            t.sort();
            t
        };
        assert_eq!(topics("a/#"), vec!["a", "a//c", "a/b", "a/b/c"]);
        assert_eq!(topics("a/+"), vec!["a/b"]);
        assert_eq!(topics("a/+/c"), vec!["a//c", "a/b/c"]);
        assert_eq!(topics("+"), vec!["a", "b"]);
        assert_eq!(topics("#").len(), 6, "no $SYS");
        assert_eq!(topics("$SYS/#"), vec!["$SYS/up"]);
        assert_eq!(topics("+/x"), vec!["/x"]);
        for t in topics("#") {
            let clear = Arc::new(Message::new(
                Str::copy_from(&t).unwrap(),
                Bytes::new(),
                QoS::AtMostOnce,
                true,
                Properties::default(),
                None,
                now,
            ));
            r.set(&clear, 100);
        }
        assert_eq!(r.len(), 1);
        assert_eq!(r.root.children.len(), 1, "empty branches pruned");
    }

    proptest::proptest! {
        /// The tree walk is an index, not a second matching rule: for any retained topics and
        /// any filter it returns exactly the topics the one rule (`tern_topic::filter_matches`,
        /// MQTT-4.7.1-2, MQTT-4.7.1-3, MQTT-4.7.2-1) accepts.
        #[test]
        fn matching_is_the_one_rule(
            topics in proptest::collection::btree_set(
                proptest::collection::vec(
                    proptest::sample::select(vec!["a", "b", "", "$SYS", "$x"]), 1..4,
                ).prop_map(|levels| levels.join("/")),
                0..12,
            ),
            filter in (
                proptest::collection::vec(proptest::sample::select(vec!["a", "b", "", "+", "$SYS"]), 0..4),
                proptest::bool::ANY,
            ).prop_filter_map("a filter has a level", |(mut levels, hash)| {
                if hash { levels.push("#"); }
                (!levels.is_empty()).then(|| levels.join("/"))
            }),
        ) {
            let now = Instant::now();
            let mut r = Retained::default();
            for topic in &topics {
                let m = Arc::new(Message::new(
                    Str::copy_from(topic).unwrap(),
                    Bytes::from_static(b"1"),
                    QoS::AtMostOnce,
                    true,
                    Properties::default(),
                    None,
                    now,
                ));
                proptest::prop_assert!(r.set(&m, 100));
            }
            let mut got: Vec<String> =
                r.matching(&filter, now).iter().map(|m| m.topic.to_string()).collect();
            got.sort();
            let want: Vec<String> = topics
                .iter()
                .filter(|t| tern_topic::filter_matches(&filter, t))
                .cloned()
                .collect();
            proptest::prop_assert_eq!(got, want, "filter {:?}", filter);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn expired_retained_messages_are_not_sent_and_purged() {
        let mut r = Retained::default();
        let props: Properties = PropertyValues {
            message_expiry_interval_s: Some(5),
            ..PropertyValues::default()
        }
        .into();
        let m = Arc::new(Message::new(
            Str::from_static("e/t"),
            Bytes::from_static(b"1"),
            QoS::AtMostOnce,
            true,
            props,
            None,
            Instant::now(),
        ));
        r.set(&m, 10);
        assert_eq!(r.matching("e/#", Instant::now()).len(), 1);
        tokio::time::advance(Duration::from_secs(6)).await;
        assert!(r.matching("e/#", Instant::now()).is_empty());
        r.purge_expired(Instant::now());
        assert!(r.is_empty());
    }

    #[tokio::test]
    async fn bounded_by_max_retained_messages() {
        let mut r = Retained::default();
        assert!(r.set(&msg("a", b"1"), 1));
        assert!(!r.set(&msg("b", b"1"), 1));
        assert!(r.set(&msg("a", b"2"), 1), "replacing is always allowed");
        let deep: String = "x/".repeat(MAX_RETAINED_TOPIC_LEVELS);
        let deep = Arc::new(Message::new(
            Str::copy_from(&deep).unwrap(),
            Bytes::from_static(b"1"),
            QoS::AtMostOnce,
            true,
            Properties::default(),
            None,
            Instant::now(),
        ));
        let mut r = Retained::default();
        assert!(!r.set(&deep, 10), "too deep to retain");
        assert!(r.is_empty());
    }
}
