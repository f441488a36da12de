//! The Raft log and vote in tern-store (openraft's `RaftLogStorage`).
//!
//! - **Log**: the stream `raft-log`, one record per entry (topic `e`, properties: the entry's
//!   log id, payload: the entry), under the configured sync policy. The Raft index is NOT the
//!   store's sequence: store sequences are never reused, so a conflicting suffix is cut by a
//!   truncate marker record (topic `t`, payload: the first index cut) and an append at index
//!   `i` replaces everything from `i` on. The index `Raft index -> store seq` lives in memory
//!   and is rebuilt on open by replaying entries and markers in sequence order.
//! - **Vote and purge point**: the kv stream `raft-meta`, always synced (`SyncPolicy::Always`)
//!   whatever the log's policy: a vote forgotten in a crash lets a node vote twice in a term.
//!   Purge records the purged log id there first, then drops whole blocks below the first
//!   entry kept (what a crash leaves behind is skipped on open). Never past the applied point
//!   the state machine has recorded (module `applied_point`): a purge beyond it (a snapshot
//!   install under way) is made durable once the point is recorded, and appends wait for it.
//!
//! # Invariants
//! - The in-memory index holds consecutive indexes above the purge point, no hole.
//! - An entry's decoded `copy` is kept at least until its record is durable: openraft reads an
//!   entry (to replicate it) as soon as `append` returns, while the store serves a record only
//!   once it is durable. Past that, copies of the newest entries stay, up to
//!   [`MAX_CACHED_ENTRY_BYTES`], so that replication and the state machine, which read an entry
//!   right after it is flushed and committed, do not read it back from the log stream.
//! - The slots holding a copy are exactly those at and above `copies_from` (a suffix of the
//!   log: appends add copies at the end, the oldest durable ones are dropped first), which is
//!   never below the first slot, and `copy_bytes` is the encoded size of their entries.

use std::fmt::Debug;
use std::ops::RangeBounds;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{AnyError, LogState, OptionalSend, RaftLogReader, StorageIOError};
use tern_store::config::{MAX_BATCH_BYTES, MAX_BATCH_RECORDS};
use tern_store::{KvStream, NewRecord, Store, StoreError, Stream, StreamConfig, SyncPolicy};

use crate::applied_point::PurgeGate;
use crate::inject::{self, Bug};
use crate::types::{Entry, LogId, LogIndex, StorageError, TypeConfig, Vote, decode, encode};

/// The log stream's name in the node's store.
pub const LOG_STREAM: &str = "raft-log";
/// The kv stream holding the vote and the purge point.
pub const META_KV: &str = "raft-meta";
const KEY_VOTE: &[u8] = b"vote";
const KEY_PURGED: &[u8] = b"purged";
const TOPIC_ENTRY: &[u8] = b"e";
const TOPIC_TRUNCATE: &[u8] = b"t";
/// Most encoded entry bytes one replication read returns (one AppendEntries request). With
/// one proposal of at most `MAX_PROPOSAL_BYTES` above it, it stays under the network's
/// `MAX_FRAME_BYTES`.
pub const MAX_APPEND_BYTES: usize = 32 << 20;
pub use index::MAX_CACHED_ENTRY_BYTES;
use index::{Index, Slot};

/// The injected bug `DeliverUncommitted`: what hands each appended entry to the application
/// at once (set by the node only under the bug).
pub(crate) type EarlyDelivery = Arc<dyn Fn(&Entry) + Send + Sync>;

#[derive(Default)]
struct Early(Option<EarlyDelivery>);

impl Debug for Early {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Early(set)"
        } else {
            "Early"
        })
    }
}

