//! tern-cluster: Tern on several nodes. The broker's store is replicated through consensus
//! (tern-raft) at the level of its files: the leader's broker writes a working copy through a
//! [`ReplicatedDisk`], whose every fsync waits for a majority to commit the changes; every
//! node applies committed changes to its [`Replica`]. Only the leader runs the MQTT engine;
//! other nodes forward client connections to it ([`forward`]). A new leader starts its
//! engine from its replica, with the single node's recovery.
//!
//! Module map, one layer per line, lowest first (`crates/server/tests/layering.rs` holds
//! the same order and enforces it):
//! - [`error`], [`ops`], [`inject`], [`limits`]: errors; the file operations an entry
//!   carries; test-only bugs for the cluster simulator; the limits tests run small and the
//!   counters of what they refused.
//! - [`disk`], [`replica`], [`forward`]: the leader's replicated disk; every node's replica
//!   (the state machine); the forwarding of client connections.
//! - [`node`]: one node's lifecycle: Raft, listeners, the engine while it leads.
//!
//! # Durability contract
//! An acknowledgement the broker sends waits for its store's fsync (the persistence seam's
//! tickets); on a cluster that fsync returns only once every change made before it is
//! committed: on disk on a majority of voters, under the `[state] sync` policy of the Raft
//! log. What the broker may lose in a crash on one node (unsynced writes) it may lose here in
//! a failover, and recovers from the same way.

pub mod disk;
pub mod error;
pub mod forward;
pub mod inject;
pub mod limits;
pub mod node;
pub(crate) mod ops;
pub mod replica;

pub use disk::ReplicatedDisk;
pub use error::ClusterError;
pub use limits::RefusedConnections;
pub use node::{ClusterConfig, ClusterNode, EngineFactory, LEADER_WAIT_MS, NodeParts};
pub use replica::Replica;
