//! The persistence seam: everything the broker would have to write for state to survive a
//! restart goes through [`MessageStore`]. This issue ships [`MemoryStore`], which issues no
//! writes; the durability issue implements the trait over `tern-store`.
//!
//! A call that issues a write returns `Some(Ticket)`; the ticket completes once the write is
//! durable. A call that issues no write returns `None` and the caller treats the step as done
//! at once. Callers decide whether to wait by that `Option`, never by QoS or flags
//! (ARCHITECTURE §4.3).
//!
//! Calls are made for every session; `session_opened` is made only for sessions that outlive
//! their connection (expiry > 0), so an implementation can ignore the others' records.
//!
//! # Invariants
//! - Tickets of one store complete in the order the writes were issued (group commit), so the
//!   ack pipeline may wait on its front entry only.
//! - Implementations never block the caller: they enqueue and return.

use std::fmt;

use tern_wire::{Protocol, QoS, SubscriptionOptions};
use tokio::sync::oneshot;

use crate::message::Message;

/// A write the store could not make durable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("store write failed: {0}")]
pub struct PersistError(pub String);

/// Completion of one issued write.
pub struct Ticket(oneshot::Receiver<Result<(), PersistError>>);

/// The store's side of a [`Ticket`].
pub struct TicketCompleter(oneshot::Sender<Result<(), PersistError>>);

impl Ticket {
    pub fn pair() -> (TicketCompleter, Ticket) {
        let (tx, rx) = oneshot::channel();
        (TicketCompleter(tx), Ticket(rx))
    }

    /// Waits for durability. A store that went away counts as a failed write.
    pub async fn wait(&mut self) -> Result<(), PersistError> {
        match (&mut self.0).await {
            Ok(result) => result,
            Err(_) => Err(PersistError("store dropped the ticket".into())),
        }
    }

    /// `Some` once the write finished (or failed).
    pub fn try_result(&mut self) -> Option<Result<(), PersistError>> {
        match self.0.try_recv() {
            Ok(result) => Some(result),
            Err(oneshot::error::TryRecvError::Empty) => None,
            Err(oneshot::error::TryRecvError::Closed) => {
                Some(Err(PersistError("store dropped the ticket".into())))
            }
        }
    }
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Ticket")
    }
}

impl TicketCompleter {
    pub fn complete(self, result: Result<(), PersistError>) {
        // The waiter may have gone away with its connection; nothing to tell then.
        let _ = self.0.send(result);
    }
}

/// Durable state of sessions, messages and QoS exchanges (ARCHITECTURE §3, §5).
pub trait MessageStore: Send + Sync + 'static {
    /// An admitted inbound PUBLISH that must be stored (QoS>0 under the default policy).
    /// `qos2_packet_id` is `Some` for QoS 2: the same write records "(session, pi) received".
    fn append_publish(
        &self,
        client_id: &str,
        message: &Message,
        qos2_packet_id: Option<u16>,
    ) -> Option<Ticket>;
    /// PUBREL from the client: "(session, pi) released". PUBCOMP leaves once durable.
    fn qos2_released(&self, client_id: &str, packet_id: u16) -> Option<Ticket>;
    /// PUBREC from a subscriber: "PUBREL pending" for an outbound QoS 2 message; PUBREL leaves
    /// once durable so that a restart resends PUBREL, never the PUBLISH.
    fn outbound_pubrel_pending(&self, client_id: &str, packet_id: u16) -> Option<Ticket>;
    /// PUBACK / PUBCOMP from a subscriber: the outbound exchange is over.
    fn outbound_completed(&self, client_id: &str, packet_id: u16);
    /// A persistent session started or resumed with this expiry.
    fn session_opened(&self, client_id: &str, expiry_interval_s: u32);
    /// The session ended (expired, clean start, or expiry 0 at disconnect).
    fn session_ended(&self, client_id: &str);
    fn session_subscribed(
        &self,
        client_id: &str,
        filter: &str,
        options: SubscriptionOptions,
        subscription_id: Option<u32>,
    );
    fn session_unsubscribed(&self, client_id: &str, filter: &str);
    /// Retained message set (`Some`) or cleared (`None`) for `topic`.
    fn retained_changed(&self, topic: &str, message: Option<&Message>);
    /// What survived the last run, read once when the broker is built. The memory store
    /// remembers nothing.
    fn recover(&self) -> Recovered {
        Recovered::default()
    }
}

/// State handed back by [`MessageStore::recover`].
#[derive(Debug, Default)]
pub struct Recovered {
    pub sessions: Vec<StoredSession>,
    pub retained: Vec<Message>,
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
    pub queued: Vec<(Message, QoS)>,
}

#[derive(Debug)]
pub struct StoredInflight {
    pub packet_id: u16,
    pub message: Message,
    pub qos: QoS,
    /// PUBREC was received: resend PUBREL, never the PUBLISH (§3).
    pub pubrel_pending: bool,
}

/// Keeps nothing beyond the broker's own memory: every call is complete at once.
#[derive(Debug, Default, Clone, Copy)]
pub struct MemoryStore;

impl MessageStore for MemoryStore {
    fn append_publish(&self, _: &str, _: &Message, _: Option<u16>) -> Option<Ticket> {
        None
    }
    fn qos2_released(&self, _: &str, _: u16) -> Option<Ticket> {
        None
    }
    fn outbound_pubrel_pending(&self, _: &str, _: u16) -> Option<Ticket> {
        None
    }
    fn outbound_completed(&self, _: &str, _: u16) {}
    fn session_opened(&self, _: &str, _: u32) {}
    fn session_ended(&self, _: &str) {}
    fn session_subscribed(&self, _: &str, _: &str, _: SubscriptionOptions, _: Option<u32>) {}
    fn session_unsubscribed(&self, _: &str, _: &str) {}
    fn retained_changed(&self, _: &str, _: Option<&Message>) {}
}
