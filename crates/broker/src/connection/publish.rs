//! Inbound PUBLISH and PUBREL: admission (topic alias, topic name, Receive Maximum, payload
//! format), the store write, and the ack pipeline (ARCHITECTURE §2.2–2.6, §3).

use std::sync::Arc;

use tern_wire::{Ack, Publish, QoS, ReasonCode};

use super::{Close, Conn};
use crate::auth::{Access, Who};
use crate::metrics::Metrics;
use crate::model::message::Message;
use crate::state::ack_pipeline::{AckKind, Entry};
use crate::state::topic_alias::AliasError;

impl Conn {
    pub(super) fn on_publish(&mut self, publish: Publish) -> Result<(), Close> {
        let topic = self.publish_topic(&publish)?;
        let packet_id = publish.packet_id;
        let qos = publish.qos;
        Metrics::add(
            &self.shared.metrics.messages_received_by_qos[usize::from(qos as u8)],
            1,
        );
        let counted = self.count_exchange(packet_id, qos)?;
        // ARCHITECTURE §3: a packet id still in the received set is a retry: PUBREC only.
        if qos == QoS::ExactlyOnce && self.session.state.lock().qos2_received.contains(packet_id) {
            self.on_qos2_retry(&publish, topic, counted);
            return Ok(());
        }
        let Some((reason, route)) = self.admit(&publish, &topic)? else {
            return Ok(());
        };
        let message = Arc::new(Message::new(
            topic,
            publish.payload,
            qos,
            publish.retain,
            publish.properties,
            Some(self.session.client_id.clone()),
            self.now,
        ));
        let ticket = self.store_publish(&message, packet_id, reason, route);
        let kind = match qos {
            QoS::AtMostOnce => AckKind::None,
            QoS::AtLeastOnce => AckKind::PubAck,
            QoS::ExactlyOnce => AckKind::PubRec,
        };
        self.push_entry(Entry {
            packet_id,
            kind,
            reason,
            ticket,
            deliver: route.then_some(message),
            deliver_after_durable: qos == QoS::ExactlyOnce
                || self.shared.config.deliver_after_durable,
            counted,
        });
        Ok(())
    }

    /// The PUBLISH's topic name (through its topic alias in v5), checked: no Subscription
    /// Identifier (MQTT-3.3.4-6), a valid topic name and Response Topic (MQTT-3.3.2-14).
    #[inline]
    fn publish_topic(&mut self, publish: &Publish) -> Result<tern_wire::Str, Close> {
        if !publish.properties.subscription_identifiers.is_empty() {
            // MQTT-3.3.4-6: a client's PUBLISH must not carry a Subscription Identifier.
            return Err(Close::Protocol(ReasonCode::PROTOCOL_ERROR));
        }
        let topic = if self.protocol.is_v5() {
            self.aliases
                .resolve(&publish.topic, publish.properties.topic_alias)
                .map_err(|error| match error {
                    AliasError::OutOfRange => Close::Protocol(ReasonCode::TOPIC_ALIAS_INVALID),
                    AliasError::Unknown => Close::Protocol(ReasonCode::PROTOCOL_ERROR),
                })?
        } else {
            publish.topic.clone()
        };
        // `Str` derefs re-check UTF-8: take the `&str` once.
        let topic_str: &str = &topic;
        if tern_topic::validate_topic_name(topic_str).is_err() {
            return Err(Close::Protocol(ReasonCode::TOPIC_NAME_INVALID));
        }
        self.check_strict(topic_str, ReasonCode::TOPIC_NAME_INVALID)?;
        if let Some(response) = &publish.properties.response_topic
            && tern_topic::validate_topic_name(response).is_err()
        {
            // MQTT-3.3.2-14: the Response Topic is a Topic Name: no wildcards.
            return Err(Close::Protocol(ReasonCode::PROTOCOL_ERROR));
        }
        Ok(topic)
    }

