//! The persistence seam: everything the broker must write for state to survive a restart goes
//! through one of the small traits below, one per concern. The broker holds them together in
//! [`Persistence`]; [`MemoryStore`] keeps nothing, [`crate::durable::DurableStore`] implements
//! every trait over `tern-store`, and a replicated store can implement them over a log that a
//! majority commits (ARCHITECTURE §5.0 states the contract).
//!
//! # The contract
//! - A call that issues a write returns `Some(Ticket)` (or a [`Ticket`] inside its answer); the
//!   ticket completes once the write is durable: on disk under the store's sync policy, or,
//!   for a replicated store, committed by a majority. A call that issues no write returns
//!   `None` and the caller treats the step as done at once. Callers decide whether to wait by
//!   that `Option`, never by QoS or flags (ARCHITECTURE §4.3): the store alone applies the
//!   durability policy of the stream a message falls in.
//! - Every acknowledgement the broker sends (CONNACK of a persistent session, PUBACK, PUBREC,
//!   PUBCOMP, SUBACK, UNSUBACK) and every outbound QoS 2 PUBLISH or PUBREL of a persistent
//!   session waits for the tickets of the writes it confirms.
//! - Tickets complete in the order the writes were issued within one log (a stream, or a
//!   replicated log); the ack pipeline may see them complete out of order across logs and only
//!   releases from its front.
//! - What an implementation may defer (write without a ticket, lose in a crash, or do later):
//!   everything its methods return no ticket for — session closes, exchange completions,
//!   will delays, cursor checkpoints, reclamation. The broker's recovery tolerates their loss:
//!   a lost completion resends a PUBREL or a QoS 2 PUBLISH under its old id (never a new
//!   delivery), a lost cursor replays from an older one (QoS 1 again, QoS 2 stopped by its
//!   exchange records), a lost close keeps a session longer.
//! - What must be durable before a ticket completes: all that the call recorded, and every
//!   write issued to the same log before it.
//! - Implementations never wait on the disk or on peers: they enqueue and return (a bounded
//!   queue may make a call wait for room, which is back-pressure, not I/O).
//! - Calls are made for every session; [`SessionStore::session_opened`] is made only for
//!   sessions that outlive their connection (expiry > 0), so an implementation can ignore the
//!   others' records.

use std::sync::Arc;

use tern_wire::{Protocol, QoS, SubscriptionOptions};

use crate::model::message::Message;
use crate::model::recovered::Recovered;
use crate::model::stats::{ActionError, StreamStats};
use crate::model::ticket::Ticket;

/// Where a stored message lives: its stream (index in the store's configuration) and sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StoreRef {
    pub stream: u16,
    pub seq: u64,
}

/// What [`ExchangeStore::outbound_sent`] did with an outbound QoS 2 exchange about to start.
pub enum OutboundSent {
    /// Nothing to record (the store keeps no sessions, or the session is not persistent).
    Untracked,
    /// Recorded (and its message pinned against retention): the PUBLISH leaves once this
    /// write is durable.
    Recorded(Ticket),
    /// Retention had removed the message before its exchange could start (a queued copy the
    /// session took before the checkpoint dropped it): it must not be sent, as a restarted
    /// broker could not finish the exchange (MQTT-4.4.0-1). A retention drop, like the
    /// queued copies the checkpoint drops; nothing was recorded.
    Removed,
}

impl OutboundSent {
    /// The write to wait for before the PUBLISH leaves, if one was issued.
    pub fn ticket(self) -> Option<Ticket> {
        match self {
            OutboundSent::Recorded(t) => Some(t),
            OutboundSent::Untracked | OutboundSent::Removed => None,
        }
    }
}

/// What [`MessageLog::append_publish`] issued for one message: where it went, and the ticket
/// that completes once it is durable.
#[must_use = "the position must be recorded on the message and the ticket waited for"]
pub struct Appended {
    /// Where the message went, for a store that keeps positions (a test store may not; a
    /// refused write has none). The caller records it on the message
    /// ([`Appended::record_on`]) before routing it: cursors, exchanges and the unrouted set
    /// name messages by it.
    pub(crate) at: Option<StoreRef>,
    /// Completes once the message (and the received record written with it) is durable; a
    /// write refused when it was issued has a failed ticket ([`Ticket::failed`]).
    pub ticket: Ticket,
}

impl Appended {
    /// A write at `at`.
    pub(crate) fn at(at: StoreRef, ticket: Ticket) -> Appended {
        Appended {
            at: Some(at),
            ticket,
        }
    }

