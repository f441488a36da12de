//! The periodic checkpoint of persistent sessions' and share groups' cursors: what each still
//! holds of the stored messages, handed to [`crate::model::CursorStore::checkpoint`] and
//! [`crate::model::CursorStore::checkpoint_group`].
//!
//! # Invariants
//! - The store's floors are read before any session's held messages are listed (see the
//!   cursor invariant in [`crate::durable`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::engine::Shared;
use crate::hash::{Map, Set};
use crate::metrics::Metrics;
use crate::model::HeldSeqs;
use crate::state::session::Session;

/// How often the checkpointer runs. Sessions whose queues changed at their last visit are
/// visited every pass: shorter means fewer QoS 1 redeliveries after a crash; each write is a
/// few bytes in a group commit.
pub(crate) const CHECKPOINT_INTERVAL_MS: u64 = 25;
/// Every persistent session is visited at least this often, a slice of them per pass; one
/// found changed is then visited every pass until it stays unchanged. Idle sessions are the
/// common case (thousands of devices that hold nothing): visiting all of them every pass
/// cost half a core with 10,000 of them (a few cache misses each), for nothing. The cost is
/// a cursor up to this much behind for a session that just became busy or holds nothing
/// while the floors move: a longer scan at recovery, reclamation held back by as much, and
/// possibly more QoS 1 redeliveries after a crash; never a message lost (cursors only trail).
pub(crate) const SWEEP_INTERVAL_MS: u64 = 1000;
/// Most cursor writes per pass (the rest continue next pass): bounds the write rate with
/// many busy persistent sessions (here 40,000 per second).
pub(crate) const MAX_CURSOR_WRITES_PER_PASS: usize = 1000;
/// A session holding more messages than this is scanned at most every
/// [`LARGE_QUEUE_SCAN_INTERVAL_MS`]: listing what it holds costs one step per message.
pub(crate) const LARGE_QUEUE_MESSAGES: usize = 8192;
pub(crate) const LARGE_QUEUE_SCAN_INTERVAL_MS: u64 = 1000;

/// What a session looked like at its last scan.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Seen {
    pushed_total: u64,
    removed_total: u64,
    inflight: usize,
}

/// State kept between passes.
///
/// # Invariants
/// - Every client in `clients` is visited within [`SWEEP_INTERVAL_MS`] (plus the passes a
///   write cap defers it), and `clients` is refreshed from the store when the sweep wraps, so a
///   new persistent session is first visited within two sweeps.
#[derive(Default)]
pub(crate) struct Checkpointer {
    /// Each visited session's state at its last visit, when that was, and the last pass that
    /// put it in `active`.
    seen: Map<Arc<str>, (Seen, Instant, u64)>,
    /// Passes run (numbers `active` membership).
    pass_no: u64,
    /// The persistent sessions as of the sweep's start, and where the sweep is in them.
    clients: Vec<Arc<str>>,
    sweep_at: usize,
    /// Sessions found changed at their last visit: visited again every pass.
    active: Vec<Arc<str>>,
}

/// Writes the cursors of persistent sessions every [`CHECKPOINT_INTERVAL_MS`] until aborted.
pub(crate) async fn run_checkpoints(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(Duration::from_millis(CHECKPOINT_INTERVAL_MS));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut checkpointer = Checkpointer::default();
    loop {
        tick.tick().await;
        if !checkpointer.pass(&shared) {
            return;
        }
    }
}

/// One complete pass (at shutdown): every persistent session, no skipping.
pub(crate) fn checkpoint_once(shared: &Shared) -> bool {
    Checkpointer::default().pass_with(shared, usize::MAX)
}

impl Checkpointer {
    /// One pass over the persistent sessions. False if the store keeps nothing.
    pub(crate) fn pass(&mut self, shared: &Shared) -> bool {
        self.pass_with(shared, MAX_CURSOR_WRITES_PER_PASS)
    }

