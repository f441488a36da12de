//! The checkpointer visits what changed (issue 24 item 5): counted per client by a store that
//! records the cursors it is asked to write.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use tern_wire::{Protocol, QoS};
use tokio::time::Instant;

use crate::broker::Broker;
use crate::config::BrokerConfig;
use crate::engine::checkpoint::{
    CHECKPOINT_INTERVAL_MS, Checkpointer, MAX_CURSOR_WRITES_PER_PASS, SAFETY_SWEEP_INTERVAL_MS,
    SWEEP_INTERVAL_MS, checkpoint_once,
};
use crate::engine::route;
use crate::model::{CursorStore, HeldSeqs, MemoryStore, Persistence};
use crate::state::outbound::stored_item;
use crate::state::session::Session;
use crate::state::session::changed::MAX_CHANGED_SESSIONS;

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

fn total_calls(store: &Counting) -> usize {
    store.calls.lock().values().sum()
}

fn passes_per_sweep() -> usize {
    (SWEEP_INTERVAL_MS / CHECKPOINT_INTERVAL_MS) as usize
}

/// Routes a stored QoS 1 message to `client`'s queue, as a publisher's router does.
fn deliver(broker: &Broker, client: &str, seq: u64) {
    let session = broker.shared().sessions.get(client).unwrap();
    let item = stored_item(b"x", QoS::AtLeastOnce, seq);
    route::deliver(broker.shared(), &session, item, Instant::now());
}

/// A checkpointer that has swept once: every session has its first cursor (the first visits
/// are writes, at most `MAX_CURSOR_WRITES_PER_PASS` a pass).
fn swept(broker: &Broker) -> Checkpointer {
    let sessions = broker.shared().sessions.len();
    let mut checkpointer = Checkpointer::default();
    for _ in 0..passes_per_sweep().max(sessions.div_ceil(MAX_CURSOR_WRITES_PER_PASS) + 1) {
        assert!(checkpointer.pass(broker.shared()));
    }
    checkpointer
}

#[tokio::test]
async fn an_idle_session_is_not_visited_again_after_its_first_checkpoint() {
    let (broker, store) = broker(400);
    let mut checkpointer = swept(&broker);
    assert!((0..400).all(|i| calls(&store, &format!("c{i}")) == 1));
    // Three sweeps' time with nothing changed and the floors still: no visit at all (a
    // sweep a second visited all 400 again and again before).
    for _ in 0..3 * passes_per_sweep() {
        checkpointer.pass(broker.shared());
    }
    assert_eq!(total_calls(&store), 400);
    // The floors moved: sessions holding nothing follow them, once each, and rest again.
    store.floor.store(9, Ordering::Relaxed);
    for _ in 0..3 * passes_per_sweep() {
        checkpointer.pass(broker.shared());
    }
    assert!((0..400).all(|i| calls(&store, &format!("c{i}")) == 2));
}

#[tokio::test]
async fn a_session_that_gets_a_message_is_visited_at_the_next_pass() {
    let (broker, store) = broker(400);
    let mut checkpointer = swept(&broker);
    for seq in 1..=5 {
        deliver(&broker, "c7", seq);
        checkpointer.pass(broker.shared());
        assert_eq!(calls(&store, "c7"), 1 + seq as usize, "after message {seq}");
    }
    // No one else was visited.
    assert_eq!(total_calls(&store), 400 + 5);
}

#[tokio::test(start_paused = true)]
async fn a_safety_sweep_visits_everyone_after_its_interval() {
    let (broker, store) = broker(100);
    let mut checkpointer = swept(&broker);
    tokio::time::advance(std::time::Duration::from_millis(
        SAFETY_SWEEP_INTERVAL_MS / 2,
    ))
    .await;
    for _ in 0..passes_per_sweep() {
        checkpointer.pass(broker.shared());
    }
    assert_eq!(total_calls(&store), 100);
    tokio::time::advance(std::time::Duration::from_millis(
        SAFETY_SWEEP_INTERVAL_MS / 2,
    ))
    .await;
    for _ in 0..passes_per_sweep() {
        checkpointer.pass(broker.shared());
    }
    assert!((0..100).all(|i| calls(&store, &format!("c{i}")) == 2));
}

#[tokio::test]
async fn a_full_changed_list_falls_back_to_a_sweep() {
    // More changed sessions in one pass than the list holds: the last ones are in no list.
    let sessions = MAX_CHANGED_SESSIONS + 10;
    let (broker, store) = broker(sessions);
    let mut checkpointer = swept(&broker);
    assert_eq!(total_calls(&store), sessions);
    for i in 0..sessions {
        deliver(&broker, &format!("c{i}"), 1);
    }
    // Every change is a write, MAX_CURSOR_WRITES_PER_PASS per pass; a sweep's visits of
    // sessions already visited write nothing.
    let bound = sessions.div_ceil(MAX_CURSOR_WRITES_PER_PASS) + passes_per_sweep() + 1;
    for _ in 0..bound {
        checkpointer.pass(broker.shared());
    }
    for i in (0..10).chain(sessions - 10..sessions) {
        assert_eq!(calls(&store, &format!("c{i}")), 2, "c{i}");
    }
}

/// Every session changes at every pass, more than the list holds and more than the write cap
/// lets through: the sweep restarts at every pass (overflow), and what is deferred is each
/// session at most once (the sweep's deferred slice was carried again at every restart).
#[tokio::test]
async fn deferred_visits_hold_each_session_at_most_once() {
    let sessions = MAX_CHANGED_SESSIONS + 10;
    let (broker, _store) = broker(sessions);
    let mut checkpointer = swept(&broker);
    for seq in 1..=5 {
        for i in 0..sessions {
            deliver(&broker, &format!("c{i}"), seq);
        }
        checkpointer.pass(broker.shared());
        assert!(
            checkpointer.carried_len() <= sessions,
            "{}",
            checkpointer.carried_len()
        );
    }
}

#[tokio::test]
async fn the_shutdown_pass_visits_everyone() {
    let (broker, store) = broker(100);
    assert!(checkpoint_once(broker.shared()));
    assert!((0..100).all(|i| calls(&store, &format!("c{i}")) == 1));
}

/// The check that keeps the announcements complete: a change made without
/// `ChangedSessions::note` is found by the next sweep's visit (debug builds).
#[cfg(debug_assertions)]
#[tokio::test]
#[should_panic(expected = "no one announced it")]
async fn a_change_no_one_announced_is_caught_by_the_sweep() {
    let (broker, store) = broker(10);
    let mut checkpointer = swept(&broker);
    let session = broker.shared().sessions.get("c3").unwrap();
    let config = BrokerConfig::default();
    let item = stored_item(b"x", QoS::AtLeastOnce, 1);
    session
        .state
        .lock()
        .out
        .push(item, false, &config, Instant::now());
    store.floor.store(2, Ordering::Relaxed);
    for _ in 0..passes_per_sweep() {
        checkpointer.pass(broker.shared());
    }
}
