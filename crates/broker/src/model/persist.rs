//! The persistence seam: everything the broker must write for state to survive a restart goes
//! through [`MessageStore`]. [`MemoryStore`] issues no writes; [`crate::durable::DurableStore`]
//! implements the trait over `tern-store`.
//!
//! A call that issues a write returns `Some(Ticket)`; the ticket completes once the write is
//! durable. A call that issues no write returns `None` and the caller treats the step as done
//! at once. Callers decide whether to wait by that `Option`, never by QoS or flags
//! (ARCHITECTURE §4.3): the store alone applies the durability policy of the stream a message
//! falls in. Every acknowledgement the broker sends (PUBACK, PUBREC, PUBCOMP, SUBACK, UNSUBACK)
//! waits for the tickets of the writes it confirms, retained records included (§5).
//!
//! Calls are made for every session; `session_opened` is made only for sessions that outlive
//! their connection (expiry > 0), so an implementation can ignore the others' records.
//!
//! # Invariants
//! - Tickets of one stream complete in the order the writes were issued (group commit); the
//!   ack pipeline may still see them complete out of order across streams, and only releases
//!   from its front.
//! - Implementations never wait on the disk: they enqueue and return (the store's bounded
//!   writer queue may make an append wait for room, which is back-pressure, not I/O).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tern_wire::{Protocol, QoS, SubscriptionOptions};
use tokio::sync::oneshot;

use crate::model::message::Message;

/// A write the store could not make durable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("store write failed: {0}")]
pub struct PersistError(pub String);

/// Where a stored message lives: its stream (index in the store's configuration) and sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StoreRef {
    pub stream: u16,
    pub seq: u64,
}

/// What [`MessageStore::outbound_sent`] did with an outbound QoS 2 exchange about to start.
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

/// Completion of one issued write: a `tern-store` ticket (no allocation, no channel per
/// message), a channel (test stores), or an outcome known at once.
pub struct Ticket(TicketInner);

enum TicketInner {
    Store(tern_store::Ticket),
    Channel(oneshot::Receiver<Result<(), PersistError>>),
    Ready(Option<Result<(), PersistError>>),
    /// Several writes (e.g. a retained PUBLISH: its message and its retained record); done
    /// when all are, failed as soon as one fails. A part is removed once it completed, so no
    /// part is polled after its completion.
    All(Vec<Ticket>),
}

/// The store's side of a channel [`Ticket`].
pub struct TicketCompleter(oneshot::Sender<Result<(), PersistError>>);

impl Ticket {
    /// A ticket completed through its [`TicketCompleter`] (test and wrapper stores).
    pub fn pair() -> (TicketCompleter, Ticket) {
        let (tx, rx) = oneshot::channel();
        (TicketCompleter(tx), Ticket(TicketInner::Channel(rx)))
    }

    pub fn from_store(ticket: tern_store::Ticket) -> Ticket {
        Ticket(TicketInner::Store(ticket))
    }

    /// A write that already failed (e.g. the stream refused it).
    pub fn failed(error: PersistError) -> Ticket {
        Ticket(TicketInner::Ready(Some(Err(error))))
    }

    /// The ticket of both writes: `None` if neither was issued, else one that completes when
    /// every issued write is durable (or one failed).
    pub fn join(a: Option<Ticket>, b: Option<Ticket>) -> Option<Ticket> {
        match (a, b) {
            (None, t) | (t, None) => t,
            (Some(Ticket(TicketInner::All(mut parts))), Some(b)) => {
                parts.push(b);
                Some(Ticket(TicketInner::All(parts)))
            }
            (Some(a), Some(b)) => Some(Ticket(TicketInner::All(vec![a, b]))),
        }
    }

    /// True for a write the store refused when it was issued ([`Ticket::failed`]): no record
    /// exists that a later step could wait for.
    pub fn is_refused(&self) -> bool {
        matches!(self.0, TicketInner::Ready(Some(Err(_))))
    }

    /// Waits for durability. A store that went away counts as a failed write.
    pub async fn wait(&mut self) -> Result<(), PersistError> {
        WaitTicket(self).await
    }

