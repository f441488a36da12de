//! tern-broker: the MQTT 3.1.1 / 5.0 broker core on `tern-wire` and `tern-topic`.
//!
//! Module map, by layer (ARCHITECTURE.md §1.1): each layer imports only the layers above it
//! in this list, never one below; `crates/server/tests/layering.rs` fails on an import cycle
//! among these top-level modules. Every module is private: what other crates use is
//! re-exported below (ARCHITECTURE.md §1.1, "Visibility").
//!
//! 1. **Leaves**: `config` ([`BrokerConfig`], the limits, validated), `hash` (the keyed
//!    hasher of maps whose order decides behaviour), `metrics`, `inject` (test-only bugs),
//!    `read_order` (packets take effect across connections in read order, §2.1),
//!    `connect_rate`, `auth` (password file and ACL, mosquitto formats), `transport`
//!    (plain TCP or any `AsyncRead + AsyncWrite`: TLS, WebSocket, in memory).
//! 2. **Model** (`model`): [`Message`], the persistence seam ([`Persistence`]: one small
//!    trait per concern, with its contract; tickets, [`Recovered`]; [`MemoryStore`] keeps
//!    nothing), stats and subscription records.
//! 3. **Durable** (`durable`): [`DurableStore`], the seam over `tern-store` (on-disk schema
//!    in its module doc).
//! 4. **State** (`state`): sessions, outbound queues and the gate, the ack pipeline, the
//!    subscription trie, the retained tree, share-group queues, packet ids, topic aliases. No
//!    I/O, no spawning, no broker-wide state.
//! 5. **Engine** (`engine`): `Shared` and every operation that takes several locks:
//!    routing, retained updates, attach/detach/end, share groups, wills, expiry, restore,
//!    the checkpointer, `$SYS`.
//! 6. **Driver** (`connection`, `fuzz`): one connection's CONNECT handshake, read loop,
//!    handlers and close.
//! 7. **Assembly** (`broker`: [`Broker`], the accept loop and shutdown; `admin`: lists
//!    and actions for operators; `exposition`: `/metrics` in the Prometheus text format).
//!
//! Tests, benches and fuzz targets of this workspace reach internals through `__internal`
//! (the `__internal` feature, below); the `tern` binary does not enable it.

// `pub` means reachable from outside: the API below, or `__internal` for the tests (without
// that feature the test window is unreachable by design, so the rule is checked with it on).
#![cfg_attr(feature = "__internal", deny(unreachable_pub))]

mod admin;
mod auth;
mod broker;
mod config;
mod connect_rate;
mod connection;
mod durable;
mod engine;
mod exposition;
#[cfg(feature = "__internal")]
mod fuzz;
mod hash;
mod inject;
mod metrics;
mod model;
mod read_order;
mod state;
mod transport;

// The public API: what the `tern` binary and the tests build a broker from. Everything else is
// crate-private (ARCHITECTURE §1.1, "Visibility").
pub use admin::{
    ClientInfo, MAX_PAGE_LIMIT, Page, RetainedInfo, SessionInfo, SubscriptionInfo, page, page_limit,
};
pub use auth::{Access, Acl, AclError, AuthRules, PasswdError, PasswordFile, Who, hash_argon2id};
pub use broker::{Accepted, Background, Broker};
pub use config::{BrokerConfig, ConfigError};
pub use durable::{
    DiskBudgetError, Durability, DurableConfig, DurableStore, Keep, MIN_DISK_BUDGET_BYTES,
    SessionLimits, StreamSpec,
};
pub use model::{
    ActionError, Appended, CursorStore, DurableMark, ExchangeStore, FullStore, HeldSeqs,
    MemoryStore, Message, MessageLog, OutboundSent, PersistError, Persistence, QueueFull,
    Recovered, Recovery, RetainedStore, SessionStore, StoreAdmin, StoreRef, StoredGroup,
    StoredInflight, StoredSession, StoredWill, StreamStats, SubRecord, Ticket, TicketCompleter,
    WillStore, WriterWakes,
};
pub use tern_store::{Limits, StreamConfig, SyncPolicy};
pub use transport::{
    AcceptedSocket, ByteStream, CertificateCheck, ClientCertificate, ConnectionInfo, Listener,
    ListenerContext, StreamRead, StreamTransport, StreamWrite, Transport, TransportKind,
    TransportRead, TransportWrite, Upgrade, UpgradeFuture, Upgraded, duplex,
};

/// Internals for this workspace's own tests, benchmarks and fuzz targets (the simulator, the
/// allocation and fan-out benches, the fuzz corpus), the way fjall's `__internal_whitebox` does:
/// behind the `__internal` feature, which only dev-dependencies turn on, never the `tern`
/// binary. Nothing here is API; it changes with the code it exposes.
#[cfg(feature = "__internal")]
#[doc(hidden)]
pub mod __internal {
    pub use crate::engine::{Shared, route};
    pub use crate::fuzz::{Outcome, RunError, run_connection};
    pub use crate::hash::fix_keys;
    pub use crate::metrics::{Counter, Metrics};
    pub use crate::state::outbound::{BatchBufs, BatchEnv, Outbound, WriterState};
    pub use crate::state::router::{Router, Targets};
    pub use crate::state::session::{ConnCtl, Session};

    /// Known bugs the simulator switches on (`inject` feature, [`crate::inject`]).
    pub mod inject {
        pub use crate::inject::Bug;
        #[cfg(feature = "inject")]
        pub use crate::inject::set;
    }
}
