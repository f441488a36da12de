//! Sessions: the state that outlives a network connection when the client asked for it.
//!
//! - [`state`]: [`Session`] and [`SessionState`] (subscriptions, QoS 2 received set, the
//!   outbound queue and in-flight window, expiry, a pending delayed will).
//! - [`registry`]: sessions by client id; attach (with takeover), detach, end.
//! - [`groups`]: share-group queues (messages waiting for a member), redistribution.
//! - [`expiry`]: the timers that end an abandoned session and fire a delayed will.
//! - `received`: the QoS 2 received set, allocated only while it holds ids.
//! - [`signal`]: the wake-up of a connection's task.
//! - [`restore`]: sessions and retained messages rebuilt from [`crate::persist::Recovered`].
//!
//! # Invariants
//! - Lock order: registry → router → retained → share-group queues → one session's state. No lock is held across
//!   an `await`.
//! - A session is reachable from the router only while it is in the registry; ending a
//!   session removes its subscriptions first, then marks it `ended` so that a publisher that
//!   matched it a moment earlier queues nothing.

pub mod expiry;
pub mod groups;
mod received;
pub mod registry;
pub mod restore;
pub mod signal;
pub mod state;

pub use received::ReceivedIds;
pub use registry::Registry;
pub use state::{ConnCtl, ConnInfo, Session, SessionState, SubRecord};
