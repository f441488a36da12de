//! tern-broker: the MQTT 3.1.1 / 5.0 broker core on `tern-wire` and `tern-topic`.
//!
//! Module map, by layer (ARCHITECTURE.md §1.1): each layer imports only the layers above it
//! in this list, never one below; `crates/server/tests/layering.rs` fails on an import cycle
//! among these top-level modules.
//!
//! 1. **Leaves**: [`config`] ([`BrokerConfig`], the limits, validated), [`hash`] (the keyed
//!    hasher of maps whose order decides behaviour), [`metrics`], [`inject`] (test-only bugs),
//!    [`read_order`] (packets take effect across connections in read order, §2.1),
//!    [`connect_rate`], [`auth`] (password file and ACL, mosquitto formats), [`transport`]
//!    (plain TCP or any `AsyncRead + AsyncWrite`: TLS, WebSocket, in memory).
//! 2. **Model** ([`model`]): [`model::Message`], the persistence seam ([`Persistence`]: one small
//!    trait per concern, with its contract; tickets, [`Recovered`]; [`MemoryStore`] keeps nothing), stats and subscription records.
//! 3. **Durable** ([`durable`]): [`DurableStore`], the seam over `tern-store` (on-disk schema
//!    in its module doc).
//! 4. **State** ([`state`]): sessions, outbound queues and the gate, the ack pipeline, the
//!    subscription trie, the retained tree, share-group queues, packet ids, topic aliases. No
//!    I/O, no spawning, no broker-wide state.
//! 5. **Engine** ([`engine`]): [`Shared`] and every operation that takes several locks:
//!    routing, retained updates, attach/detach/end, share groups, wills, expiry, restore,
//!    the checkpointer, `$SYS`.
//! 6. **Driver** ([`connection`], [`fuzz`]): one connection's CONNECT handshake, read loop,
//!    handlers and close.
//! 7. **Assembly** ([`broker`]: [`Broker`], the accept loop and shutdown; [`admin`]: lists
//!    and actions for operators; [`exposition`]: `/metrics` in the Prometheus text format).

pub mod admin;
pub mod auth;
pub mod broker;
pub mod config;
pub mod connect_rate;
pub mod connection;
pub mod durable;
pub mod engine;
pub mod exposition;
pub mod fuzz;
pub mod hash;
#[doc(hidden)]
pub mod inject;
pub mod metrics;
pub mod model;
pub mod read_order;
pub mod state;
pub mod transport;

pub use auth::{Auth, AuthRules};
pub use broker::{Background, Broker};
pub use config::{BrokerConfig, ConfigError};
pub use durable::{
    DiskBudgetError, Durability, DurableConfig, DurableStore, Keep, MIN_DISK_BUDGET_BYTES,
    SessionLimits, StreamSpec,
};
pub use engine::Shared;
pub use model::{
    CursorStore, ExchangeStore, FullStore, HeldSeqs, MemoryStore, MessageLog, OutboundSent,
    PersistError, Persistence, QueueFull, Recovered, Recovery, RetainedStore, SessionStore,
    StoreAdmin, StoreRef, StoredInflight, StoredSession, Ticket, TicketCompleter, WillStore,
    WriterWakes,
};
pub use tern_store::{Limits, StreamConfig, SyncPolicy};
