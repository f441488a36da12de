//! The cluster layer's errors.

use tern_raft::ConsensusError;

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// Shown as the consensus error itself (a prefix would print it twice in a chain).
    #[error(transparent)]
    Consensus(#[from] ConsensusError),
    #[error("{context}: {source}")]
    Io {
        context: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The broker engine could not be opened or stopped with an error.
    #[error("engine: {0}")]
    Engine(String),
    /// The Raft core stopped on its own: this node takes no part in consensus until it is
    /// started again (a supervisor restarts the process).
    #[error("the consensus engine stopped: {0}")]
    ConsensusStopped(String),
}

impl ClusterError {
    pub(crate) fn io(context: &'static str, source: std::io::Error) -> ClusterError {
        ClusterError::Io { context, source }
    }
}
