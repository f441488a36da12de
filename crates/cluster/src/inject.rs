//! Known bugs, injectable for the cluster simulator with the broker on top
//! (`crates/cluster/tests/broker_sim`, issue 23): each one breaks a guarantee the simulator
//! must then find. Compiled in only with the test-only cargo feature `inject`; without it
//! [`on`] is a constant `false` and every check folds away, so production code keeps one
//! path. The switch is process-wide: the simulator sets it once for a run of seeds.

/// A bug the simulator can inject.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Bug {
    /// A node that loses the leadership does not stop its engine (`node.rs`, `reconcile`):
    /// the deposed engine keeps the client connections it holds (and takes new ones) while
    /// the new leader's engine takes their sessions over, so a session has two owners. Its
    /// disk still fails at its first write (the proposer checks the term), so nothing it
    /// writes reaches the log.
    LoseOwnershipOnTakeover = 1,
    /// The broker's store completes a pipelined commit's tickets when its sync starts on the
    /// replicated disk (`tern_store::vfs::Bugs::ack_at_sync_start`), not once the majority
    /// committed it: a PUBACK or PUBREC for what a failover can still lose.
    AckAtSyncStart = 2,
}

tern_store::inject_switch!(pub Bug);