    /// Polls for durability in place (a ticket kept in shared state and awaited by whichever
    /// task currently serves it). Its outcome is reported once.
    pub fn poll_wait(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), PersistError>> {
        Pin::new(&mut WaitTicket(self)).poll(cx)
    }

    /// `Some` once the write finished (or failed).
    pub fn try_result(&mut self) -> Option<Result<(), PersistError>> {
        match &mut self.0 {
            TicketInner::Store(t) => t
                .try_result()
                .map(|r| r.map(drop).map_err(|e| PersistError(e.to_string()))),
            TicketInner::Channel(rx) => match rx.try_recv() {
                Ok(result) => Some(result),
                Err(oneshot::error::TryRecvError::Empty) => None,
                Err(oneshot::error::TryRecvError::Closed) => Some(Err(dropped())),
            },
            TicketInner::Ready(r) => Some(r.clone().unwrap_or(Ok(()))),
            TicketInner::All(parts) => {
                let mut failed = None;
                parts.retain_mut(|part| match part.try_result() {
                    Some(Ok(())) => false,
                    Some(Err(error)) => {
                        failed.get_or_insert(error);
                        false
                    }
                    None => true,
                });
                let outcome = match failed {
                    Some(error) => Err(error),
                    None if parts.is_empty() => Ok(()),
                    None => return None,
                };
                // Settled for good: a later call answers the same.
                self.0 = TicketInner::Ready(Some(outcome.clone()));
                Some(outcome)
            }
        }
    }
}

fn dropped() -> PersistError {
    PersistError("store dropped the ticket".into())
}

struct WaitTicket<'a>(&'a mut Ticket);

impl Future for WaitTicket<'_> {
    type Output = Result<(), PersistError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.0.0 {
            TicketInner::Store(t) => Pin::new(t)
                .poll(cx)
                .map(|r| r.map(drop).map_err(|e| PersistError(e.to_string()))),
            TicketInner::Channel(rx) => Pin::new(rx)
                .poll(cx)
                .map(|r| r.unwrap_or_else(|_| Err(dropped()))),
            TicketInner::Ready(r) => Poll::Ready(r.clone().unwrap_or(Ok(()))),
            TicketInner::All(parts) => {
                let mut failed = None;
                parts.retain_mut(|part| match Pin::new(&mut WaitTicket(part)).poll(cx) {
                    Poll::Ready(Ok(())) => false,
                    Poll::Ready(Err(error)) => {
                        failed.get_or_insert(error);
                        false
                    }
                    Poll::Pending => true,
                });
                let outcome = match failed {
                    Some(error) => Err(error),
                    None if parts.is_empty() => Ok(()),
                    None => return Poll::Pending,
                };
                self.0.0 = TicketInner::Ready(Some(outcome.clone()));
                Poll::Ready(outcome)
            }
        }
    }
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            TicketInner::Store(t) => write!(f, "Ticket({})", t.seq()),
            TicketInner::All(parts) => f.debug_tuple("Ticket").field(parts).finish(),
            _ => f.write_str("Ticket"),
        }
    }
}

impl TicketCompleter {
    pub fn complete(self, result: Result<(), PersistError>) {
        // The waiter may have gone away with its connection; nothing to tell then.
        let _ = self.0.send(result);
    }
}

/// What a persistent session holds per stream, for its cursor.
pub type HeldSeqs = Vec<(u16, u64)>;

