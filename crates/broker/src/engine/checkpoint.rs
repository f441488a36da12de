//! The periodic checkpoint of persistent sessions' and share groups' cursors: what each still
//! holds of the stored messages, handed to [`crate::model::CursorStore::checkpoint`] and
//! [`crate::model::CursorStore::checkpoint_group`].
//!
//! A pass costs what changed (issue 24 item 5): the sessions that announced a change since
//! their last visit ([`crate::state::session::ChangedSessions`]), plus a sweep of every persistent session only when
//! one is owed: the floors moved (a session that holds nothing follows them), the list
//! overflowed, or [`SAFETY_SWEEP_INTERVAL_MS`] passed. Idle, with nothing published, a pass
//! visits no session.
//!
//! # Invariants
//! - The store's floors are read before any session's held messages are listed (see the
//!   cursor invariant in [`crate::durable`]). Which sessions a pass visits never decides what
//!   a cursor says, only how soon it follows: a visit lists what the session holds then.
//! - A session whose held messages changed since its last visit is listed, or the list
//!   overflowed and a sweep is under way or starts at the next pass.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

use crate::engine::Shared;
use crate::hash::{Map, Set};
use crate::metrics::Metrics;
use crate::model::HeldSeqs;
use crate::state::session::Session;

/// How often the checkpointer runs. Sessions that announced a change are visited at the next
/// pass: shorter means fewer QoS 1 redeliveries after a crash; each write is a few bytes in a
/// group commit.
pub(crate) const CHECKPOINT_INTERVAL_MS: u64 = 25;
/// A sweep visits every persistent session within this, a slice per pass. A sweep runs when
/// the floors moved since the last one started (a session holding nothing follows them: its
/// cursor is the floors), when the changed list overflowed, and every
/// [`SAFETY_SWEEP_INTERVAL_MS`]. The cost of a sweep is a cursor up to this much behind for a
/// session that holds nothing while the floors move: reclamation held back by as much, and
/// possibly more QoS 1 redeliveries after a crash; never a message lost (cursors only trail).
pub(crate) const SWEEP_INTERVAL_MS: u64 = 1000;
/// With nothing else owing one, a sweep starts this long after the last one started: a
/// change no one announced (a bug) leaves a cursor at most this far behind. 100,000 idle
/// sessions cost ~0.2 s of CPU per sweep, so ~0.3% of a core at this interval.
pub(crate) const SAFETY_SWEEP_INTERVAL_MS: u64 = 60_000;
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

/// A session's last visit: what it looked like, when, and which session it was (a new session
/// under the same client id starts its counts afresh). The `Weak` keeps the old session's
/// block allocated, so the pointer comparison cannot match a new one at the same address;
/// entries of gone sessions are dropped when a sweep starts.
struct LastVisit {
    seen: Seen,
    at: Instant,
    session: Weak<Session>,
}