    /// MQTT-3.3.4-9 (v5 §4.9): one more exchange than our Receive Maximum is refused, after
    /// reading it and before anything else happens to it. A retry of an exchange counted
    /// already counts nothing (`quota`). True if this PUBLISH counts.
    ///
    /// MQTT 3.1.1 has no Receive Maximum: its exchanges take pipeline room instead, so a burst
    /// (paho resends everything it holds at once after a reconnect) is slowed down by
    /// backpressure, never disconnected. Its received set is bounded by the 65,535 packet ids.
    #[inline]
    fn count_exchange(&mut self, packet_id: u16, qos: QoS) -> Result<bool, Close> {
        if qos == QoS::AtMostOnce || !self.protocol.is_v5() {
            return Ok(false);
        }
        self.inflight
            .get(&self.shared)
            .quota
            .admit(packet_id, self.shared.config.receive_maximum)
            .map_err(|_| Close::Protocol(ReasonCode::RECEIVE_MAXIMUM_EXCEEDED))
    }

    /// A QoS 2 PUBLISH on a packet id still in the received set: PUBREC only, delivered to no
    /// one, whatever DUP says (MQTT-4.3.3-10 / MQTT-4.3.3-2). Its PUBREC waits for the
    /// original's write, which may still be pending on a connection that died (found by the
    /// simulator: PUBREC before the message was durable). The original's insert and append
    /// are one step under the session lock (`store_publish`), so the store knows the write of
    /// any id found here.
    fn on_qos2_retry(&mut self, publish: &Publish, topic: tern_wire::Str, counted: bool) {
        let packet_id = publish.packet_id;
        let mut ticket = self
            .shared
            .store
            .messages
            .qos2_retry(&self.session.client_id, packet_id);
        if publish.retain && !crate::model::topics::is_reserved(&topic) {
            // The original's retained record may be lost where its message record (and so
            // this retry) survived a power loss: the retry carries the whole message, apply it
            // again, and the PUBREC waits for that write too (found by the broker simulator,
            // docs/simulation.md finding 7).
            let message = Arc::new(Message::new(
                topic,
                publish.payload.clone(),
                publish.qos,
                true,
                publish.properties.clone(),
                Some(self.session.client_id.clone()),
                self.now,
            ));
            let retained = crate::engine::retain::update(&self.shared, &message);
            ticket = crate::model::Ticket::join(ticket, retained);
        }
        self.push_entry(Entry {
            packet_id,
            kind: AckKind::PubRec,
            reason: ReasonCode::SUCCESS,
            ticket,
            deliver: None,
            deliver_after_durable: false,
            counted,
        });
    }

    /// Whether the PUBLISH is stored and routed, and the reason its ack carries; `None` for a
    /// QoS 0 PUBLISH dropped without a word, `Err` for one that closes the connection.
    #[inline]
    fn admit(
        &mut self,
        publish: &Publish,
        topic: &str,
    ) -> Result<Option<(ReasonCode, bool)>, Close> {
        let qos = publish.qos;
        if self.protocol.is_v5()
            && publish.properties.payload_format_indicator == Some(1)
            && std::str::from_utf8(&publish.payload).is_err()
        {
            // MQTT-3.3.2-4 allows refusing it; QoS 0 has no ack to carry the refusal.
            if qos == QoS::AtMostOnce {
                return Err(Close::Protocol(ReasonCode::PAYLOAD_FORMAT_INVALID));
            }
            return Ok(Some((ReasonCode::PAYLOAD_FORMAT_INVALID, false)));
        }
        if crate::model::topics::is_reserved(topic) {
            // Clients may not publish into the broker's own statistics, nor into the topic
            // space of the store's control records: acknowledged, not routed.
            return Ok(Some((ReasonCode::SUCCESS, false)));
        }
        if !self.may_write(topic) {
            if qos == QoS::AtMostOnce {
                return Ok(None);
            }
            // As mosquitto: v5 PUBACK / PUBREC 0x87 (a PUBREC >= 0x80 ends the exchange);
            // 3.1.1 acks carry no reason, so the message is acknowledged and dropped.
            return Ok(Some((ReasonCode::NOT_AUTHORIZED, false)));
        }
        if self.limit_reached(topic, qos) {
            if qos == QoS::AtMostOnce {
                // No ack to carry a refusal: dropped, counted (disk budget only; the memory
                // bound drops QoS 0 per subscriber as it is queued).
                return Ok(None);
            }
            if !self.protocol.is_v5() {
                // 3.1.1 has no negative PUBACK: close without acknowledging, so that the
                // client sends the message again on its next connection (ARCHITECTURE §6).
                return Err(Close::Protocol(ReasonCode::QUOTA_EXCEEDED));
            }
            return Ok(Some((ReasonCode::QUOTA_EXCEEDED, false)));
        }
        Ok(Some((ReasonCode::SUCCESS, true)))
    }

