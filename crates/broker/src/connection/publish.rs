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
        let v5 = self.protocol.is_v5();
        if !publish.properties.subscription_identifiers.is_empty() {
            // MQTT-3.3.4-6: a client's PUBLISH must not carry a Subscription Identifier.
            return Err(Close::Protocol(ReasonCode::PROTOCOL_ERROR));
        }
        let topic = if v5 {
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
        let sys_topic = topic_str.starts_with("$SYS/") || topic_str == "$SYS";
        let packet_id = publish.packet_id;
        let qos = publish.qos;
        Metrics::add(
            &self.shared.metrics.messages_received_by_qos[usize::from(qos as u8)],
            1,
        );

        // MQTT-3.3.4-9 (v5 §4.9): one more exchange than our Receive Maximum is refused,
        // after reading it and before anything else happens to it. A retry of an exchange
        // counted already counts nothing (`quota`).
        // MQTT 3.1.1 has no Receive Maximum: its exchanges take pipeline room instead, so a
        // burst (paho resends everything it holds at once after a reconnect) is slowed down by
        // backpressure, never disconnected. Its received set is bounded by the 65,535 packet
        // ids.
        let counted = if qos == QoS::AtMostOnce || !self.protocol.is_v5() {
            false
        } else {
            self.inflight
                .get(&self.shared)
                .quota
                .admit(packet_id, self.shared.config.receive_maximum)
                .map_err(|_| Close::Protocol(ReasonCode::RECEIVE_MAXIMUM_EXCEEDED))?
        };
        if qos == QoS::ExactlyOnce {
            // ARCHITECTURE §3: a packet id still in the received set is a retry: PUBREC only.
            // Its PUBREC waits for the original's write, which may still be pending on a
            // connection that died (found by the simulator: PUBREC before the message was
            // durable). The original's insert and append are one step under the session lock
            // (below), so the store knows the write of any id found here.
            let duplicate = self.session.state.lock().qos2_received.contains(packet_id);
            if duplicate {
                let mut ticket = self
                    .shared
                    .store
                    .messages
                    .qos2_retry(&self.session.client_id, packet_id);
                if publish.retain && !sys_topic && !topic_str.starts_with("$tern/") {
                    // The original's retained record may be lost where its message record
                    // (and so this retry) survived a power loss: the retry carries the whole
                    // message, apply it again, and the PUBREC waits for that write too (found
                    // by the broker simulator, docs/simulation.md finding 7).
                    let message = Arc::new(Message::new(
                        topic.clone(),
                        publish.payload.clone(),
                        qos,
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
                return Ok(());
            }
        }

        let mut reason = ReasonCode::SUCCESS;
        let mut route = true;
        if v5
            && publish.properties.payload_format_indicator == Some(1)
            && std::str::from_utf8(&publish.payload).is_err()
        {
            // MQTT-3.3.2-4 allows refusing it; QoS 0 has no ack to carry the refusal.
            if qos == QoS::AtMostOnce {
                return Err(Close::Protocol(ReasonCode::PAYLOAD_FORMAT_INVALID));
            }
            reason = ReasonCode::PAYLOAD_FORMAT_INVALID;
            route = false;
        }
        if sys_topic || topic.starts_with("$tern/") {
            // Clients may not publish into the broker's own statistics, nor into the topic
            // space of the store's control records.
            route = false;
        }
        if route && reason.is_success() && !self.may_write(topic_str) {
            if qos == QoS::AtMostOnce {
                return Ok(());
            }
            // As mosquitto: v5 PUBACK / PUBREC 0x87 (a PUBREC >= 0x80 ends the exchange);
            // 3.1.1 acks carry no reason, so the message is acknowledged and dropped.
            reason = ReasonCode::NOT_AUTHORIZED;
            route = false;
        }
        if route && reason.is_success() && self.limit_reached(topic_str, qos) {
            if qos == QoS::AtMostOnce {
                // No ack to carry a refusal: dropped, counted (disk budget only; the memory
                // bound drops QoS 0 per subscriber as it is queued).
                return Ok(());
            }
            if !v5 {
                // 3.1.1 has no negative PUBACK: close without acknowledging, so that the
                // client sends the message again on its next connection (ARCHITECTURE §6).
                return Err(Close::Protocol(ReasonCode::QUOTA_EXCEEDED));
            }
            reason = ReasonCode::QUOTA_EXCEEDED;
            route = false;
        }

        let message = Arc::new(Message::new(
            topic,
            publish.payload,
            qos,
            publish.retain,
            publish.properties,
            Some(self.session.client_id.clone()),
            self.now,
        ));
        let exactly_once = qos == QoS::ExactlyOnce && reason.is_success();
        // The received set and the write change together under the session lock: a retry
        // on another connection that finds the id also finds its write (`qos2_retry`).
        let session = self.session.clone();
        let mut state = exactly_once.then(|| session.state.lock());
        // Only a session that can outlive this connection needs its received set on disk: one
        // with expiry 0 ends with the connection and is never resumed (a takeover replaces it,
        // `registry::attach`), and a DISCONNECT may not raise its expiry (MQTT-3.14.2-2).
        // Within the connection the ack pipeline orders a retry's PUBREC after the original's
        // write. Without the record its PUBREL writes nothing either (`qos2_released`).
        let mut durable_rx = None;
        if let Some(state) = state.as_mut() {
            state.qos2_received.insert(packet_id);
            if state.expiry_interval_s > 0 {
                durable_rx = Some(packet_id);
            }
        }
        // The store decides by the stream's durability policy whether to write; the pipeline
        // waits only if it did (ARCHITECTURE §4.3).
        let ticket = if route {
            self.shared
                .store
                .messages
                .append_publish(&self.session.client_id, &message, durable_rx)
        } else {
            None
        };
        if let (Some(state), Some(true)) = (
            state.as_mut(),
            ticket.as_ref().map(crate::model::Ticket::is_refused),
        ) {
            // Refused at once (the stream failed on an earlier EIO): no record exists for a
            // retry to wait on (`qos2_retry`), so the id leaves the received set again and the
            // publisher's resend is handled, and refused, as new, never PUBREC'd with nothing
            // durable (found by the broker simulator with `--eio`, docs/simulation.md
            // finding 6).
            state.qos2_received.remove(packet_id);
        }
        drop(state);
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
            deliver_after_durable: qos == QoS::ExactlyOnce,
            counted,
        });
        Ok(())
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
            (
                ReasonCode::SUCCESS,
                self.shared
                    .store
                    .messages
                    .qos2_released(&self.session.client_id, ack.packet_id),
            )
        } else if self.protocol.is_v5() {
            (ReasonCode::PACKET_IDENTIFIER_NOT_FOUND, None)
        } else {
            (ReasonCode::SUCCESS, None)
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