#[derive(Debug)]
struct Inner {
    log: Stream,
    meta: KvStream,
    index: Mutex<Index>,
    /// Set under the injected bug `DeliverUncommitted` only.
    early: Mutex<Early>,
    /// Where a purge waits for the state machine's recorded applied point to cover it (set
    /// by the node; a log opened alone, to be read, has none).
    purge_gate: std::sync::OnceLock<PurgeGate>,
    /// The purge point last made durable; held while one is written (never goes back).
    durable_purge: tokio::sync::Mutex<Option<LogId>>,
    /// A purge waiting for the state machine to record its point (module `purge`).
    deferred: tokio::sync::watch::Sender<purge::Deferred>,
    /// Declared last, so dropped last: once it is gone the streams (and the store's lock)
    /// are released.
    canary: Arc<()>,
}

/// The Raft log storage of one node. Cheap to clone (the clone is also its log reader).
#[derive(Debug, Clone)]
pub struct LogStore {
    inner: Arc<Inner>,
}

fn store_err(e: impl ToString) -> AnyError {
    AnyError::error(e.to_string())
}

impl LogStore {
    /// Opens the log (under `sync`) and the meta kv (always synced) in `store`, and rebuilds
    /// the index.
    pub fn open(store: &Store, sync: SyncPolicy) -> Result<LogStore, StoreError> {
        let log = store.stream(
            LOG_STREAM,
            StreamConfig {
                sync,
                ..StreamConfig::default()
            },
        )?;
        let meta_sync = if inject::on(Bug::VoteNotSynced) {
            SyncPolicy::Never
        } else {
            SyncPolicy::Always
        };
        let meta = store.kv(
            META_KV,
            StreamConfig {
                sync: meta_sync,
                ..StreamConfig::default()
            },
        )?;
        let mut index = Index::default();
        if let Some(v) = meta.get(KEY_VOTE)? {
            index.vote = Some(decode(&v).map_err(corrupt)?);
        }
        if let Some(p) = meta.get(KEY_PURGED)? {
            index.purged = Some(decode(&p).map_err(corrupt)?);
        }
        index::rebuild(&log, &mut index)?;
        index.debug_check();
        let purged = index.purged;
        Ok(LogStore {
            inner: Arc::new(Inner {
                log,
                meta,
                index: Mutex::new(index),
                early: Mutex::default(),
                purge_gate: std::sync::OnceLock::new(),
                durable_purge: tokio::sync::Mutex::new(purged),
                deferred: tokio::sync::watch::Sender::new(purge::Deferred::None),
                canary: Arc::new(()),
            }),
        })
    }

    /// The records `first_seq..=last_seq` are durable: the store may serve their entries
    /// from now on, and their copies may go (`Index::mark_durable`).
    fn durable(&self, first_seq: u64, last_seq: u64) {
        let mut ix = self.index();
        ix.mark_durable(first_seq, last_seq);
        ix.debug_check();
    }

    /// The injected bug `DeliverUncommitted`: every appended entry goes to `deliver` too.
    pub(crate) fn deliver_early(&self, deliver: EarlyDelivery) {
        self.inner.early.lock().unwrap_or_else(|e| e.into_inner()).0 = Some(deliver);
    }

    /// From now on a purge past the state machine's recorded applied point, as `gate` shows
    /// it, reaches the disk only once the point covers it (module [`crate::applied_point`]).
    pub(crate) fn purge_after(&self, gate: PurgeGate) {
        let set = self.inner.purge_gate.set(gate);
        debug_assert!(
            set.is_ok(),
            "a log store's purge gate is set once, by its node"
        );
    }

    /// Gone once every clone is dropped and with them the streams and the store's lock.
    pub(crate) fn liveness(&self) -> Weak<()> {
        Arc::downgrade(&self.inner.canary)
    }

