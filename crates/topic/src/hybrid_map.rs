//! A map that is a plain vector while small and a hash map once it grows.
//!
//! Used for a node's literal children. Trie nodes are numerous and most have one or two
//! children, so a hash table per node would cost memory and hashing time for nothing; a
//! few nodes (`site/{n}/device` with 1,000 devices) are wide and need O(1) lookup. The
//! crossover was chosen with `benches/trie.rs` (see BENCHMARKS.md).
//!
//! # Invariants
//! - Keys are unique in both representations.
//! - `Small` holds at most `small_max` entries after any insert; an insert that would pass
//!   it moves everything to `Large`. `Large` moves back to `Small` when it shrinks to a
//!   quarter of `small_max`, so churn does not leave wide tables behind.

use std::borrow::Borrow;
use std::hash::Hash;

use hashbrown::HashMap;

/// hashbrown's default: foldhash with a random seed, so level names chosen by clients
/// cannot be crafted to collide.
pub(crate) type HashState = hashbrown::DefaultHashBuilder;

pub(crate) enum HybridMap<Q, T> {
    Small(Vec<(Q, T)>),
    // Boxed: keeps every node small; only wide nodes pay the extra pointer.
    Large(Box<HashMap<Q, T, HashState>>),
}

impl<Q, T> Default for HybridMap<Q, T> {
    fn default() -> Self {
        HybridMap::Small(Vec::new())
    }
}

impl<Q: Eq + Hash, T> HybridMap<Q, T> {
    #[inline]
    pub(crate) fn get<B>(&self, key: &B) -> Option<&T>
    where
        Q: Borrow<B>,
        B: ?Sized + Eq + Hash,
    {
        match self {
            HybridMap::Small(entries) => entries
                .iter()
                .find(|(k, _)| k.borrow() == key)
                .map(|(_, v)| v),
            HybridMap::Large(map) => map.get(key),
        }
    }

    pub(crate) fn get_mut<B>(&mut self, key: &B) -> Option<&mut T>
    where
        Q: Borrow<B>,
        B: ?Sized + Eq + Hash,
    {
        match self {
            HybridMap::Small(entries) => entries
                .iter_mut()
                .find(|(k, _)| k.borrow() == key)
                .map(|(_, v)| v),
            HybridMap::Large(map) => map.get_mut(key),
        }
    }

    /// Returns the value for `key`, inserting `make_value()` if absent. Takes a borrowed key
    /// so that the owned key is only built on insertion.
    pub(crate) fn get_or_insert_with<'b, B>(
        &mut self,
        key: &'b B,
        small_max: usize,
        make_value: impl FnOnce() -> T,
    ) -> &mut T
    where
        Q: Borrow<B> + From<&'b B>,
        B: ?Sized + Eq + Hash,
    {
        let small_position = match &*self {
            HybridMap::Small(entries) => Some(entries.iter().position(|(k, _)| k.borrow() == key)),
            HybridMap::Large(_) => None,
        };
        if small_position == Some(None) && self.len() >= small_max {
            self.promote();
        }
        match self {
            HybridMap::Small(entries) => {
                let index = match small_position.flatten() {
                    Some(index) => index,
                    None => {
                        // Exact growth: most nodes have one child, and Vec's default
                        // minimum capacity of 4 would triple their size.
                        entries.reserve_exact(1);
                        entries.push((Q::from(key), make_value()));
                        entries.len() - 1
                    }
                };
                &mut entries[index].1
            }
            HybridMap::Large(map) => map.entry_ref(key).or_insert_with(make_value),
        }
    }

    fn promote(&mut self) {
        if let HybridMap::Small(entries) = self {
            let mut map =
                HashMap::with_capacity_and_hasher(entries.len() + 1, HashState::default());
            map.extend(entries.drain(..));
            *self = HybridMap::Large(Box::new(map));
        }
    }

    pub(crate) fn remove<B>(&mut self, key: &B, small_max: usize) -> Option<T>
    where
        Q: Borrow<B>,
        B: ?Sized + Eq + Hash,
    {
        match self {
            HybridMap::Small(entries) => {
                let index = entries.iter().position(|(k, _)| k.borrow() == key)?;
                let (_, value) = entries.swap_remove(index);
                if entries.is_empty() {
                    // Release the buffer: an empty node is about to be pruned or reused.
                    *entries = Vec::new();
                }
                Some(value)
            }
            HybridMap::Large(map) => {
                let value = map.remove(key)?;
                if map.len() <= small_max / 4 {
                    let entries: Vec<(Q, T)> = map.drain().collect();
                    *self = HybridMap::Small(entries);
                }
                Some(value)
            }
        }
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        match self {
            HybridMap::Small(entries) => entries.is_empty(),
            HybridMap::Large(map) => map.is_empty(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            HybridMap::Small(entries) => entries.len(),
            HybridMap::Large(map) => map.len(),
        }
    }

    /// Calls `f` for every entry; a callback instead of an iterator keeps the two
    /// representations free of boxing.
    #[inline]
    pub(crate) fn for_each<'s>(&'s self, mut f: impl FnMut(&'s Q, &'s T)) {
        match self {
            HybridMap::Small(entries) => entries.iter().for_each(|(k, v)| f(k, v)),
            HybridMap::Large(map) => map.iter().for_each(|(k, v)| f(k, v)),
        }
    }

    /// Keeps the entries for which `keep` returns true.
    pub(crate) fn retain(&mut self, small_max: usize, mut keep: impl FnMut(&Q, &mut T) -> bool) {
        match self {
            HybridMap::Small(entries) => {
                entries.retain_mut(|(k, v)| keep(k, v));
                if entries.is_empty() {
                    *entries = Vec::new();
                }
            }
            HybridMap::Large(map) => {
                map.retain(|k, v| keep(k, v));
                if map.len() <= small_max / 4 {
                    let entries: Vec<(Q, T)> = map.drain().collect();
                    *self = HybridMap::Small(entries);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_into_a_hash_map_and_shrinks_back() {
        let mut map: HybridMap<Box<str>, u32> = HybridMap::default();
        let keys: Vec<String> = (0..20).map(|i| i.to_string()).collect();
        for (i, key) in keys.iter().enumerate() {
            *map.get_or_insert_with(key.as_str(), 8, || 0) = i as u32 * 10;
        }
        assert!(matches!(map, HybridMap::Large(_)));
        *map.get_or_insert_with("3", 8, || 0) += 3;
        assert_eq!(map.get("3"), Some(&33));
        assert_eq!(map.len(), 20);
        for key in &keys[..19] {
            assert!(map.remove(key.as_str(), 8).is_some());
        }
        assert!(matches!(map, HybridMap::Small(_)));
        assert_eq!(map.get("19"), Some(&190));
        map.retain(8, |_, v| *v != 190);
        assert!(map.is_empty());
    }

    #[test]
    fn get_or_insert_with_builds_value_only_when_absent() {
        let mut map: HybridMap<Box<str>, u32> = HybridMap::default();
        for round in 0..2 {
            for i in 0..12u32 {
                let key = i.to_string();
                let mut built = false;
                *map.get_or_insert_with(key.as_str(), 4, || {
                    built = true;
                    0
                }) += 1;
                assert_eq!(built, round == 0);
            }
        }
        assert_eq!(map.len(), 12);
        assert_eq!(map.get("7"), Some(&2));
    }
}
