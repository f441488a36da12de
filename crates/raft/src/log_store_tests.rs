//! The log store alone: truncation, purge and the vote survive a reopen, the vote a power loss.

use openraft::storage::{RaftLogStorage, RaftLogStorageExt};
use openraft::{CommittedLeaderId, EntryPayload, RaftLogReader};
use tern_store::sim::{SimConfig, SimDisk};
use tern_store::{Store, SyncPolicy};

use super::LogStore;
use crate::types::{Batch, Entry, LogId, NodeId, Vote};

fn log_id(term: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, NodeId(1)), index)
}

fn entry(term: u64, index: u64) -> Entry {
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Normal(Batch(vec![format!("op {term}/{index}").into()])),
    }
}

fn open(dir: &std::path::Path) -> (Store, LogStore) {
    let store = Store::open(dir).expect("open store");
    let log = LogStore::open(&store, SyncPolicy::Always).expect("open log");
    (store, log)
}

async fn terms(log: &mut LogStore, range: std::ops::Range<u64>) -> Vec<(u64, u64)> {
    log.try_get_log_entries(range)
        .await
        .expect("read")
        .iter()
        .map(|e| (e.log_id.leader_id.term, e.log_id.index))
        .collect()
}

#[tokio::test]
async fn a_truncated_conflicting_suffix_stays_truncated_after_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let (_store, mut log) = open(dir.path());
        log.blocking_append((1..=5).map(|i| entry(1, i)))
            .await
            .expect("append");
        // A new leader's log conflicts from index 3 on: cut, then its entries.
        log.truncate(log_id(1, 3)).await.expect("truncate");
        log.blocking_append([entry(2, 3), entry(2, 4)])
            .await
            .expect("append");
        assert_eq!(
            terms(&mut log, 1..10).await,
            vec![(1, 1), (1, 2), (2, 3), (2, 4)]
        );
        // A cut not followed by an append must hold too.
        log.truncate(log_id(2, 4)).await.expect("truncate");
    }
    let (_store, mut log) = open(dir.path());
    let state = log.get_log_state().await.expect("state");
    assert_eq!(state.last_log_id, Some(log_id(2, 3)));
    assert_eq!(terms(&mut log, 1..10).await, vec![(1, 1), (1, 2), (2, 3)]);
}

#[tokio::test]
async fn a_purge_and_the_vote_survive_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let vote = Vote::new(7, NodeId(2));
    {
        let (_store, mut log) = open(dir.path());
        log.blocking_append((1..=6).map(|i| entry(1, i)))
            .await
            .expect("append");
        log.purge(log_id(1, 4)).await.expect("purge");
        log.save_vote(&vote).await.expect("vote");
    }
    let (_store, mut log) = open(dir.path());
    let state = log.get_log_state().await.expect("state");
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 4)));
    assert_eq!(state.last_log_id, Some(log_id(1, 6)));
    assert_eq!(terms(&mut log, 0..10).await, vec![(1, 5), (1, 6)]);
    assert_eq!(log.read_vote().await.expect("vote"), Some(vote));
}

#[tokio::test]
async fn an_entry_is_readable_as_soon_as_append_returns() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_store, mut log) = open(dir.path());
    log.blocking_append([entry(1, 1)]).await.expect("append");
    // Read through a separate reader, as replication does.
    let mut reader = log.get_log_reader().await;
    assert_eq!(terms(&mut reader, 1..2).await, vec![(1, 1)]);
}

/// The vote is synced even when the log is not (`SyncPolicy::Never`): a power loss right
/// after `save_vote` keeps it, on every seed tried. (Opening the meta kv under the log's
/// policy instead makes this fail: checked by hand.)
#[tokio::test]
async fn the_vote_survives_a_power_loss_when_the_log_is_not_synced() {
    for seed in 0..16 {
        let dir = tempfile::tempdir().expect("tempdir");
        let disk = SimDisk::new(dir.path(), seed, SimConfig::default());
        let vote = Vote::new(3 + seed, NodeId(1));
        {
            let store = Store::open_with_vfs(dir.path(), disk.vfs()).expect("open");
            let mut log = LogStore::open(&store, SyncPolicy::Never).expect("log");
            log.blocking_append([entry(1, 1)]).await.expect("append");
            log.save_vote(&vote).await.expect("vote");
            disk.power_loss();
        }
        let store = Store::open_with_vfs(dir.path(), disk.vfs()).expect("reopen");
        let mut log = LogStore::open(&store, SyncPolicy::Never).expect("log");
        assert_eq!(
            log.read_vote().await.expect("vote"),
            Some(vote),
            "seed {seed}: the vote was lost"
        );
    }
}

