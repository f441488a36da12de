//! `$share/{ShareName}/{filter}` groups: the members of one ShareName on one filter, and
//! the round-robin choice of the member that gets a message.
//!
//! # Invariants
//! - A key appears at most once in `members`; order is subscription order, which makes
//!   the rotation deterministic.
//! - `cursor` is the index of the next member to try; it is always `< members.len()` or 0,
//!   and removing a member before it moves it back by one so that nobody is skipped.
//! - The cursor is an atomic so that picking a member needs only `&self`: the broker can
//!   match under a read lock. Two threads picking at once from the same group may pick the
//!   same member; rotation is exactly fair for a single picker and close to fair otherwise.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The members of one share group on one topic filter.
#[derive(Debug)]
pub struct SharedGroup<K, V> {
    name: Box<str>,
    filter: Box<str>,
    members: Vec<(K, V)>,
    cursor: AtomicUsize,
}

impl<K: Eq, V> SharedGroup<K, V> {
    pub(crate) fn new(name: &str, filter: &str) -> Self {
        SharedGroup {
            name: name.into(),
            filter: filter.into(),
            members: Vec::new(),
            cursor: AtomicUsize::new(0),
        }
    }

    /// The ShareName.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The topic filter the group subscribed to (without `$share/{ShareName}/`).
    pub fn filter(&self) -> &str {
        &self.filter
    }

    /// Members in subscription order.
    pub fn members(&self) -> &[(K, V)] {
        &self.members
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// True if the group has no member (never the case for a group stored in the trie).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The next member in rotation, advancing the rotation.
    pub fn next_member(&self) -> Option<(&K, &V)> {
        self.next_member_where(|_, _| true)
    }

    /// The next member in rotation that `accept` agrees to (e.g. skip offline sessions or
    /// ones whose queue is full), advancing the rotation past it. Members are offered in
    /// order starting at the cursor, each at most once; `None` if all are rejected, in
    /// which case the rotation does not move.
    pub fn next_member_where(&self, mut accept: impl FnMut(&K, &V) -> bool) -> Option<(&K, &V)> {
        let count = self.members.len();
        if count == 0 {
            return None;
        }
        let start = self.cursor.load(Ordering::Relaxed) % count;
        for step in 0..count {
            let index = (start + step) % count;
            let (key, value) = &self.members[index];
            if accept(key, value) {
                self.cursor.store((index + 1) % count, Ordering::Relaxed);
                return Some((key, value));
            }
        }
        None
    }

    /// Adds or replaces the member `key`, returning its previous value. A new member joins
    /// at the end of the rotation.
    pub(crate) fn insert(&mut self, key: K, value: V) -> Option<V> {
        match self.members.iter_mut().find(|(k, _)| *k == key) {
            Some((_, slot)) => Some(std::mem::replace(slot, value)),
            None => {
                self.members.push((key, value));
                None
            }
        }
    }

    /// Removes the member `key`, keeping the rotation on the member that was next.
    pub(crate) fn remove(&mut self, key: &K) -> Option<V> {
        let index = self.members.iter().position(|(k, _)| k == key)?;
        let (_, value) = self.members.remove(index);
        let cursor = self.cursor.get_mut();
        if index < *cursor {
            *cursor -= 1;
        }
        if *cursor >= self.members.len() {
            *cursor = 0;
        }
        Some(value)
    }

    /// Removes every member for which `keep` is false; returns how many were removed.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) -> usize {
        let before = self.members.len();
        let cursor = self.cursor.get_mut();
        let mut index = 0;
        let mut removed_before_cursor = 0;
        self.members.retain(|(k, _)| {
            let kept = keep(k);
            if !kept && index < *cursor {
                removed_before_cursor += 1;
            }
            index += 1;
            kept
        });
        *cursor -= removed_before_cursor;
        if *cursor >= self.members.len() {
            *cursor = 0;
        }
        before - self.members.len()
    }
}

