//! SUBSCRIBE and UNSUBSCRIBE: per-filter validation and reason codes, the session's
//! subscription table, the router, and retained messages per Retain Handling.
//!
//! A subscription is routed at once; its SUBACK (UNSUBACK) goes through the ack pipeline as an
//! entry holding the encoded packet and the ticket of the session record's write, so that for
//! a persistent session it leaves only once the subscription (its removal) is durable, and
//! every acknowledgement of the connection still leaves in packet order (ARCHITECTURE §2.5,
//! §5). Retained messages due to a new subscription are delivered at once, so they may
//! precede a SUBACK that waits (MQTT 3.8.4 allows PUBLISH before SUBACK) but never follow a
//! newer live message on their topic.

use std::sync::Arc;

use tern_topic::FilterKind;
use tern_wire::{
    Packet, Properties, QoS, ReasonCode, RetainHandling, SubAck, Subscribe, UnsubAck, Unsubscribe,
};
use tokio::time::Instant;

use super::{Close, Conn};
use crate::auth::Who;
use crate::engine::registry::{self, Subscribed};
use crate::engine::route;
use crate::metrics::Metrics;
use crate::model::SubRecord;
use crate::model::Ticket;
use crate::model::message::Message;
use crate::state::ack_pipeline::{AckKind, Entry};
use crate::state::outbound::Outgoing;

fn granted(qos: QoS) -> ReasonCode {
    match qos {
        QoS::AtMostOnce => ReasonCode::GRANTED_QOS_0,
        QoS::AtLeastOnce => ReasonCode::GRANTED_QOS_1,
        QoS::ExactlyOnce => ReasonCode::GRANTED_QOS_2,
    }
}

impl Conn {
    pub(super) fn on_subscribe(&mut self, subscribe: Subscribe) -> Result<(), Close> {
        let subscription_id = subscribe
            .properties
            .subscription_identifiers
            .first()
            .copied();
        let mut reasons = Vec::with_capacity(subscribe.filters.len());
        // The writes of the session's subscription records (persistent sessions only).
        let mut ticket = None;
        // (filter, record) whose retained messages are due (Retain Handling 0, or 1 when new).
        let mut retained_due = Vec::new();
        for (raw, options) in &subscribe.filters {
            let record = SubRecord {
                options: *options,
                subscription_id,
            };
            match self.subscribe_one(raw, record)? {
                Ok((written, due)) => {
                    ticket = Ticket::join(ticket, written);
                    reasons.push(granted(options.qos));
                    if due {
                        retained_due.push((raw.clone(), record));
                    }
                }
                Err(refused) => reasons.push(refused),
            }
        }
        // SUBACK is queued before the retained messages it triggers when it need not wait.
        let suback = Packet::SubAck(SubAck {
            packet_id: subscribe.packet_id,
            properties: Properties::default(),
            reasons,
        });
        self.push_control_ack(subscribe.packet_id, &suback, ticket);
        // A new member online: messages that waited for its groups go out.
        crate::engine::groups::flush_member(&self.shared, &self.session);
        self.send_retained(retained_due);
        Ok(())
    }

    /// One filter of a SUBSCRIBE: `Ok(Ok((write, retained due)))` when granted, `Ok(Err(reason))`
    /// for a refusal in the SUBACK, `Err` for one that closes the connection.
    fn subscribe_one(
        &mut self,
        raw: &tern_wire::Str,
        record: SubRecord,
    ) -> Result<Result<(Option<Ticket>, bool), ReasonCode>, Close> {
        let v5 = self.protocol.is_v5();
        let options = record.options;
        if let Err(close) = self.check_strict(raw, ReasonCode::TOPIC_FILTER_INVALID) {
            if close == Close::Protocol(ReasonCode::TOPIC_FILTER_INVALID) {
                return Ok(Err(ReasonCode::TOPIC_FILTER_INVALID));
            }
            return Err(close);
        }
        let Ok(kind) = tern_topic::classify_filter(raw) else {
            return Ok(Err(ReasonCode::TOPIC_FILTER_INVALID));
        };
        let shared_sub = matches!(kind, FilterKind::Shared { .. });
        if shared_sub && options.no_local && v5 {
            // MQTT-3.8.3-4: No Local on a shared subscription is a protocol error.
            return Err(Close::Protocol(ReasonCode::PROTOCOL_ERROR));
        }
        if !self.may_subscribe(kind) {
            // 3.1.1: 0x80 Failure (MQTT-3.9.3); v5: 0x87 Not authorized.
            return Ok(Err(if v5 {
                ReasonCode::NOT_AUTHORIZED
            } else {
                ReasonCode::UNSPECIFIED_ERROR
            }));
        }
        let (existed, full) = {
            let state = self.session.state.lock();
            let existed = state.subscriptions.contains_key(raw.as_str());
            let full =
                state.subscriptions.len() >= self.shared.config.max_subscriptions_per_session;
            (existed, full)
        };
        if !existed && full {
            return Ok(Err(ReasonCode::QUOTA_EXCEEDED));
        }
        match registry::subscribe(&self.shared, &self.session, kind, raw, record) {
            Subscribed::New | Subscribed::Replaced => {}
            // Replaced by a clean-start takeover: this connection is on its way out.
            Subscribed::Ended => return Err(Close::Kicked(ReasonCode::SESSION_TAKEN_OVER)),
            Subscribed::Refused(error) => {
                tracing::debug!(%error, filter = %raw, "subscription refused");
                return Ok(Err(ReasonCode::TOPIC_FILTER_INVALID));
            }
        }
        let written = self.shared.store.sessions.session_subscribed(
            &self.session.client_id,
            raw,
            options,
            record.subscription_id,
        );
        let due = match options.retain_handling {
            RetainHandling::SendAtSubscribe => true,
            RetainHandling::SendIfNew => !existed,
            RetainHandling::DoNotSend => false,
        };
        // Retained messages are not sent for shared subscriptions (MQTT 5 §4.8.2).
        Ok(Ok((written, due && !shared_sub)))
    }

