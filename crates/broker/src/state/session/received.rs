//! The QoS 2 packet ids a session received and has not yet seen released (ARCHITECTURE §3).

use crate::hash::Set;

/// The received set behind a pointer that is null while it is empty: ids are only held
/// between a PUBLISH QoS 2 and its PUBREL, so nearly every idle session holds none, and an
/// empty `HashSet` inline costs every session 32 bytes where this costs 8 (issue 15: the
/// session's `Arc` block must fit jemalloc's 256 B class). The set is freed as soon as its
/// last id leaves, so a burst's capacity is not kept either.
///
/// Its size is bounded by our Receive Maximum: a client exceeding it is disconnected (0x93).
#[derive(Debug, Default)]
pub(crate) struct ReceivedIds(Option<Box<Set<u16>>>);

impl ReceivedIds {
    /// Adds `packet_id`; false if it was already there.
    pub(crate) fn insert(&mut self, packet_id: u16) -> bool {
        self.0.get_or_insert_default().insert(packet_id)
    }

    /// Removes `packet_id`; false if it was not there. Frees the set once empty.
    pub(crate) fn remove(&mut self, packet_id: u16) -> bool {
        let Some(set) = self.0.as_deref_mut() else {
            return false;
        };
        let removed = set.remove(&packet_id);
        if set.is_empty() {
            self.0 = None;
        }
        removed
    }

    pub(crate) fn contains(&self, packet_id: u16) -> bool {
        self.0
            .as_deref()
            .is_some_and(|set| set.contains(&packet_id))
    }

    /// The set is allocated (tests of the release).
    #[cfg(test)]
    fn is_allocated(&self) -> bool {
        self.0.is_some()
    }
}

impl Extend<u16> for ReceivedIds {
    fn extend<I: IntoIterator<Item = u16>>(&mut self, packet_ids: I) {
        for packet_id in packet_ids {
            self.insert(packet_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn behaves_as_a_set_and_frees_itself_once_empty() {
        let mut ids = ReceivedIds::default();
        assert!(!ids.contains(7));
        assert!(!ids.remove(7));
        assert!(!ids.is_allocated(), "reading or removing allocates nothing");
        assert!(ids.insert(7));
        assert!(!ids.insert(7), "an id is held once");
        ids.extend([8, 9]);
        assert!(ids.contains(7) && ids.contains(8) && ids.contains(9));
        assert!(ids.remove(8));
        assert!(!ids.remove(8));
        assert!(!ids.contains(8));
        assert!(ids.remove(7) && ids.remove(9));
        assert!(!ids.is_allocated(), "the last id out frees the set");
        assert!(!ids.contains(9));
        assert!(ids.insert(9) && ids.contains(9));
    }

    #[test]
    fn an_empty_extend_allocates_nothing() {
        let mut ids = ReceivedIds::default();
        ids.extend(std::iter::empty());
        assert!(!ids.is_allocated());
    }
}
