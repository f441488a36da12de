//! The state machine (openraft's `RaftStateMachine`): hands committed batches, in log order,
//! to the application's [`Applier`], and builds and installs snapshots through it. A
//! snapshot is the bytes the application produces from its own state, never a copy of the log.
//!
//! What is applied is recorded in the kv stream `raft-applied` (last applied log id and
//! membership), under the log's sync policy, after [`Applier::persist`]: at most every
//! [`RECORD_APPLIED_INTERVAL_MS`] while entries are applied, and before a snapshot built is
//! handed to openraft, at the snapshot's own point (openraft may purge the log up to it next).
//! The recorded point never goes back, except to an installed snapshot's. After a crash the
//! entries after the recorded point are applied again: the [`Applier`] sees an index it may
//! already have applied, and must skip it (its own state should carry its applied index).

use std::io::Cursor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use bytes::Bytes;
use openraft::storage::RaftStateMachine;
use openraft::{
    AnyError, BasicNode, EntryPayload, OptionalSend, RaftSnapshotBuilder, Snapshot, SnapshotMeta,
    StorageIOError, StoredMembership,
};
use serde::{Deserialize, Serialize};
use tern_store::{KvStream, Store, StoreError, StreamConfig, SyncPolicy};

use crate::applied_point::{AppliedRecords, PurgeGate};
use crate::types::{Entry, LogId, LogIndex, NodeId, StorageError, TypeConfig, decode, encode};

/// The kv stream recording the applied point.
pub const APPLIED_KV: &str = "raft-applied";
const KEY_APPLIED: &[u8] = b"applied";

/// An application's failure to apply or snapshot: consensus stops on it (a node that cannot
/// apply a committed entry must not go on as if it had).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ApplyError(pub String);

/// What the application (the broker) implements: its state, driven by committed batches.
///
/// Contract: `apply` is called with strictly increasing indexes, each committed batch once per
/// run; after a restart, batches after the last recorded applied point are applied again, so
/// an implementation skips an index at or below the one its own durable state has reached.
/// Calls are serialized. `apply` runs on the Raft state machine's task, so it should be
/// quick; `snapshot`, `install_snapshot` and `persist` (file work, fsyncs) run where
/// [`ApplierWork`] says: tokio's blocking pool, but in a simulator.
pub trait Applier: Send + 'static {
    /// Applies a committed batch of operations, at Raft log `index`.
    fn apply(&mut self, index: LogIndex, ops: &[Bytes]) -> Result<(), ApplyError>;
    /// The application's state as of the last applied index, as bytes (a snapshot).
    fn snapshot(&mut self) -> Result<Vec<u8>, ApplyError>;
    /// Replaces the application's state with a snapshot taken at `index` by another node.
    /// Durable when it returns.
    fn install_snapshot(&mut self, index: LogIndex, data: &[u8]) -> Result<(), ApplyError>;
    /// Makes every batch applied so far durable. `apply` need not be: the state machine
    /// calls this before it records the applied point, which it does at most every
    /// [`RECORD_APPLIED_INTERVAL_MS`] and before each snapshot (so that one fsync serves
    /// many batches, and the ack of a proposal waits for none).
    fn persist(&mut self) -> Result<(), ApplyError>;
}

/// Longest time between two records of the applied point while entries are applied. After
/// a crash, what was applied since the last record is applied again (the [`Applier`]
/// contract).
pub const RECORD_APPLIED_INTERVAL_MS: u64 = 200;

/// Where the state machine runs the [`Applier`]'s file work (`persist`, `snapshot`,
/// `install_snapshot`): time, injected, as TigerBeetle injects it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ApplierWork {
    /// On tokio's blocking pool: the work blocks on files and fsyncs, and would otherwise
    /// hold one of the runtime's workers (two on a 2-core machine) for its length.
    #[default]
    BlockingPool,
    /// On the state machine's own task, after `latency_ms` of the runtime's clock. For a
    /// simulator on tokio's paused clock: that clock stands still while a blocking-pool task
    /// runs (`inhibit_auto_advance`), so an install there takes no time at all and no fault
    /// can strike in the middle of one. Here it takes `latency_ms`, during which the rest of
    /// the node (its Raft core, its log's purges and syncs) goes on.
    #[cfg(feature = "sim")]
    Simulated { latency_ms: u64 },
}

/// The applied point, as recorded in `raft-applied`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Applied {
    last_applied: Option<LogId>,
    membership: StoredMembership<NodeId, BasicNode>,
}

type Meta = SnapshotMeta<NodeId, BasicNode>;

fn read_applied(kv: &KvStream) -> Result<Applied, StoreError> {
    Ok(match kv.get(KEY_APPLIED)? {
        Some(b) => decode(&b).map_err(|e| {
            StoreError::InvalidConfig(format!("raft applied: undecodable record: {e}"))
        })?,
        None => Applied::default(),
    })
}