    fn pass_with(&mut self, shared: &Shared, max_writes: usize) -> bool {
        // Floors first, then what each session holds (see the cursor invariant in `durable`).
        let floors = shared.store.cursors.checkpoint_floors();
        if floors.is_empty() {
            return false;
        }
        let removed = shared.store.cursors.removed_ranges();
        // What retention freed lets publishing resume (`[store] max_disk_bytes`).
        shared.store.cursors.refresh_disk_usage();
        if !removed.is_empty() {
            drop_removed_everywhere(shared, &removed);
        }
        // Share groups before the sessions: a member's completed QoS 2 markers are cleared
        // only below its groups' written cursors (`durable::shared`).
        let mut held = Vec::new();
        for share in shared.store.cursors.durable_groups() {
            held.clear();
            crate::engine::groups::held(shared, &share, &mut held);
            shared
                .store
                .cursors
                .checkpoint_group(&share, &floors, &held);
        }
        // Cursors are taken as written and removal waits for them to be durable, so this may
        // run before this pass's writes (see `durable::reclaim`).
        shared.store.cursors.reclaim();
        if self.sweep_at >= self.clients.len() {
            self.start_sweep(shared);
        }
        let complete = max_writes == usize::MAX;
        let now = Instant::now();
        // The active sessions, then this pass's slice of the sweep (everyone for `complete`).
        let slice = if complete {
            self.clients.len()
        } else {
            let passes = (SWEEP_INTERVAL_MS / CHECKPOINT_INTERVAL_MS).max(1) as usize;
            self.clients.len().div_ceil(passes)
        };
        self.pass_no += 1;
        let mut todo = std::mem::take(&mut self.active);
        let end = (self.sweep_at + slice).min(self.clients.len());
        todo.extend_from_slice(&self.clients[self.sweep_at..end]);
        let mut writes = 0;
        for (i, client) in todo.iter().enumerate() {
            if writes >= max_writes {
                // Deferred: the rest stay active, so the next pass starts with them.
                for client in &todo[i..] {
                    self.mark_active(client);
                }
                break;
            }
            match self.visit(shared, client, now, complete, &mut held) {
                Visit::Skipped => continue,
                Visit::Changed => self.mark_active(client),
                Visit::Settled => {}
            }
            if shared.store.cursors.checkpoint(client, &floors, &held) {
                writes += 1;
            }
        }
        self.sweep_at = end;
        true
    }

    /// Puts `client` in the next pass's active list, once.
    fn mark_active(&mut self, client: &Arc<str>) {
        match self.seen.get_mut(client) {
            Some((_, _, pass)) if *pass == self.pass_no => {}
            Some((_, _, pass)) => {
                *pass = self.pass_no;
                self.active.push(client.clone());
            }
            None => self.active.push(client.clone()),
        }
    }

    /// A new sweep: the store's persistent sessions now, and the visit records of the others
    /// forgotten.
    fn start_sweep(&mut self, shared: &Shared) {
        self.clients = shared.store.cursors.persistent_sessions();
        self.sweep_at = 0;
        if self.seen.len() > self.clients.len() {
            let live: Set<&Arc<str>> = self.clients.iter().collect();
            self.seen.retain(|k, _| live.contains(k));
        }
    }

