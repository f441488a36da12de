//! The log store's in-memory index: where each Raft entry is in the log stream, and the
//! decoded copies of the newest entries (see the invariants in `log_store`'s module text).

use std::collections::BTreeMap;

use tern_store::{FilterSet, StoreError, Stream};

use super::{TOPIC_ENTRY, TOPIC_TRUNCATE, corrupt};
use crate::types::{Entry, LogId, LogIndex, Vote, decode};

/// Most encoded bytes of durable entries whose decoded copies are kept in memory (the newest
/// ones). openraft 0.9 replicates an entry once the leader has flushed it and applies it once
/// committed: without the copies each of those reads went back to the log stream (a read and
/// a decode; ~9% of a leader's CPU in session 18's profile). Copies of entries that are not
/// yet durable are kept whatever this says (the store cannot serve them yet).
pub const MAX_CACHED_ENTRY_BYTES: usize = 16 << 20;
/// Records read per page while rebuilding the index on open.
const OPEN_SCAN_RECORDS: usize = 4096;
/// Bytes read per page while rebuilding the index on open.
const OPEN_SCAN_BYTES: usize = 16 << 20;

/// Where one entry is: its store sequence, and its decoded copy while the index keeps one.
#[derive(Debug)]
pub(super) struct Slot {
    pub(super) seq: u64,
    pub(super) log_id: LogId,
    /// The encoded entry's size, to bound what one read returns.
    pub(super) len_bytes: usize,
    pub(super) copy: Option<Entry>,
    /// The record is durable: the store serves it, so the copy may go.
    pub(super) durable: bool,
}

#[derive(Debug, Default)]
pub(super) struct Index {
    pub(super) slots: BTreeMap<LogIndex, Slot>,
    pub(super) purged: Option<LogId>,
    pub(super) vote: Option<Vote>,
    /// Slots at and above this index hold a copy, those below do not.
    pub(super) copies_from: LogIndex,
    /// Encoded bytes of the entries whose copies are held.
    pub(super) copy_bytes: usize,
}

impl Index {
    /// An entry at `index` replaces everything from `index` on (a log has no holes).
    pub(super) fn cut_from(&mut self, index: LogIndex) {
        let cut = self.slots.split_off(&index);
        self.copy_bytes -= copied_bytes(&cut);
        if !self.slots.is_empty() {
            self.copies_from = self.copies_from.min(index);
        }
    }

    /// Drops every slot up to `log_id` (purged). A point below the current one changes
    /// nothing: a purge deferred for a snapshot install may be made durable after a later one.
    pub(super) fn purge_through(&mut self, log_id: LogId) {
        if self.purged > Some(log_id) {
            return;
        }
        let kept = self.slots.split_off(&(log_id.index + 1));
        let gone = std::mem::replace(&mut self.slots, kept);
        self.copy_bytes -= copied_bytes(&gone);
        self.copies_from = self.copies_from.max(log_id.index + 1);
        self.purged = Some(log_id);
    }

    /// An appended entry, with its copy (at the end: `cut_from` its index first).
    pub(super) fn push(&mut self, index: LogIndex, slot: Slot) {
        debug_assert!(slot.copy.is_some());
        debug_assert!(
            self.slots
                .last_key_value()
                .is_none_or(|(&l, _)| l + 1 == index)
        );
        // The first slot of an empty log starts the copies (the default 0 may lie below it,
        // and the oldest copies are dropped from `copies_from` up).
        if self.slots.is_empty() || self.copies_from > index {
            self.copies_from = index;
        }
        self.copy_bytes += slot.len_bytes;
        self.slots.insert(index, slot);
    }

    /// The records `first_seq..=last_seq` are durable; then the oldest copies of durable
    /// entries go until the copies fit [`MAX_CACHED_ENTRY_BYTES`].
    pub(super) fn mark_durable(&mut self, first_seq: u64, last_seq: u64) {
        // Live slots' sequences grow with their index: walk back to this append.
        for s in self.slots.values_mut().rev() {
            if s.seq < first_seq {
                break;
            }
            if s.seq <= last_seq {
                s.durable = true;
            }
        }
        while self.copy_bytes > MAX_CACHED_ENTRY_BYTES {
            let Some(s) = self.slots.get_mut(&self.copies_from) else {
                break;
            };
            if !s.durable {
                break;
            }
            if s.copy.take().is_some() {
                self.copy_bytes -= s.len_bytes;
            }
            self.copies_from += 1;
        }
    }

    pub(super) fn last_log_id(&self) -> Option<LogId> {
        self.slots
            .values()
            .next_back()
            .map(|s| s.log_id)
            .or(self.purged)
    }

    /// O(1): keys are unique, so consecutive means the span equals the count; the first is
    /// right after the purge point.
    pub(super) fn debug_check(&self) {
        let (Some((&first, _)), Some((&last, _))) =
            (self.slots.first_key_value(), self.slots.last_key_value())
        else {
            return;
        };
        debug_assert_eq!(
            last - first + 1,
            self.slots.len() as u64,
            "hole in the Raft log"
        );
        if let Some(p) = self.purged {
            debug_assert_eq!(first, p.index + 1, "hole after the purge point");
        }
        debug_assert!(first <= self.copies_from, "copies_from below the log");
        // The copies are a suffix: the ends of its border only (O(log n)).
        if let Some(s) = self.slots.get(&self.copies_from) {
            debug_assert!(s.copy.is_some(), "no copy at copies_from");
        }
        if let Some(below) = self.copies_from.checked_sub(1)
            && let Some(s) = self.slots.get(&below)
        {
            debug_assert!(s.copy.is_none(), "a copy below copies_from");
        }
    }
}

/// Encoded bytes of the entries whose copies `slots` hold.
pub(super) fn copied_bytes(slots: &BTreeMap<LogIndex, Slot>) -> usize {
    slots
        .values()
        .filter(|s| s.copy.is_some())
        .map(|s| s.len_bytes)
        .sum()
}

/// Replays the log stream's entries and truncate markers into `index` (its vote and purge
/// point already read): what was read back is durable and has no copy.
pub(super) fn rebuild(log: &Stream, index: &mut Index) -> Result<(), StoreError> {
    let mut from = 0;
    let all = FilterSet::all();
    loop {
        let page = log.read_from(from, &all, OPEN_SCAN_RECORDS, OPEN_SCAN_BYTES)?;
        if page.records.is_empty() {
            break;
        }
        from = page.next_seq;
        for r in page.records {
            if r.topic.as_ref() == TOPIC_ENTRY {
                let log_id: LogId = decode(&r.properties).map_err(corrupt)?;
                index.cut_from(log_id.index);
                index.slots.insert(
                    log_id.index,
                    Slot {
                        seq: r.seq,
                        log_id,
                        len_bytes: r.payload.len(),
                        copy: None,
                        durable: true,
                    },
                );
            } else if r.topic.as_ref() == TOPIC_TRUNCATE {
                let first_cut: LogIndex = decode(&r.payload).map_err(corrupt)?;
                index.cut_from(first_cut);
            }
        }
    }
    if let Some(p) = index.purged {
        index.purge_through(p);
    }
    // Nothing read back is copied: copies start with the next append.
    index.copies_from = index
        .slots
        .last_key_value()
        .map_or(index.copies_from, |(&last, _)| last + 1);
    Ok(())
}
