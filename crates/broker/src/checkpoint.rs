//! The periodic checkpoint of persistent sessions' and share groups' cursors: what each still
//! holds of the stored messages, handed to [`crate::persist::MessageStore::checkpoint`] and
//! [`crate::persist::MessageStore::checkpoint_group`].
//!
//! # Invariants
//! - The store's floors are read before any session's held messages are listed (see the
//!   cursor invariant in [`crate::durable`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::broker::Shared;
use crate::hash::{Map, Set};
use crate::metrics::Metrics;
use crate::session::Session;

/// How often persistent sessions' cursors are written (only those that moved). Shorter means
/// fewer QoS 1 redeliveries after a crash; each write is a few bytes in a group commit.
pub const CHECKPOINT_INTERVAL_MS: u64 = 25;
/// Most cursor writes per pass (the rest continue next pass, round robin): bounds the write
/// rate with many busy persistent sessions (here 40,000 per second).
pub const MAX_CURSOR_WRITES_PER_PASS: usize = 1000;
/// A session holding more messages than this is scanned at most every
/// [`LARGE_QUEUE_SCAN_INTERVAL_MS`]: listing what it holds costs one step per message.
pub const LARGE_QUEUE_MESSAGES: usize = 8192;
pub const LARGE_QUEUE_SCAN_INTERVAL_MS: u64 = 1000;

/// What a session looked like at its last scan.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Seen {
    pushed_total: u64,
    removed_total: u64,
    inflight: usize,
}

/// State kept between passes.
#[derive(Default)]
pub struct Checkpointer {
    seen: Map<Arc<str>, (Seen, Instant)>,
    /// Where the next pass starts in the session list (round robin under the write cap).
    start: usize,
}

/// Writes the cursors of persistent sessions every [`CHECKPOINT_INTERVAL_MS`] until aborted.
pub async fn run_checkpoints(shared: Arc<Shared>) {
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
pub fn checkpoint_once(shared: &Shared) -> bool {
    Checkpointer::default().pass_with(shared, usize::MAX)
}

impl Checkpointer {
    /// One pass over the persistent sessions. False if the store keeps nothing.
    pub fn pass(&mut self, shared: &Shared) -> bool {
        self.pass_with(shared, MAX_CURSOR_WRITES_PER_PASS)
    }

    fn pass_with(&mut self, shared: &Shared, max_writes: usize) -> bool {
        // Floors first, then what each session holds (see the cursor invariant in `durable`).
        let floors = shared.store.checkpoint_floors();
        if floors.is_empty() {
            return false;
        }
        let removed = shared.store.removed_ranges();
        // What retention freed lets publishing resume (`[store] max_disk_bytes`).
        shared.store.refresh_disk_usage();
        if !removed.is_empty() {
            // Retention removed ranges: queued copies of those messages are dropped, once per
            // range and session, not message by message as they would come due.
            let sessions: Vec<Arc<Session>> =
                shared.sessions.map.lock().values().cloned().collect();
            for session in &sessions {
                let dropped = session.state.lock().out.drop_removed(&removed);
                if dropped > 0 {
                    Metrics::add(&shared.metrics.messages_dropped, dropped as u64);
                    Metrics::add(&shared.metrics.messages_dropped_retention, dropped as u64);
                    tracing::info!(client_id = %session.client_id, dropped, "retention removed queued messages; session skips ahead");
                }
            }
            for (share, queue) in shared.groups.map.lock().iter_mut() {
                let dropped = queue.drop_removed(&removed);
                if dropped > 0 {
                    Metrics::add(&shared.metrics.messages_dropped, dropped as u64);
                    Metrics::add(&shared.metrics.messages_dropped_retention, dropped as u64);
                    tracing::info!(
                        share = &**share,
                        dropped,
                        "retention removed queued messages; share group skips ahead"
                    );
                }
            }
        }
        // Share groups before the sessions: a member's completed QoS 2 markers are cleared
        // only below its groups' written cursors (`durable::shared`).
        let mut held = Vec::new();
        for share in shared.store.durable_groups() {
            held.clear();
            crate::session::groups::held(shared, &share, &mut held);
            shared.store.checkpoint_group(&share, &floors, &held);
        }
        // Cursors are taken as written and removal waits for them to be durable, so this may
        // run before this pass's writes (see `durable::reclaim`).
        shared.store.reclaim();
        let clients = shared.store.persistent_sessions();
        if clients.is_empty() {
            self.seen.clear();
            return true;
        }
        if self.seen.len() > clients.len() {
            let live: Set<&Arc<str>> = clients.iter().collect();
            self.seen.retain(|k, _| live.contains(k));
        }
        let now = Instant::now();
        let large_interval = Duration::from_millis(LARGE_QUEUE_SCAN_INTERVAL_MS);
        let mut writes = 0;
        let n = clients.len();
        let start = self.start % n;
        for offset in 0..n {
            if writes >= max_writes {
                self.start = start + offset;
                return true;
            }
            let client = &clients[(start + offset) % n];
            let Some(session) = shared.sessions.get(client) else {
                continue;
            };
            held.clear();
            {
                let state = session.state.lock();
                if state.ended || state.expiry_interval_s == 0 {
                    continue;
                }
                let out = &state.out;
                let seen = Seen {
                    pushed_total: out.pushed_total,
                    removed_total: out.removed_total,
                    inflight: out.inflight.len(),
                };
                let holds_nothing = out.queue.is_empty() && out.inflight.is_empty();
                if let Some((last, at)) = self.seen.get(client) {
                    // Unchanged: its cursor can only move if it holds nothing (then the
                    // floors decide, and that costs nothing to check).
                    if *last == seen && !holds_nothing && max_writes != usize::MAX {
                        continue;
                    }
                    if out.queue.len() > LARGE_QUEUE_MESSAGES
                        && now.saturating_duration_since(*at) < large_interval
                        && max_writes != usize::MAX
                    {
                        continue;
                    }
                }
                self.seen.insert(client.clone(), (seen, now));
                out.held(&mut held);
            }
            if shared.store.checkpoint(client, &floors, &held) {
                writes += 1;
            }
        }
        self.start = start;
        true
    }
}
