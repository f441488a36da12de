//! Keyed state (sessions, retained messages) on a stream with `max_msgs_per_topic = 1`:
//! the key is the record's topic and the value its payload; a delete is a tombstone record.
//! The per-topic index finds a key's record in O(1); reopening restores the latest value per
//! key from the blocks; superseded records are removed as the new one is written, and
//! compaction (automatic on the writer's timer, or `compact`) rewrites sparse blocks so the
//! files stay bounded by the live data.

use bytes::Bytes;

use crate::config::{Discard, StreamConfig};
use crate::error::Result;
use crate::filter::FilterSet;
use crate::stream::Stream;
use crate::ticket::Ticket;

/// Records fetched per read while iterating.
const KV_SCAN_BATCH: usize = 1024;

/// A compacted key/value stream.
#[derive(Clone, Debug)]
pub struct KvStream {
    stream: Stream,
}

impl KvStream {
    pub(crate) fn adjust(mut config: StreamConfig) -> StreamConfig {
        config.limits.max_msgs_per_topic = Some(1);
        config.limits.discard = Discard::Old;
        config.limits.max_age = None;
        config.limits.max_msgs = None;
        config.limits.max_bytes = None;
        config
    }

    pub(crate) fn new(stream: Stream) -> Result<Self> {
        Ok(KvStream { stream })
    }

    /// Sets `key` to `value`; the ticket completes when durable.
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<Ticket> {
        self.stream.append(key, &[], value)
    }

    /// Removes `key` (writes a tombstone).
    pub fn delete(&self, key: &[u8]) -> Result<Ticket> {
        self.stream.append_tombstone(key)
    }

    /// The durable value of `key`.
    pub fn get(&self, key: &[u8]) -> Result<Option<Bytes>> {
        Ok(self
            .stream
            .last_for_topic(key)?
            .filter(|r| !r.is_tombstone())
            .map(|r| r.payload))
    }

    /// Every durable key and value whose key matches `filters`, in write order.
    pub fn entries(&self, filters: &FilterSet) -> Result<Vec<(Bytes, Bytes)>> {
        let mut out = Vec::new();
        let mut from = 0;
        loop {
            let b = self
                .stream
                .read_from(from, filters, KV_SCAN_BATCH, usize::MAX)?;
            if b.next_seq <= from {
                break;
            }
            from = b.next_seq;
            let empty = b.records.is_empty();
            out.extend(
                b.records
                    .into_iter()
                    .filter(|r| !r.is_tombstone())
                    .map(|r| (r.topic, r.payload)),
            );
            if empty && from > self.stream.info().durable_seq {
                break;
            }
        }
        Ok(out)
    }

    /// Number of keys (tombstones not yet compacted away included).
    pub fn len(&self) -> usize {
        self.stream.info().topics
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rewrites up to `max_blocks` sparse blocks now.
    pub fn compact(&self, max_blocks: usize) -> Result<()> {
        self.stream.compact(max_blocks)
    }

    /// The underlying stream.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }
}
