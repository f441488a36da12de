//! The subscription trie: topic filters split at `/`, one node per level, with separate
//! slots for `+` and `#` so that matching a topic walks only branches that can match.
//!
//! # Invariants
//! - A node's literal children are keyed by their level text; that text is stored only
//!   there, once per node. `+` and `#` never appear as literal keys: they live in `plus`
//!   and `hash`. A `hash` node never has children (`#` is always the last level).
//! - Every node except the root is non-empty: it has a subscriber, a share group or a
//!   child. Unsubscribing prunes nodes that become empty, so churn does not leak memory.
//! - No share group in the trie is empty; removing its last member removes the group from
//!   its node and from the group slab. Groups live in a slab; nodes hold their ids.
//! - `len` is the number of (filter, key) subscriptions plus the number of (group, filter,
//!   key) shared memberships, and never exceeds `max_subscriptions`.
//! - A refused subscribe (invalid filter, limits) changes nothing: checks run before any
//!   node is created.
//! - The trie depth is at most `max_filter_levels` + 1, which bounds the recursion depth of
//!   matching and pruning whatever the topic length (topics are walked lazily, never
//!   deeper than the trie).

use std::hash::Hash;

use crate::error::SubscribeError;
use crate::hybrid_map::HybridMap;
use crate::shared::{GroupSlab, SharedGroup};
use crate::subscribers::Subscribers;
use crate::validate::{is_sys_topic, validate_share_name, validate_topic_filter};

/// Default limit on levels per subscribed filter; see [`SubscriptionTrie::with_limits`].
pub const DEFAULT_MAX_FILTER_LEVELS: usize = 128;

/// Default limit on subscriptions plus shared memberships in one trie (about 2.2 GB at the
/// measured 222 bytes each); see [`SubscriptionTrie::with_limits`]. The broker's per-session
/// limits are expected to bite long before this one.
pub const DEFAULT_MAX_SUBSCRIPTIONS: usize = 10_000_000;

/// A node's literal children stay a vector up to this many entries: a linear scan over a
/// few short strings beats hashing the level, and most nodes have one child. Measured on
/// the 100k-subscription bench: hash maps everywhere 378 ns/match and 367 B/subscription,
/// this hybrid 261 ns and 210 B (bench-topic.md); 32 measured the same as 8.
const CHILDREN_SMALL_MAX: usize = 8;

/// One match reported by [`SubscriptionTrie::for_each_match`].
#[derive(Debug)]
pub enum Match<'a, K, V> {
    /// A normal (non-shared) subscription. A client with several overlapping filters is
    /// reported once per filter; merging them is the broker's job.
    Subscription {
        /// The subscriber.
        key: &'a K,
        /// The subscription's options.
        value: &'a V,
    },
    /// A share group whose filter matches; the broker picks one member per message, e.g.
    /// with [`SharedGroup::next_member_where`].
    Shared(&'a SharedGroup<K, V>),
}

struct Node<K, V> {
    children: HybridMap<Box<str>, Node<K, V>>,
    plus: Option<Box<Node<K, V>>>,
    hash: Option<Box<Node<K, V>>>,
    subscribers: Subscribers<K, V>,
    /// Ids in the trie's [`GroupSlab`] of the groups on exactly this filter.
    groups: Vec<usize>,
}

impl<K, V> Default for Node<K, V> {
    fn default() -> Self {
        Node {
            children: HybridMap::default(),
            plus: None,
            hash: None,
            subscribers: Subscribers::default(),
            groups: Vec::new(),
        }
    }
}

impl<K: Eq + Hash + Clone, V> Node<K, V> {
    fn is_empty(&self) -> bool {
        self.children.is_empty()
            && self.plus.is_none()
            && self.hash.is_none()
            && self.subscribers.is_empty()
            && self.groups.is_empty()
    }

