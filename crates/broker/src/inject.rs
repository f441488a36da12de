//! Known bugs, injectable for the broker simulator (`crates/broker/tests/sim.rs`, issue 12):
//! each one breaks a guarantee the simulator must then find. Compiled in only with the
//! test-only cargo feature `inject`; without it [`on`] is a constant `false` and every check
//! folds away, so production code keeps one path.
//!
//! The switch is process-wide: the simulator sets it once for a run of seeds (all with the
//! same bug) and runs its tests one at a time; nothing in the broker turns it on.

/// A bug the simulator can inject.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
#[cfg_attr(not(feature = "__internal"), allow(dead_code))] // only tests reach it (`__internal`)
pub enum Bug {
    /// A restored session forgets its QoS 2 received set (`session/restore.rs`).
    IgnoreReceivedSetAfterRestart = 1,
    /// PUBRELs jump ahead of the PUBRELs queued before them (`outbound/gate.rs`).
    RandomPubrelOrder = 2,
    /// Retention limits may remove open QoS 2 state: no retention floor
    /// (`durable/reclaim.rs`).
    RetentionRemovesOpenQos2 = 4,
    /// A share-group member that leaves drops the group's messages it held, instead of
    /// handing them to another member or back to the group (`session/groups.rs`).
    DropShareQueueOnLeave = 8,
    /// The disk budget is not checked: new messages are written past `[store]
    /// max_disk_bytes` (`durable/message_store.rs`).
    IgnoreDiskBudget = 16,
    /// The broker-wide memory cap is not checked: QoS>0 PUBLISHes are accepted and QoS 0
    /// queued past `max_queued_bytes_total` (`connection/publish.rs`, `outbound/mod.rs`).
    IgnoreQueuedBytesTotal = 32,
    /// Recovery queues a message again (for a fresh packet id) though it is in the restored
    /// in-flight set, to be resent under its own id (`durable/recover/sessions.rs`).
    ReplayIgnoresInflight = 64,
}

tern_store::inject_switch!(pub(crate) Bug);

/// A cheap pseudo-random number for bugs that act at random (not seeded: the simulator's
/// interleaving is not either).
#[doc(hidden)]
#[cfg(feature = "inject")]
pub(crate) fn random() -> u64 {
    static STATE: std::sync::atomic::AtomicU64 =
        std::sync::atomic::AtomicU64::new(0x9e37_79b9_7f4a_7c15);
    let mut x = STATE.fetch_add(0x9e37_79b9_7f4a_7c15, std::sync::atomic::Ordering::Relaxed);
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}