    fn index(&self) -> MutexGuard<'_, Index> {
        self.inner.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The entries in `range` that are in the log, from its start up to the first missing one,
    /// stopping once `max_bytes` (encoded) are reached (at least one entry is returned).
    #[expect(
        clippy::result_large_err,
        reason = "openraft's StorageError, which the trait method calling this returns anyway"
    )]
    fn read_range(
        &self,
        range: impl RangeBounds<u64>,
        max_bytes: usize,
    ) -> Result<Vec<Entry>, StorageError> {
        // The copies are a suffix of the log (module text): what the range needs from the
        // stream comes first, the copies after it.
        let mut from_stream: Vec<(u64, LogIndex)> = Vec::new();
        let mut copies: Vec<Entry> = Vec::new();
        {
            let ix = self.index();
            let mut bytes = 0usize;
            for (&i, s) in ix.slots.range(range) {
                let taken = from_stream.len() + copies.len();
                if taken > 0 && bytes + s.len_bytes > max_bytes {
                    break;
                }
                bytes += s.len_bytes;
                match &s.copy {
                    Some(e) => copies.push(e.clone()),
                    None => {
                        debug_assert!(copies.is_empty(), "a copy below an entry without one");
                        from_stream.push((s.seq, i));
                    }
                }
            }
        }
        let mut out = Vec::with_capacity(from_stream.len() + copies.len());
        for (seq, i) in from_stream {
            let rec = self
                .inner
                .log
                .get(seq)
                .map_err(|e| StorageIOError::read_log_at_index(i, store_err(e)))?;
            // Purged meanwhile: the entries found so far are still consecutive (the copies
            // after the gap are not).
            let Some(rec) = rec else { return Ok(out) };
            let e: Entry = decode(&rec.payload)
                .map_err(|e| StorageIOError::read_log_at_index(i, store_err(e)))?;
            out.push(e);
        }
        out.extend(copies);
        Ok(out)
    }

    /// Appends encoded entries to the log stream in store batches; returns the store
    /// sequences assigned and the last batch's ticket (tickets complete in order).
    async fn write_entries(
        &self,
        recs: Vec<(Vec<u8>, Vec<u8>)>,
    ) -> Result<(Vec<u64>, Option<tern_store::Ticket>), StoreError> {
        let mut seqs = Vec::with_capacity(recs.len());
        let mut last = None;
        let mut start = 0;
        while start < recs.len() {
            let mut end = start;
            let mut bytes = 0;
            while end < recs.len() && end - start < MAX_BATCH_RECORDS {
                let len = recs[end].0.len() + recs[end].1.len() + 64;
                if end > start && bytes + len > MAX_BATCH_BYTES / 2 {
                    break;
                }
                bytes += len;
                end += 1;
            }
            let ticket = self.append_chunk(&recs[start..end]).await?;
            seqs.extend(ticket.first_seq()..=ticket.seq());
            last = Some(ticket);
            start = end;
        }
        Ok((seqs, last))
    }

    /// One store batch: without blocking when the queue has room, else on a blocking thread
    /// (the store's back-pressure waits on a condition variable).
    async fn append_chunk(
        &self,
        chunk: &[(Vec<u8>, Vec<u8>)],
    ) -> Result<tern_store::Ticket, StoreError> {
        match self.inner.log.try_append_batch(&entry_records(chunk)) {
            Err(StoreError::QueueFull { .. }) => {
                let owned = chunk.to_vec();
                let log = self.inner.log.clone();
                tokio::task::spawn_blocking(move || log.append_batch(&entry_records(&owned)))
                    .await
                    .map_err(|e| StoreError::Closed(format!("append task: {e}")))?
            }
            other => other,
        }
    }
}

/// Store records for encoded entries (log id, entry). Record time is unused: 0.
fn entry_records(chunk: &[(Vec<u8>, Vec<u8>)]) -> Vec<NewRecord<'_>> {
    chunk
        .iter()
        .map(|(props, payload)| NewRecord {
            topic: TOPIC_ENTRY,
            properties: props,
            payload,
            time_ns: Some(0),
        })
        .collect()
}

fn write_logs_err(e: impl ToString) -> StorageError {
    StorageIOError::write_logs(store_err(e)).into()
}

