//! Hash maps of per-session and per-connection state without a `RandomState` each.
//!
//! A std `HashMap` keeps its `RandomState` (16 bytes) inline. Every session holds three (its
//! subscriptions, its QoS 2 received set, its packet ids in flight) and every connection one
//! (its Receive Maximum quota), all empty while the connection is idle. [`ProcessKeys`] hashes
//! with SipHash keyed once per process with random keys, as `RandomState` is: the same
//! protection against chosen collisions, in 0 bytes per map.

use std::collections::hash_map::{DefaultHasher, RandomState};
use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;
use std::sync::OnceLock;

pub type SmallHashMap<K, V> = HashMap<K, V, ProcessKeys>;
pub type SmallHashSet<T> = HashSet<T, ProcessKeys>;

/// Random SipHash keys, drawn once per process.
static KEYS: OnceLock<RandomState> = OnceLock::new();

#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessKeys;

impl BuildHasher for ProcessKeys {
    type Hasher = DefaultHasher;

    fn build_hasher(&self) -> DefaultHasher {
        KEYS.get_or_init(RandomState::new).build_hasher()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_keep_no_hasher_state() {
        assert_eq!(std::mem::size_of::<ProcessKeys>(), 0);
        assert!(std::mem::size_of::<SmallHashSet<u16>>() < std::mem::size_of::<HashSet<u16>>());
        let mut set = SmallHashSet::default();
        assert!(set.insert(7u16));
        assert!(!set.insert(7u16));
        assert!(set.contains(&7));
    }
}
