//! The vocabulary every other layer shares: node ids, the openraft type configuration, the
//! entry payload (a batch of opaque application operations) and the binary codec.

use std::fmt;
use std::io::Cursor;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// A node's id in the cluster, as written in `[cluster] peers` (`"1=127.0.0.1:7001"`).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct NodeId(pub u64);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A Raft log index (1-based; openraft's membership entry written by `initialize` is index 0).
pub type LogIndex = u64;

/// Most operations one proposal may carry: a batch is one Raft entry, and one entry is one
/// record of the log stream (bounded by tern-store's `MAX_RECORD_BYTES`).
pub const MAX_BATCH_OPS: usize = 65_536;

/// Most bytes (sum of the operations' lengths) one proposal may carry: one entry is one store
/// record, and it must fit one network frame beside a full AppendEntries batch.
pub const MAX_PROPOSAL_BYTES: usize = 8 << 20;
const _: () = assert!(MAX_PROPOSAL_BYTES * 4 < tern_store::config::MAX_RECORD_BYTES);

/// The payload of a normal Raft entry: many application operations committed together (the
/// group commit of the single node, one level up). Opaque to consensus.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch(pub Vec<Bytes>);

impl fmt::Display for Batch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Batch({} ops)", self.0.len())
    }
}

openraft::declare_raft_types!(
    /// Tern's openraft type configuration.
    pub TypeConfig:
        D = Batch,
        R = (),
        NodeId = NodeId,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

pub type Entry = openraft::Entry<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type Vote = openraft::Vote<NodeId>;
pub type StorageError = openraft::StorageError<NodeId>;
pub type Raft = openraft::Raft<TypeConfig>;

/// Encodes with postcard (the format of the log stream, the KV values and the wire).
pub(crate) fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, postcard::Error> {
    postcard::to_allocvec(value)
}

/// Decodes what [`encode`] wrote; trailing bytes are an error (a torn or foreign value).
pub(crate) fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, postcard::Error> {
    let (value, rest) = postcard::take_from_bytes(bytes)?;
    if !rest.is_empty() {
        return Err(postcard::Error::DeserializeBadEncoding);
    }
    Ok(value)
}