    #[inline]
    fn visit_own<'a>(&'a self, slab: &'a GroupSlab<K, V>, visit: &mut impl FnMut(Match<'a, K, V>)) {
        for (key, value) in self.subscribers.as_slice() {
            visit(Match::Subscription { key, value });
        }
        for &id in &self.groups {
            if let Some(group) = slab.get(id) {
                visit(Match::Shared(group));
            }
        }
    }

    fn group_position(&self, slab: &GroupSlab<K, V>, name: &str) -> Option<usize> {
        self.groups
            .iter()
            .position(|&id| slab.get(id).is_some_and(|g| g.name() == name))
    }

    /// Node for one level of a filter, created if absent.
    fn child_mut(&mut self, level: &str) -> &mut Node<K, V> {
        match level {
            "+" => self.plus.get_or_insert_with(Box::default),
            "#" => self.hash.get_or_insert_with(Box::default),
            literal => self
                .children
                .get_or_insert_with(literal, CHILDREN_SMALL_MAX, Node::default),
        }
    }

    fn child(&self, level: &str) -> Option<&Node<K, V>> {
        match level {
            "+" => self.plus.as_deref(),
            "#" => self.hash.as_deref(),
            literal => self.children.get(literal),
        }
    }

    /// Walks `levels` down from this node, applies `op` to the last node and prunes the
    /// nodes that `op` left empty on the way back up.
    fn remove_at<'f, R>(
        &mut self,
        mut levels: impl Iterator<Item = &'f str>,
        op: impl FnOnce(&mut Node<K, V>) -> Option<R>,
    ) -> Option<R> {
        let Some(level) = levels.next() else {
            return op(self);
        };
        let result;
        let now_empty;
        match level {
            "+" | "#" => {
                let slot = if level == "+" {
                    &mut self.plus
                } else {
                    &mut self.hash
                };
                let child = slot.as_deref_mut()?;
                result = child.remove_at(levels, op);
                now_empty = child.is_empty();
                if now_empty {
                    *slot = None;
                }
            }
            literal => {
                let child = self.children.get_mut(literal)?;
                result = child.remove_at(levels, op);
                now_empty = child.is_empty();
                if now_empty {
                    self.children.remove(literal, CHILDREN_SMALL_MAX);
                }
            }
        }
        result
    }

    fn node_count(&self) -> usize {
        let mut count = 1;
        self.children
            .for_each(|_, child| count += child.node_count());
        count += self.plus.as_ref().map_or(0, |n| n.node_count());
        count += self.hash.as_ref().map_or(0, |n| n.node_count());
        count
    }

    /// Removes every subscription and membership of `key` below this node, pruning empty
    /// nodes; returns how many were removed.
    fn remove_key(&mut self, key: &K, slab: &mut GroupSlab<K, V>) -> usize {
        let mut removed = usize::from(self.subscribers.remove(key).is_some());
        self.groups.retain(|&id| {
            let Some(group) = slab.get_mut(id) else {
                return false;
            };
            removed += group.retain(|k| k != key);
            if group.is_empty() {
                slab.remove(id);
                return false;
            }
            true
        });
        self.children.retain(CHILDREN_SMALL_MAX, |_, child| {
            removed += child.remove_key(key, slab);
            !child.is_empty()
        });
        for slot in [&mut self.plus, &mut self.hash] {
            if let Some(child) = slot.as_deref_mut() {
                removed += child.remove_key(key, slab);
                if child.is_empty() {
                    *slot = None;
                }
            }
        }
        removed
    }
}

/// Subscriptions by topic filter, generic over the subscriber key `K` (a session id) and
/// the per-subscription value `V` (QoS, no-local, retain-as-published, identifiers...).
pub struct SubscriptionTrie<K, V> {
    root: Node<K, V>,
    groups: GroupSlab<K, V>,
    len: usize,
    max_filter_levels: usize,
    max_subscriptions: usize,
}

impl<K: Eq + Hash + Clone, V> Default for SubscriptionTrie<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Eq + Hash + Clone, V> SubscriptionTrie<K, V> {
    /// An empty trie with the default limits, [`DEFAULT_MAX_FILTER_LEVELS`] and
    /// [`DEFAULT_MAX_SUBSCRIPTIONS`].
    pub fn new() -> Self {
        Self::with_limits(DEFAULT_MAX_FILTER_LEVELS, DEFAULT_MAX_SUBSCRIPTIONS)
    }