fn corrupt(e: postcard::Error) -> StoreError {
    StoreError::InvalidConfig(format!("raft log: undecodable record: {e}"))
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        self.read_range(range, usize::MAX)
    }

    /// What replication sends in one AppendEntries: at most [`MAX_APPEND_BYTES`] of entries
    /// (and at least one), so that a frame stays under the network's limit.
    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry>, StorageError> {
        self.read_range(start..end, MAX_APPEND_BYTES)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let ix = self.index();
        Ok(LogState {
            last_purged_log_id: ix.purged,
            last_log_id: ix.last_log_id(),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let bytes = encode(vote).map_err(|e| StorageIOError::write_vote(store_err(e)))?;
        let ticket = self
            .inner
            .meta
            .put(KEY_VOTE, &bytes)
            .map_err(|e| StorageIOError::write_vote(store_err(e)))?;
        // The vote is on disk before openraft acts on it (meta is always synced).
        ticket
            .await
            .map_err(|e| StorageIOError::write_vote(store_err(e)))?;
        self.index().vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        Ok(self.index().vote)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        if entries.is_empty() {
            callback.log_io_completed(Ok(()));
            return Ok(());
        }
        self.wait_deferred_purge().await?;
        let mut recs = Vec::with_capacity(entries.len());
        for e in &entries {
            let w = |x: postcard::Error| StorageIOError::write_log_entry(e.log_id, store_err(x));
            recs.push((encode(&e.log_id).map_err(w)?, encode(e).map_err(w)?));
        }
        let lens: Vec<usize> = recs.iter().map(|(_, payload)| payload.len()).collect();
        let (seqs, ticket) = self
            .write_entries(recs)
            .await
            .map_err(|e| StorageIOError::write_logs(store_err(e)))?;
        let first_seq = seqs.first().copied().unwrap_or(0);
        // Folds away unless the bug is compiled in (feature `inject`) and switched on.
        if inject::on(Bug::DeliverUncommitted) {
            let early = self.inner.early.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(deliver) = early.0.clone() {
                drop(early);
                entries.iter().for_each(|e| deliver(e));
            }
        }
        {
            let mut ix = self.index();
            ix.cut_from(entries[0].log_id.index);
            for ((e, seq), len_bytes) in entries.into_iter().zip(seqs).zip(lens) {
                let log_id = e.log_id;
                ix.push(
                    log_id.index,
                    Slot {
                        seq,
                        log_id,
                        len_bytes,
                        copy: Some(e),
                        durable: false,
                    },
                );
            }
            ix.debug_check();
        }
        let Some(ticket) = ticket else {
            callback.log_io_completed(Ok(()));
            return Ok(());
        };
        // Flushed off the Raft core's task: the callback fires when the store's group commit
        // has made the batch durable under the log's sync policy.
        let this = self.clone();
        let last_seq = ticket.seq();
        if inject::on(Bug::FlushBeforeSync) {
            callback.log_io_completed(Ok(()));
            tokio::spawn(async move {
                if ticket.await.is_ok() {
                    this.durable(first_seq, last_seq);
                }
            });
            return Ok(());
        }
        tokio::spawn(async move {
            match ticket.await {
                Ok(_) => {
                    this.durable(first_seq, last_seq);
                    callback.log_io_completed(Ok(()));
                }
                Err(e) => callback.log_io_completed(Err(std::io::Error::other(e.to_string()))),
            }
        });
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let payload = encode(&log_id.index).map_err(write_logs_err)?;
        let ticket = self
            .inner
            .log
            .append_at(0, TOPIC_TRUNCATE, &[], &payload)
            .map_err(write_logs_err)?;
        self.index().cut_from(log_id.index);
        ticket.await.map_err(write_logs_err)?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.purge_or_defer(log_id).await
    }
}

mod index;
mod purge;

#[cfg(test)]
#[path = "log_store_tests.rs"]
mod tests;
