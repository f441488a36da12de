//! The store's error type.

use std::io;
use std::ops::RangeInclusive;
use std::path::PathBuf;

/// Everything a store operation can fail with.
#[derive(Debug, thiserror::Error, Clone)]
pub enum StoreError {
    /// An I/O call failed. The stream that saw it refuses writes until reopened.
    #[error("I/O error during {op} on {path}: {message}")]
    Io {
        op: &'static str,
        path: PathBuf,
        kind: io::ErrorKind,
        message: String,
    },
    /// A previous write or fsync failed; the stream refuses every write until it is reopened.
    /// Nothing acknowledged before the failure is lost.
    #[error("stream {stream} refuses writes after an earlier I/O failure ({cause}); reopen it")]
    Failed { stream: String, cause: String },
    /// The writer queue is at its limit (`try_append` only; `append` waits instead).
    #[error("stream {stream} write queue is full")]
    QueueFull { stream: String },
    /// A limit with `Discard::New` rejected this append; nothing was written.
    #[error("stream {stream} rejected the append: {limit} limit reached")]
    LimitReached { stream: String, limit: &'static str },
    /// A record is larger than the store accepts.
    #[error("record of {size_bytes} bytes exceeds the limit of {limit_bytes} bytes")]
    RecordTooLarge {
        size_bytes: usize,
        limit_bytes: usize,
    },
    /// A batch is empty or larger than allowed.
    #[error("invalid batch: {0}")]
    InvalidBatch(&'static str),
    /// Checksums or structure of a sealed block do not match; the block is quarantined.
    #[error("corrupt block {path} (seq {first}..={last}): {detail}", first = range.start(), last = range.end())]
    Corrupt {
        path: PathBuf,
        range: RangeInclusive<u64>,
        detail: String,
    },
    /// Another process (or another `Store` in this one) holds the store's lock file.
    #[error("store directory {0} is locked by another process")]
    Locked(PathBuf),
    /// The stream is already open in this store; clone the existing handle instead.
    #[error("stream {0} is already open")]
    AlreadyOpen(String),
    /// A stream name that cannot be a directory name.
    #[error("invalid stream name {0:?}")]
    InvalidName(String),
    /// Configuration values that cannot work together.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// Stepped writers (a simulator's mode): a blocking call waits for something no writer
    /// turn can bring about (e.g. a ticket for a sequence not appended yet); with one thread
    /// it would wait forever.
    #[error("stream {stream}: nothing queued can complete sequence {seq} (stepped writer)")]
    Stalled { stream: String, seq: u64 },
    /// The stream was closed (its writer thread stopped).
    #[error("stream {0} is closed")]
    Closed(String),
}

impl StoreError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, err: &io::Error) -> Self {
        StoreError::Io {
            op,
            path: path.into(),
            kind: err.kind(),
            message: err.to_string(),
        }
    }
}

/// Result alias used throughout the crate.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;
