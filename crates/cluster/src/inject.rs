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
    /// A node that takes over the leadership opens its engine on its replica without the
    /// barrier (`node.rs`, `start_engine`): the takeover does not wait for what the previous
    /// owner of the sessions committed to be applied here, so the new engine may start
    /// without the last sessions, subscriptions and messages the previous one acknowledged.
    LoseOwnershipOnTakeover = 1,
}

#[cfg(feature = "inject")]
static ACTIVE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Whether `bug` is injected.
#[doc(hidden)]
#[inline(always)]
pub fn on(bug: Bug) -> bool {
    #[cfg(feature = "inject")]
    {
        ACTIVE.load(std::sync::atomic::Ordering::Relaxed) & bug as u32 != 0
    }
    #[cfg(not(feature = "inject"))]
    {
        let _ = bug;
        false
    }
}

/// Sets the injected bug (`None`: none), process-wide.
#[doc(hidden)]
#[cfg(feature = "inject")]
pub fn set(bug: Option<Bug>) {
    ACTIVE.store(
        bug.map_or(0, |b| b as u32),
        std::sync::atomic::Ordering::Relaxed,
    );
}
