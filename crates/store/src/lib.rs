//! tern-store: Tern's durable stream store (ARCHITECTURE.md §4). No async runtime inside:
//! one std writer thread per stream does group commit; tickets are plain `Future`s. A
//! simulator can have no thread at all instead: with stepped writers (`Vfs::stepped_writers`)
//! turns run when it calls [`Store::step`], and time is `Vfs::now_ns` / `Vfs::monotonic_ns`.
//!
//! Module map, one layer per line, lowest first: a module imports only its own line and the
//! lines before it (`crates/server/tests/layering.rs` holds the same order and enforces it).
//! - [`error`]; [`filter`]: MQTT matching; [`histogram`]: the writer's fsync latency and
//!   batch size histograms; [`vfs`]: the file abstraction (real and fault-injecting, and the
//!   test-only bug switches a simulated disk hands the store); `wakers`: the wakers of the
//!   tasks waiting on pending tickets, several per sequence, bounded.
//! - [`config`]: block size, sync policy, retention limits; `lockfile`: the directory's lock;
//!   `queue`: the bounded hand-off from appenders to the writer; `sim` (feature `sim` only):
//!   the simulated disk (page cache, power loss, EIO), a `Vfs`.
//! - [`format`](mod@format): the on-disk layout.
//! - `record`: the records appends take and reads return; `scan`: parsing a block's records.
//! - `state`: the in-memory view (blocks, entries, topic index; the directory's file names).
//! - `recovery`: opening a stream, torn tails, quarantine.
//! - `shared`: what a stream's handles, writer and tickets share. A stepped writer is handed
//!   to it as a trait (`SteppedWriter`): the writer holds an `Arc<Shared>` and sits above.
//! - `wake`: [`DeferWakes`], one group commit for a run of appends; [`ticket`]: completion
//!   handles (`Future`, `is_done`, `wait`).
//! - `writer`: the per-stream group commit (its turns driven by a thread, or stepped), block
//!   rolls, limits, and compaction (block rewrites, run in the writer's turns).
//! - [`stream`]: appends returning tickets, removals, and what a stream reports about itself.
//! - `read`: reads by sequence, by topic filter, per topic, and the scrub of sealed blocks;
//!   [`kv`]: keyed state (sessions, retained) on a one-record-per-topic stream.
//! - [`store`]: a directory of named streams behind a lock file.
//!
//! # Invariants
//! - Sequence numbers start at 1, grow by one per record and are never reused.
//! - A ticket completes only after its record (and every earlier one) is durable under the
//!   stream's sync policy; tickets complete in append order.
//! - After a write or sync failure a stream accepts no more writes until reopened.
//! - Readers see a record only once it is durable under the sync policy, so nothing that was
//!   served can vanish in a crash.
//!
//! # Design notes for users
//! - **Back-pressure.** Each stream's queue is bounded by `max_queue_bytes`: `append` waits
//!   for room, `try_append` returns `StoreError::QueueFull` (use it from async tasks and stop
//!   reading the socket until tickets complete).
//! - **Atomic groups.** `append_batch` makes several records durable together, in one stream.
//!   Records that must survive a crash together go in one batch of one stream.
//! - **Removals** (expiry, limits, purges, floors) report sequence ranges (`Removed`); the
//!   writer's own removals (limits on append, the expiry timer) wait in `drain_removed`.
//! - **Memory.** Every block keeps its topic table and per-topic counts in memory. Per-record
//!   entries (32 bytes each) stay in memory for the active block, for blocks holding deleted
//!   records, and for up to `index_cache_blocks` other sealed blocks; the rest are reloaded
//!   from their index files on demand.
//! - **Removing data costs per block.** Whole blocks are removed by renaming them into
//!   `trash/` (one directory fsync per call); a reaper thread frees the data afterwards
//!   (with stepped writers, the turn itself does).
//! - **Corruption** is never skipped silently: a sealed block that fails a checksum (on open
//!   with `verify_on_open`, on a read, or in `Stream::verify`) is moved to `quarantine/` and
//!   reported with its sequence range; everything else keeps being served.

