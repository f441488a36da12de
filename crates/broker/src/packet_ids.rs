//! Packet identifiers for outbound QoS>0 PUBLISHes of one session.
//!
//! # Invariants
//! - An id handed out is never handed out again until released ([MQTT-2.2.1-3]).
//! - `in_use.len()` is bounded by the in-flight window (at most 65_534 by config validation),
//!   so allocation always finds a free id when the caller respects the window.

use crate::small_hash::SmallHashSet;

/// Capacity an empty id set may keep.
const IDLE_CAPACITY: usize = 64;

#[derive(Debug, Default)]
pub struct PacketIds {
    next: u16,
    in_use: SmallHashSet<u16>,
}

impl PacketIds {
    /// A free id in 1..=65535, or `None` if all are in flight.
    pub fn allocate(&mut self) -> Option<u16> {
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
    pub fn reserve(&mut self, id: u16) {
        self.in_use.insert(id);
    }

    /// Takes `id` if it is free.
    pub fn take(&mut self, id: u16) -> bool {
        id != 0 && self.in_use.insert(id)
    }

    pub fn release(&mut self, id: u16) {
        self.in_use.remove(&id);
    }

    pub fn in_flight(&self) -> usize {
        self.in_use.len()
    }

    /// Returns the set's memory after a burst once nothing is in flight (the counter stays,
    /// so ids keep rotating).
    pub fn shrink_if_idle(&mut self) {
        if self.in_use.is_empty() && self.in_use.capacity() > IDLE_CAPACITY {
            self.in_use = SmallHashSet::default();
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
