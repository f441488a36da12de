//! The limits on what clients and the broker can make a node hold, that tests run small:
//! their production values (the constants), the [`Limits`] a node and its disk are built
//! with (the constants, unless a test says otherwise; not configurable), and the counters of
//! what they held back or refused.
//!
//! At a connection limit the connection is closed before anything is read from it (the client
//! sees its connection closed before its CONNACK and reconnects), counted in
//! [`RefusedConnections`] and logged at warn with the limit's name. At a disk limit nothing
//! is refused: the writer or the proposer waits ([`DiskStats`]).

/// Most client connections this node forwards to the leader (or holds while it waits for one)
/// at once; beyond it a new client connection is closed before any byte is read.
pub const MAX_FORWARDED_CONNECTIONS: usize = 65_536;
/// Most forwarded connections from other nodes waiting to be handed to the engine (reading
/// their preamble, or waiting for this new leader's engine to open); beyond it one is closed,
/// and its node closes its client. The channel from the cluster port in front of them holds
/// as many more, but is drained at once.
pub const MAX_FORWARD_QUEUE: usize = 1024;
/// Most accepted sockets waiting for the engine's accept loop; beyond it one is closed.
pub const MAX_ACCEPT_QUEUE: usize = 4096;
/// Most bytes of recorded operations not yet proposed: a writer waits while this many are
/// pending, so at most this plus one change's operations are (back-pressure on the broker's
/// writers while proposals lag; nothing is refused).
pub const MAX_PENDING_BYTES: usize = 64 << 20;
/// Most proposals submitted and not yet committed: the proposer waits for a commit before
/// it submits more (meanwhile writes gather into the next proposal).
pub const MAX_PROPOSALS_IN_FLIGHT: usize = 8;

/// A node's limits: the constants above (and the disk's) in production; small in the
/// tests, which could not fill them otherwise. Not configurable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    pub(crate) forwarded_connections: usize,
    pub(crate) forward_queue: usize,
    pub(crate) accept_queue: usize,
    pub(crate) disk: DiskLimits,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            forwarded_connections: MAX_FORWARDED_CONNECTIONS,
            forward_queue: MAX_FORWARD_QUEUE,
            accept_queue: MAX_ACCEPT_QUEUE,
            disk: DiskLimits::default(),
        }
    }
}

/// Client connections this node closed at a limit since it started, by limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RefusedConnections {
    /// At [`MAX_FORWARDED_CONNECTIONS`].
    pub forwarded_connections: u64,
    /// At [`MAX_FORWARD_QUEUE`].
    pub forward_queue: u64,
    /// At [`MAX_ACCEPT_QUEUE`].
    pub accept_queue: u64,
}

/// The limit a connection was closed at.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Refusal {
    ForwardedConnections,
    ForwardQueue,
    AcceptQueue,
}

/// A disk's limits: [`MAX_PENDING_BYTES`] and [`MAX_PROPOSALS_IN_FLIGHT`] in production.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DiskLimits {
    /// [`MAX_PENDING_BYTES`].
    pub(crate) pending_bytes: usize,
    /// [`MAX_PROPOSALS_IN_FLIGHT`].
    pub(crate) proposals_in_flight: usize,
}

impl Default for DiskLimits {
    fn default() -> DiskLimits {
        DiskLimits {
            pending_bytes: MAX_PENDING_BYTES,
            proposals_in_flight: MAX_PROPOSALS_IN_FLIGHT,
        }
    }
}

/// How often the disk's limits held its writers and its proposer back, since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskStats {
    /// Times a writer waited for room among the pending operations ([`MAX_PENDING_BYTES`]).
    pub writer_waits: u64,
    /// Times the proposer waited for a commit before submitting ([`MAX_PROPOSALS_IN_FLIGHT`]).
    pub proposer_waits: u64,
}