    /// A write whose position the store does not report (test and wrapper stores), or one
    /// refused at once.
    pub fn unplaced(ticket: Ticket) -> Appended {
        Appended { at: None, ticket }
    }

    /// Records the position on `message` and hands back the ticket to wait for.
    pub fn record_on(self, message: &Message) -> Ticket {
        if let Some(at) = self.at {
            message.mark_stored(at);
        }
        self.ticket
    }
}

/// What a persistent session holds per stream, for its cursor.
pub type HeldSeqs = Vec<(u16, u64)>;

/// See [`MessageLog::defer_writer_wakes`]: the deferred streams' guards.
#[derive(Default)]
#[must_use = "dropping the guard at once defers nothing"]
pub struct WriterWakes(pub Vec<tern_store::DeferWakes>);

/// Inbound application messages and their QoS 2 records (ARCHITECTURE §2.4, §3).
pub trait MessageLog: Send + Sync + 'static {
    /// An admitted inbound PUBLISH (any QoS). The store writes it if the stream it falls in
    /// says so (durability `default`: QoS>0; `always`: every QoS; `never`: none) and returns
    /// where it went and its ticket ([`Appended`]); `None` if nothing was written. The store
    /// does not touch the message: the caller records the position
    /// ([`Appended::record_on`]). `qos2_packet_id` is `Some` for QoS 2 of a persistent
    /// session: the same write records "(session, pi) received", so both are durable or
    /// neither.
    fn append_publish(
        &self,
        client_id: &str,
        message: &Message,
        qos2_packet_id: Option<u16>,
    ) -> Option<Appended>;
    /// [`MessageLog::append_publish`] that never waits for room in the store's writer queue:
    /// `Err(QueueFull)`, with nothing written, when there is none. For a caller holding a lock
    /// that others wait on (a QoS 2 PUBLISH under its session's lock, which routers delivering
    /// to that session take): it lets go of the lock, waits with
    /// [`MessageLog::wait_for_room`] and tries again.
    fn try_append_publish(
        &self,
        client_id: &str,
        message: &Message,
        qos2_packet_id: Option<u16>,
    ) -> Result<Option<Appended>, QueueFull>;
    /// Blocks until the writer queue `message` would be written to has room for it (with the
    /// QoS 2 record of `client_id` if `qos2`), as [`MessageLog::append_publish`] would wait.
    /// Returns at once for a store that writes no such message or has no queue; may return
    /// with the room taken again by another writer by the time the caller tries.
    fn wait_for_room(&self, client_id: &str, message: &Message, qos2: bool);
    /// A QoS 2 PUBLISH on a packet id still in the session's received set: a retry, answered
    /// with PUBREC only. The PUBREC must still wait for the original's write (the original
    /// may be in flight on a connection that died): its ticket, if one is pending.
    fn qos2_retry(&self, client_id: &str, packet_id: u16) -> Option<Ticket>;
    /// PUBREL from the client: "(session, pi) released". PUBCOMP leaves once durable.
    fn qos2_released(&self, client_id: &str, packet_id: u16) -> Option<Ticket>;
    /// A PUBREL on a packet id no longer in the session's received set: perhaps a retry
    /// whose first PUBREL's "released" record is not durable yet, or failed (the id left the
    /// set when that record was appended). Its PUBCOMP waits for every record appended so
    /// far: a PUBCOMP before it, with the record then lost, let recovery restore the exchange
    /// as open (docs/simulation.md, finding 17). A store that writes no such record has
    /// nothing to wait for.
    fn qos2_release_retry(&self, client_id: &str, packet_id: u16) -> Option<Ticket>;
    /// The message left the publisher's pipeline (routed, or given up): a cursor may pass it.
    fn message_released(&self, message: &Message);
    /// Until the guard drops, the appends of [`MessageLog::append_publish`] leave the store's
    /// writers asleep; the drop wakes them for all of them, so that the PUBLISHes of one
    /// socket read share one group commit (`tern_store::DeferWakes`). Not held across an
    /// `.await` (the guard is not `Send`).
    fn defer_writer_wakes(&self) -> WriterWakes;
    /// True if a message to `topic` at `qos` would be written and the store is at its disk
    /// budget: the caller refuses it (QoS>0) or drops it (QoS 0). One atomic load.
    fn disk_budget_reached(&self, topic: &str, qos: QoS) -> bool;
}

