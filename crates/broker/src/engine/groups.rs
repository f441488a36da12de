//! Share-group queues (MQTT 5 §4.8.2): a group's queue belongs to the group, not to one member.
//!
//! A message for a group goes to an online member (round robin). With no member online it waits
//! here, in the group's queue, bounded like a session queue (`max_queued_messages`: the oldest
//! QoS>0 message is dropped, counted, logged; QoS 0 is not kept), and goes to the first member
//! that comes online ([`flush`], from attach and SUBSCRIBE). A member that leaves gives its
//! queued share-group messages and its QoS 1 ones in flight to another online member, or back
//! to the group ([`redistribute`]); QoS 2 in flight stays with it (MQTT-4.8.2-4). The queue
//! lives as long as the group has a member (a member's subscription lives as long as its
//! session); when the last one goes the queue is dropped and logged ([`forget_if_orphaned`]).
//!
//! Durably, a group's queue is a cursor plus the group's filter (`g` key space of
//! `tern.sessions`, see [`crate::durable`]), checkpointed with the sessions' cursors from what
//! the group queue and every member hold of the group's messages.
//!
//! # Invariants
//! - Lock order: registry → router → groups → one session's state.
//! - A message moves between a member and the group queue (or another member) under the
//!   groups lock, and the checkpointer lists what a group holds under the same lock, so a
//!   message in transit is never missed by a group cursor.
//! - After a message is queued for a group, the group is flushed if a member is online (the
//!   groups mutex orders that check after any concurrent attach's flush).

use std::sync::Arc;

use tern_wire::QoS;
use tokio::time::Instant;

use crate::engine::Shared;
use crate::engine::route;
use crate::metrics::Metrics;
use crate::model::HeldSeqs;
use crate::state::outbound::{Outbound, Outgoing, PushResult};
use crate::state::router::SubValue;
use crate::state::session::Session;

fn push(shared: &Shared, queue: &mut Outbound, share: &str, item: Outgoing, now: Instant) {
    let dropped_before = queue.dropped_oldest;
    match queue.push(item, false, &shared.config, now) {
        PushResult::Queued | PushResult::SlowSubscriber => {}
        PushResult::Dropped | PushResult::DroppedMemoryLimit => {
            Metrics::add(&shared.metrics.messages_dropped, 1)
        }
        PushResult::QueuedDroppedOldest => {
            // Counted as a session's queue counts them (`router`): one push may drop several.
            let dropped_now = queue.dropped_oldest - dropped_before;
            shared.metrics.dropped_at_queue_limit(dropped_now);
            if queue.dropped_oldest.is_power_of_two() {
                tracing::warn!(
                    share,
                    dropped_oldest = queue.dropped_oldest,
                    "share group queue full; oldest QoS>0 messages dropped"
                );
            }
        }
    }
}

/// The queue of `share`, made when missing. It counts into the broker-wide queued totals
/// (`max_queued_bytes_total`) as a session's queue does: messages waiting for a group's members
/// are held in memory like any other (issue 24 item 3).
fn group_queue<'a>(
    shared: &Shared,
    groups: &'a mut crate::hash::Map<Arc<str>, Outbound>,
    share: &Arc<str>,
) -> &'a mut Outbound {
    groups.entry(share.clone()).or_insert_with(|| {
        let mut queue = Outbound::default();
        queue.count_into(shared.metrics.queued.clone());
        queue
    })
}

/// Queues `item` for the group `share` (no member was online when it was routed).
pub(crate) fn enqueue(shared: &Shared, share: &Arc<str>, item: Outgoing, now: Instant) {
    if item.qos == QoS::AtMostOnce {
        Metrics::add(&shared.metrics.messages_dropped, 1);
        return;
    }
    {
        let mut groups = shared.groups.map.lock();
        let queue = group_queue(shared, &mut groups, share);
        push(shared, queue, share, item, now);
    }
    if any_member_online(shared, share) {
        flush(shared, share);
    }
}

fn any_member_online(shared: &Shared, share: &str) -> bool {
    shared
        .router
        .read()
        .share_group(share)
        .is_some_and(|g| g.members().iter().any(|(_, v)| v.session.is_online()))
}

/// The delivery of `item` to member `value`: its QoS and subscription identifier.
fn for_member(mut item: Outgoing, value: &SubValue) -> Outgoing {
    item.qos = item.message.qos.min(value.options.qos);
    item.subscription_ids = value.subscription_id.into_iter().collect();
    item.share = value.share.clone();
    item
}

/// Hands the group's waiting messages to its online members, round robin.
pub(crate) fn flush(shared: &Shared, share: &str) {
    let router = shared.router.read();
    let Some(group) = router.share_group(share) else {
        return;
    };
    let mut groups = shared.groups.map.lock();
    let Some(queue) = groups.get_mut(share) else {
        return;
    };
    let now = Instant::now();
    while queue.queued_len() > 0 {
        let Some((_, value)) = group.next_member_where(|_, v| v.session.is_online()) else {
            break;
        };
        let Some(item) = queue.pop_front() else {
            break;
        };
        route::deliver(shared, &value.session, for_member(item, value), now);
    }
    if queue.queued_len() == 0 {
        groups.remove(share);
    }
}

/// Flushes every group `session` is a member of (it just came online).
pub(crate) fn flush_member(shared: &Shared, session: &Session) {
    let shares: Vec<Arc<str>> = session
        .state
        .lock()
        .subscriptions
        .keys()
        .filter(|f| f.starts_with(tern_topic::SHARE_PREFIX))
        .map(|f| Arc::from(&**f))
        .collect();
    for share in shares {
        flush(shared, &share);
    }
}

