//! Publisher-side routing: the publishing connection's task calls [`publish`] or [`route`],
//! which looks the topic up under the router's read lock ([`crate::state::router`]), releases
//! it, then pushes into each target session's outbound queue and wakes its writer; a message
//! for a share group with no member online goes to the group's queue
//! ([`crate::engine::groups`]).

use std::sync::Arc;

use tern_wire::QoS;
use tokio::time::Instant;

use crate::engine::Shared;
use crate::metrics::Metrics;
use crate::model::Message;
use crate::state::outbound::{Outgoing, PushResult};
use crate::state::router::Targets;
use crate::state::session::Session;

/// Routes a message the broker publishes itself (will, `$SYS`): retained store first (if
/// RETAIN; nothing waits for its write), then every subscriber.
pub fn publish(shared: &Shared, message: Arc<Message>) {
    if message.retain {
        // No acknowledgement waits for it.
        drop(crate::engine::retain::update(shared, &message));
    }
    route(shared, message);
}

/// Routes a message to every subscriber, leaving the retained store alone: a client's PUBLISH
/// was applied to it when its connection's ack pipeline released it
/// ([`crate::engine::retain::release_hook`]), so that its PUBACK / PUBREC waits for the write.
pub(crate) fn route(shared: &Shared, message: Arc<Message>) {
    let mut targets = Targets::new();
    let mut to_groups = Vec::new();
    shared
        .router
        .read()
        .targets(&message, &mut targets, &mut to_groups);
    // The arrival time stands in for "now" (queue-full tracking): one clock read less per
    // message, and the two differ by the routing time only.
    let now = message.arrived_at;
    // The ACL is taken once per message, not once per delivery (a fan-out would otherwise
    // clone one shared `Arc` per subscriber).
    let acl = shared.auth.acl();
    if targets.len() + to_groups.len() > 1 {
        message.mark_fan_out();
    }
    for (session, item) in targets {
        deliver_with(shared, acl.as_deref(), &session, item, now);
    }
    for item in to_groups {
        if let Some(share) = item.share.clone() {
            crate::engine::groups::enqueue(shared, &share, item, now);
        }
    }
}

/// Routes a message that a publisher's pipeline released (or a will), then tells the store it
/// left the pipeline, so that cursors may pass its position: routed first, so a checkpoint
/// that finds it released also finds it in the queues it went to (the cursor invariant of
/// `durable`). The one sequence of every released message.
pub(crate) fn route_released(shared: &Shared, message: Arc<Message>) {
    route(shared, message.clone());
    shared.store.messages.message_released(&message);
}

/// [`publish`] for a message the store wrote (a will): retained, routed, then released as
/// [`route_released`] does.
pub(crate) fn publish_released(shared: &Shared, message: Arc<Message>) {
    publish(shared, message.clone());
    shared.store.messages.message_released(&message);
}

/// Pushes one delivery into a session's queue and wakes its writer.
pub(crate) fn deliver(shared: &Shared, session: &Session, item: Outgoing, now: Instant) {
    // `None` (no ACL file) costs one atomic load.
    deliver_with(shared, shared.auth.acl().as_deref(), session, item, now);
}

/// [`deliver`] under `acl` (read access checked on the message's topic), taken by the caller.
fn deliver_with(
    shared: &Shared,
    acl: Option<&crate::auth::Acl>,
    session: &Session,
    item: Outgoing,
    now: Instant,
) {
    let qos = item.qos;
    let (result, dropped_oldest, dropped_now, online, first_kick) = {
        let mut state = session.state.lock();
        if state.ended {
            return;
        }
        if let Some(acl) = acl {
            let who = crate::auth::Who {
                username: state.username.as_deref(),
                client_id: &session.client_id,
            };
            // As mosquitto: read access is checked per message, on its concrete topic, so a
            // wide subscription never carries a topic the ACL keeps from this client.
            if !acl.allows(who, &item.message.topic, crate::auth::Access::Read) {
                drop(state);
                Metrics::add(&shared.metrics.acl_denied_deliver, 1);
                return;
            }
        }
        let online = state.conn.is_some();
        let before = state.out.dropped_oldest;
        let result = state.out.push(item, online, &shared.config, now);
        shared.changed_sessions.note(session, &state);
        let dropped_now = state.out.dropped_oldest - before;
        let mut first_kick = false;
        if let Some(conn) = &state.conn {
            if result == PushResult::SlowSubscriber {
                first_kick = conn.kick(tern_wire::ReasonCode::QUOTA_EXCEEDED);
            }
            // Waking under the lock saves an Arc clone per delivery; the wake only queues
            // the connection's task.
            conn.wake.notify();
        }
        (
            result,
            state.out.dropped_oldest,
            dropped_now,
            online,
            first_kick,
        )
    };
    count_push(shared, session, result, qos, online, first_kick);
    if dropped_now > 0 {
        shared.metrics.dropped_at_queue_limit(dropped_now);
        note_dropped_oldest(session, dropped_oldest, dropped_now);
    }
}