#[tokio::test]
async fn a_replication_read_is_bounded_in_bytes_but_returns_at_least_one_entry() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_store, mut log) = open(dir.path());
    log.blocking_append((1..=6).map(|i| entry(1, i)))
        .await
        .expect("append");
    let one = log.index().slots[&1].len_bytes;
    let got = log.read_range(1..7, 3 * one).expect("read");
    assert_eq!(got.len(), 3);
    let got = log.read_range(2..7, 0).expect("read");
    assert_eq!(got.len(), 1, "at least one entry, or replication stalls");
    assert_eq!(got[0].log_id, log_id(1, 2));
}

/// openraft counts this node's copy of an entry when the flush callback fires: by then the
/// entry must survive a power loss (the log under `SyncPolicy::Always`). Firing the callback
/// before the store's ticket completes makes this fail: checked by hand.
#[tokio::test]
async fn an_entry_whose_flush_was_reported_survives_a_power_loss() {
    for seed in 0..8 {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = SimConfig {
            // Slow calls widen the window an early report would fall into.
            latency: Some(std::time::Duration::from_millis(2)),
            ..SimConfig::default()
        };
        let disk = SimDisk::new(dir.path(), seed, cfg);
        {
            let store = Store::open_with_vfs(dir.path(), disk.vfs()).expect("open");
            let mut log = LogStore::open(&store, SyncPolicy::Always).expect("log");
            // Returns once the callback has fired.
            log.blocking_append((1..=3).map(|i| entry(1, i)))
                .await
                .expect("append");
            disk.power_loss();
            // Wait for the old store to let go of the directory (its flush task may hold it).
            let alive = log.liveness();
            drop(log);
            while alive.strong_count() > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
        }
        let store = Store::open_with_vfs(dir.path(), disk.vfs()).expect("reopen");
        let mut log = LogStore::open(&store, SyncPolicy::Always).expect("log");
        let state = log.get_log_state().await.expect("state");
        assert_eq!(state.last_log_id, Some(log_id(1, 3)), "seed {seed}");
    }
}

/// An entry of `bytes` payload bytes (its text names its term and index).
fn big_entry(term: u64, index: u64, bytes: usize) -> Entry {
    let mut op = format!("op {term}/{index} ").into_bytes();
    op.resize(bytes, b'.');
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Normal(Batch(vec![op.into()])),
    }
}

/// The copies kept in memory, checked whole: a suffix of the log from `copies_from`, their
/// bytes counted in `copy_bytes`, within `MAX_CACHED_ENTRY_BYTES` once everything is durable.
fn check_copies(log: &LogStore) {
    let ix = log.index();
    for (&i, s) in &ix.slots {
        assert_eq!(
            s.copy.is_some(),
            i >= ix.copies_from,
            "slot {i}: not a suffix"
        );
    }
    assert_eq!(
        ix.copy_bytes,
        super::index::copied_bytes(&ix.slots),
        "copy_bytes"
    );
    if let Some((&first, _)) = ix.slots.first_key_value() {
        assert!(ix.copies_from >= first, "copies_from below the log");
    }
    assert!(
        ix.copy_bytes <= super::MAX_CACHED_ENTRY_BYTES,
        "{}",
        ix.copy_bytes
    );
}