/// Durable state of sessions, messages and QoS exchanges (ARCHITECTURE §3, §5).
///
/// Every method has the body of a store that keeps nothing: it issues no write (`None`) and
/// remembers nothing. [`MemoryStore`] is exactly that; a real store overrides every method, and
/// a test store only the ones it scripts.
pub trait MessageStore: Send + Sync + 'static {
    /// An admitted inbound PUBLISH (any QoS). The store writes it if the stream it falls in
    /// says so (durability `default`: QoS>0; `always`: every QoS; `never`: none) and then
    /// returns the ticket. `qos2_packet_id` is `Some` for QoS 2: the same write records
    /// "(session, pi) received".
    fn append_publish(
        &self,
        _client_id: &str,
        _message: &Message,
        _qos2_packet_id: Option<u16>,
    ) -> Option<Ticket> {
        None
    }
    /// A QoS 2 PUBLISH on a packet id still in the session's received set: a retry, answered
    /// with PUBREC only. The PUBREC must still wait for the original's write (the original
    /// may be in flight on a connection that died): its ticket, if one is pending.
    fn qos2_retry(&self, _client_id: &str, _packet_id: u16) -> Option<Ticket> {
        None
    }
    /// The message left the publisher's pipeline (routed, or given up).
    fn message_released(&self, _message: &Message) {}
    /// Until the guard drops, the appends of [`MessageStore::append_publish`] leave the
    /// store's writers asleep; the drop wakes them for all of them, so that the PUBLISHes of
    /// one socket read share one group commit (`tern_store::DeferWakes`). Not held across an
    /// `.await` (the guard is not `Send`).
    fn defer_writer_wakes(&self) -> WriterWakes {
        WriterWakes::default()
    }
    /// PUBREL from the client: "(session, pi) released". PUBCOMP leaves once durable.
    fn qos2_released(&self, _client_id: &str, _packet_id: u16) -> Option<Ticket> {
        None
    }
    /// An outbound QoS 2 PUBLISH of a stored message is about to go to `client_id` for the
    /// first time under `packet_id`. A store that keeps the session records "(session, packet
    /// id) → message" and the PUBLISH leaves once that is durable, so that after a restart the
    /// message is resent under the same id (exactly once outbound, ARCHITECTURE §3). From
    /// then on retention never removes the message; if it removed it before, the exchange
    /// does not start ([`OutboundSent::Removed`]).
    fn outbound_sent(&self, _client_id: &str, _packet_id: u16, _stored: StoreRef) -> OutboundSent {
        OutboundSent::Untracked
    }
    /// PUBREC from a subscriber: "PUBREL pending" for an outbound QoS 2 message; PUBREL leaves
    /// once durable so that a restart resends PUBREL, never the PUBLISH.
    fn outbound_pubrel_pending(
        &self,
        _client_id: &str,
        _packet_id: u16,
        _stored: Option<StoreRef>,
    ) -> Option<Ticket> {
        None
    }
    /// PUBACK / PUBCOMP (or a v5 PUBREC with a failure reason) from a subscriber: the
    /// outbound exchange is over; a stored QoS 2 message is never sent to it again.
    fn outbound_completed(&self, _client_id: &str, _packet_id: u16) {}
    /// A persistent session started (`fresh`) or resumed with this expiry. The CONNACK leaves
    /// once the returned write is durable: a client told its session exists must find it
    /// after a power loss (its QoS 2 received set hangs on the session's incarnation).
    fn session_opened(
        &self,
        _client_id: &str,
        _protocol: Protocol,
        _expiry_interval_s: u32,
        _fresh: bool,
    ) -> Option<Ticket> {
        None
    }
    /// A persistent session with a finite expiry lost its connection: its expiry interval
    /// (`expiry_interval_s`, possibly changed by DISCONNECT) runs from now.
    fn session_closed(&self, _client_id: &str, _expiry_interval_s: u32) {}
    /// The session ended (expired, clean start, or expiry 0 at disconnect).
    fn session_ended(&self, _client_id: &str) {}
    /// A subscription of a persistent session was added or replaced. SUBACK leaves once the
    /// returned write is durable (the subscription is routed at once, only the ack waits).
    fn session_subscribed(
        &self,
        _client_id: &str,
        _filter: &str,
        _options: SubscriptionOptions,
        _subscription_id: Option<u32>,
    ) -> Option<Ticket> {
        None
    }
    /// A subscription of a persistent session was removed; UNSUBACK leaves once durable.
    fn session_unsubscribed(&self, _client_id: &str, _filter: &str) -> Option<Ticket> {
        None
    }
    /// Retained message set (`Some`) or cleared (`None`) for `topic`. Calls are made in the
    /// order the retained messages were applied in memory. The PUBACK / PUBREC of the PUBLISH
    /// that made the change leaves once the write is durable.
    fn retained_changed(&self, _topic: &str, _message: Option<&Message>) -> Option<Ticket> {
        None
    }
    /// What survived the last run, read once when the broker is built. The memory store
    /// remembers nothing.
    fn recover(&self) -> Recovered {
        Recovered::default()
    }
    /// Ranges retention removed from the message streams since the last call (stream index,
    /// sequences), for sessions to skip ahead over them once.
    fn removed_ranges(&self) -> Vec<(u16, std::ops::RangeInclusive<u64>)> {
        Vec::new()
    }
    /// Per stream, the lowest sequence that may still be routed. Read before the sessions'
    /// held messages are listed for [`MessageStore::checkpoint`]; empty if nothing is stored.
    fn checkpoint_floors(&self) -> Vec<u64> {
        Vec::new()
    }
    /// Periodic housekeeping from the checkpointer: removes what no one needs any more and
    /// checkpoints state that would otherwise be rebuilt from history. Never waits on the disk.
    fn reclaim(&self) {}
    /// Records how far a persistent session got: `held` lists the stored messages it still
    /// holds (queued or in flight). Called periodically. True if a write was issued.
    fn checkpoint(&self, _client_id: &str, _floors: &[u64], _held: &HeldSeqs) -> bool {
        false
    }
    /// Client ids of the sessions the store keeps (the ones to checkpoint).
    fn persistent_sessions(&self) -> Vec<Arc<str>> {
        Vec::new()
    }
    /// Share groups (`$share/{group}/{filter}`) whose queue the store keeps (a persistent
    /// session joined them), the ones to checkpoint.
    fn durable_groups(&self) -> Vec<Arc<str>> {
        Vec::new()
    }
    /// Records how far the share group `share` got: `held` lists the stored messages its
    /// queue and its members still hold of the group's messages. True if a write was issued.
    fn checkpoint_group(&self, _share: &str, _floors: &[u64], _held: &HeldSeqs) -> bool {
        false
    }
    /// The share group lost its last member: its queue is gone.
    fn group_ended(&self, _share: &str) {}
    /// CONNECT: the new connection's will (`None`: it has none) and its Will Delay Interval,
    /// for sessions of every expiry. Replaces any earlier will of `client_id`. Returns the
    /// token that names this will in [`MessageStore::will_delayed`] and
    /// [`MessageStore::will_cleared`] (calls with an older token do nothing), and the write
    /// the CONNACK waits for (if one was issued).
    fn will_set(&self, _client_id: &str, _will: Option<(&Message, u32)>) -> (u64, Option<Ticket>) {
        (0, None)
    }
    /// The connection closed without a clean DISCONNECT; its will waits for its delay, which
    /// runs from now.
    fn will_delayed(&self, _client_id: &str, _token: u64) {}
    /// The will is cancelled, or about to be published: its record goes. The broker publishes
    /// only once the returned write is durable, so a will is published at most once.
    fn will_cleared(&self, _client_id: &str, _token: u64) -> Option<Ticket> {
        None
    }
    /// True if a message to `topic` at `qos` would be written and the store is at its disk
    /// budget: the caller refuses it (QoS>0) or drops it (QoS 0). One atomic load.
    fn disk_budget_reached(&self, _topic: &str, _qos: QoS) -> bool {
        false
    }
    /// Measures the disk use again (what retention freed counts from here on). Called with
    /// every checkpoint pass; cheap: the store sums the block lengths it knows.
    fn refresh_disk_usage(&self) {}
    /// `(bytes used, budget)` when a disk budget is set.
    fn disk_usage(&self) -> Option<(u64, u64)> {
        None
    }
    /// Every stream with its numbers, for `/metrics` and the admin API (none in memory).
    fn stream_stats(&self) -> Vec<crate::model::StreamStats> {
        Vec::new()
    }
    /// Removes every message (not `$`-topics) of the message stream `name`; the number of
    /// records removed.
    fn purge_stream(&self, name: &str) -> Result<u64, crate::model::ActionError> {
        Err(crate::model::ActionError::NotFound {
            what: "stream",
            name: name.to_string(),
        })
    }
    /// A consistent copy of the data directory under the label `label`; its path.
    fn backup(&self, _label: &str) -> Result<std::path::PathBuf, crate::model::ActionError> {
        Err(crate::model::ActionError::Invalid(
            "the in-memory store has nothing to back up".into(),
        ))
    }
    /// A ticket that completes once every state-stream write issued so far is durable
    /// (`None`: nothing to wait for).
    fn state_barrier(&self) -> Option<Ticket> {
        None
    }
}