    /// The retained messages due to new subscriptions, with RETAIN=1 (MQTT-3.3.1-8).
    fn send_retained(&self, retained_due: Vec<(tern_wire::Str, SubRecord)>) {
        let now = Instant::now();
        for (filter, record) in retained_due {
            let messages: Vec<Arc<Message>> = self.shared.retained.read().matching(&filter, now);
            for message in messages {
                let item = Outgoing {
                    qos: message.qos.min(record.options.qos),
                    retain: true,
                    subscription_ids: record.subscription_id.into_iter().collect(),
                    share: None,
                    message,
                };
                route::deliver(&self.shared, &self.session, item, now);
            }
        }
    }

    pub(super) fn on_unsubscribe(&mut self, unsubscribe: Unsubscribe) -> Result<(), Close> {
        let mut reasons = Vec::with_capacity(unsubscribe.filters.len());
        let mut ticket = None;
        for raw in &unsubscribe.filters {
            if let Err(close) = self.check_strict(raw, ReasonCode::TOPIC_FILTER_INVALID) {
                if close == Close::Protocol(ReasonCode::TOPIC_FILTER_INVALID) {
                    reasons.push(ReasonCode::TOPIC_FILTER_INVALID);
                    continue;
                }
                return Err(close);
            }
            let Ok(kind) = tern_topic::classify_filter(raw) else {
                reasons.push(ReasonCode::TOPIC_FILTER_INVALID);
                continue;
            };
            let removed = self
                .shared
                .router
                .write()
                .unsubscribe(kind, &self.session.client_id);
            {
                let mut state = self.session.state.lock();
                state.subscriptions.remove(raw.as_str());
                self.session.recount_subscriptions(&state);
            }
            if removed {
                Metrics::sub(&self.shared.metrics.subscriptions, 1);
                if matches!(kind, FilterKind::Shared { .. }) {
                    crate::engine::groups::forget_if_orphaned(&self.shared, &[raw.as_str().into()]);
                }
                let written = self
                    .shared
                    .store
                    .sessions
                    .session_unsubscribed(&self.session.client_id, raw);
                ticket = Ticket::join(ticket, written);
                reasons.push(ReasonCode::SUCCESS);
            } else {
                reasons.push(ReasonCode::NO_SUBSCRIPTION_EXISTED);
            }
        }
        let unsuback = Packet::UnsubAck(UnsubAck {
            packet_id: unsubscribe.packet_id,
            properties: Properties::default(),
            reasons,
        });
        self.push_control_ack(unsubscribe.packet_id, &unsuback, ticket);
        Ok(())
    }

    /// The ACL's check of a filter (a shared subscription's filter without its
    /// `$share/{group}/`); always true without an ACL. Denials are counted.
    fn may_subscribe(&mut self, kind: FilterKind<'_>) -> bool {
        let Some(acl) = self.acl.current(&self.shared.auth) else {
            return true;
        };
        let filter = match kind {
            FilterKind::Shared { filter, .. } => filter,
            FilterKind::Normal(filter) => filter,
        };
        let who = Who {
            username: self.username.as_deref(),
            client_id: &self.session.client_id,
        };
        if acl.allows_subscribe(who, filter) {
            return true;
        }
        let n = Metrics::add_get(&self.shared.metrics.acl_denied_subscribe, 1);
        if n.is_power_of_two() {
            tracing::info!(client_id = %self.session.client_id, filter, count = n, "ACL: SUBSCRIBE denied");
        }
        false
    }

    /// Queues SUBACK / UNSUBACK behind the acknowledgements before it; it leaves once
    /// `ticket` (the session record's write, if one was issued) is durable.
    fn push_control_ack(&mut self, packet_id: u16, packet: &Packet, ticket: Option<Ticket>) {
        let Some(bytes) = self.encode(packet) else {
            return;
        };
        let inflight = self.inflight.get(&self.shared);
        inflight.pipeline.push(
            Entry {
                packet_id,
                kind: AckKind::Encoded(bytes),
                reason: ReasonCode::SUCCESS,
                ticket,
                deliver: None,
                deliver_after_durable: false,
                // Not part of a Receive Maximum exchange: it takes pipeline room.
                counted: false,
            },
            &mut inflight.released,
        );
        self.flush_released();
    }
}
