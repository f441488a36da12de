//! The record types of the stream API: what `read_from` returns and what appends take.

use bytes::Bytes;

use crate::format::{FLAG_TOMBSTONE, RawRecord};

/// A stored record. The byte fields share one read buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub seq: u64,
    pub time_ns: u64,
    pub topic: Bytes,
    pub properties: Bytes,
    pub payload: Bytes,
    pub(crate) tombstone: bool,
}

impl Record {
    pub(crate) fn from_raw(r: RawRecord) -> Self {
        Record {
            seq: r.seq,
            time_ns: r.time_ns,
            tombstone: r.flags & FLAG_TOMBSTONE != 0,
            topic: r.topic,
            properties: r.props,
            payload: r.payload,
        }
    }

    /// True for a keyed-state delete.
    pub fn is_tombstone(&self) -> bool {
        self.tombstone
    }
}

/// One record of an `append_batch`.
#[derive(Debug, Clone, Copy, Default)]
pub struct NewRecord<'a> {
    pub topic: &'a [u8],
    pub properties: &'a [u8],
    pub payload: &'a [u8],
    /// Record time in ns since the Unix epoch; `None` takes the system clock.
    pub time_ns: Option<u64>,
}

/// A page of `read_from`.
#[derive(Debug, Clone, Default)]
pub struct ReadBatch {
    pub records: Vec<Record>,
    /// Where the next call should start.
    pub next_seq: u64,
}
