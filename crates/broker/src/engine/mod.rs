//! The engine: [`Shared`], the broker-wide state, and every operation that takes several of
//! the state layer's locks or outlives one call: routing and delivery, retained updates,
//! attaching and ending sessions, share-group queues, wills and expiry timers, restoring what
//! the store recovered, the checkpointer and `$SYS`. It imports the state and model layers
//! and the leaves, never a connection or a transport.
//!
//! - [`shared`]: the broker-wide state, [`Shared`].
//! - [`route`]: a message to every subscriber's queue.
//! - [`retain`]: a RETAIN=1 message into the retained tree and the store.
//! - [`registry`]: attach (with takeover), detach, end.
//! - [`groups`]: share-group queues: enqueue, flush to members, redistribute.
//! - [`expiry`], [`will`]: session expiry and will timers, a will's publication.
//! - [`reload`]: a reloaded password file and ACL applied to queued messages and clients.
//! - [`restore`]: sessions, groups and retained messages rebuilt from [`crate::model::Recovered`].
//! - [`checkpoint`]: the periodic write of persistent sessions' cursors.
//! - [`live_tasks`]: counting live tasks (connections, lingering sockets).
//! - [`sys`]: the `$SYS/broker/...` topics.

pub(crate) mod checkpoint;
#[cfg(test)]
mod checkpoint_tests;
pub(crate) mod expiry;
pub(crate) mod groups;
pub(crate) mod live_tasks;
pub(crate) mod registry;
pub(crate) mod reload;
pub(crate) mod restore;
pub(crate) mod retain;
pub mod route;
pub(crate) mod shared;
pub(crate) mod sys;
pub(crate) mod will;

pub use shared::Shared;
