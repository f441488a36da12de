//! The wakers of the tasks that polled a pending ticket, by sequence.
//!
//! A record can be waited for by several tasks: it has several tickets
//! (`Stream::ticket_for`), or one ticket is polled by one task and then by another (a
//! session's ticket moving from a closing connection to its successor). Each of those tasks
//! must be woken when the record completes. The store once kept one waker per sequence, and
//! a second task's registration replaced the first's, which then slept forever (simulation
//! finding 9: a share-group member's PUBREL never sent with writer threads).
//!
//! The common case is one task per sequence: it costs what one waker per sequence did (no
//! allocation besides the map's node). A second task's waker makes the sequence's entry a
//! list; a task that polls again is kept once (`Waker::will_wake`).
//!
//! # Invariants
//! - `len` is the number of wakers held, over every sequence; it never exceeds
//!   [`MAX_WAKERS_PER_STREAM`].
//! - No two wakers of one sequence `will_wake` each other.
//! - A waker leaves the set only to be woken: at its record's completion, at the stream's
//!   failure, or early when the bound is reached (a spurious wake: its task polls again and
//!   registers again). No registered waker is ever dropped unwoken.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::task::Waker;

/// Wakers a stream keeps for its pending tickets. Past it, a registration first wakes every
/// waker held (they poll again, and re-register if still pending), so the bound costs
/// spurious wakes, never a lost one. It is far above what a broker has waiting: one task per
/// polled pending record, plus the rare second waiter of a record.
pub(crate) const MAX_WAKERS_PER_STREAM: usize = 65_536;

/// The wakers waiting on one sequence.
enum Waiters {
    One(Waker),
    /// Two or more, none `will_wake` another.
    Many(Vec<Waker>),
}

impl Waiters {
    /// Whether a waker here wakes the same task as `waker`.
    fn holds(&self, waker: &Waker) -> bool {
        match self {
            Waiters::One(w) => w.will_wake(waker),
            Waiters::Many(ws) => ws.iter().any(|w| w.will_wake(waker)),
        }
    }

    /// Adds the waker of another task (the caller checked `holds`).
    fn push(&mut self, waker: &Waker) {
        debug_assert!(!self.holds(waker));
        match self {
            Waiters::One(w) => {
                let first = std::mem::replace(w, Waker::noop().clone());
                *self = Waiters::Many(vec![first, waker.clone()]);
            }
            Waiters::Many(ws) => ws.push(waker.clone()),
        }
    }

    fn len(&self) -> usize {
        match self {
            Waiters::One(_) => 1,
            Waiters::Many(ws) => ws.len(),
        }
    }

    fn wake(self) {
        match self {
            Waiters::One(w) => w.wake(),
            Waiters::Many(ws) => ws.into_iter().for_each(Waker::wake),
        }
    }
}

/// Wakers by sequence (see the module doc). Taken out of the stream's lock before they are
/// woken: a waker runs foreign code.
pub(crate) struct WakerSet {
    by_seq: BTreeMap<u64, Waiters>,
    len: usize,
    /// [`MAX_WAKERS_PER_STREAM`], smaller in tests.
    max_len: usize,
}

impl Default for WakerSet {
    fn default() -> Self {
        WakerSet::with_bound(MAX_WAKERS_PER_STREAM)
    }
}

impl WakerSet {
    fn with_bound(max_len: usize) -> Self {
        debug_assert!(max_len > 0);
        WakerSet {
            by_seq: BTreeMap::new(),
            len: 0,
            max_len,
        }
    }