//! # Example
//! ```
//! use tern_store::{FilterSet, NewRecord, Store, StreamConfig};
//!
//! let dir = tempfile::tempdir()?;
//! let store = Store::open(dir.path())?;
//! let msgs = store.stream("messages", StreamConfig::default())?;
//! // The sequence is known at once; the ticket completes when the record is durable.
//! let ticket = msgs.append(b"sensors/1/temp", b"", b"21.5")?;
//! let seq = ticket.seq();
//! assert_eq!(ticket.wait()?, seq);
//! // Several records that must survive a crash together (e.g. a QoS 2 message and its
//! // "received" marker) go in one batch of one stream.
//! let t = msgs.append_batch(&[
//!     NewRecord { topic: b"sensors/2/temp", payload: b"19.0", ..Default::default() },
//!     NewRecord { topic: b"$tern/rx/client-a", payload: b"7", ..Default::default() },
//! ])?;
//! t.wait()?;
//! let page = msgs.read_from(1, &FilterSet::new(["sensors/+/temp"]), 100, 1 << 20)?;
//! assert_eq!(page.records.len(), 2);
//! // Keyed state: latest value per key survives a reopen.
//! let sessions = store.kv("sessions", StreamConfig::default())?;
//! sessions.put(b"client-a", b"state")?.wait()?;
//! assert_eq!(sessions.get(b"client-a")?.as_deref(), Some(&b"state"[..]));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod config;
pub mod error;
pub mod filter;
pub mod format;
pub mod histogram;
pub mod kv;
mod record;
pub mod store;
pub mod stream;
pub mod ticket;
pub mod vfs;

#[cfg(feature = "sim")]
pub mod sim;

mod lockfile;
mod queue;
mod read;
mod recovery;
mod scan;
mod shared;
mod state;
mod wake;
mod wakers;
mod writer;

pub use config::{Discard, Limits, StreamConfig, SyncPolicy};
pub use error::{Result, StoreError};
pub use filter::{FilterSet, topic_matches};
pub use histogram::{HistogramSnapshot, StreamHistograms};
pub use kv::KvStream;
pub use queue::Removed;
pub use recovery::RecoveryReport;
pub use state::{Corruption, RemovedLog};
pub use store::Store;
pub use stream::{NewRecord, ReadBatch, Record, Stream, StreamInfo, StreamMetrics, TopicStats};
pub use ticket::Ticket;
pub use wake::DeferWakes;
pub use writer::MAX_SYNCS_IN_FLIGHT;

/// The process-wide switch of a crate's injectable bugs, for its simulator (the test-only
/// cargo feature `inject` of tern-broker, tern-raft and tern-cluster): `inject_switch!(pub
/// Bug)` defines `on(Bug) -> bool` with the given visibility and, under the calling crate's
/// feature `inject`, `set(Option<Bug>)`. Without the feature `on` is a constant `false`, so
/// every check folds away and production code keeps one path. `Bug` is a `#[repr(u32)]`
/// enum whose values are distinct bits.
#[macro_export]
macro_rules! inject_switch {
    ($vis:vis $bug:ty) => {
        #[cfg(feature = "inject")]
        static ACTIVE: ::std::sync::atomic::AtomicU32 = ::std::sync::atomic::AtomicU32::new(0);

        /// Whether `bug` is injected.
        #[doc(hidden)]
        #[inline(always)]
        $vis fn on(bug: $bug) -> bool {
            #[cfg(feature = "inject")]
            {
                ACTIVE.load(::std::sync::atomic::Ordering::Relaxed) & bug as u32 != 0
            }
            #[cfg(not(feature = "inject"))]
            {
                let _ = bug;
                false
            }
        }

        /// Sets the injected bug (`None`: none), process-wide.
        #[doc(hidden)]
        #[cfg(feature = "inject")]
        pub fn set(bug: Option<$bug>) {
            ACTIVE.store(
                bug.map_or(0, |b| b as u32),
                ::std::sync::atomic::Ordering::Relaxed,
            );
        }
    };
}
