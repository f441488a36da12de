//! One key space of the shared session-state stream `tern.sessions`: keys carry a one-byte
//! prefix, so several kinds of record share one stream and its log order.

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

    /// Every live key (prefix removed) and value of this key space.
    pub(super) fn entries(
        &self,
        all: &FilterSet,
    ) -> Result<Vec<(bytes::Bytes, bytes::Bytes)>, StoreError> {
        Ok(self
            .kv
            .entries(all)?
            .into_iter()
            .filter(|(k, _)| k.first() == Some(&self.prefix))
            .map(|(k, v)| (k.slice(1..), v))
            .collect())
    }
}