/// The applied point recorded in `store`, where a restart starts applying from, read without
/// a state machine: for checks of the rule that the log is never purged past it (the
/// cluster simulator reads a node's disk with it before each restart).
pub fn recorded_applied(store: &Store) -> Result<Option<LogId>, StoreError> {
    let kv = store.kv(APPLIED_KV, StreamConfig::default())?;
    Ok(read_applied(&kv)?.last_applied)
}

/// How a record of the applied point treats the one before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Record {
    /// The applier's own progress: never recorded below the last record.
    Forward,
    /// An installed snapshot: its point replaces whatever was recorded.
    Replace,
}

struct Inner {
    /// Held across a whole `apply` call, so a snapshot sees state and applied point together.
    applier: Mutex<Box<dyn Applier>>,
    applied: Mutex<Applied>,
    kv: KvStream,
    /// The last snapshot built or installed (in memory: after a restart openraft builds a new
    /// one from the application's state when it needs one).
    current: Mutex<Option<(Meta, Vec<u8>)>>,
    snapshots_built: AtomicU64,
    /// The applied point last recorded; held while a record is written ([`StateMachine::record`]).
    recorded: tokio::sync::Mutex<Option<LogId>>,
    /// When the applied point was last recorded.
    recorded_at: Mutex<std::time::Instant>,
    /// Each recorded point, published for the log's purges (crate::applied_point).
    records: AppliedRecords,
    work: ApplierWork,
    /// Declared last, so dropped last: once it is gone the streams (and the store's lock)
    /// are released.
    canary: Arc<()>,
}

/// The state machine of one node. Cheap to clone (the clone is also its snapshot builder).
#[derive(Clone)]
pub struct StateMachine {
    inner: Arc<Inner>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn any(e: impl ToString) -> AnyError {
    AnyError::error(e.to_string())
}

impl StateMachine {
    /// Opens the applied record in `store` (under `sync`, the log's policy); the applier's
    /// file work runs where `work` says.
    pub fn open(
        store: &Store,
        sync: SyncPolicy,
        applier: Box<dyn Applier>,
        work: ApplierWork,
    ) -> Result<StateMachine, StoreError> {
        let kv = store.kv(
            APPLIED_KV,
            StreamConfig {
                sync,
                ..StreamConfig::default()
            },
        )?;
        let applied = read_applied(&kv)?;
        let recorded = tokio::sync::Mutex::new(applied.last_applied);
        let records = AppliedRecords::new(applied.last_applied.map(|l| l.index));
        Ok(StateMachine {
            inner: Arc::new(Inner {
                applier: Mutex::new(applier),
                applied: Mutex::new(applied),
                recorded,
                kv,
                current: Mutex::new(None),
                snapshots_built: AtomicU64::new(0),
                recorded_at: Mutex::new(std::time::Instant::now()),
                records,
                work,
                canary: Arc::new(()),
            }),
        })
    }

    /// The injected bug `DeliverUncommitted`: hands a normal entry to the applier as it is
    /// appended to the log, committed or not (the real apply comes again later).
    pub(crate) fn early_delivery(&self) -> impl Fn(&Entry) + Send + Sync + 'static {
        let inner = Arc::downgrade(&self.inner);
        move |e: &Entry| {
            if let (Some(inner), EntryPayload::Normal(batch)) = (inner.upgrade(), &e.payload) {
                let _ = lock(&inner.applier).apply(e.log_id.index, &batch.0);
            }
        }
    }

    /// Where the log's purges wait for the applied point recorded here to cover them.
    pub(crate) fn purge_gate(&self) -> PurgeGate {
        self.inner.records.gate()
    }

    /// Gone once every clone is dropped and with them the kv stream and the store's lock.
    pub(crate) fn liveness(&self) -> Weak<()> {
        Arc::downgrade(&self.inner.canary)
    }

    /// Makes the applier's state durable, then records the applied point (under the sync
    /// policy): the point never runs ahead of the state it names.
    async fn persist_and_record(&self) -> Result<(), StorageError> {
        let applied = self
            .run_work(|applier, inner| {
                applier.persist()?;
                Ok(lock(&inner.applied).clone())
            })
            .await
            .map_err(StorageIOError::write_state_machine)?;
        *lock(&self.inner.recorded_at) = std::time::Instant::now();
        self.record(applied, Record::Forward).await
    }

