//! The periodic checkpoint of persistent sessions' cursors: what each still holds of the
//! stored messages, handed to [`crate::persist::MessageStore::checkpoint`].
//!
//! # Invariants
//! - The store's floors are read before any session's held messages are listed (see the
//!   cursor invariant in [`crate::durable`]).

use std::sync::Arc;
use std::time::Duration;

use crate::broker::Shared;
use crate::metrics::Metrics;
use crate::session::Session;

/// How often persistent sessions' cursors are written (only those that moved). Shorter means
/// fewer QoS 1 redeliveries after a crash; each write is a few bytes in a group commit.
pub const CHECKPOINT_INTERVAL_MS: u64 = 25;

/// Writes the cursors of persistent sessions every [`CHECKPOINT_INTERVAL_MS`] until aborted.
pub async fn run_checkpoints(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(Duration::from_millis(CHECKPOINT_INTERVAL_MS));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if !checkpoint_once(&shared) {
            return;
        }
    }
}

/// One pass over the persistent sessions. False if the store keeps nothing.
pub fn checkpoint_once(shared: &Shared) -> bool {
    // Floors first, then what each session holds (see the cursor invariant in `durable`).
    let floors = shared.store.checkpoint_floors();
    if floors.is_empty() {
        return false;
    }
    let sessions: Vec<Arc<Session>> = shared.sessions.map.lock().values().cloned().collect();
    let removed = shared.store.removed_ranges();
    if !removed.is_empty() {
        // Retention removed ranges: queued copies of those messages are dropped, once per
        // range and session, not message by message as they would come due.
        for session in &sessions {
            let dropped = session.state.lock().out.drop_removed(&removed);
            if dropped > 0 {
                Metrics::add(&shared.metrics.messages_dropped, dropped as u64);
                tracing::info!(client_id = %session.client_id, dropped, "retention removed queued messages; session skips ahead");
            }
        }
    }
    let mut held = Vec::new();
    for session in sessions {
        held.clear();
        {
            let state = session.state.lock();
            if state.ended || state.expiry_interval_s == 0 {
                continue;
            }
            state.out.held(&mut held);
        }
        shared.store.checkpoint(&session.client_id, &floors, &held);
    }
    true
}