    /// Wakers held, over every sequence.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Keeps `waker` to be woken when `seq` completes (once per task: a task that polls
    /// again is already here). Returns what to wake now: everything held before, when the
    /// bound is reached (see [`MAX_WAKERS_PER_STREAM`]).
    #[must_use = "the wakers returned must be woken"]
    pub fn register(&mut self, seq: u64, waker: &Waker) -> Option<WakerSet> {
        let mut evicted = None;
        if self.len >= self.max_len && !self.by_seq.get(&seq).is_some_and(|ws| ws.holds(waker)) {
            let bound = WakerSet::with_bound(self.max_len);
            evicted = Some(std::mem::replace(self, bound));
        }
        match self.by_seq.entry(seq) {
            Entry::Occupied(e) if e.get().holds(waker) => return evicted,
            Entry::Occupied(mut e) => e.get_mut().push(waker),
            Entry::Vacant(e) => {
                e.insert(Waiters::One(waker.clone()));
            }
        }
        self.len += 1;
        debug_assert!(self.len <= self.max_len);
        evicted
    }

    /// Takes the wakers of every sequence up to `seq` (they completed).
    pub fn take_through(&mut self, seq: u64) -> WakerSet {
        let Some(above) = seq.checked_add(1) else {
            let bound = WakerSet::with_bound(self.max_len);
            return std::mem::replace(self, bound);
        };
        let pending = self.by_seq.split_off(&above);
        let ready = std::mem::replace(&mut self.by_seq, pending);
        let ready_len: usize = ready.values().map(Waiters::len).sum();
        self.len -= ready_len;
        WakerSet {
            by_seq: ready,
            len: ready_len,
            max_len: self.max_len,
        }
    }

    /// Wakes every waker held.
    pub fn wake(self) {
        self.by_seq.into_values().for_each(Waiters::wake);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn task() -> (Arc<Count>, Waker) {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        (count, waker)
    }

    fn woken(c: &Count) -> usize {
        c.0.load(Ordering::SeqCst)
    }

    #[test]
    fn every_waker_of_a_sequence_is_woken_once() {
        let mut set = WakerSet::default();
        let (a, wa) = task();
        let (b, wb) = task();
        let (later, wl) = task();
        for _ in 0..3 {
            assert!(set.register(5, &wa).is_none());
            assert!(set.register(5, &wb).is_none());
        }
        assert!(set.register(6, &wl).is_none());
        assert_eq!(set.len(), 3, "a task that polls again is kept once");
        set.take_through(5).wake();
        assert_eq!((woken(&a), woken(&b), woken(&later)), (1, 1, 0));
        assert_eq!(set.len(), 1);
        set.take_through(u64::MAX).wake();
        assert_eq!(woken(&later), 1);
        assert_eq!(set.len(), 0);
    }

    /// At the bound nothing is lost: what is evicted is woken early, and every waker is woken
    /// by the time its sequence completes.
    #[test]
    fn the_bound_wakes_early_and_loses_nothing() {
        const MAX: usize = 64;
        let mut set = WakerSet::with_bound(MAX);
        let tasks: Vec<_> = (0..=MAX).map(|_| task()).collect();
        let mut evicted = 0;
        for (i, (_, w)) in tasks.iter().enumerate() {
            // Half on sequence 1 (the last task too), half on others.
            let seq = if i % 2 == 0 { 1 } else { i as u64 };
            if let Some(early) = set.register(seq, w) {
                evicted += early.len();
                early.wake();
            }
            assert!(set.len() <= MAX);
        }
        assert_eq!(evicted, MAX, "the full set was woken early");
        assert_eq!(set.len(), 1, "and the newest kept");
        // A task already held polling again at the bound wakes nobody.
        let (_, last) = &tasks[MAX];
        for (_, w) in &tasks[1..MAX] {
            assert!(set.register(7, w).is_none());
        }
        assert_eq!(set.len(), MAX);
        assert!(set.register(1, last).is_none(), "held already");
        set.take_through(u64::MAX).wake();
        // Task 0 early only; 1..MAX early and at the end (they registered again); the last
        // at the end.
        let counts: Vec<usize> = tasks.iter().map(|(c, _)| woken(c)).collect();
        assert_eq!(counts[0], 1);
        assert!(counts[1..MAX].iter().all(|&n| n == 2), "{counts:?}");
        assert_eq!(counts[MAX], 1);
    }
}
