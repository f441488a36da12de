//! A small bounded cache of match results per topic, invalidated by the trie's generation.
//!
//! Meant to be owned by one publisher (connection task) or one routing worker: a publisher
//! tends to publish to the same few topics, the cache needs `&mut` but the trie only `&`,
//! so the trie can stay behind a read lock while every worker keeps its own cache.
//!
//! Share groups are cached by their slot id in the trie and resolved against the live trie
//! on every hit, so the member is still chosen per message from the group's current
//! rotation.
//!
//! # Invariants
//! - Every cached entry was computed from a trie whose generation equals `generation`;
//!   any lookup against a different generation clears the cache first.
//! - At most `max_topics` entries, each holding at most `max_matches_per_topic`
//!   subscriptions and groups: a topic with more matches is marked uncacheable instead.
//! - Cached group ids are valid because ids are only reused after a removal, and every
//!   removal changes the generation. When full, the
//!   cache is cleared before inserting (bounded memory, no eviction bookkeeping).
//! - A cache must be used with one trie only: generations of different tries are unrelated.

use std::hash::Hash;

use hashbrown::HashMap;

use crate::hybrid_map::HashState;
use crate::shared::SharedGroup;
use crate::trie::{Match, SubscriptionTrie};

/// Default number of topics a [`MatchCache`] remembers.
pub const DEFAULT_CACHE_MAX_TOPICS: usize = 1_024;

/// Default largest fan-out a [`MatchCache`] stores for one topic.
pub const DEFAULT_CACHE_MAX_MATCHES_PER_TOPIC: usize = 256;

enum Cached<K, V> {
    Matches {
        subscriptions: Box<[(K, V)]>,
        group_ids: Box<[usize]>,
    },
    /// More than `max_matches_per_topic` matches: walk the trie.
    Uncacheable,
}

/// The matches of one topic served from a [`MatchCache`].
pub struct CachedMatches<'a, K, V> {
    subscriptions: &'a [(K, V)],
    group_ids: &'a [usize],
    trie: &'a SubscriptionTrie<K, V>,
}

impl<'a, K: Eq + Hash + Clone, V> CachedMatches<'a, K, V> {
    /// The normal subscriptions that match, as [`Match::Subscription`] would report them.
    pub fn subscriptions(&self) -> &'a [(K, V)] {
        self.subscriptions
    }

    /// The share groups that match, live from the trie.
    pub fn shared_groups(&self) -> impl Iterator<Item = &'a SharedGroup<K, V>> + use<'a, K, V> {
        let trie = self.trie;
        self.group_ids
            .iter()
            .filter_map(move |&id| trie.group_by_id(id))
    }

    /// Visits the matches exactly as [`SubscriptionTrie::for_each_match`] does.
    pub fn for_each(&self, mut visit: impl FnMut(Match<'a, K, V>)) {
        for (key, value) in self.subscriptions {
            visit(Match::Subscription { key, value });
        }
        for group in self.shared_groups() {
            visit(Match::Shared(group));
        }
    }
}

/// Cached matches per topic; see the module documentation.
pub struct MatchCache<K, V> {
    generation: u64,
    max_topics: usize,
    max_matches_per_topic: usize,
    /// Topic to its slot in `slots`: a hit costs one hash of the topic.
    entries: HashMap<Box<str>, usize, HashState>,
    slots: Vec<Cached<K, V>>,
    scratch_subscriptions: Vec<(K, V)>,
    scratch_group_ids: Vec<usize>,
}

impl<K: Eq + Hash + Clone, V: Clone> Default for MatchCache<K, V> {
    fn default() -> Self {
        Self::new(
            DEFAULT_CACHE_MAX_TOPICS,
            DEFAULT_CACHE_MAX_MATCHES_PER_TOPIC,
        )
    }
}

impl<K: Eq + Hash + Clone, V: Clone> MatchCache<K, V> {
    /// A cache of at most `max_topics` topics with at most `max_matches_per_topic`
    /// subscriptions and groups each.
    pub fn new(max_topics: usize, max_matches_per_topic: usize) -> Self {
        MatchCache {
            generation: u64::MAX,
            max_topics: max_topics.max(1),
            max_matches_per_topic,
            entries: HashMap::with_hasher(HashState::default()),
            slots: Vec::new(),
            scratch_subscriptions: Vec::new(),
            scratch_group_ids: Vec::new(),
        }
    }