    /// Writes the message (if routed) with, for QoS 2, its packet id in the received set: the
    /// set and the write change together under the session lock, so that a retry on another
    /// connection that finds the id also finds its write (`qos2_retry`). The write never waits
    /// under that lock for room in the store's writer queue (routers delivering to this
    /// session take the lock, and a full queue can last as long as the disk stalls): without
    /// room the id leaves the set again, the lock is let go for the wait, and both are done
    /// again (issue 24 item 5). The store decides by the stream's durability policy whether to
    /// write; the pipeline waits only if it did (ARCHITECTURE §4.3).
    #[inline]
    fn store_publish(
        &mut self,
        message: &Message,
        packet_id: u16,
        reason: ReasonCode,
        route: bool,
    ) -> Option<crate::model::Ticket> {
        let messages = &self.shared.store.messages;
        let client_id = &*self.session.client_id;
        if message.qos != QoS::ExactlyOnce || !reason.is_success() {
            return if route {
                messages
                    .append_publish(client_id, message, None)
                    .map(|appended| appended.record_on(message))
            } else {
                None
            };
        }
        loop {
            let mut state = self.session.state.lock();
            state.qos2_received.insert(packet_id);
            // Only a session that can outlive this connection needs its received set on disk:
            // one with expiry 0 ends with the connection and is never resumed (a takeover
            // replaces it, `registry::attach`), and a DISCONNECT may not raise its expiry
            // (MQTT-3.14.2-2). Within the connection the ack pipeline orders a retry's PUBREC
            // after the original's write. Without the record its PUBREL writes nothing either
            // (`qos2_released`).
            let durable_rx = (state.expiry_interval_s > 0).then_some(packet_id);
            let ticket = if route {
                match messages.try_append_publish(client_id, message, durable_rx) {
                    Ok(appended) => appended.map(|appended| appended.record_on(message)),
                    Err(crate::model::QueueFull) => {
                        // Nothing written: no retry may find the id meanwhile. (None can
                        // come: a later connection of this client reads nothing before this
                        // one has routed everything, `ConnCtl::routed`.)
                        state.qos2_received.remove(packet_id);
                        drop(state);
                        messages.wait_for_room(client_id, message, durable_rx.is_some());
                        continue;
                    }
                }
            } else {
                None
            };
            if ticket
                .as_ref()
                .is_some_and(crate::model::Ticket::is_refused)
            {
                // Refused at once (the stream failed on an earlier EIO): no record exists for
                // a retry to wait on (`qos2_retry`), so the id leaves the received set again
                // and the publisher's resend is handled, and refused, as new, never PUBREC'd
                // with nothing durable (found by the broker simulator with `--eio`,
                // docs/simulation.md finding 6).
                state.qos2_received.remove(packet_id);
            }
            return ticket;
        }
    }