    /// Runs `f` under the applier's lock, where [`ApplierWork`] says.
    async fn run_work<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut dyn Applier, &Inner) -> Result<T, ApplyError> + Send + 'static,
    ) -> Result<T, AnyError> {
        let inner = self.inner.clone();
        let run = move || {
            let mut applier = lock(&inner.applier);
            f(applier.as_mut(), &inner)
        };
        match self.inner.work {
            ApplierWork::BlockingPool => match tokio::task::spawn_blocking(run).await {
                Ok(done) => done.map_err(any),
                Err(e) => Err(any(format!("the applier's task failed: {e}"))),
            },
            #[cfg(feature = "sim")]
            ApplierWork::Simulated { latency_ms } => {
                // The lock is taken after the wait: nothing is held across it.
                tokio::time::sleep(std::time::Duration::from_millis(latency_ms)).await;
                run().map_err(any)
            }
        }
    }

    /// Records `applied` durably (under the sync policy). Records are serialized: an
    /// `apply`'s and a snapshot's can be in flight together, and under [`Record::Forward`]
    /// one older than the last recorded is dropped, so the recorded point never goes back
    /// below a snapshot the log may have been purged to.
    async fn record(&self, applied: Applied, rule: Record) -> Result<(), StorageError> {
        fn w(e: impl ToString) -> StorageError {
            StorageIOError::write_state_machine(any(e)).into()
        }
        let mut last = self.inner.recorded.lock().await;
        let index = |l: Option<LogId>| l.map(|l| l.index);
        if rule == Record::Forward && index(applied.last_applied) < index(*last) {
            return Ok(());
        }
        let written = async {
            let bytes = encode(&applied).map_err(w)?;
            let ticket = self.inner.kv.put(KEY_APPLIED, &bytes).map_err(w)?;
            ticket.await.map_err(w)
        };
        if let Err(e) = written.await {
            self.inner.records.failed(&e);
            return Err(e);
        }
        *last = applied.last_applied;
        self.inner.records.recorded(index(applied.last_applied));
        Ok(())
    }

    /// Applies entries under the applier's lock; returns the new applied point.
    #[expect(
        clippy::result_large_err,
        reason = "openraft's StorageError, which the trait method calling this returns anyway"
    )]
    fn apply_entries(&self, entries: Vec<Entry>) -> Result<(Applied, usize), StorageError> {
        let mut applier = lock(&self.inner.applier);
        let mut applied = lock(&self.inner.applied).clone();
        let n = entries.len();
        for e in entries {
            match e.payload {
                EntryPayload::Blank => {}
                EntryPayload::Normal(batch) => applier
                    .apply(e.log_id.index, &batch.0)
                    .map_err(|x| StorageIOError::apply(e.log_id, any(x)))?,
                EntryPayload::Membership(m) => {
                    applied.membership = StoredMembership::new(Some(e.log_id), m);
                }
            }
            applied.last_applied = Some(e.log_id);
        }
        // Published while the applier lock is held: a snapshot pairs state and point.
        *lock(&self.inner.applied) = applied.clone();
        Ok((applied, n))
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        // The log up to the snapshot's point may be purged once this returns, and after a
        // power loss the state machine starts again from the recorded point: that must not
        // be older than the snapshot's. So the state is made durable, its point read and the
        // snapshot taken under one hold of the applier (no apply in between), and that very
        // point is recorded before the snapshot is handed over. (Recording first and taking
        // the snapshot after let applies in between: the snapshot named a later point than
        // the one recorded.)
        let (data, applied) = self
            .run_work(|applier, inner| {
                applier.persist()?;
                let applied = lock(&inner.applied).clone();
                Ok((applier.snapshot()?, applied))
            })
            .await
            .map_err(StorageIOError::read_state_machine)?;
        *lock(&self.inner.recorded_at) = std::time::Instant::now();
        self.record(applied.clone(), Record::Forward).await?;
        let n = self.inner.snapshots_built.fetch_add(1, Ordering::Relaxed);
        let meta = Meta {
            last_log_id: applied.last_applied,
            last_membership: applied.membership,
            snapshot_id: format!("{}-{n}", applied.last_applied.map_or(0, |l| l.index)),
        };
        *lock(&self.inner.current) = Some((meta.clone(), data.clone()));
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = StateMachine;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId>, StoredMembership<NodeId, BasicNode>), StorageError> {
        let a = lock(&self.inner.applied);
        Ok((a.last_applied, a.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<()>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let (_, n) = self.apply_entries(entries.into_iter().collect())?;
        let due = lock(&self.inner.recorded_at).elapsed()
            >= std::time::Duration::from_millis(RECORD_APPLIED_INTERVAL_MS);
        if due {
            self.persist_and_record().await?;
        }
        Ok(vec![(); n])
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &Meta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let data = snapshot.into_inner();
        let index = meta.last_log_id.map_or(0, |l| l.index);
        let applied = Applied {
            last_applied: meta.last_log_id,
            membership: meta.last_membership.clone(),
        };
        let installed = applied.clone();
        let data = self
            .run_work(move |applier, inner| {
                applier.install_snapshot(index, &data)?;
                *lock(&inner.applied) = installed;
                Ok(data)
            })
            .await
            .map_err(|e| {
                // A purge up to this snapshot may be waiting for its point (applied_point).
                self.inner.records.failed(&e);
                StorageIOError::write_snapshot(Some(meta.signature()), e)
            })?;
        // The state is the snapshot's now, whatever was recorded before.
        self.record(applied, Record::Replace).await?;
        *lock(&self.inner.current) = Some((meta.clone(), data));
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        Ok(lock(&self.inner.current)
            .clone()
            .map(|(meta, data)| Snapshot {
                meta,
                snapshot: Box::new(Cursor::new(data)),
            }))
    }
}

#[cfg(test)]
#[path = "state_machine_tests.rs"]
mod tests;