/// State handed back by [`MessageStore::recover`].
#[derive(Debug, Default)]
pub struct Recovered {
    pub sessions: Vec<StoredSession>,
    pub retained: Vec<Message>,
    /// Share-group queues of groups that persistent sessions are members of.
    pub groups: Vec<StoredGroup>,
    /// Wills not yet published nor cancelled.
    pub wills: Vec<StoredWill>,
}

/// A share group's queue as the store rebuilt it: messages waiting for a member.
#[derive(Debug)]
pub struct StoredGroup {
    /// `$share/{group}/{filter}`.
    pub share: String,
    pub queued: Vec<Message>,
}

/// A will that survived a restart.
#[derive(Debug)]
pub struct StoredWill {
    pub client_id: String,
    /// The will as the message it turns into.
    pub message: Message,
    /// How long it still waits: zero when due now (its delay passed, its session ended, or it
    /// had none).
    pub due_in: std::time::Duration,
    /// As from [`MessageStore::will_set`].
    pub token: u64,
}

/// A persistent session as the store rebuilt it (ARCHITECTURE §5). It comes back offline:
/// in-flight messages are resent (DUP, or PUBREL) when its client reconnects.
#[derive(Debug)]
pub struct StoredSession {
    pub client_id: String,
    pub protocol: Protocol,
    pub expiry_interval_s: u32,
    /// `(filter as subscribed, options, subscription identifier)`.
    pub subscriptions: Vec<(String, SubscriptionOptions, Option<u32>)>,
    /// QoS 2 packet ids received and not yet released (§3).
    pub qos2_received: Vec<u16>,
    /// Outbound messages in flight, in send order.
    pub inflight: Vec<StoredInflight>,
    /// Messages queued beyond the window, in order, with their delivery QoS.
    /// A message queued for many sessions is one shared `Arc`.
    pub queued: Vec<(Arc<Message>, QoS)>,
    /// Oldest stored messages recovery left out to keep `queued` within the session queue
    /// limits (counted by the broker in `messages/dropped/queue_limit`).
    pub dropped_queue_limit: u64,
}

