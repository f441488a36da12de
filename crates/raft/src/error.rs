//! Tern's consensus errors: what the broker can act on, without openraft's types.

use std::net::SocketAddr;

use crate::types::NodeId;

/// Why a consensus call failed.
#[derive(Debug, thiserror::Error)]
pub enum ConsensusError {
    /// This node is not the leader: forward to `leader` if one is known. For a proposal that
    /// was already accepted by this node when it lost leadership, the batch may or may not be
    /// committed by the next leader (openraft 0.9 does not say which): the outcome is unknown.
    #[error("not the leader (leader: {leader:?})")]
    NotLeader {
        leader: Option<(NodeId, Option<SocketAddr>)>,
    },
    /// A leader transfer whose chosen node did not take over in time (this node leads on).
    #[error("leader transfer timed out: {0}")]
    TransferTimedOut(String),
    /// A disk error in the Raft log, vote or state machine.
    #[error("storage: {0}")]
    Storage(String),
    /// An I/O error outside storage (binding the listener, ...).
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// The node is shut down (or its Raft core stopped on a fatal error).
    #[error("consensus stopped: {0}")]
    Shutdown(String),
    /// A membership change openraft refused (e.g. promoting a node that is not a learner).
    #[error("membership change refused: {0}")]
    Membership(String),
    /// A request the engine cannot do in this version (leader transfer on openraft 0.9).
    #[error("unsupported by the consensus engine: {0}")]
    Unsupported(&'static str),
    /// A bad configuration or argument.
    #[error("invalid: {0}")]
    Invalid(String),
    /// This node starts on an empty data directory, but the cluster knew it with another
    /// disk: it must not vote or count towards a majority (`crate::incarnation`).
    #[error("this node lost its disk: {0}")]
    DiskLost(String),
}

impl From<tern_store::StoreError> for ConsensusError {
    fn from(e: tern_store::StoreError) -> Self {
        ConsensusError::Storage(e.to_string())
    }
}