/// Persistent sessions: their existence, expiry and subscriptions (ARCHITECTURE §5).
pub trait SessionStore: Send + Sync + 'static {
    /// A persistent session started (`fresh`) or resumed with this expiry. The CONNACK leaves
    /// once the returned write is durable: a client told its session exists must find it
    /// after a power loss (its QoS 2 received set hangs on the session's incarnation).
    fn session_opened(
        &self,
        client_id: &str,
        protocol: Protocol,
        expiry_interval_s: u32,
        fresh: bool,
    ) -> Option<Ticket>;
    /// A persistent session with a finite expiry lost its connection: its expiry interval
    /// (`expiry_interval_s`, possibly changed by DISCONNECT) runs from now. May be deferred.
    fn session_closed(&self, client_id: &str, expiry_interval_s: u32);
    /// The session ended (expired, clean start, or expiry 0 at disconnect). May be deferred.
    fn session_ended(&self, client_id: &str);
    /// A subscription of a persistent session was added or replaced. SUBACK leaves once the
    /// returned write is durable (the subscription is routed at once, only the ack waits).
    fn session_subscribed(
        &self,
        client_id: &str,
        filter: &str,
        options: SubscriptionOptions,
        subscription_id: Option<u32>,
    ) -> Option<Ticket>;
    /// A subscription of a persistent session was removed; UNSUBACK leaves once durable.
    fn session_unsubscribed(&self, client_id: &str, filter: &str) -> Option<Ticket>;
    /// A ticket that completes once every session-state write issued so far is durable
    /// (`None`: nothing to wait for).
    fn state_barrier(&self) -> Option<Ticket>;
}

/// Outbound QoS 2 exchanges of persistent sessions (ARCHITECTURE §3, outbound).
pub trait ExchangeStore: Send + Sync + 'static {
    /// An outbound QoS 2 PUBLISH of a stored message is about to go to `client_id` for the
    /// first time under `packet_id`. A store that keeps the session records "(session, packet
    /// id) → message" and the PUBLISH leaves once that is durable, so that after a restart the
    /// message is resent under the same id (exactly once outbound). From then on retention
    /// never removes the message; if it removed it before, the exchange does not start
    /// ([`OutboundSent::Removed`]).
    fn outbound_sent(&self, client_id: &str, packet_id: u16, stored: StoreRef) -> OutboundSent;
    /// PUBREC from a subscriber: "PUBREL pending" for an outbound QoS 2 message; PUBREL leaves
    /// once durable so that a restart resends PUBREL, never the PUBLISH.
    fn outbound_pubrel_pending(
        &self,
        client_id: &str,
        packet_id: u16,
        stored: Option<StoreRef>,
    ) -> Option<Ticket>;
    /// PUBACK / PUBCOMP (or a v5 PUBREC with a failure reason) from a subscriber: the
    /// outbound exchange is over; a stored QoS 2 message is never sent to it again. May be
    /// deferred (a restart then finishes the exchange again: PUBREL, or the PUBLISH under its
    /// old id).
    fn outbound_completed(&self, client_id: &str, packet_id: u16);
}

/// Retained messages (ARCHITECTURE §5).
pub trait RetainedStore: Send + Sync + 'static {
    /// Retained message set (`Some`) or cleared (`None`) for `topic`. Calls are made in the
    /// order the retained messages were applied in memory. The PUBACK / PUBREC of the PUBLISH
    /// that made the change leaves once the write is durable.
    fn retained_changed(&self, topic: &str, message: Option<&Message>) -> Option<Ticket>;
}

/// The store's writer queue has no room for a write (`try_append_publish`); nothing was
/// written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the store's writer queue is full")]
pub struct QueueFull;

/// Wills, for sessions of every expiry (ARCHITECTURE §5, "Wills survive a crash").
pub trait WillStore: Send + Sync + 'static {
    /// CONNECT: the new connection's will (`None`: it has none) and its Will Delay Interval.
    /// Replaces any earlier will of `client_id`. Returns the token that names this will in
    /// [`WillStore::will_delayed`] and [`WillStore::will_cleared`] (calls with an older token do
    /// nothing), and the write the CONNACK waits for (if one was issued).
    fn will_set(&self, client_id: &str, will: Option<(&Message, u32)>) -> (u64, Option<Ticket>);
    /// The connection closed without a clean DISCONNECT; its will waits for its delay, which
    /// runs from now. May be deferred (a restart then counts the delay from the restart).
    fn will_delayed(&self, client_id: &str, token: u64);
    /// The will is cancelled, or about to be published: its record goes. The broker publishes
    /// only once the returned write is durable, so a will is published at most once.
    fn will_cleared(&self, client_id: &str, token: u64) -> Option<Ticket>;
}