/// Appends, conflicting suffixes and purges in a seeded order, with entries large enough that
/// the copies overflow their bound many times: after each step the copies keep their rules
/// and every index of the log reads back as the model says, whether from a copy or from the
/// stream. (Checked failing with the oldest copies never dropped, and with a truncation that
/// leaves their bytes counted.)
#[tokio::test]
async fn copies_stay_bounded_and_every_read_sees_the_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open store");
    let mut log = LogStore::open(&store, SyncPolicy::Never).expect("open log");
    let mut model: Vec<(u64, u64, usize)> = Vec::new(); // (term, index, bytes), from `first`
    let (mut first, mut term, mut rng) = (1u64, 1u64, 0x9e37_79b9_7f4a_7c15u64);
    let mut dropped_some = false;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for step in 0..160 {
        // Appends alone first: the copies overflow their bound before any truncation or
        // purge has moved `copies_from`.
        let roll = if step < 40 { 9 } else { next() % 10 };
        let last = first + model.len() as u64 - 1;
        if roll == 0 && model.len() > 4 {
            // A new leader's log conflicts from some index on.
            let from = first + 1 + next() % (model.len() as u64 - 1);
            log.truncate(log_id(term, from)).await.expect("truncate");
            model.truncate((from - first) as usize);
            term += 1;
        } else if roll == 1 && model.len() > 8 {
            let upto = first + next() % (model.len() as u64 / 2);
            let (t, _, _) = model[(upto - first) as usize];
            log.purge(log_id(t, upto)).await.expect("purge");
            model.drain(..=((upto - first) as usize));
            first = upto + 1;
        } else {
            let n = 1 + next() % 4;
            let mut batch = Vec::new();
            for k in 0..n {
                let bytes = 64 * 1024 + (next() % (512 * 1024)) as usize;
                let index = last + 1 + k;
                batch.push(big_entry(term, index, bytes));
                model.push((term, index, bytes));
            }
            log.blocking_append(batch).await.expect("append");
        }
        check_copies(&log);
        dropped_some |= log.index().copies_from > first;
        let got = log
            .try_get_log_entries(first..first + model.len() as u64)
            .await
            .expect("read");
        let got: Vec<(u64, u64, usize)> = got
            .iter()
            .map(|e| match &e.payload {
                EntryPayload::Normal(Batch(ops)) => {
                    (e.log_id.leader_id.term, e.log_id.index, ops[0].len())
                }
                other => panic!("step {step}: {other:?}"),
            })
            .collect();
        assert_eq!(got, model, "step {step}");
    }
    assert!(
        dropped_some,
        "the bound never dropped a copy: the test proves nothing"
    );
}

/// openraft 0.9 asks for a purge up to an installed snapshot's point while the install runs.
/// Until the state machine has recorded that point, the purge stays in memory: a crash then
/// finds every entry the restart re-applies, and an append (which would leave a hole on disk
/// below it) waits. Seen failing with the purge made durable at once (the reopened log was
/// purged to 5 while the recorded point was 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_past_the_recorded_applied_point_reaches_the_disk_once_the_point_is_recorded() {
    use crate::applied_point::AppliedRecords;
    for recorded in [false, true] {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let (_store, mut log) = open(dir.path());
            let records = AppliedRecords::new(Some(2));
            log.purge_after(records.gate());
            log.blocking_append((1..=6).map(|i| entry(1, i)))
                .await
                .expect("append");
            log.purge(log_id(1, 5))
                .await
                .expect("purge returns at once");
            let state = log.get_log_state().await.expect("state");
            assert_eq!(state.last_purged_log_id, Some(log_id(1, 5)), "in memory");
            let mut appender = log.clone();
            let appending =
                tokio::spawn(async move { appender.blocking_append([entry(1, 7)]).await });
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            assert!(!appending.is_finished(), "the append waits for the purge");
            if recorded {
                records.recorded(Some(5));
                appending
                    .await
                    .expect("task")
                    .expect("append after the purge");
            } else {
                // The state machine goes (a crash): the append fails, nothing reaches disk.
                drop(records);
                assert!(appending.await.expect("task").is_err());
            }
            // The deferred purge's task lets go of the log (and the store's lock) once done.
            let live = log.liveness();
            drop(log);
            for _ in 0..1000 {
                if live.strong_count() == 0 {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
        let (_store, mut log) = open(dir.path());
        let state = log.get_log_state().await.expect("state");
        if recorded {
            assert_eq!(state.last_purged_log_id, Some(log_id(1, 5)));
            assert_eq!(terms(&mut log, 0..10).await, vec![(1, 6), (1, 7)]);
        } else {
            assert_eq!(
                state.last_purged_log_id, None,
                "purged past the recorded point"
            );
            assert_eq!(
                terms(&mut log, 0..10).await,
                (1..=6).map(|i| (1, i)).collect::<Vec<_>>()
            );
        }
    }
}

/// The index's purge point never goes back: a purge deferred for an install may be made
/// durable after a later one (`log_store/purge.rs`), and must not undo it.
#[tokio::test]
async fn an_older_purge_point_leaves_the_index_as_it_is() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_store, mut log) = open(dir.path());
    log.blocking_append((1..=8).map(|i| entry(1, i)))
        .await
        .expect("append");
    log.index().purge_through(log_id(1, 5));
    log.index().purge_through(log_id(1, 3));
    let state = log.get_log_state().await.expect("state");
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 5)));
    assert_eq!(terms(&mut log, 0..10).await, vec![(1, 6), (1, 7), (1, 8)]);
    log.index().debug_check();
}
