//! Known bugs, injectable for the cluster simulator (`crates/raft/tests/sim.rs`, issue 23):
//! each one breaks a guarantee the simulator must then find. Compiled in only with the
//! test-only cargo feature `inject`; without it [`on`] is a constant `false` and every check
//! folds away, so production code keeps one path.
//!
//! The switch is process-wide: the simulator sets it once for a run of seeds (all with the
//! same bug); nothing in tern-raft turns it on.

/// A bug the simulator can inject.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Bug {
    /// `propose` completes once the leader has appended the entry to its own log, without
    /// waiting for the commit (`consensus.rs`).
    AckBeforeCommit = 1,
    /// The vote kv is never synced: a vote can be forgotten in a power loss
    /// (`log_store.rs`).
    VoteNotSynced = 2,
    /// Entries are handed to the `Applier` as soon as they are appended to this node's log,
    /// before they are committed (`state_machine.rs`, fed by `log_store.rs`).
    DeliverUncommitted = 4,
    /// The log's flush callback fires as soon as the entries are handed to the store, before
    /// its group commit has made them durable: a node's copy counts toward the majority
    /// while it is still in the page cache (`log_store.rs`).
    FlushBeforeSync = 8,
    /// A purge of the log is made durable at once, even past the applied point the state
    /// machine has recorded: openraft 0.9 purges up to an installed snapshot's point while
    /// the install still runs, and a power loss in between leaves a log the node cannot start
    /// from (`log_store/purge.rs`; the bug fixed in 010dec4).
    PurgeBeforeRecord = 16,
}

tern_store::inject_switch!(pub Bug);
