//! The subscription trie keyed by client id, and which sessions a message goes to, at which
//! QoS, with which subscription identifiers ([`Router::targets`]). Delivery into the sessions'
//! queues is the engine's ([`crate::engine::route`]).
//!
//! # Invariants
//! - One copy per session for overlapping normal subscriptions: the highest granted QoS, every
//!   matching subscription identifier, and the retain flag kept if any match asks for Retain
//!   As Published (MQTT-3.3.5-1 for 3.1.1; the single-copy option of MQTT 5 §3.3.4).
//! - A share group delivers each message to exactly one online member [MQTT-4.8.2-*], or, with
//!   no member online, to the group's queue ([`crate::state::groups`]); the member's copy is
//!   separate from its normal subscriptions.
//! - No Local: a subscription never receives its own client's messages [MQTT-3.8.3-3].

use std::sync::Arc;
use std::sync::atomic::Ordering;

use smallvec::SmallVec;
use tern_topic::{FilterKind, Match, SubscribeError, SubscriptionTrie};
use tern_wire::SubscriptionOptions;

use crate::model::SubRecord;
use crate::model::message::Message;
use crate::state::outbound::Outgoing;
use crate::state::session::Session;

/// Deliveries a message routes to before spilling to the heap: a message to a handful of
/// subscribers (the common case) costs no allocation for its target list.
const INLINE_TARGETS: usize = 4;

/// The sessions a message is routed to, with their delivery.
pub type Targets = SmallVec<[(Arc<Session>, Outgoing); INLINE_TARGETS]>;

/// One subscription in the trie.
#[derive(Debug, Clone)]
pub(crate) struct SubValue {
    pub(crate) session: Arc<Session>,
    pub(crate) options: SubscriptionOptions,
    pub(crate) subscription_id: Option<u32>,
    /// `$share/{group}/{filter}` for a share-group membership, built once at subscribe time
    /// rather than per routed message (deliveries carry it for redistribution).
    pub(crate) share: Option<Arc<str>>,
}

#[derive(Default)]
pub struct Router {
    trie: SubscriptionTrie<Arc<str>, SubValue>,
}

impl Router {
    /// Adds or replaces `session`'s subscription. `Ok(true)` if it replaced one.
    pub fn subscribe(
        &mut self,
        kind: FilterKind<'_>,
        session: &Arc<Session>,
        record: SubRecord,
    ) -> Result<bool, SubscribeError> {
        let share = match kind {
            FilterKind::Normal(_) => None,
            FilterKind::Shared { group, filter } => {
                Some(format!("{}{group}/{filter}", tern_topic::SHARE_PREFIX).into())
            }
        };
        let value = SubValue {
            session: session.clone(),
            options: record.options,
            subscription_id: record.subscription_id,
            share,
        };
        let key = session.client_id.clone();
        let old = match kind {
            FilterKind::Normal(filter) => self.trie.subscribe(filter, key, value)?,
            FilterKind::Shared { group, filter } => {
                self.trie.subscribe_shared(group, filter, key, value)?
            }
        };
        Ok(old.is_some())
    }

    /// True if the subscription existed.
    pub(crate) fn unsubscribe(&mut self, kind: FilterKind<'_>, client_id: &Arc<str>) -> bool {
        match kind {
            FilterKind::Normal(filter) => self.trie.unsubscribe(filter, client_id).is_some(),
            FilterKind::Shared { group, filter } => self
                .trie
                .unsubscribe_shared(group, filter, client_id)
                .is_some(),
        }
    }

    pub(crate) fn remove_session(&mut self, client_id: &Arc<str>) -> usize {
        self.trie.remove_key(client_id)
    }

    /// Subscriptions plus shared memberships.
    pub(crate) fn len(&self) -> usize {
        self.trie.len()
    }