#[derive(Debug)]
pub struct StoredInflight {
    pub packet_id: u16,
    pub message: Arc<Message>,
    pub qos: QoS,
    /// PUBREC was received: resend PUBREL, never the PUBLISH (§3).
    pub pubrel_pending: bool,
}

/// Keeps nothing beyond the broker's own memory: every call is complete at once.
/// See [`MessageStore::defer_writer_wakes`]: the deferred streams' guards.
#[derive(Default)]
#[must_use = "dropping the guard at once defers nothing"]
pub struct WriterWakes(pub Vec<tern_store::DeferWakes>);

#[derive(Debug, Default, Clone, Copy)]
pub struct MemoryStore;

impl MessageStore for MemoryStore {}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn joined_ticket_completes_when_all_parts_did() {
        assert!(Ticket::join(None, None).is_none());
        let (a_done, a) = Ticket::pair();
        let (b_done, b) = Ticket::pair();
        let (c_done, c) = Ticket::pair();
        let mut t = Ticket::join(Ticket::join(Some(a), Some(b)), Some(c)).unwrap();
        assert!(t.try_result().is_none());
        b_done.complete(Ok(()));
        a_done.complete(Ok(()));
        assert!(t.try_result().is_none(), "c is still out");
        c_done.complete(Ok(()));
        assert_eq!(t.wait().await, Ok(()));
        assert_eq!(t.try_result(), Some(Ok(())), "settled for good");
    }

    #[tokio::test]
    async fn joined_ticket_fails_when_one_part_fails() {
        let (a_done, a) = Ticket::pair();
        let (_b_done, b) = Ticket::pair();
        let mut t = Ticket::join(Some(a), Some(b)).unwrap();
        a_done.complete(Err(PersistError("disk".into())));
        assert_eq!(t.wait().await, Err(PersistError("disk".into())));
        assert_eq!(t.try_result(), Some(Err(PersistError("disk".into()))));
    }
}
