//! The state layer: sessions and what they hold, with no I/O, no spawning and no broker-wide
//! state. It imports the model layer and the leaves; the engine above owns every operation
//! that takes more than one of these locks.
//!
//! - [`session`]: [`Session`](session::Session) and its state (subscriptions, QoS 2 received
//!   set, the outbound queue and in-flight window, expiry, a pending delayed will), and
//!   [`ConnCtl`](session::ConnCtl), what a connection's task shares with the rest.
//! - [`outbound`]: a session's ordered delivery queue, in-flight window, release gate and
//!   batches (the socket writer over them is the driver's, `connection::outflow`).
//! - [`ack_pipeline`]: ordered inbound acks and deliveries gated on store tickets.
//! - [`router`]: the subscription trie and which sessions a message goes to.
//! - [`retained`]: the retained-message tree.
//! - [`registry`]: sessions by client id; [`groups`]: share-group queues.
//! - [`packet_ids`], [`topic_alias`]: per-session identifiers.
//! - [`keep_alive`]: the table the keep-alive sweeper reads.
//!
//! # Invariants
//! - Lock order: registry → router → retained → share-group queues → one session's state. No
//!   lock is held across an `await`.
//! - A session is reachable from the router only while it is in the registry; ending a
//!   session removes its subscriptions first, then marks it `ended` so that a publisher that
//!   matched it a moment earlier queues nothing.

pub(crate) mod ack_pipeline;
pub(crate) mod groups;
pub(crate) mod keep_alive;
pub(crate) mod outbound;
pub(crate) mod packet_ids;
pub(crate) mod registry;
pub(crate) mod retained;
pub(crate) mod router;
pub(crate) mod session;
pub(crate) mod topic_alias;