/// State kept between passes.
///
/// # Invariants
/// - `carried` holds client ids taken from [`crate::state::session::ChangedSessions`] whose
///   visit a write cap or the large-queue interval deferred: their change flag is still set,
///   so none is listed again and each is in `carried` at most once (bounded by the persistent
///   sessions). The sweep is never carried: it stops where the write cap stops it.
/// - A sweep runs over `clients` (the store's persistent sessions when it started) from
///   `sweep_at`; none runs while `sweep_at == clients.len()`.
#[derive(Default)]
pub(crate) struct Checkpointer {
    seen: Map<Arc<str>, LastVisit>,
    clients: Vec<Arc<str>>,
    sweep_at: usize,
    /// When the last sweep started, and the floors then.
    sweep_started: Option<Instant>,
    sweep_floors: Vec<u64>,
    /// Sessions whose visit was deferred: visited first at the next pass.
    carried: Vec<Arc<str>>,
    /// What this pass visits (kept for its allocation).
    todo: Vec<Arc<str>>,
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
    /// One pass. False if the store keeps nothing.
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
        let complete = max_writes == usize::MAX;
        let now = Instant::now();
        let mut todo = std::mem::take(&mut self.todo);
        todo.clear();
        todo.append(&mut self.carried);
        let overflowed = shared.changed_sessions.drain(&mut todo);
        self.sweep_if_owed(shared, &floors, now, overflowed);
        let slice = if complete {
            self.clients.len()
        } else {
            let passes = (SWEEP_INTERVAL_MS / CHECKPOINT_INTERVAL_MS).max(1) as usize;
            self.clients.len().div_ceil(passes)
        };
        let mut writes = 0;
        for (i, client) in todo.iter().enumerate() {
            if writes >= max_writes {
                // Deferred: the next pass starts with them.
                self.carried.extend_from_slice(&todo[i..]);
                break;
            }
            match self.visit(shared, client, now, complete, &mut held) {
                Visit::Skipped => {}
                Visit::Later => self.carried.push(client.clone()),
                Visit::Listed => writes += usize::from(self.write(shared, client, &floors, &held)),
            }
        }
        self.todo = todo;
        // The sweep's slice, as far as the write cap lets it: it resumes where it stopped
        // (nothing of it is carried, so `carried` holds each session at most once).
        let end = (self.sweep_at + slice).min(self.clients.len());
        while self.sweep_at < end && writes < max_writes {
            let client = self.clients[self.sweep_at].clone();
            self.sweep_at += 1;
            // A large queue's rescan waits (`Later`): if it changed, it announced it.
            if self.visit(shared, &client, now, complete, &mut held) == Visit::Listed {
                writes += usize::from(self.write(shared, &client, &floors, &held));
            }
        }
        true
    }

    /// Sessions whose deferred visit the next pass starts with.
    #[cfg(test)]
    pub(crate) fn carried_len(&self) -> usize {
        self.carried.len()
    }

    /// Hands what a visit listed to the store; true if it wrote a cursor.
    fn write(&self, shared: &Shared, client: &str, floors: &[u64], held: &HeldSeqs) -> bool {
        shared.store.cursors.checkpoint(client, floors, held)
    }

    /// Starts a sweep if none runs and one is owed: the list overflowed (then one starts
    /// afresh even if one runs: the sessions it lost may lie behind it), the floors moved
    /// since the last one started, or none started for [`SAFETY_SWEEP_INTERVAL_MS`].
    fn sweep_if_owed(&mut self, shared: &Shared, floors: &[u64], now: Instant, overflowed: bool) {
        let running = self.sweep_at < self.clients.len();
        let owed = overflowed
            || (!running
                && (self.sweep_floors != floors
                    || self.sweep_started.is_none_or(|at| {
                        now.saturating_duration_since(at)
                            >= Duration::from_millis(SAFETY_SWEEP_INTERVAL_MS)
                    })));
        if !owed {
            return;
        }
        tracing::debug!(
            overflowed,
            floors_moved = self.sweep_floors != floors,
            ?floors,
            "checkpoint sweep starts"
        );
        self.clients = shared.store.cursors.persistent_sessions();
        self.sweep_at = 0;
        self.sweep_started = Some(now);
        self.sweep_floors.clear();
        self.sweep_floors.extend_from_slice(floors);
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
            self.seen.remove(client);
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
        let last = self
            .seen
            .get(client)
            .filter(|last| std::ptr::eq(last.session.as_ptr(), Arc::as_ptr(&session)));
        if let Some(last) = last {
            debug_assert!(
                last.seen == seen || session.checkpoint_pending(&state),
                "what {client} holds changed and no one announced it (ChangedSessions::note)"
            );
            // Unchanged: its cursor can only move if it holds nothing (then the floors
            // decide, and the store's comparison with the written cursor is cheap).
            if !complete && last.seen == seen && !holds_nothing {
                session.checkpoint_visited(&state);
                return Visit::Skipped;
            }
            if !complete
                && out.queued_len() > LARGE_QUEUE_MESSAGES
                && now.saturating_duration_since(last.at)
                    < Duration::from_millis(LARGE_QUEUE_SCAN_INTERVAL_MS)
            {
                return Visit::Later;
            }
        }
        session.checkpoint_visited(&state);
        let visit = LastVisit {
            seen,
            at: now,
            session: Arc::downgrade(&session),
        };
        self.seen.insert(client.clone(), visit);
        out.held(held);
        Visit::Listed
    }
}

/// What a visit found.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Visit {
    /// Nothing to write (not a live persistent session, or unchanged while holding messages).
    Skipped,
    /// Its held messages are listed: the store compares them with the written cursor.
    Listed,
    /// Changed, but a large queue scanned less than [`LARGE_QUEUE_SCAN_INTERVAL_MS`] ago:
    /// visited again at the next pass.
    Later,
}

/// Retention removed ranges: queued copies of those messages are dropped, once per range and
/// session (and share group), not message by message as they would come due.
fn drop_removed_everywhere(shared: &Shared, removed: &[(u16, std::ops::RangeInclusive<u64>)]) {
    let sessions: Vec<Arc<Session>> = shared.sessions.map.lock().values().cloned().collect();
    for session in &sessions {
        let (effect, persistent) = {
            let mut state = session.state.lock();
            let effect = state.out.drop_removed(removed);
            shared.changed_sessions.note(session, &state);
            (effect, state.expiry_interval_s > 0)
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
