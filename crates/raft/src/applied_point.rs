//! The one rule between the log and the state machine that openraft 0.9 leaves to storage:
//! **the log is never purged past the applied point the state machine has recorded.**
//!
//! After a restart openraft starts the state machine at its recorded applied point and
//! re-applies the committed entries after it, which it reads from the log. An entry purged
//! before the point covering it was recorded is gone for good: the node's Raft core stops on
//! "try to get log at index N" at every start. A built snapshot keeps the rule by itself (its
//! point is recorded before openraft sees it). An installed one does not: openraft 0.9 issues
//! the purge up to the snapshot's point together with the install, and runs it at once while
//! the state machine is still writing the snapshot's state (openraft 0.10 makes the purge wait
//! for the install: its `Condition::Snapshot`). A crash in between left the log purged past a
//! state rolled back to the old point.
//!
//! So the state machine publishes every point it records ([`AppliedRecords`]), and the log
//! store makes a purge durable only once the point covers it, waiting at a [`PurgeGate`] (off
//! openraft's core: `log_store/purge.rs`). A failed record or install ends the wait with an
//! error: the log refuses appends and the core stops, as it would on the failure itself.

use tokio::sync::watch;

use crate::types::LogIndex;

/// What the state machine has durably recorded, as the log store sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Recorded {
    /// The applied point last recorded (`None`: nothing applied yet).
    At(Option<LogIndex>),
    /// Recording or installing failed: no later point will come (terminal).
    Failed(String),
}

/// The state machine's side: publishes each applied point once it is durable.
pub(crate) struct AppliedRecords {
    tx: watch::Sender<Recorded>,
}

/// The log store's side: where a purge waits for the applied point to cover it.
#[derive(Clone, Debug)]
pub(crate) struct PurgeGate {
    rx: watch::Receiver<Recorded>,
}

/// Why a purge could not wait for the state machine.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PurgeRefused {
    #[error("the state machine failed before recording the applied point {wanted}: {why}")]
    Failed { wanted: LogIndex, why: String },
    #[error("the state machine is gone before recording the applied point {wanted}")]
    Gone { wanted: LogIndex },
}

impl AppliedRecords {
    /// Starts at the point found recorded when the state machine opened.
    pub(crate) fn new(recorded: Option<LogIndex>) -> AppliedRecords {
        AppliedRecords {
            tx: watch::Sender::new(Recorded::At(recorded)),
        }
    }

    /// `at` is durably recorded (called with the records serialized, so the last call is the
    /// point on disk). It is published as it is, even below the previous one (an installed
    /// snapshot's record replaces whatever was recorded; openraft installs only snapshots
    /// past what was applied, but the gate must not claim more than the disk holds).
    pub(crate) fn recorded(&self, at: Option<LogIndex>) {
        self.tx.send_if_modified(|r| match r {
            Recorded::At(prev) if *prev != at => {
                *r = Recorded::At(at);
                true
            }
            _ => false,
        });
    }

    /// No point will be recorded any more (a record or an install failed).
    pub(crate) fn failed(&self, why: impl ToString) {
        let why = why.to_string();
        self.tx.send_if_modified(|r| {
            let first = !matches!(r, Recorded::Failed(_));
            if first {
                *r = Recorded::Failed(why);
            }
            first
        });
    }

    pub(crate) fn gate(&self) -> PurgeGate {
        PurgeGate {
            rx: self.tx.subscribe(),
        }
    }
}

impl PurgeGate {
    /// Returns once the recorded applied point is at or past `index`.
    pub(crate) async fn wait_through(&self, index: LogIndex) -> Result<(), PurgeRefused> {
        let mut rx = self.rx.clone();
        let seen = rx
            .wait_for(|r| match r {
                Recorded::At(at) => *at >= Some(index),
                Recorded::Failed(_) => true,
            })
            .await
            .map_err(|_| PurgeRefused::Gone { wanted: index })?;
        match &*seen {
            Recorded::At(_) => Ok(()),
            Recorded::Failed(why) => Err(PurgeRefused::Failed {
                wanted: index,
                why: why.clone(),
            }),
        }
    }

    /// True if a purge through `index` would pass at once.
    pub(crate) fn covers(&self, index: LogIndex) -> bool {
        matches!(&*self.rx.borrow(), Recorded::At(at) if *at >= Some(index))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_purge_waits_until_the_point_covering_it_is_recorded() {
        let records = AppliedRecords::new(Some(5));
        let gate = records.gate();
        assert!(gate.covers(5));
        assert!(!gate.covers(6));
        gate.wait_through(5).await.expect("covered already");
        let waiting = tokio::spawn({
            let gate = gate.clone();
            async move { gate.wait_through(20).await }
        });
        records.recorded(Some(19));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "19 does not cover 20");
        records.recorded(Some(20));
        waiting.await.expect("task").expect("20 covers 20");
        // A record that replaced a later one (an install) is what the disk holds: shown.
        records.recorded(Some(3));
        assert!(!gate.covers(20));
        assert!(gate.covers(3));
    }

    #[tokio::test]
    async fn a_failure_or_the_state_machine_gone_ends_the_wait_with_an_error() {
        let records = AppliedRecords::new(None);
        let gate = records.gate();
        let waiting = tokio::spawn({
            let gate = gate.clone();
            async move { gate.wait_through(1).await }
        });
        records.failed("disk gone");
        let refused = waiting.await.expect("task").expect_err("failed");
        assert!(refused.to_string().contains("disk gone"), "{refused}");
        records.recorded(Some(9));
        assert!(!gate.covers(1), "a failure is terminal");

        let records = AppliedRecords::new(None);
        let gate = records.gate();
        drop(records);
        let refused = gate.wait_through(1).await.expect_err("gone");
        assert!(
            matches!(refused, PurgeRefused::Gone { wanted: 1 }),
            "{refused}"
        );
    }
}