    /// An empty trie accepting filters of up to `max_filter_levels` levels (the spec has no
    /// such limit; ours bounds the trie depth and so the stack used by matching) and at most
    /// `max_subscriptions` subscriptions plus shared memberships.
    pub fn with_limits(max_filter_levels: usize, max_subscriptions: usize) -> Self {
        SubscriptionTrie {
            root: Node::default(),
            groups: GroupSlab::default(),
            len: 0,
            max_filter_levels: max_filter_levels.max(1),
            max_subscriptions,
        }
    }

    /// Number of subscriptions plus shared memberships.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if there is no subscription.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Nodes in the trie, root included (1 when empty). For memory accounting and tests.
    pub fn node_count(&self) -> usize {
        self.root.node_count()
    }

    fn check_filter(&self, filter: &str) -> Result<(), SubscribeError> {
        validate_topic_filter(filter)?;
        let levels = filter.bytes().filter(|&b| b == b'/').count() + 1;
        if levels > self.max_filter_levels {
            return Err(SubscribeError::TooManyLevels {
                levels,
                max_levels: self.max_filter_levels,
            });
        }
        Ok(())
    }

    fn quota_error(&self) -> SubscribeError {
        SubscribeError::TooManySubscriptions {
            max_subscriptions: self.max_subscriptions,
        }
    }