/// Storage for every share group of a trie; nodes hold slot ids.
///
/// Ids are reused after removal. Memory is bounded by the peak number of groups (freed slots
/// are reused, not returned).
pub(crate) struct GroupSlab<K, V> {
    slots: Vec<Option<SharedGroup<K, V>>>,
    free: Vec<usize>,
}

impl<K, V> Default for GroupSlab<K, V> {
    fn default() -> Self {
        GroupSlab {
            slots: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<K, V> GroupSlab<K, V> {
    pub(crate) fn insert(&mut self, group: SharedGroup<K, V>) -> usize {
        let id = self.free.pop().unwrap_or(self.slots.len());
        if id == self.slots.len() {
            self.slots.push(Some(group));
        } else {
            self.slots[id] = Some(group);
        }
        id
    }

    pub(crate) fn remove(&mut self, id: usize) -> Option<SharedGroup<K, V>> {
        let group = self.slots.get_mut(id)?.take()?;
        self.free.push(id);
        Some(group)
    }

    #[inline]
    pub(crate) fn get(&self, id: usize) -> Option<&SharedGroup<K, V>> {
        self.slots.get(id)?.as_ref()
    }

    pub(crate) fn get_mut(&mut self, id: usize) -> Option<&mut SharedGroup<K, V>> {
        self.slots.get_mut(id)?.as_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(keys: &[u32]) -> SharedGroup<u32, ()> {
        let mut g = SharedGroup::new("g", "a/+");
        for &k in keys {
            assert!(g.insert(k, ()).is_none());
        }
        g
    }

    fn picks(g: &SharedGroup<u32, ()>, n: usize) -> Vec<u32> {
        (0..n)
            .filter_map(|_| g.next_member().map(|(k, _)| *k))
            .collect()
    }

    #[test]
    fn round_robin_is_deterministic_and_fair() {
        let g = group(&[1, 2, 3]);
        assert_eq!(picks(&g, 7), vec![1, 2, 3, 1, 2, 3, 1]);
        assert_eq!(g.name(), "g");
        assert_eq!(g.filter(), "a/+");
    }

    #[test]
    fn rejected_members_are_skipped_without_losing_turns() {
        let g = group(&[1, 2, 3, 4]);
        let online = |k: &u32, _: &()| *k != 2;
        let got: Vec<u32> = (0..6)
            .filter_map(|_| g.next_member_where(online).map(|(k, _)| *k))
            .collect();
        assert_eq!(got, vec![1, 3, 4, 1, 3, 4]);
        assert!(g.next_member_where(|_, _| false).is_none());
        // Rejecting everyone does not move the rotation.
        assert_eq!(picks(&g, 1), vec![1]);
    }

    #[test]
    fn removal_keeps_the_next_member_next() {
        let mut g = group(&[1, 2, 3, 4]);
        assert_eq!(picks(&g, 2), vec![1, 2]); // next is 3
        assert_eq!(g.remove(&1), Some(()));
        assert_eq!(picks(&g, 1), vec![3]); // next is 4
        assert_eq!(g.remove(&4), Some(()));
        assert_eq!(picks(&g, 3), vec![2, 3, 2]);
        assert_eq!(g.remove(&9), None);
        assert_eq!(g.retain(|k| *k != 2), 1);
        assert_eq!(picks(&g, 2), vec![3, 3]);
    }

    #[test]
    fn replacing_a_member_keeps_its_place() {
        let mut g: SharedGroup<u32, u8> = SharedGroup::new("g", "#");
        assert_eq!(g.insert(1, 0), None);
        assert_eq!(g.insert(2, 0), None);
        assert_eq!(g.insert(1, 7), Some(0));
        assert_eq!(g.members(), &[(1, 7), (2, 0)]);
        assert_eq!(g.next_member(), Some((&1, &7)));
    }

    #[test]
    fn empty_group_yields_nothing() {
        let g: SharedGroup<u32, ()> = SharedGroup::new("g", "#");
        assert!(g.is_empty());
        assert_eq!(g.next_member(), None);
    }
}
