//! What recovery hands the broker ([`crate::model::Recovery::recover`]): persistent sessions,
//! share-group queues, wills still owed and retained messages, in the broker's shape.

use std::sync::Arc;

use tern_wire::{Protocol, QoS, SubscriptionOptions};

use crate::model::message::Message;

/// State handed back by [`crate::model::Recovery::recover`].
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
    pub(crate) share: String,
    pub(crate) queued: Vec<Message>,
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
    /// As from [`crate::model::WillStore::will_set`].
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