/// `from` lost its connection: its queued share-group messages and its QoS 1 ones in flight
/// go to another online member of their group, or back to the group's queue.
pub(crate) fn redistribute(shared: &Shared, from: &Arc<Session>) {
    let router = shared.router.read();
    let mut groups = shared.groups.map.lock();
    let items = {
        let mut state = from.state.lock();
        let items = state.out.take_shared();
        shared.changed_sessions.note(from, &state);
        items
    };
    if items.is_empty() {
        return;
    }
    if crate::inject::on(crate::inject::Bug::DropShareQueueOnLeave) {
        return;
    }
    let now = Instant::now();
    for item in items {
        let Some(share) = item.share.clone() else {
            continue;
        };
        let member = router.share_group(&share).and_then(|g| {
            g.next_member_where(|k, v| k != &from.client_id && v.session.is_online())
        });
        match member {
            Some((_, value)) => {
                route::deliver(shared, &value.session, for_member(item, value), now);
            }
            None if router.share_group(&share).is_some() => {
                let queue = group_queue(shared, &mut groups, &share);
                push(shared, queue, &share, item, now);
            }
            None => Metrics::add(&shared.metrics.messages_dropped, 1),
        }
    }
}

/// Drops the queue of each group in `shares` that has no member any more (its last member's
/// session ended or unsubscribed), and tells the store.
pub(crate) fn forget_if_orphaned(shared: &Shared, shares: &[Arc<str>]) {
    for share in shares {
        let orphaned = shared.router.read().share_group(share).is_none();
        if !orphaned {
            continue;
        }
        let dropped = shared
            .groups
            .map
            .lock()
            .remove(share)
            .map_or(0, |q| q.queued_len());
        if dropped > 0 {
            Metrics::add(&shared.metrics.messages_dropped, dropped as u64);
            tracing::warn!(
                share = &**share,
                dropped,
                "share group has no member left; its queued messages are dropped"
            );
        }
        shared.store.cursors.group_ended(share);
    }
}

/// What the group `share` holds of the stored messages: its queue and what each member holds
/// of the group's messages (queued, in flight). Listed under the groups lock (see the module
/// invariants).
pub(crate) fn held(shared: &Shared, share: &str, out: &mut HeldSeqs) {
    let router = shared.router.read();
    let groups = shared.groups.map.lock();
    if let Some(queue) = groups.get(share) {
        queue.held(out);
    }
    if let Some(group) = router.share_group(share) {
        for (_, value) in group.members() {
            value.session.state.lock().out.held_share(share, out);
        }
    }
}

/// Restores a group queue replayed from the store at start-up.
pub(crate) fn restore(shared: &Shared, share: &str, messages: Vec<crate::model::message::Message>) {
    let share: Arc<str> = share.into();
    let now = Instant::now();
    let mut groups = shared.groups.map.lock();
    let queue = group_queue(shared, &mut groups, &share);
    for message in messages {
        let item = Outgoing {
            qos: message.qos,
            message: Arc::new(message),
            retain: false,
            subscription_ids: Vec::new(),
            share: Some(share.clone()),
        };
        if item.qos != QoS::AtMostOnce {
            push(shared, queue, &share, item, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::Broker;
    use crate::config::BrokerConfig;
    use crate::state::outbound::stored_item;

    /// Docs/simulation.md finding 14: a share group's queue dropping its oldest QoS>0
    /// messages at `max_queued_messages` counts each one in `messages/dropped/queue_limit`,
    /// as a session's queue does, not only in `messages/dropped`.
    #[tokio::test]
    async fn a_group_queue_dropping_its_oldest_counts_them_as_queue_limit_drops() {
        let config = BrokerConfig {
            max_queued_messages: 3,
            ..BrokerConfig::default()
        };
        let broker = Broker::new(config).unwrap();
        let shared = broker.shared();
        let share: Arc<str> = "$share/g/t".into();
        for seq in 1..=10 {
            enqueue(
                shared,
                &share,
                stored_item(b"x", QoS::AtLeastOnce, seq),
                Instant::now(),
            );
        }
        assert_eq!(shared.groups.queued(&share), 3);
        assert_eq!(
            Metrics::get(&shared.metrics.messages_dropped_queue_limit),
            7
        );
        assert_eq!(Metrics::get(&shared.metrics.messages_dropped), 7);
    }

    /// Issue 24 item 3: a share group's queue counts into `max_queued_bytes_total` as a
    /// session's does, so messages waiting for a group's members cannot grow past the
    /// broker-wide cap unseen (the publisher is refused with 0x97 at the cap), and they leave
    /// the total when a member takes them or the queue goes.
    #[tokio::test]
    async fn a_group_queue_counts_into_the_broker_wide_queued_total() {
        let broker = Broker::new(BrokerConfig::default()).unwrap();
        let shared = broker.shared();
        let share: Arc<str> = "$share/g/t".into();
        let total = || {
            shared
                .metrics
                .queued
                .bytes
                .load(std::sync::atomic::Ordering::Relaxed)
        };
        assert_eq!(total(), 0);
        let item = stored_item(b"0123456789", QoS::AtLeastOnce, 1);
        let len = item.message.approx_len();
        enqueue(shared, &share, item, Instant::now());
        enqueue(
            shared,
            &share,
            stored_item(b"0123456789", QoS::AtLeastOnce, 2),
            Instant::now(),
        );
        assert_eq!(shared.groups.queued(&share), 2);
        assert_eq!(total(), 2 * len, "the group's queue counts into the total");
        forget_if_orphaned(shared, std::slice::from_ref(&share));
        assert_eq!(shared.groups.queued(&share), 0);
        assert_eq!(total(), 0, "a dropped queue leaves the total");
    }
}
