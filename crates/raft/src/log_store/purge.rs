//! Purging the log, never past the state machine's recorded applied point.
//!
//! openraft 0.9 asks for a purge up to an installed snapshot's point while the install still
//! runs (module [`crate::applied_point`]). Such a purge is taken at once in memory (openraft
//! reads nothing below it any more), and made durable (the purge point recorded, blocks
//! dropped) by a task once the state machine has recorded the snapshot's point. Until then the
//! disk keeps the entries a restart may need to re-apply. Appends wait for it: an entry after
//! the snapshot written to disk while the purge point is not would leave a hole in the log a
//! restart cannot rebuild. openraft's core is not held meanwhile (0.10 holds its queued log
//! commands behind such a purge, and goes on answering peers).

use crate::inject::{self, Bug};
use crate::types::{LogId, StorageError};

use super::{LogStore, write_logs_err};

/// A purge waiting for the state machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Deferred {
    None,
    /// Taken in memory, durable once the applied point covers it.
    Waiting(LogId),
    /// The state machine failed before recording the point: the log cannot go on.
    Failed(String),
}

impl LogStore {
    /// `RaftLogStorage::purge`: durable now when the recorded applied point covers `log_id`,
    /// else taken in memory now and made durable later.
    pub(super) async fn purge_or_defer(&self, log_id: LogId) -> Result<(), StorageError> {
        let gate = self.inner.purge_gate.get().cloned();
        let gate = gate.filter(|_| !inject::on(Bug::PurgeBeforeRecord));
        let Some(gate) = gate.filter(|g| !g.covers(log_id.index)) else {
            return self.purge_durably(log_id).await;
        };
        tracing::info!(
            upto = log_id.index,
            "raft log: purge deferred until the state machine records the point covering it (a snapshot install)"
        );
        {
            let mut ix = self.index();
            ix.purge_through(log_id);
            ix.debug_check();
        }
        self.inner.deferred.send_replace(Deferred::Waiting(log_id));
        let log = self.clone();
        tokio::spawn(async move {
            let done = match gate.wait_through(log_id.index).await {
                Ok(()) => log.purge_durably(log_id).await.map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            log.inner.deferred.send_modify(|d| match done {
                Ok(()) if *d == Deferred::Waiting(log_id) => *d = Deferred::None,
                Ok(()) => {}
                Err(e) => *d = Deferred::Failed(e),
            });
        });
        Ok(())
    }

    /// Records the purge point (synced), then drops whole blocks below the first entry kept.
    /// Purges are serialized and a point below the last durable one is skipped: a deferred
    /// purge may complete after a later one.
    async fn purge_durably(&self, log_id: LogId) -> Result<(), StorageError> {
        let mut durable = self.inner.durable_purge.lock().await;
        if *durable >= Some(log_id) {
            return Ok(());
        }
        let bytes = crate::types::encode(&log_id).map_err(write_logs_err)?;
        self.inner
            .meta
            .put(super::KEY_PURGED, &bytes)
            .map_err(write_logs_err)?
            .await
            .map_err(write_logs_err)?;
        *durable = Some(log_id);
        let floor = {
            let mut ix = self.index();
            ix.purge_through(log_id);
            ix.debug_check();
            ix.slots.values().next().map(|s| s.seq)
        };
        // Whole blocks below the first entry kept go; what a crash leaves is skipped on open.
        let floor = floor.unwrap_or_else(|| self.inner.log.next_seq());
        self.inner.log.queue_remove_blocks_below(floor);
        Ok(())
    }

    /// Returns once no purge is waiting for the state machine (at once, nearly always: one
    /// read of the watch per append, no receiver made).
    pub(super) async fn wait_deferred_purge(&self) -> Result<(), StorageError> {
        if *self.inner.deferred.borrow() == Deferred::None {
            return Ok(());
        }
        let mut rx = self.inner.deferred.subscribe();
        let seen = rx
            .wait_for(|d| !matches!(d, Deferred::Waiting(_)))
            .await
            .map_err(write_logs_err)?;
        match &*seen {
            Deferred::Failed(why) => Err(write_logs_err(format!(
                "a purge deferred for a snapshot install failed: {why}"
            ))),
            Deferred::None | Deferred::Waiting(_) => Ok(()),
        }
    }
}