    /// Looks at `client`: lists what it holds into `held` unless nothing can have changed
    /// since its last visit.
    fn visit(
        &mut self,
        shared: &Shared,
        client: &Arc<str>,
        now: Instant,
        complete: bool,
        held: &mut HeldSeqs,
    ) -> Visit {
        let Some(session) = shared.sessions.get(client) else {
            return Visit::Skipped;
        };
        held.clear();
        let state = session.state.lock();
        if state.ended || state.expiry_interval_s == 0 {
            return Visit::Skipped;
        }
        let out = &state.out;
        let seen = Seen {
            pushed_total: out.pushed_total(),
            removed_total: out.removed_total(),
            inflight: out.inflight_len(),
        };
        let holds_nothing = out.queued_len() == 0 && out.inflight_len() == 0;
        let last = self.seen.get(client).copied();
        if let Some((last, at, _)) = last {
            // Unchanged: its cursor can only move if it holds nothing (then the floors
            // decide, and the store's comparison with the written cursor is cheap).
            if !complete && last == seen && !holds_nothing {
                return Visit::Skipped;
            }
            if !complete
                && out.queued_len() > LARGE_QUEUE_MESSAGES
                && now.saturating_duration_since(at)
                    < Duration::from_millis(LARGE_QUEUE_SCAN_INTERVAL_MS)
            {
                return Visit::Skipped;
            }
        }
        let pass = last.map_or(0, |(_, _, pass)| pass);
        self.seen.insert(client.clone(), (seen, now, pass));
        out.held(held);
        // A first visit says nothing about activity (at start-up every session is new to
        // the checkpointer): it takes a change between two visits to become active.
        match last {
            Some((last, _, _)) if last != seen => Visit::Changed,
            _ => Visit::Settled,
        }
    }
}

/// What a visit found.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Visit {
    /// Nothing to write (not a live persistent session, or unchanged while holding messages).
    Skipped,
    /// First visit, or unchanged but holding nothing (the cursor follows the floors).
    Settled,
    /// Its queue changed since the last visit: visited again next pass.
    Changed,
}

/// Retention removed ranges: queued copies of those messages are dropped, once per range and
/// session (and share group), not message by message as they would come due.
fn drop_removed_everywhere(shared: &Shared, removed: &[(u16, std::ops::RangeInclusive<u64>)]) {
    let sessions: Vec<Arc<Session>> = shared.sessions.map.lock().values().cloned().collect();
    for session in &sessions {
        let (effect, persistent) = {
            let mut state = session.state.lock();
            (state.out.drop_removed(removed), state.expiry_interval_s > 0)
        };
        note_retention_drops(shared, Queue::Session(&session.client_id), effect.dropped);
        if persistent && effect.inflight_exposed > 0 {
            let n = effect.inflight_exposed as u64;
            Metrics::add(&shared.metrics.inflight_exposed_retention, n);
            tracing::warn!(client_id = %session.client_id, exposed = n, "retention removed the records of QoS 1 messages in flight; a restart before their PUBACK cannot resend them");
        }
    }
    for (share, queue) in shared.groups.map.lock().iter_mut() {
        let effect = queue.drop_removed(removed);
        note_retention_drops(shared, Queue::ShareGroup(share), effect.dropped);
    }
}