    fn node_mut_or_insert<'t>(root: &'t mut Node<K, V>, filter: &str) -> &'t mut Node<K, V> {
        filter
            .split('/')
            .fold(root, |node, level| node.child_mut(level))
    }

    fn node(&self, filter: &str) -> Option<&Node<K, V>> {
        filter
            .split('/')
            .try_fold(&self.root, |node, level| node.child(level))
    }

    /// Subscribes `key` to `filter` (a plain filter, without `$share/`). Replaces the
    /// existing subscription of `key` on exactly this filter and returns its old value.
    pub fn subscribe(
        &mut self,
        filter: &str,
        key: K,
        value: V,
    ) -> Result<Option<V>, SubscribeError> {
        self.check_filter(filter)?;
        if self.len >= self.max_subscriptions && self.get(filter, &key).is_none() {
            return Err(self.quota_error());
        }
        let old = Self::node_mut_or_insert(&mut self.root, filter)
            .subscribers
            .insert(key, value);
        if old.is_none() {
            self.len += 1;
        }
        Ok(old)
    }

    /// Removes the subscription of `key` on exactly `filter`, returning its value.
    /// An invalid or unknown filter removes nothing.
    pub fn unsubscribe(&mut self, filter: &str, key: &K) -> Option<V> {
        let old = self
            .root
            .remove_at(filter.split('/'), |node| node.subscribers.remove(key))?;
        self.len -= 1;
        Some(old)
    }

    /// The value of `key`'s subscription on exactly `filter`.
    pub fn get(&self, filter: &str, key: &K) -> Option<&V> {
        self.node(filter)?.subscribers.get(key)
    }

    /// Adds `key` to the share group `group` on `filter` (`$share/{group}/{filter}`, already
    /// split, e.g. by [`crate::classify_filter`]). Replaces the value of an existing
    /// membership and returns the old one.
    pub fn subscribe_shared(
        &mut self,
        group: &str,
        filter: &str,
        key: K,
        value: V,
    ) -> Result<Option<V>, SubscribeError> {
        validate_share_name(group)?;
        self.check_filter(filter)?;
        if self.len >= self.max_subscriptions
            && !self
                .shared_group(group, filter)
                .is_some_and(|g| g.members().iter().any(|(k, _)| *k == key))
        {
            return Err(self.quota_error());
        }
        let node = Self::node_mut_or_insert(&mut self.root, filter);
        let slab = &mut self.groups;
        let id = match node.group_position(slab, group) {
            Some(index) => node.groups[index],
            None => {
                let id = slab.insert(SharedGroup::new(group, filter));
                node.groups.push(id);
                id
            }
        };
        let old = slab
            .get_mut(id)
            .and_then(|shared| shared.insert(key, value));
        if old.is_none() {
            self.len += 1;
        }
        Ok(old)
    }

    /// Removes `key` from the share group `group` on `filter`, returning its value. The
    /// group disappears with its last member.
    pub fn unsubscribe_shared(&mut self, group: &str, filter: &str, key: &K) -> Option<V> {
        let slab = &mut self.groups;
        let old = self.root.remove_at(filter.split('/'), |node| {
            let index = node.group_position(slab, group)?;
            let id = node.groups[index];
            let shared = slab.get_mut(id)?;
            let old = shared.remove(key)?;
            if shared.is_empty() {
                slab.remove(id);
                node.groups.swap_remove(index);
            }
            Some(old)
        })?;
        self.len -= 1;
        Some(old)
    }

    /// The share group `group` on exactly `filter`.
    pub fn shared_group(&self, group: &str, filter: &str) -> Option<&SharedGroup<K, V>> {
        let node = self.node(filter)?;
        let index = node.group_position(&self.groups, group)?;
        self.groups.get(node.groups[index])
    }

    /// Removes every subscription and shared membership of `key` (a session that ends).
    /// Visits the whole trie: O(nodes). Returns how many were removed.
    pub fn remove_key(&mut self, key: &K) -> usize {
        let removed = self.root.remove_key(key, &mut self.groups);
        if removed > 0 {
            self.len -= removed;
        }
        removed
    }

    /// Calls `visit` for every subscription and every share group whose filter matches the
    /// topic name `topic`. Does not allocate. Topics starting with `$` are not matched by
    /// filters starting with `+` or `#` [MQTT-4.7.2-1]. The order of visits is unspecified.
    ///
    /// `topic` should be a valid topic name (see [`crate::validate_topic_name`]); an
    /// invalid one is matched literally and harmlessly.
    pub fn for_each_match<'a>(&'a self, topic: &str, mut visit: impl FnMut(Match<'a, K, V>)) {
        walk(
            &self.root,
            &self.groups,
            Some(topic),
            is_sys_topic(topic),
            &mut visit,
        );
    }

    /// Like [`Self::for_each_match`], normal subscriptions only.
    pub fn for_each_subscription<'a>(&'a self, topic: &str, mut visit: impl FnMut(&'a K, &'a V)) {
        self.for_each_match(topic, |m| {
            if let Match::Subscription { key, value } = m {
                visit(key, value);
            }
        });
    }

    /// Like [`Self::for_each_match`], share groups only.
    pub fn for_each_shared_group<'a>(
        &'a self,
        topic: &str,
        mut visit: impl FnMut(&'a SharedGroup<K, V>),
    ) {
        self.for_each_match(topic, |m| {
            if let Match::Shared(group) = m {
                visit(group);
            }
        });
    }
}

/// `rest` is the unmatched part of the topic: `None` once every level is consumed,
/// `Some("")` for a remaining empty level. `skip_wildcards` is set only at the root of a
/// `$` topic [MQTT-4.7.2-1].
fn walk<'a, K: Eq + Hash + Clone, V>(
    node: &'a Node<K, V>,
    slab: &'a GroupSlab<K, V>,
    rest: Option<&str>,
    skip_wildcards: bool,
    visit: &mut impl FnMut(Match<'a, K, V>),
) {
    let Some(rest) = rest else {
        node.visit_own(slab, visit);
        // `sport/#` also matches `sport`: the parent level.
        if let Some(hash) = &node.hash {
            hash.visit_own(slab, visit);
        }
        return;
    };
    let (level, next) = match rest.find('/') {
        Some(slash) => (&rest[..slash], Some(&rest[slash + 1..])),
        None => (rest, None),
    };
    if !skip_wildcards {
        if let Some(hash) = &node.hash {
            hash.visit_own(slab, visit);
        }
        if let Some(plus) = &node.plus {
            walk(plus, slab, next, false, visit);
        }
    }
    if let Some(child) = node.children.get(level) {
        walk(child, slab, next, false, visit);
    }
}

#[cfg(test)]
mod tests;