    /// Appends one `(session, delivery)` per receiving session to `out`, and one delivery per
    /// share group without an online member to `to_groups` (its `share` names the group).
    pub fn targets(
        &self,
        message: &Arc<Message>,
        out: &mut Targets,
        to_groups: &mut Vec<Outgoing>,
    ) {
        let first = out.len();
        let publisher = message.publisher.as_deref();
        // Only a session with several plain subscriptions can match twice; without one, the
        // merge (a sort) is skipped.
        let mut may_overlap = false;
        self.trie.for_each_match(&message.topic, |m| match m {
            Match::Subscription { key, value } => {
                if value.options.no_local && publisher == Some(&**key) {
                    return;
                }
                may_overlap |= value.session.plain_subscriptions.load(Ordering::Relaxed) > 1;
                out.push((value.session.clone(), outgoing(message, value)));
            }
            Match::Shared(group) => match group.next_member_where(|_, v| v.session.is_online()) {
                Some((_, value)) => {
                    out.push((value.session.clone(), outgoing(message, value)));
                }
                None => {
                    if let Some((_, value)) = group.members().first() {
                        to_groups.push(outgoing(message, value));
                    }
                }
            },
        });
        if may_overlap {
            merge_per_session(out, first);
        }
    }

    /// The share group `share` (`$share/{group}/{filter}`), if it has a member.
    pub(crate) fn share_group(
        &self,
        share: &str,
    ) -> Option<&tern_topic::SharedGroup<Arc<str>, SubValue>> {
        let (group, filter) = tern_topic::parse_shared_filter(share)?.ok()?;
        self.trie.shared_group(group, filter)
    }
}

#[cfg(test)]
impl Router {
    fn targets_for_test(&self, message: &Arc<Message>, out: &mut Targets) {
        self.targets(message, out, &mut Vec::new());
    }
}

fn outgoing(message: &Arc<Message>, value: &SubValue) -> Outgoing {
    Outgoing {
        message: message.clone(),
        qos: message.qos.min(value.options.qos),
        // MQTT-3.3.1-9 (3.1.1) / MQTT-3.3.1-12 (5.0): the live copy's retain flag is 0 unless
        // Retain As Published.
        retain: message.retain && value.options.retain_as_published,
        subscription_ids: value.subscription_id.into_iter().collect(),
        share: value.share.clone(),
    }
}