/// Whose queue retention dropped copies from.
#[derive(Clone, Copy)]
enum Queue<'a> {
    /// A session's, by client id.
    Session(&'a str),
    /// A share group's, by `$share/{group}/{filter}`.
    ShareGroup(&'a str),
}

/// Counts and logs `dropped` queued copies that retention removed from `queue`.
fn note_retention_drops(shared: &Shared, queue: Queue<'_>, dropped: usize) {
    if dropped == 0 {
        return;
    }
    shared.metrics.dropped_by_retention(dropped as u64);
    match queue {
        Queue::Session(client_id) => tracing::info!(
            client_id,
            dropped,
            "retention removed queued messages; session skips ahead"
        ),
        Queue::ShareGroup(share) => tracing::info!(
            share,
            dropped,
            "retention removed queued messages; share group skips ahead"
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU64, Ordering};

    use parking_lot::Mutex;
    use tern_wire::{Protocol, QoS};

    use super::*;
    use crate::broker::Broker;
    use crate::config::BrokerConfig;
    use crate::model::{CursorStore, HeldSeqs, MemoryStore, Persistence};
    use crate::state::outbound::stored_item;

    /// A store that counts the cursors it is asked to write, per client.
    #[derive(Default)]
    struct Counting {
        clients: Vec<Arc<str>>,
        floor: AtomicU64,
        calls: Mutex<HashMap<String, usize>>,
    }

    impl CursorStore for Counting {
        fn checkpoint_floors(&self) -> Vec<u64> {
            vec![self.floor.load(Ordering::Relaxed)]
        }
        fn removed_ranges(&self) -> Vec<(u16, std::ops::RangeInclusive<u64>)> {
            MemoryStore.removed_ranges()
        }
        fn reclaim(&self) {
            MemoryStore.reclaim()
        }
        fn checkpoint(&self, client_id: &str, _: &[u64], _: &HeldSeqs) -> bool {
            *self.calls.lock().entry(client_id.to_owned()).or_default() += 1;
            true
        }
        fn persistent_sessions(&self) -> Vec<Arc<str>> {
            self.clients.clone()
        }
        fn durable_groups(&self) -> Vec<Arc<str>> {
            MemoryStore.durable_groups()
        }
        fn checkpoint_group(&self, share: &str, floors: &[u64], held: &HeldSeqs) -> bool {
            MemoryStore.checkpoint_group(share, floors, held)
        }
        fn group_ended(&self, share: &str) {
            MemoryStore.group_ended(share)
        }
        fn refresh_disk_usage(&self) {
            MemoryStore.refresh_disk_usage()
        }
    }

    fn broker(sessions: usize) -> (Broker, Arc<Counting>) {
        let store = Arc::new(Counting {
            clients: (0..sessions).map(|i| format!("c{i}").into()).collect(),
            floor: AtomicU64::new(1),
            ..Counting::default()
        });
        let broker = Broker::with_persistence(
            BrokerConfig::default(),
            Persistence {
                cursors: store.clone(),
                ..Persistence::memory()
            },
        )
        .unwrap();
        for client in &store.clients {
            let session = Session::new(client.clone(), Protocol::V5, 3600);
            broker
                .shared()
                .sessions
                .map
                .lock()
                .insert(client.clone(), session);
        }
        (broker, store)
    }

    fn calls(store: &Counting, client: &str) -> usize {
        store.calls.lock().get(client).copied().unwrap_or(0)
    }

    fn passes_per_sweep() -> usize {
        (SWEEP_INTERVAL_MS / CHECKPOINT_INTERVAL_MS) as usize
    }

    #[tokio::test]
    async fn idle_sessions_are_visited_once_per_sweep_not_every_pass() {
        let (broker, store) = broker(400);
        let mut checkpointer = Checkpointer::default();
        for _ in 0..passes_per_sweep() {
            assert!(checkpointer.pass(broker.shared()));
        }
        // One sweep: every idle session once (every pass, before: 40 times each).
        for i in 0..400 {
            assert_eq!(calls(&store, &format!("c{i}")), 1, "c{i}");
        }
        // The floors moved: the next sweep follows them, once per session again.
        store.floor.store(9, Ordering::Relaxed);
        for _ in 0..passes_per_sweep() {
            checkpointer.pass(broker.shared());
        }
        let total: usize = store.calls.lock().values().sum();
        assert_eq!(total, 800);
    }

    #[tokio::test]
    async fn a_session_whose_queue_changes_is_visited_every_pass() {
        let (broker, store) = broker(400);
        let config = BrokerConfig::default();
        let mut checkpointer = Checkpointer::default();
        // One sweep first, so that every session has been seen once.
        for _ in 0..passes_per_sweep() {
            checkpointer.pass(broker.shared());
        }
        let busy = broker.shared().sessions.get("c7").unwrap();
        let before = calls(&store, "c7");
        for seq in 1..=5 {
            busy.state.lock().out.push(
                stored_item(b"x", QoS::AtLeastOnce, seq),
                false,
                &config,
                Instant::now(),
            );
            checkpointer.pass(broker.shared());
        }
        // Each pass after a change wrote its cursor (the sweep alone would not come back to
        // it within 5 passes); an untouched neighbour was not visited again.
        assert_eq!(calls(&store, "c7") - before, 5);
        assert_eq!(calls(&store, "c300"), 1);
    }

    #[tokio::test]
    async fn the_shutdown_pass_visits_everyone() {
        let (broker, store) = broker(100);
        assert!(checkpoint_once(broker.shared()));
        assert!((0..100).all(|i| calls(&store, &format!("c{i}")) == 1));
    }
}