/// Counts (and logs, rate-limited) what a push into a session's queue did.
#[inline]
fn count_push(
    shared: &Shared,
    session: &Session,
    result: PushResult,
    qos: QoS,
    online: bool,
    first_kick: bool,
) {
    match result {
        PushResult::Queued => {}
        PushResult::Dropped => {
            Metrics::add(&shared.metrics.messages_dropped, 1);
            if online {
                Metrics::add(&shared.metrics.messages_dropped_queue_full, 1);
            }
        }
        PushResult::DroppedMemoryLimit => {
            Metrics::add(&shared.metrics.messages_dropped, 1);
            let n = Metrics::add_get(&shared.metrics.messages_dropped_memory_limit, 1);
            if n.is_power_of_two() {
                tracing::warn!(
                    client_id = %session.client_id,
                    dropped = n,
                    limit = shared.config.max_queued_bytes_total,
                    "max_queued_bytes_total reached; QoS 0 dropped"
                );
            }
        }
        // Counted below: the push may also have reported a slow subscriber.
        PushResult::QueuedDroppedOldest => {}
        PushResult::SlowSubscriber => {
            if qos == QoS::AtMostOnce {
                Metrics::add(&shared.metrics.messages_dropped, 1);
                Metrics::add(&shared.metrics.messages_dropped_queue_full, 1);
            }
            if first_kick {
                Metrics::add(&shared.metrics.slow_subscribers_disconnected, 1);
                tracing::warn!(client_id = %session.client_id, "slow subscriber disconnected");
            }
        }
    }
}

/// Logs drops of a session's oldest QoS>0 messages (`max_queued_messages` /
/// `max_queued_bytes`) when the session's running count (`total`, `added` of them just now)
/// crosses a power of two: 1, 2, 4, 8, ... — visible, never a flood.
pub(crate) fn note_dropped_oldest(session: &Session, total: u64, added: u64) {
    let before = total - added;
    if added > 0 && (before == 0 || total.ilog2() > before.ilog2()) {
        tracing::warn!(
            client_id = %session.client_id,
            dropped_oldest = total,
            online = session.is_online(),
            "session queue limit (max_queued_messages / max_queued_bytes); oldest QoS>0 messages dropped"
        );
    }
}

#[cfg(test)]
mod tests {
    use tern_topic::FilterKind;

    use super::*;
    use crate::state::router::tests::{message, record, session};

    /// A message to several sessions is marked fan-out before it is queued (its deliveries
    /// share one encoding, ARCHITECTURE §2 "Encode once"); one to a single session is not.
    #[test]
    fn route_marks_a_message_for_several_sessions_as_fan_out() {
        let broker = crate::broker::Broker::new(crate::BrokerConfig::default()).unwrap();
        let shared = broker.shared();
        for (subscribers, fan_out) in [(1, false), (2, true)] {
            for i in 0..subscribers {
                let s = session(&format!("s{i}"));
                shared
                    .router
                    .write()
                    .subscribe(FilterKind::Normal("f/t"), &s, record(QoS::AtMostOnce, None))
                    .unwrap();
            }
            let m = message("f/t", QoS::AtMostOnce, None);
            route(shared, m.clone());
            assert_eq!(m.fans_out(), fan_out, "{subscribers} subscriber(s)");
        }
    }
}