    /// Number of cached topics.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True if nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The matches of `topic`, from the cache or computed and cached. `None` means the
    /// topic has more than `max_matches_per_topic` matches and is not cached: use
    /// [`SubscriptionTrie::for_each_match`] for it.
    pub fn matches<'a>(
        &'a mut self,
        trie: &'a SubscriptionTrie<K, V>,
        topic: &str,
    ) -> Option<CachedMatches<'a, K, V>> {
        if self.generation != trie.generation() {
            self.clear();
            self.generation = trie.generation();
        }
        // The borrow that answers a hit is taken only on that path, so the miss path below
        // may still change the cache: one lookup per hit, not a probe and then a get.
        if let Some(&slot) = self.entries.get(topic) {
            return self.view(slot, trie);
        }
        let computed = self.compute(trie, topic);
        if self.entries.len() >= self.max_topics {
            self.clear();
        }
        let slot = self.slots.len();
        self.entries.insert(topic.into(), slot);
        self.slots.push(computed);
        self.view(slot, trie)
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.slots.clear();
    }

    fn view<'a>(
        &'a self,
        slot: usize,
        trie: &'a SubscriptionTrie<K, V>,
    ) -> Option<CachedMatches<'a, K, V>> {
        match self.slots.get(slot)? {
            Cached::Matches {
                subscriptions,
                group_ids,
            } => Some(CachedMatches {
                subscriptions,
                group_ids,
                trie,
            }),
            Cached::Uncacheable => None,
        }
    }

    fn compute(&mut self, trie: &SubscriptionTrie<K, V>, topic: &str) -> Cached<K, V> {
        let max = self.max_matches_per_topic;
        let subscriptions = &mut self.scratch_subscriptions;
        let group_ids = &mut self.scratch_group_ids;
        subscriptions.clear();
        group_ids.clear();
        let mut count = 0usize;
        trie.for_each_match(topic, |m| {
            count += 1;
            if count > max {
                return;
            }
            match m {
                Match::Subscription { key, value } => {
                    subscriptions.push((key.clone(), value.clone()))
                }
                Match::Shared(group) => group_ids.push(group.id),
            }
        });
        let result = if count <= max {
            Cached::Matches {
                subscriptions: subscriptions.as_slice().into(),
                group_ids: group_ids.as_slice().into(),
            }
        } else {
            Cached::Uncacheable
        };
        subscriptions.clear();
        group_ids.clear();
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subscriptions(
        cache: &mut MatchCache<u32, u8>,
        trie: &SubscriptionTrie<u32, u8>,
        topic: &str,
    ) -> Option<Vec<(u32, u8)>> {
        cache.matches(trie, topic).map(|m| {
            let mut v = m.subscriptions().to_vec();
            v.sort();
            v
        })
    }

    #[test]
    fn hits_until_the_trie_changes() {
        let mut trie = SubscriptionTrie::new();
        trie.subscribe("a/+", 1u32, 0u8).unwrap();
        trie.subscribe("a/#", 2, 1).unwrap();
        let mut cache = MatchCache::default();
        assert_eq!(
            subscriptions(&mut cache, &trie, "a/b"),
            Some(vec![(1, 0), (2, 1)])
        );
        assert_eq!(cache.len(), 1);
        assert_eq!(
            subscriptions(&mut cache, &trie, "a/b"),
            Some(vec![(1, 0), (2, 1)])
        );
        trie.subscribe("a/b", 3, 2).unwrap();
        assert_eq!(
            subscriptions(&mut cache, &trie, "a/b"),
            Some(vec![(1, 0), (2, 1), (3, 2)])
        );
        trie.unsubscribe("a/+", &1);
        assert_eq!(
            subscriptions(&mut cache, &trie, "a/b"),
            Some(vec![(2, 1), (3, 2)])
        );
        assert_eq!(subscriptions(&mut cache, &trie, "x"), Some(vec![]));
    }

    #[test]
    fn shared_groups_are_resolved_live_and_keep_rotating() {
        let mut trie = SubscriptionTrie::new();
        trie.subscribe_shared("g", "s/#", 1u32, 0u8).unwrap();
        trie.subscribe_shared("g", "s/#", 2, 0).unwrap();
        trie.subscribe("s/x", 9, 0).unwrap();
        let mut cache = MatchCache::default();
        let mut picks = Vec::new();
        for _ in 0..4 {
            let cached = cache.matches(&trie, "s/x").unwrap();
            let mut subs = 0;
            cached.for_each(|m| match m {
                Match::Subscription { .. } => subs += 1,
                Match::Shared(group) => picks.push(*group.next_member().unwrap().0),
            });
            assert_eq!(subs, 1);
        }
        assert_eq!(picks, vec![1, 2, 1, 2]);
        // Removing the group and reusing its slot for another one is seen by the cache.
        trie.unsubscribe_shared("g", "s/#", &1);
        trie.unsubscribe_shared("g", "s/#", &2);
        trie.subscribe_shared("h", "other", 3, 0).unwrap();
        assert_eq!(
            cache.matches(&trie, "s/x").unwrap().shared_groups().count(),
            0
        );
        let other = cache.matches(&trie, "other").unwrap();
        assert_eq!(
            other.shared_groups().map(|g| g.name()).collect::<Vec<_>>(),
            vec!["h"]
        );
    }

    #[test]
    fn big_fan_outs_are_not_cached() {
        let mut trie = SubscriptionTrie::new();
        for k in 0..5 {
            trie.subscribe("big", k, 0u8).unwrap();
        }
        let mut cache = MatchCache::new(8, 4);
        assert!(cache.matches(&trie, "big").is_none());
        trie.unsubscribe("big", &0);
        assert_eq!(
            subscriptions(&mut cache, &trie, "big").map(|v| v.len()),
            Some(4)
        );
    }

    #[test]
    fn stays_within_max_topics() {
        let mut trie = SubscriptionTrie::new();
        trie.subscribe("#", 1u32, 0u8).unwrap();
        let mut cache = MatchCache::new(3, 8);
        for i in 0..10 {
            assert_eq!(
                subscriptions(&mut cache, &trie, &format!("t/{i}")).map(|v| v.len()),
                Some(1)
            );
            assert!(cache.len() <= 3);
        }
    }
}
