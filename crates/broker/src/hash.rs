//! The hasher of the broker's maps whose iteration order decides behaviour: which session,
//! will, queue or exchange is processed first (checkpoints, recovery, expiry, retained
//! delivery). With std's `RandomState` that order changes with every map and every process,
//! so a simulated run could not be one execution. [`Seeded`] is keyed SipHash with keys the
//! broker chooses once per process: random in production (the keys stay secret, so
//! client-chosen keys such as client ids cannot be made to collide), fixed by the simulator
//! ([`fix_keys`]) so that a seed replays the same iteration orders.
//!
//! The hasher is zero-sized (the keys are the process's, not the map's): a std `HashMap`
//! keeps its `RandomState` (16 bytes) inline, and every session holds several maps (its
//! subscriptions, its QoS 2 received set) and every connection one (its Receive Maximum
//! quota), all empty while the connection is idle.
//!
//! Maps only looked up keep std's hasher (topic aliases, the ACL) or, for ids the broker
//! chooses itself, a cheaper one (`packet_ids`).
//!
//! One key pair for every map of the process (std varies it per map): iterating a large map
//! into a smaller one with the same hasher can cluster its inserts. No broker map is built
//! that way from one of at least the same size (recovery builds its maps from the store's
//! records, not from other maps).

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, RandomState};
use std::sync::OnceLock;

static KEYS: OnceLock<(u64, u64)> = OnceLock::new();

/// Fixes the keys of every [`Seeded`] hasher of this process (the simulator: the same
/// iteration orders in every run). Only the first call takes effect, and only before the
/// first map is made; returns whether the keys are now `(k0, k1)`.
#[cfg_attr(not(feature = "__internal"), allow(dead_code))] // only tests reach it (`__internal`)
pub fn fix_keys(k0: u64, k1: u64) -> bool {
    *KEYS.get_or_init(|| (k0, k1)) == (k0, k1)
}

fn keys() -> (u64, u64) {
    *KEYS.get_or_init(|| {
        // std's per-process random keys, drawn from the OS once.
        let random = RandomState::new();
        (random.hash_one(0u8), random.hash_one(1u8))
    })
}

/// Keyed SipHash-2-4 with the process's keys ([`fix_keys`]); zero bytes per map.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Seeded;

impl BuildHasher for Seeded {
    // std's only keyed hasher: deprecated for a faster one it keeps private (SipHash-1-3
    // behind `RandomState`, which cannot be given keys).
    #[allow(deprecated)]
    type Hasher = std::hash::SipHasher;

    #[allow(deprecated)]
    fn build_hasher(&self) -> Self::Hasher {
        let (k0, k1) = keys();
        std::hash::SipHasher::new_with_keys(k0, k1)
    }
}

/// A map whose iteration order is the same in every run with the same keys and history.
pub(crate) type Map<K, V> = HashMap<K, V, Seeded>;
/// A set whose iteration order is the same in every run with the same keys and history.
pub(crate) type Set<K> = HashSet<K, Seeded>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_maps_with_one_history_iterate_alike() {
        let fill = || {
            let mut m: Map<String, u32> = Map::default();
            for i in 0..200 {
                m.insert(format!("client-{i}"), i);
            }
            m.keys().cloned().collect::<Vec<_>>()
        };
        assert_eq!(fill(), fill());
    }

    #[test]
    fn maps_keep_no_hasher_state() {
        assert_eq!(std::mem::size_of::<Seeded>(), 0);
        assert!(std::mem::size_of::<Set<u16>>() < std::mem::size_of::<HashSet<u16>>());
        let mut set = Set::default();
        assert!(set.insert(7u16));
        assert!(!set.insert(7u16));
        assert!(set.contains(&7));
    }
}
