//! tern-store: Tern's durable stream store (ARCHITECTURE.md §4). No async runtime inside:
//! one std writer thread per stream does group commit; tickets are plain `Future`s.
//!
//! Module map:
//! - [`store`]: a directory of named streams behind a lock file.
//! - [`stream`]: appends returning tickets, reads by sequence and by topic filter, removals.
//! - [`kv`]: keyed state (sessions, retained) on a one-record-per-topic stream.
//! - [`ticket`]: completion handles (`Future`, `is_done`, `wait`).
//! - [`config`]: block size, sync policy, retention limits.
//! - `writer`: the per-stream group-commit thread; `queue`: the bounded hand-off to it.
//! - `state`: the in-memory view (blocks, entries, topic index); `compact`: block rewrites.
//! - `recovery`: opening a stream, torn tails, quarantine; [`format`]: the on-disk layout.
//! - [`vfs`]: the file abstraction (real and fault-injecting); [`filter`]: MQTT matching.
//!
//! # Invariants
//! - Sequence numbers start at 1, grow by one per record and are never reused.
//! - A ticket completes only after its record (and every earlier one) is durable under the
//!   stream's sync policy; tickets complete in append order.
//! - After a write or sync failure a stream accepts no more writes until reopened.

pub mod config;
pub mod error;
pub mod filter;
pub mod format;
pub mod kv;
pub mod store;
pub mod stream;
pub mod ticket;
pub mod vfs;

mod compact;
mod lockfile;
mod queue;
mod recovery;
mod shared;
mod state;
mod writer;

pub use config::{Discard, Limits, StreamConfig, SyncPolicy};
pub use error::{Result, StoreError};
pub use filter::{FilterSet, topic_matches};
pub use kv::KvStream;
pub use queue::Removed;
pub use recovery::RecoveryReport;
pub use state::{Corruption, RemovedLog};
pub use store::Store;
pub use stream::{NewRecord, ReadBatch, Record, Stream, StreamInfo, TopicStats};
pub use ticket::Ticket;