/// Cursors and reclamation: what sessions and share groups still need, and the removal of
/// what no one needs (ARCHITECTURE §5, "Reclamation by interest"). Everything here may be
/// deferred: a lost cursor only replays from an older one.
pub trait CursorStore: Send + Sync + 'static {
    /// Per stream, the lowest sequence that may still be routed. Read before the sessions'
    /// held messages are listed for [`CursorStore::checkpoint`]; empty if nothing is stored.
    fn checkpoint_floors(&self) -> Vec<u64>;
    /// Ranges retention removed from the message streams since the last call (stream index,
    /// sequences), for sessions to skip ahead over them once.
    fn removed_ranges(&self) -> Vec<(u16, std::ops::RangeInclusive<u64>)>;
    /// Periodic housekeeping from the checkpointer: removes what no one needs any more and
    /// checkpoints state that would otherwise be rebuilt from history. Never waits on the disk.
    fn reclaim(&self);
    /// Records how far a persistent session got: `held` lists the stored messages it still
    /// holds (queued or in flight). Called periodically. True if a write was issued.
    fn checkpoint(&self, client_id: &str, floors: &[u64], held: &HeldSeqs) -> bool;
    /// Client ids of the sessions the store keeps (the ones to checkpoint).
    fn persistent_sessions(&self) -> Vec<Arc<str>>;
    /// Share groups (`$share/{group}/{filter}`) whose queue the store keeps (a persistent
    /// session joined them), the ones to checkpoint.
    fn durable_groups(&self) -> Vec<Arc<str>>;
    /// Records how far the share group `share` got: `held` lists the stored messages its
    /// queue and its members still hold of the group's messages. True if a write was issued.
    fn checkpoint_group(&self, share: &str, floors: &[u64], held: &HeldSeqs) -> bool;
    /// The share group lost its last member: its queue is gone.
    fn group_ended(&self, share: &str);
    /// Measures the disk use again (what retention freed counts from here on). Called with
    /// every checkpoint pass; cheap: the store sums the block lengths it knows.
    fn refresh_disk_usage(&self);
}

/// What operators see and do through the admin API and `/metrics`.
pub trait StoreAdmin: Send + Sync + 'static {
    /// Every stream with its numbers (none in memory).
    fn stream_stats(&self) -> Vec<StreamStats>;
    /// `(bytes used, budget)` when a disk budget is set.
    fn disk_usage(&self) -> Option<(u64, u64)>;
    /// Removes every message (not `$`-topics) of the message stream `name`; the number of
    /// records removed.
    fn purge_stream(&self, name: &str) -> Result<u64, ActionError>;
    /// A consistent copy of the data directory under the label `label`; its path.
    fn backup(&self, label: &str) -> Result<std::path::PathBuf, ActionError>;
}

/// Start-up.
pub trait Recovery: Send + Sync + 'static {
    /// What survived the last run, read once when the broker is built.
    fn recover(&self) -> Recovered;
}

/// A store of every concern: what the broker is usually built over.
pub trait FullStore:
    MessageLog
    + SessionStore
    + ExchangeStore
    + RetainedStore
    + WillStore
    + CursorStore
    + StoreAdmin
    + Recovery
{
}

impl<S> FullStore for S where
    S: MessageLog
        + SessionStore
        + ExchangeStore
        + RetainedStore
        + WillStore
        + CursorStore
        + StoreAdmin
        + Recovery
{
}

/// The broker's persistence, one handle per concern. Usually every handle is the same store
/// ([`Persistence::of`]); a test replaces the concerns it scripts
/// (`Persistence { messages: scripted, ..Persistence::memory() }`).
#[derive(Clone)]
pub struct Persistence {
    pub messages: Arc<dyn MessageLog>,
    pub sessions: Arc<dyn SessionStore>,
    pub exchanges: Arc<dyn ExchangeStore>,
    pub retained: Arc<dyn RetainedStore>,
    pub wills: Arc<dyn WillStore>,
    pub cursors: Arc<dyn CursorStore>,
    pub admin: Arc<dyn StoreAdmin>,
    pub recovery: Arc<dyn Recovery>,
}

impl Persistence {
    /// Every concern served by `store`.
    pub(crate) fn of<S: FullStore>(store: Arc<S>) -> Persistence {
        Persistence {
            messages: store.clone(),
            sessions: store.clone(),
            exchanges: store.clone(),
            retained: store.clone(),
            wills: store.clone(),
            cursors: store.clone(),
            admin: store.clone(),
            recovery: store,
        }
    }

