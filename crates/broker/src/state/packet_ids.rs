//! Packet identifiers for outbound QoS>0 PUBLISHes of one session.
//!
//! # Invariants
//! - An id handed out is never handed out again until released ([MQTT-2.2.1-3]).
//! - `in_use.len()` is bounded by the in-flight window (at most 65_534 by config validation),
//!   so allocation always finds a free id when the caller respects the window.

use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hasher};

/// Capacity an empty id set may keep.
const IDLE_CAPACITY: usize = 64;

/// Hashes a packet id by one multiplication. The ids in the set are chosen by the broker
/// (`allocate`, or ids it handed out before a restart), never by a client, so nobody can pick
/// colliding keys. An allocate + release (once per QoS>0 delivery) cost 22-53 ns with
/// SipHash and 10-14 ns with this, window 256, in a loop on this project's VM; SipHash and
/// the set's insert were ~4% of a QoS 1 fan-out to 1,000 in perf.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u16(&mut self, id: u16) {
        // Sequential ids spread over both the low bits (bucket) and the top 7 (tag).
        self.0 = u64::from(id).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[derive(Debug, Default)]
pub(crate) struct PacketIds {
    next: u16,
    in_use: HashSet<u16, BuildHasherDefault<IdHasher>>,
}

impl PacketIds {
    /// A free id in 1..=65535, or `None` if all are in flight.
    pub(crate) fn allocate(&mut self) -> Option<u16> {
        if self.in_use.len() >= usize::from(u16::MAX) {
            return None;
        }
        loop {
            self.next = self.next.wrapping_add(1);
            if self.next == 0 {
                continue;
            }
            if self.in_use.insert(self.next) {
                return Some(self.next);
            }
        }
    }

    /// Marks an id taken (rebuilding in-flight state).
    pub(crate) fn reserve(&mut self, id: u16) {
        self.in_use.insert(id);
    }

    pub(crate) fn release(&mut self, id: u16) {
        self.in_use.remove(&id);
    }

    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> usize {
        self.in_use.len()
    }

    /// Returns the set's memory after a burst once nothing is in flight (the counter stays,
    /// so ids keep rotating).
    pub(crate) fn shrink_if_idle(&mut self) {
        if self.in_use.is_empty() && self.in_use.capacity() > IDLE_CAPACITY {
            self.in_use = HashSet::default();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_reuses_an_id_in_flight_mqtt_2_2_1_3() {
        let mut ids = PacketIds::default();
        let first = ids.allocate().unwrap();
        assert_eq!(first, 1);
        for _ in 0..70_000 {
            let id = ids.allocate().unwrap();
            assert_ne!(id, first);
            assert_ne!(id, 0);
            ids.release(id);
        }
    }

    #[test]
    fn exhausts_cleanly() {
        let mut ids = PacketIds::default();
        for _ in 0..65_535 {
            assert!(ids.allocate().is_some());
        }
        assert_eq!(ids.allocate(), None);
        ids.release(42);
        assert_eq!(ids.allocate(), Some(42));
    }
}
