//! tern-raft: Tern's consensus. openraft (pinned, see README.md) does the Raft protocol; Tern
//! keeps the Raft log, vote and applied point in its own store (tern-store), and the broker
//! sees only the [`Consensus`] trait and implements the [`Applier`] trait.
//!
//! Module map, one layer per line, lowest first: a module imports only its own line and the
//! lines before it (`crates/server/tests/layering.rs` holds the same order and enforces it).
//! - [`error`]: typed errors; `applied_point`: the log is never purged past the applied
//!   point the state machine recorded (the wait between the two); [`inject`]: test-only bugs for the simulator; [`types`]: node ids, the openraft type configuration, the entry
//!   payload (a batch of opaque operations), the binary codec; [`tls`]: mutual TLS between
//!   nodes and the connection type (TCP or TLS) both ends use; `sim_seeds` (feature `sim`,
//!   test-only): the seed runner both cluster simulators share.
//! - [`log_store`]: the Raft log on a tern-store stream, the vote in an always-synced kv;
//!   [`state_machine`]: committed batches to the [`Applier`], snapshots from its state;
//!   [`network`]: Raft RPCs over TCP or TLS (length-prefixed frames); `sim_net` (feature
//!   `sim`, test-only): a simulated network for the simulators (`tests/sim`, tern-cluster's).
//! - [`incarnation`]: a node back on an empty disk under its old id refuses to start.
//! - [`node`]: one node: store, core, listener, cluster formation from the peers list.
//! - [`consensus`]: the [`Consensus`] trait, the cluster status, their implementation.
//!
//! # Durability contract
//! - A proposal completes only after its entry is on disk on a majority of voters (under the
//!   log's sync policy) and applied on the proposing node.
//! - The vote is always fsynced before it is acted on, whatever the log's policy.
//! - The log is synced under `[state] sync` (`NodeConfig::sync`): with `Always` each append's
//!   group commit is fsynced before openraft counts this node's copy.
//! - The log is never purged on disk past the applied point the state machine has recorded,
//!   so a restart finds every entry it must apply again (`applied_point`).

mod applied_point;
pub mod consensus;
pub mod error;
pub mod incarnation;
pub mod inject;
pub mod log_store;
pub mod network;
pub mod node;
#[cfg(feature = "sim")]
pub mod sim_net;
#[cfg(feature = "sim")]
pub mod sim_seeds;
pub mod state_machine;
pub mod tls;
pub mod types;

pub use consensus::{
    ClusterStatus, Committed, Consensus, PeerReplication, Proposal, Role, TRANSFER_CATCH_UP_MS,
};
pub use error::ConsensusError;
pub use node::{Member, NodeConfig, RaftNode, StatusChanges};
pub use state_machine::{Applier, ApplierWork, ApplyError, RECORD_APPLIED_INTERVAL_MS};
pub use tls::{ClusterTls, Link};
pub use types::{Batch, LogIndex, NodeId};