/// Merges entries of `out[first..]` that target the same session through normal
/// subscriptions into one copy.
fn merge_per_session(out: &mut Targets, first: usize) {
    if out.len() - first < 2 {
        return;
    }
    let mut tail: Targets = out.drain(first..).collect();
    tail.sort_by_key(|(s, o)| (Arc::as_ptr(s) as usize, o.share.is_some()));
    for (session, item) in tail {
        if item.share.is_none() && out.len() > first {
            if let Some((last_session, last)) = out.last_mut() {
                if Arc::ptr_eq(last_session, &session) && last.share.is_none() {
                    last.qos = last.qos.max(item.qos);
                    last.retain |= item.retain;
                    last.subscription_ids.extend(item.subscription_ids);
                    continue;
                }
            }
        }
        out.push((session, item));
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use bytes::Bytes;
    use tern_wire::{Properties, Protocol, QoS, Str};
    use tokio::time::Instant;

    pub(crate) fn session(id: &str) -> Arc<Session> {
        Session::new(id.into(), Protocol::V5, 0)
    }

    pub(crate) fn record(qos: QoS, id: Option<u32>) -> SubRecord {
        SubRecord {
            options: SubscriptionOptions {
                qos,
                ..SubscriptionOptions::default()
            },
            subscription_id: id,
        }
    }

    pub(crate) fn message(topic: &'static str, qos: QoS, publisher: Option<&str>) -> Arc<Message> {
        Arc::new(Message::new(
            Str::from_static(topic),
            Bytes::from_static(b"p"),
            qos,
            true,
            Properties::default(),
            publisher.map(Into::into),
            Instant::now(),
        ))
    }

    #[test]
    fn overlapping_subscriptions_give_one_copy_at_highest_qos_mqtt_3_3_5_1() {
        let mut router = Router::default();
        let a = session("a");
        router
            .subscribe(
                FilterKind::Normal("x/+"),
                &a,
                record(QoS::AtMostOnce, Some(1)),
            )
            .unwrap();
        router
            .subscribe(
                FilterKind::Normal("x/#"),
                &a,
                record(QoS::ExactlyOnce, Some(2)),
            )
            .unwrap();
        // Kept by the SUBSCRIBE handler from the session's table.
        a.plain_subscriptions.store(2, Ordering::Relaxed);
        let mut out = Targets::new();
        router.targets_for_test(&message("x/y", QoS::AtLeastOnce, None), &mut out);
        assert_eq!(out.len(), 1);
        let (_, item) = &out[0];
        assert_eq!(
            item.qos,
            QoS::AtLeastOnce,
            "downgraded to the message's QoS"
        );
        let mut ids = item.subscription_ids.clone();
        ids.sort();
        assert_eq!(ids, vec![1, 2]);
        assert!(
            !item.retain,
            "live copies drop RETAIN unless retain-as-published"
        );
    }

    #[test]
    fn no_local_skips_own_messages_mqtt_3_8_3_3() {
        let mut router = Router::default();
        let a = session("a");
        let mut rec = record(QoS::AtLeastOnce, None);
        rec.options.no_local = true;
        router.subscribe(FilterKind::Normal("t"), &a, rec).unwrap();
        let mut out = Targets::new();
        router.targets_for_test(&message("t", QoS::AtLeastOnce, Some("a")), &mut out);
        assert!(out.is_empty());
        router.targets_for_test(&message("t", QoS::AtLeastOnce, Some("b")), &mut out);
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn share_group_delivers_to_one_member_in_rotation() {
        let mut router = Router::default();
        let a = session("a");
        let b = session("b");
        a.set_online(true);
        b.set_online(true);
        let kind = FilterKind::Shared {
            group: "g",
            filter: "jobs/#",
        };
        router
            .subscribe(kind, &a, record(QoS::AtLeastOnce, None))
            .unwrap();
        router
            .subscribe(kind, &b, record(QoS::AtLeastOnce, None))
            .unwrap();
        let mut got = Vec::new();
        for _ in 0..4 {
            let mut out = Targets::new();
            router.targets_for_test(&message("jobs/1", QoS::AtLeastOnce, None), &mut out);
            assert_eq!(out.len(), 1);
            assert_eq!(out[0].1.share.as_deref(), Some("$share/g/jobs/#"));
            got.push(out[0].0.client_id.to_string());
        }
        assert_eq!(got, vec!["a", "b", "a", "b"]);
        // An offline member is skipped while an online one exists.
        b.set_online(false);
        for _ in 0..2 {
            let mut out = Targets::new();
            router.targets_for_test(&message("jobs/1", QoS::AtLeastOnce, None), &mut out);
            assert_eq!(&*out[0].0.client_id, "a");
        }
        // With no member online the message is for the group's queue.
        a.set_online(false);
        let (mut out, mut to_groups) = (Targets::new(), Vec::new());
        router.targets(
            &message("jobs/1", QoS::AtLeastOnce, None),
            &mut out,
            &mut to_groups,
        );
        assert!(out.is_empty());
        assert_eq!(to_groups.len(), 1);
        assert_eq!(to_groups[0].share.as_deref(), Some("$share/g/jobs/#"));
    }

    #[test]
    fn dollar_topics_not_matched_by_leading_wildcards_mqtt_4_7_2_1() {
        let mut router = Router::default();
        let a = session("a");
        router
            .subscribe(FilterKind::Normal("#"), &a, record(QoS::AtMostOnce, None))
            .unwrap();
        let mut out = Targets::new();
        router.targets_for_test(&message("$SYS/x", QoS::AtMostOnce, None), &mut out);
        assert!(out.is_empty());
    }
}
