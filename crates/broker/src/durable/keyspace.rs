//! One key space of the shared session-state stream `tern.sessions`: keys carry a one-byte
//! prefix, so several kinds of record share one stream and its log order.

use crate::hash::Map;
use tern_store::{FilterSet, KvStream, StoreError};

/// One key space of the shared session-state stream: keys carry a one-byte prefix.
#[derive(Clone, Debug)]
pub(super) struct Keyspace {
    pub(super) kv: KvStream,
    prefix: u8,
}

impl Keyspace {
    pub(super) fn new(kv: &KvStream, prefix: u8) -> Keyspace {
        Keyspace {
            kv: kv.clone(),
            prefix,
        }
    }

    pub(super) fn key(&self, key: &[u8]) -> Vec<u8> {
        let mut k = Vec::with_capacity(key.len() + 1);
        k.push(self.prefix);
        k.extend_from_slice(key);
        k
    }

    pub(super) fn put(&self, key: &[u8], value: &[u8]) -> Result<tern_store::Ticket, StoreError> {
        self.kv.put(&self.key(key), value)
    }

    pub(super) fn delete(&self, key: &[u8]) -> Result<tern_store::Ticket, StoreError> {
        self.kv.delete(&self.key(key))
    }

    /// Every live key and value of every key space of `kv` in one read, by prefix (prefix
    /// removed from the keys): recovery reads `tern.sessions` once, not once per key space.
    pub(super) fn read_all(
        kv: &KvStream,
        all: &FilterSet,
    ) -> Result<Map<u8, Vec<(bytes::Bytes, bytes::Bytes)>>, StoreError> {
        let mut out: Map<u8, Vec<_>> = Map::default();
        for (k, v) in kv.entries(all)? {
            if let Some(&prefix) = k.first() {
                out.entry(prefix).or_default().push((k.slice(1..), v));
            }
        }
        Ok(out)
    }

    pub(super) fn prefix(&self) -> u8 {
        self.prefix
    }
}