    /// Nothing kept beyond the broker's memory.
    pub fn memory() -> Persistence {
        Persistence::of(Arc::new(MemoryStore))
    }
}

/// Keeps nothing beyond the broker's own memory: it issues no write, so every step is done at
/// once, remembers no session and recovers nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct MemoryStore;

impl MessageLog for MemoryStore {
    fn append_publish(&self, _: &str, _: &Message, _: Option<u16>) -> Option<Appended> {
        None
    }
    fn try_append_publish(
        &self,
        _: &str,
        _: &Message,
        _: Option<u16>,
    ) -> Result<Option<Appended>, QueueFull> {
        Ok(None)
    }
    fn wait_for_room(&self, _: &str, _: &Message, _: bool) {}
    fn qos2_retry(&self, _: &str, _: u16) -> Option<Ticket> {
        None
    }
    fn qos2_released(&self, _: &str, _: u16) -> Option<Ticket> {
        None
    }
    fn qos2_release_retry(&self, _: &str, _: u16) -> Option<Ticket> {
        None
    }
    fn message_released(&self, _: &Message) {}
    fn defer_writer_wakes(&self) -> WriterWakes {
        WriterWakes::default()
    }
    fn disk_budget_reached(&self, _: &str, _: QoS) -> bool {
        false
    }
}

impl SessionStore for MemoryStore {
    fn session_opened(&self, _: &str, _: Protocol, _: u32, _: bool) -> Option<Ticket> {
        None
    }
    fn session_closed(&self, _: &str, _: u32) {}
    fn session_ended(&self, _: &str) {}
    fn session_subscribed(
        &self,
        _: &str,
        _: &str,
        _: SubscriptionOptions,
        _: Option<u32>,
    ) -> Option<Ticket> {
        None
    }
    fn session_unsubscribed(&self, _: &str, _: &str) -> Option<Ticket> {
        None
    }
    fn state_barrier(&self) -> Option<Ticket> {
        None
    }
}

impl ExchangeStore for MemoryStore {
    fn outbound_sent(&self, _: &str, _: u16, _: StoreRef) -> OutboundSent {
        OutboundSent::Untracked
    }
    fn outbound_pubrel_pending(&self, _: &str, _: u16, _: Option<StoreRef>) -> Option<Ticket> {
        None
    }
    fn outbound_completed(&self, _: &str, _: u16) {}
}

impl RetainedStore for MemoryStore {
    fn retained_changed(&self, _: &str, _: Option<&Message>) -> Option<Ticket> {
        None
    }
}

impl WillStore for MemoryStore {
    fn will_set(&self, _: &str, _: Option<(&Message, u32)>) -> (u64, Option<Ticket>) {
        (0, None)
    }
    fn will_delayed(&self, _: &str, _: u64) {}
    fn will_cleared(&self, _: &str, _: u64) -> Option<Ticket> {
        None
    }
}

impl CursorStore for MemoryStore {
    fn checkpoint_floors(&self) -> Vec<u64> {
        Vec::new()
    }
    fn removed_ranges(&self) -> Vec<(u16, std::ops::RangeInclusive<u64>)> {
        Vec::new()
    }
    fn reclaim(&self) {}
    fn checkpoint(&self, _: &str, _: &[u64], _: &HeldSeqs) -> bool {
        false
    }
    fn persistent_sessions(&self) -> Vec<Arc<str>> {
        Vec::new()
    }
    fn durable_groups(&self) -> Vec<Arc<str>> {
        Vec::new()
    }
    fn checkpoint_group(&self, _: &str, _: &[u64], _: &HeldSeqs) -> bool {
        false
    }
    fn group_ended(&self, _: &str) {}
    fn refresh_disk_usage(&self) {}
}

impl StoreAdmin for MemoryStore {
    fn stream_stats(&self) -> Vec<StreamStats> {
        Vec::new()
    }
    fn disk_usage(&self) -> Option<(u64, u64)> {
        None
    }
    fn purge_stream(&self, name: &str) -> Result<u64, ActionError> {
        Err(ActionError::NotFound {
            what: "stream",
            name: name.to_string(),
        })
    }
    fn backup(&self, _: &str) -> Result<std::path::PathBuf, ActionError> {
        Err(ActionError::Invalid(
            "the in-memory store has nothing to back up".into(),
        ))
    }
}

impl Recovery for MemoryStore {
    fn recover(&self) -> Recovered {
        Recovered::default()
    }
}
