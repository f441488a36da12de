//! tern-broker: the MQTT 3.1.1 / 5.0 broker core on `tern-wire` and `tern-topic`.
//!
//! Module map (ARCHITECTURE.md §1–3, §5):
//! - [`config`]: [`BrokerConfig`], the limits of the server contract, validated.
//! - [`broker`]: [`Broker`] (shared state, accept loop, shutdown).
//! - [`connection`]: one connection: CONNECT handshake, read loop, per-packet handlers, close.
//! - [`read_order`]: read tickets, so that packets take effect across connections in the order
//!   the I/O driver reported them (ARCHITECTURE.md §2.1).
//! - [`auth`]: password file and ACL (mosquitto formats), replaced whole on reload.
//! - [`connect_rate`]: the token bucket per source address behind `max_connect_rate_per_ip`.
//! - [`fuzz`]: one input through a whole in-process connection (the fuzz target's core).
//! - [`hash`]: the keyed hasher of maps whose iteration order decides behaviour.
//! - [`ack_pipeline`]: ordered inbound acks and deliveries gated on store tickets.
//! - [`persist`]: the [`MessageStore`] seam and tickets; [`MemoryStore`] keeps nothing.
//! - [`durable`]: [`DurableStore`], the `MessageStore` over `tern-store` (on-disk schema in
//!   its module doc); [`checkpoint`]: the periodic write of persistent sessions' cursors.
//! - [`session`]: session state, the registry (takeover, resume), share-group queues, expiry
//!   and will timers.
//! - [`router`]: trie lookups, per-session merging, share-group member choice, delivery.
//! - [`transport`]: the seam between a connection and its byte stream: plain TCP, or any
//!   `AsyncRead + AsyncWrite` (TLS, WebSocket, in memory); listener and peer context.
//! - [`outbound`]: per-session queue, in-flight window and the connection's vectored writes.
//! - [`retained`], [`will`], [`sys`] (`$SYS/broker/...`), [`topic_alias`], [`packet_ids`],
//!   [`message`] (a routed message, encoded once per protocol), [`metrics`].
//! - [`admin`]: paged lists and actions for operators; [`exposition`]: `/metrics` (Prometheus
//!   text format) over the same counters as `$SYS`.

pub mod ack_pipeline;
pub mod admin;
pub mod auth;
pub mod broker;
pub mod checkpoint;
pub mod config;
pub mod connect_rate;
pub mod connection;
pub mod durable;
pub mod exposition;
pub mod fuzz;
pub mod hash;
#[doc(hidden)]
pub mod inject;
pub mod keep_alive;
pub mod message;
pub mod metrics;
pub mod outbound;
pub mod packet_ids;
pub mod persist;
pub mod read_order;
pub mod retained;
pub mod router;
pub mod session;
pub mod sys;
pub mod topic_alias;
pub mod transport;
pub mod will;

pub use auth::{Auth, AuthRules};
pub use broker::{Background, Broker, Shared};
pub use config::{BrokerConfig, ConfigError};
pub use durable::{
    DiskBudgetError, Durability, DurableConfig, DurableStore, Keep, MIN_DISK_BUDGET_BYTES,
    SessionLimits, StreamSpec,
};
pub use persist::{
    MemoryStore, MessageStore, OutboundSent, PersistError, Recovered, StoreRef, StoredInflight,
    StoredSession, Ticket, TicketCompleter,
};
pub use tern_store::{Limits, StreamConfig, SyncPolicy};