    pub(super) fn on_pubrel(&mut self, ack: Ack) -> Result<(), Close> {
        // The set frees itself once empty (`ReceivedIds`).
        let known = self
            .session
            .state
            .lock()
            .qos2_received
            .remove(ack.packet_id);
        // The PUBREL of an exchange counted here is a step of it (until its PUBCOMP is sent);
        // any other PUBREL takes pipeline room of its own.
        let counted = known && self.inflight.is_counted(ack.packet_id);
        let (reason, ticket) = if known {
            let ticket = self
                .shared
                .store
                .messages
                .qos2_released(&self.session.client_id, ack.packet_id);
            if ticket
                .as_ref()
                .is_some_and(crate::model::Ticket::is_refused)
            {
                // Nothing records the release (the stream failed): the exchange stays open,
                // and the client's retry must find it so (docs/simulation.md, finding 17).
                let mut state = self.session.state.lock();
                state.qos2_received.insert(ack.packet_id);
            }
            (ReasonCode::SUCCESS, ticket)
        } else {
            // Not in the set: maybe the retry of a PUBREL whose record is still being
            // written, or failed; the PUBCOMP waits for it (`qos2_release_retry`).
            let reason = if self.protocol.is_v5() {
                ReasonCode::PACKET_IDENTIFIER_NOT_FOUND
            } else {
                ReasonCode::SUCCESS
            };
            let wait = self
                .shared
                .store
                .messages
                .qos2_release_retry(&self.session.client_id, ack.packet_id);
            (reason, wait)
        };
        self.push_entry(Entry {
            packet_id: ack.packet_id,
            kind: AckKind::PubComp,
            reason,
            ticket,
            deliver: None,
            deliver_after_durable: false,
            counted,
        });
        Ok(())
    }

    /// True if a PUBLISH to `topic` at `qos` runs into a broker-wide limit, counted and logged
    /// (rate-limited): the disk budget (`[store] max_disk_bytes`, when the message would be
    /// written), or for QoS>0 the memory bound (`max_queued_bytes_total`).
    fn limit_reached(&self, topic: &str, qos: QoS) -> bool {
        let metrics = &self.shared.metrics;
        let (name, counter) = if self.shared.store.messages.disk_budget_reached(topic, qos) {
            if qos == QoS::AtMostOnce {
                Metrics::add(&metrics.messages_dropped, 1);
                ("max_disk_bytes", &metrics.messages_dropped_disk_budget)
            } else {
                ("max_disk_bytes", &metrics.publishes_refused_disk_budget)
            }
        } else if qos != QoS::AtMostOnce
            && metrics
                .queued
                .at_cap(self.shared.config.max_queued_bytes_total)
        {
            (
                "max_queued_bytes_total",
                &metrics.publishes_refused_memory_limit,
            )
        } else {
            return false;
        };
        let n = Metrics::add_get(counter, 1);
        if n.is_power_of_two() {
            tracing::warn!(
                client_id = %self.session.client_id,
                limit = name,
                qos = qos as u8,
                count = n,
                "broker limit reached: PUBLISH refused (QoS>0: v5 0x97, 3.1.1 connection closed) or dropped (QoS 0)"
            );
        }
        true
    }

    /// The ACL's write check (always true without an ACL); a denial is counted and logged
    /// (rate-limited).
    fn may_write(&mut self, topic: &str) -> bool {
        let Some(acl) = self.acl.current(&self.shared.auth) else {
            return true;
        };
        let who = Who {
            username: self.username.as_deref(),
            client_id: &self.session.client_id,
        };
        if acl.allows(who, topic, Access::Write) {
            return true;
        }
        let n = Metrics::add_get(&self.shared.metrics.acl_denied_publish, 1);
        if n.is_power_of_two() {
            tracing::info!(client_id = %self.session.client_id, topic, count = n, "ACL: PUBLISH denied");
        }
        false
    }

    fn push_entry(&mut self, entry: Entry<Arc<Message>>) {
        let inflight = self.inflight.get(&self.shared);
        inflight.pipeline.push(entry, &mut inflight.released);
        self.flush_released();
    }
}
