//! Per-stream configuration: block size, sync policy, retention limits.

use std::time::Duration;

use crate::error::{Result, StoreError};

/// Default block file size: large enough that per-block costs (open, unlink, index) are
/// amortised over tens of thousands of small records, small enough to expire finely.
pub const DEFAULT_BLOCK_SIZE_BYTES: u64 = 4 * 1024 * 1024;
/// Default of `StreamConfig::index_cache_blocks`: 64 blocks of 4 MiB hold the entries of
/// up to 256 MiB of records in memory.
pub const DEFAULT_INDEX_CACHE_BLOCKS: usize = 64;
/// Largest block size: record offsets are u32, and a block may overrun its size by one
/// batch (at most `MAX_RECORD_BYTES`), so this keeps every offset in range.
pub const MAX_BLOCK_SIZE_BYTES: u64 = 1 << 30;
/// Largest record (header + topic + properties + payload) the store accepts.
pub const MAX_RECORD_BYTES: usize = 64 * 1024 * 1024;
/// Longest topic, bounded by the u16 length field of the record format.
pub const MAX_TOPIC_BYTES: usize = u16::MAX as usize;
/// Largest `append_batch` in encoded bytes (a batch is written to one block).
pub const MAX_BATCH_BYTES: usize = MAX_RECORD_BYTES;
/// Most records in one `append_batch`.
pub const MAX_BATCH_RECORDS: usize = 1024;
/// Default bound of the writer queue in bytes of encoded records.
pub const DEFAULT_MAX_QUEUE_BYTES: usize = 32 * 1024 * 1024;
/// Most removed ranges kept for `drain_removed` before older ones are merged.
pub const MAX_PENDING_REMOVED_RANGES: usize = 4096;

/// When an append becomes durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncPolicy {
    /// `fdatasync` after every group-commit batch, before its tickets complete (default).
    Always,
    /// `fdatasync` at most every interval; tickets complete after the covering sync.
    Interval(Duration),
    /// Never sync a commit; tickets complete once the data is written to the file (page
    /// cache). A block is still synced once, when it is sealed, so a power loss loses at
    /// most the active block's tail.
    Never,
}

/// What a limit does when it is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Discard {
    /// Remove the oldest records to make room (default).
    #[default]
    Old,
    /// Reject the new append with `StoreError::LimitReached`.
    New,
}

/// Retention limits of a stream; `None` means unlimited.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Limits {
    /// Records older than this (by record time) are expired by `expire` and the writer's timer.
    pub max_age: Option<Duration>,
    /// Most live records in the stream.
    pub max_msgs: Option<u64>,
    /// Most live record bytes (encoded size) in the stream.
    pub max_bytes: Option<u64>,
    /// Most live records per topic.
    pub max_msgs_per_topic: Option<u64>,
    /// Behaviour of `max_msgs`, `max_bytes` and `max_msgs_per_topic` when reached.
    pub discard: Discard,
    /// Topics starting with this prefix are not subject to `max_msgs_per_topic` (a caller's
    /// control records, which the caller removes itself).
    pub per_topic_exempt_prefix: Option<Vec<u8>>,
}

impl Limits {
    /// The `max_msgs_per_topic` that applies to `topic`, if any.
    pub(crate) fn per_topic_max(&self, topic: &[u8]) -> Option<u64> {
        match &self.per_topic_exempt_prefix {
            Some(p) if topic.starts_with(p) => None,
            _ => self.max_msgs_per_topic,
        }
    }
}

/// Configuration of one stream.
#[derive(Debug, Clone)]
pub struct StreamConfig {
    /// Size at which the active block is sealed and a new one started.
    pub block_size_bytes: u64,
    pub sync: SyncPolicy,
    pub limits: Limits,
    /// Bound of the queue between appenders and the writer thread.
    pub max_queue_bytes: usize,
    /// How often the writer applies `max_age` on its own while idle.
    pub expire_interval: Duration,
    /// Sealed blocks whose per-record index stays in memory; beyond it, clean blocks drop
    /// theirs (32 bytes a record) and reload it from the index file when next needed.
    pub index_cache_blocks: usize,
    /// Verify every record checksum of sealed blocks on open (otherwise sealed blocks are
    /// trusted through their index and verified when read).
    pub verify_on_open: bool,
    /// Start with a retention floor of 0 (limits remove nothing) until the owner sets one with
    /// `Stream::set_retention_floor` (e.g. once it knows what open state the stream holds).
    pub start_pinned: bool,
}

impl Default for StreamConfig {
    fn default() -> Self {
        StreamConfig {
            block_size_bytes: DEFAULT_BLOCK_SIZE_BYTES,
            sync: SyncPolicy::Always,
            limits: Limits::default(),
            max_queue_bytes: DEFAULT_MAX_QUEUE_BYTES,
            expire_interval: Duration::from_secs(1),
            verify_on_open: false,
            index_cache_blocks: DEFAULT_INDEX_CACHE_BLOCKS,
            start_pinned: false,
        }
    }
}

impl StreamConfig {
    pub(crate) fn validate(&self) -> Result<()> {
        if !(4096..=MAX_BLOCK_SIZE_BYTES).contains(&self.block_size_bytes) {
            return Err(StoreError::InvalidConfig(format!(
                "block_size_bytes {} outside 4096..={MAX_BLOCK_SIZE_BYTES}",
                self.block_size_bytes
            )));
        }
        if self.max_queue_bytes < 4096 {
            return Err(StoreError::InvalidConfig(
                "max_queue_bytes below 4096".into(),
            ));
        }
        if let SyncPolicy::Interval(d) = self.sync {
            if d.is_zero() {
                return Err(StoreError::InvalidConfig("sync interval of zero".into()));
            }
        }
        if self.expire_interval.is_zero() {
            // The expiry timer would always be due: a busy loop, or with stepped writers a
            // `Store::step` that never runs out of work.
            return Err(StoreError::InvalidConfig("expire interval of zero".into()));
        }
        if self.limits.max_msgs_per_topic == Some(0) {
            return Err(StoreError::InvalidConfig(
                "max_msgs_per_topic of zero".into(),
            ));
        }
        Ok(())
    }
}
