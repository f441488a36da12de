use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tern_wire::{Packet, Properties, Protocol, QoS, Str, decode};
use tokio::time::Instant;

use super::*;
use crate::config::BrokerConfig;
use crate::message::Message;
use crate::metrics::Metrics;

fn message(topic: &'static str, payload: &'static [u8], props: Properties) -> Arc<Message> {
    Arc::new(Message::new(
        Str::from_static(topic),
        Bytes::from_static(payload),
        QoS::ExactlyOnce,
        false,
        props,
        None,
        Instant::now(),
    ))
}

pub(super) fn item(payload: &'static [u8], qos: QoS) -> Outgoing {
    Outgoing {
        message: message("t", payload, Properties::default()),
        qos,
        retain: false,
        subscription_ids: Vec::new(),
        share: None,
    }
}

fn packets(parts: &mut Vec<Bytes>, protocol: Protocol) -> Vec<Packet> {
    let mut buf = BytesMut::new();
    for part in parts.drain(..) {
        buf.extend_from_slice(&part);
    }
    let mut out = Vec::new();
    while let Some(packet) = decode(&mut buf, protocol, u32::MAX).unwrap() {
        out.push(packet);
    }
    assert!(buf.is_empty());
    out
}

pub(super) struct Fixture {
    pub(super) out: Outbound,
    writer: WriterState,
    pub(super) config: BrokerConfig,
    pub(super) metrics: Metrics,
}

impl Fixture {
    pub(super) fn new(window: usize) -> Self {
        let mut out = Outbound::default();
        out.attach(window);
        Fixture {
            out,
            writer: WriterState::new(Protocol::V5, u32::MAX, 0),
            config: BrokerConfig::default(),
            metrics: Metrics::default(),
        }
    }

    pub(super) fn push(&mut self, item: Outgoing) -> PushResult {
        self.out.push(item, true, &self.config, Instant::now())
    }

    pub(super) fn drain(&mut self) -> Vec<Packet> {
        let mut parts = Vec::new();
        let env = batch::BatchEnv {
            config: &self.config,
            metrics: &self.metrics,
            store: &crate::persist::MemoryStore,
            client_id: "c",
            persistent: false,
            now: Instant::now(),
        };
        self.out.fill_batch(&mut self.writer, &env, &mut parts);
        packets(&mut parts, self.writer.protocol)
    }
}

fn publish_summary(packets: &[Packet]) -> Vec<(Vec<u8>, u16, bool)> {
    packets
        .iter()
        .map(|p| match p {
            Packet::Publish(p) => (p.payload.to_vec(), p.packet_id, p.dup),
            other => panic!("expected PUBLISH, got {other:?}"),
        })
        .collect()
}

#[tokio::test]
async fn window_limits_inflight_and_qos0_waits_behind_it_in_order() {
    let mut f = Fixture::new(2);
    f.push(item(b"1", QoS::AtLeastOnce));
    f.push(item(b"2", QoS::AtLeastOnce));
    f.push(item(b"3", QoS::AtLeastOnce));
    f.push(item(b"4", QoS::AtMostOnce));
    assert_eq!(
        publish_summary(&f.drain()),
        vec![(b"1".to_vec(), 1, false), (b"2".to_vec(), 2, false)]
    );
    assert!(
        f.drain().is_empty(),
        "window full: 3 and the QoS 0 behind it wait"
    );
    assert!(f.out.on_puback(1).is_some());
    assert!(f.out.on_puback(1).is_none(), "unknown id is ignored");
    assert_eq!(
        publish_summary(&f.drain()),
        vec![(b"3".to_vec(), 3, false), (b"4".to_vec(), 0, false)]
    );
}

#[tokio::test]
async fn packet_ids_in_flight_are_never_reused_mqtt_2_2_1_3() {
    let mut f = Fixture::new(3);
    for _ in 0..3 {
        f.push(item(b"x", QoS::AtLeastOnce));
    }
    f.drain();
    // Free the middle one; the allocator must not hand out 1 or 3.
    f.out.on_puback(2);
    for _ in 0..200 {
        f.push(item(b"y", QoS::AtLeastOnce));
        let sent = publish_summary(&f.drain());
        let id = sent[0].1;
        assert!(id != 1 && id != 3, "id {id} reused while in flight");
        f.out.on_puback(id);
    }
}

#[tokio::test]
async fn reconnect_resends_inflight_with_dup_in_order_then_pubrel_then_queue_mqtt_4_4_0_1() {
    let mut f = Fixture::new(3);
    f.push(item(b"a", QoS::AtLeastOnce));
    f.push(item(b"b", QoS::ExactlyOnce));
    f.push(item(b"c", QoS::ExactlyOnce));
    f.push(item(b"d", QoS::AtLeastOnce));
    f.drain();
    assert!(f.out.on_pubrec(3, true), "c is now PUBREL pending");
    f.out.detach();
    f.out.attach(3);
    let resent = f.drain();
    assert_eq!(resent.len(), 3, "{resent:?}");
    assert!(
        matches!(&resent[0], Packet::Publish(p) if p.dup && p.packet_id == 1 && &p.payload[..] == b"a")
    );
    assert!(
        matches!(&resent[1], Packet::Publish(p) if p.dup && p.packet_id == 2 && &p.payload[..] == b"b")
    );
    // MQTT-4.4.0-1: PUBREL resent, never the PUBLISH of an acknowledged PUBREC.
    assert!(matches!(&resent[2], Packet::PubRel(a) if a.packet_id == 3));
    assert!(f.out.on_pubcomp(3).is_some());
    let rest = publish_summary(&f.drain());
    assert_eq!(rest, vec![(b"d".to_vec(), 4, false)]);
}

#[tokio::test]
async fn qos0_is_not_queued_offline_and_dropped_over_the_byte_limit() {
    let mut f = Fixture::new(10);
    assert_eq!(
        f.out.push(
            item(b"x", QoS::AtMostOnce),
            false,
            &f.config,
            Instant::now()
        ),
        PushResult::Dropped
    );
    f.config.outbound_queue_max_bytes = 140; // two small messages
    assert_eq!(f.push(item(b"1", QoS::AtMostOnce)), PushResult::Queued);
    assert_eq!(f.push(item(b"2", QoS::AtMostOnce)), PushResult::Queued);
    assert_eq!(f.push(item(b"3", QoS::AtMostOnce)), PushResult::Dropped);
    assert_eq!(
        f.push(item(b"q1", QoS::AtLeastOnce)),
        PushResult::Queued,
        "QoS>0 waits"
    );
    assert_eq!(f.drain().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn full_queue_past_the_slow_subscriber_timeout_is_reported() {
    let mut f = Fixture::new(10);
    f.config.outbound_queue_max_messages = 1;
    f.config.slow_subscriber_timeout_ms = 1_000;
    f.push(item(b"1", QoS::AtMostOnce));
    assert_eq!(f.push(item(b"2", QoS::AtMostOnce)), PushResult::Dropped);
    tokio::time::advance(Duration::from_millis(1_001)).await;
    assert_eq!(
        f.push(item(b"3", QoS::AtMostOnce)),
        PushResult::SlowSubscriber
    );
    f.drain();
    assert_eq!(
        f.push(item(b"4", QoS::AtMostOnce)),
        PushResult::Queued,
        "drained: reset"
    );
}

#[tokio::test]
async fn max_queued_messages_drops_the_oldest_reliable_message() {
    let mut f = Fixture::new(1);
    f.config.max_queued_messages = 2;
    f.push(item(b"inflight", QoS::AtLeastOnce));
    f.drain();
    f.push(item(b"1", QoS::AtLeastOnce));
    f.push(item(b"2", QoS::AtLeastOnce));
    assert_eq!(
        f.push(item(b"3", QoS::AtLeastOnce)),
        PushResult::QueuedDroppedOldest
    );
    f.out.on_puback(1);
    assert_eq!(publish_summary(&f.drain())[0].0, b"2".to_vec());
}

#[tokio::test(start_paused = true)]
async fn expired_messages_are_dropped_and_the_remaining_interval_forwarded_mqtt_3_3_2_5() {
    let mut f = Fixture::new(10);
    let expiring = |payload, seconds| Outgoing {
        message: message(
            "t",
            payload,
            tern_wire::PropertyValues {
                message_expiry_interval_s: Some(seconds),
                ..tern_wire::PropertyValues::default()
            }
            .into(),
        ),
        qos: QoS::AtLeastOnce,
        retain: false,
        subscription_ids: Vec::new(),
        share: None,
    };
    f.push(expiring(b"short", 2));
    f.push(expiring(b"long", 10));
    tokio::time::advance(Duration::from_secs(3)).await;
    let sent = f.drain();
    assert_eq!(sent.len(), 1);
    let Packet::Publish(p) = &sent[0] else {
        panic!("{sent:?}")
    };
    assert_eq!(&p.payload[..], b"long");
    assert_eq!(p.properties.message_expiry_interval_s, Some(7));
    assert_eq!(Metrics::get(&f.metrics.messages_dropped), 1);
}

#[tokio::test]
async fn too_large_for_the_client_is_skipped_and_counted_mqtt_3_1_2_25() {
    let mut f = Fixture::new(10);
    f.writer = WriterState::new(Protocol::V5, 30, 0);
    f.push(item(&[b'x'; 40], QoS::AtLeastOnce));
    f.push(item(b"small", QoS::AtLeastOnce));
    let sent = publish_summary(&f.drain());
    assert_eq!(
        sent,
        vec![(b"small".to_vec(), 1, false)],
        "the big one took no packet id"
    );
    assert_eq!(Metrics::get(&f.metrics.messages_dropped), 1);
}

#[tokio::test]
async fn outbound_topic_alias_sends_the_topic_once_mqtt_3_3_2_10() {
    let mut f = Fixture::new(10);
    f.writer = WriterState::new(Protocol::V5, u32::MAX, 4);
    f.push(item(b"1", QoS::AtMostOnce));
    f.push(item(b"2", QoS::AtMostOnce));
    let sent = f.drain();
    let (Packet::Publish(first), Packet::Publish(second)) = (&sent[0], &sent[1]) else {
        panic!("{sent:?}")
    };
    assert_eq!(first.topic.as_str(), "t");
    assert_eq!(first.properties.topic_alias, Some(1));
    assert_eq!(second.topic.as_str(), "");
    assert_eq!(second.properties.topic_alias, Some(1));
}

#[tokio::test]
async fn subscription_identifiers_only_for_v5() {
    for protocol in [Protocol::V5, Protocol::V3_1_1] {
        let mut f = Fixture::new(10);
        f.writer = WriterState::new(protocol, u32::MAX, 0);
        let mut it = item(b"1", QoS::AtLeastOnce);
        it.subscription_ids = vec![3, 9];
        f.push(it);
        let sent = f.drain();
        let Packet::Publish(p) = &sent[0] else {
            panic!("{sent:?}")
        };
        let want: Vec<u32> = if protocol.is_v5() { vec![3, 9] } else { vec![] };
        assert_eq!(p.properties.subscription_identifiers, want);
    }
}

#[tokio::test]
async fn shared_messages_are_taken_back_from_a_leaving_member() {
    let mut f = Fixture::new(1);
    let shared = |payload| Outgoing {
        share: Some("$share/g/t".into()),
        ..item(payload, QoS::AtLeastOnce)
    };
    f.push(shared(b"inflight"));
    f.drain();
    f.push(shared(b"queued"));
    f.push(item(b"own", QoS::AtLeastOnce));
    let taken: Vec<_> = f
        .out
        .take_shared()
        .into_iter()
        .map(|o| o.message.payload.clone())
        .collect();
    assert_eq!(taken.len(), 2);
    assert!(f.out.queues.inflight.is_empty());
    assert_eq!(f.out.queues.queue.len(), 1);
    assert_eq!(f.out.packet_ids.in_flight(), 0);
}

/// MQTT-4.8.2-4: a QoS 2 message in flight to a leaving member stays with it (its delivery is
/// completed when it reconnects); only QoS 1 in flight and queued messages are taken.
#[tokio::test]
async fn shared_qos2_in_flight_stays_with_a_leaving_member() {
    let mut f = Fixture::new(2);
    let shared = |payload, qos| Outgoing {
        share: Some("$share/g/t".into()),
        ..item(payload, qos)
    };
    f.push(shared(b"q2", QoS::ExactlyOnce));
    f.push(shared(b"q1", QoS::AtLeastOnce));
    f.drain();
    let taken: Vec<_> = f
        .out
        .take_shared()
        .into_iter()
        .map(|o| o.message.payload.clone())
        .collect();
    assert_eq!(taken, vec![Bytes::from_static(b"q1")]);
    assert_eq!(f.out.queues.inflight.len(), 1);
    assert_eq!(f.out.queues.inflight[0].item.qos, QoS::ExactlyOnce);
    assert_eq!(f.out.packet_ids.in_flight(), 1);
}

#[tokio::test]
async fn control_packets_keep_their_place_behind_queued_deliveries() {
    let mut f = Fixture::new(10);
    f.push(item(b"1", QoS::AtMostOnce));
    f.out.push_control(Bytes::from_static(&[0xD0, 0x00])); // PINGRESP
    f.push(item(b"2", QoS::AtMostOnce));
    let sent = f.drain();
    assert!(matches!(&sent[0], Packet::Publish(p) if &p.payload[..] == b"1"));
    assert_eq!(
        sent[1],
        Packet::PingResp,
        "a barrier for what was queued before it"
    );
    assert!(matches!(&sent[2], Packet::Publish(p) if &p.payload[..] == b"2"));
}

#[tokio::test]
async fn control_packets_overtake_a_delivery_waiting_for_the_window() {
    let mut f = Fixture::new(1);
    f.push(item(b"in flight", QoS::AtLeastOnce));
    f.drain();
    f.push(item(b"waits", QoS::AtLeastOnce));
    f.push(item(b"qos0 behind it", QoS::AtMostOnce));
    f.out.push_control(Bytes::from_static(&[0xD0, 0x00]));
    assert_eq!(
        f.drain(),
        vec![Packet::PingResp],
        "acks never wait for the client's acks"
    );
    f.out.on_puback(1);
    let rest = publish_summary(&f.drain());
    assert_eq!(rest[0].0, b"waits".to_vec());
    assert_eq!(rest[1].0, b"qos0 behind it".to_vec());
}

#[tokio::test]
async fn connack_goes_before_resends_and_the_offline_backlog() {
    let mut f = Fixture::new(2);
    f.push(item(b"a", QoS::AtLeastOnce));
    f.drain();
    f.out.detach();
    f.out.push(
        item(b"b", QoS::AtLeastOnce),
        false,
        &f.config,
        Instant::now(),
    );
    f.out.attach(2);
    f.out
        .push_control_first(Bytes::from_static(&[0x20, 0x02, 0x01, 0x00]));
    let sent = f.drain();
    assert!(matches!(&sent[0], Packet::ConnAck(c) if c.session_present));
    assert!(matches!(&sent[1], Packet::Publish(p) if p.dup && &p.payload[..] == b"a"));
    assert!(matches!(&sent[2], Packet::Publish(p) if !p.dup && &p.payload[..] == b"b"));
}

#[tokio::test]
async fn a_batch_stops_at_max_batch_bytes() {
    let mut f = Fixture::new(1000);
    static BIG: [u8; 100 * 1024] = [b'x'; 100 * 1024];
    for _ in 0..5 {
        f.push(item(&BIG, QoS::AtMostOnce));
    }
    assert_eq!(
        f.drain().len(),
        3,
        "3 x 100 KiB reach the 256 KiB batch limit"
    );
    assert_eq!(f.drain().len(), 2);
}

/// ARCHITECTURE §2.6: one message to 100 subscribers (v5 and 3.1.1, QoS 0/1/2, with and without
/// subscription identifiers) is written from one shared body per protocol version (QoS 0 without
/// per-subscriber fields: one shared packet), never copied per subscriber, and every subscriber
/// decodes exactly the message that was published.
#[tokio::test]
async fn one_shared_buffer_reaches_every_subscriber_unchanged() {
    let payload: &'static [u8] = b"shared payload: encoded once, written a hundred times";
    let props: Properties = tern_wire::PropertyValues {
        content_type: Some(Str::from_static("text/plain")),
        ..tern_wire::PropertyValues::default()
    }
    .into();
    let msg = message("fan/t", payload, props);
    // As the router marks a message it routes to more than one session.
    msg.mark_fan_out();
    let mut bodies: Vec<(Protocol, *const u8)> = Vec::new();
    let mut qos0_packets: Vec<(Protocol, *const u8)> = Vec::new();
    for i in 0..100u32 {
        let protocol = if i % 4 == 3 {
            Protocol::V3_1_1
        } else {
            Protocol::V5
        };
        let qos = [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce][(i % 3) as usize];
        let subscription_ids = if i % 5 == 0 { vec![i + 1] } else { Vec::new() };
        let mut f = Fixture::new(16);
        f.writer = WriterState::new(protocol, u32::MAX, 0);
        f.push(Outgoing {
            message: msg.clone(),
            qos,
            retain: false,
            subscription_ids: subscription_ids.clone(),
            share: None,
        });
        let mut parts = Vec::new();
        let env = batch::BatchEnv {
            config: &f.config,
            metrics: &f.metrics,
            store: &crate::persist::MemoryStore,
            client_id: "c",
            persistent: false,
            now: Instant::now(),
        };
        f.out.fill_batch(&mut f.writer, &env, &mut parts);
        let per_subscriber_fields =
            qos != QoS::AtMostOnce || (protocol.is_v5() && !subscription_ids.is_empty());
        if per_subscriber_fields {
            assert_eq!(parts.len(), 2, "small head + shared body");
            assert!(
                parts[0].len() < 32,
                "the head is only the per-delivery fields"
            );
            bodies.push((protocol, parts[1].as_ptr()));
        } else {
            assert_eq!(parts.len(), 1, "QoS 0 shares the whole packet");
            qos0_packets.push((protocol, parts[0].as_ptr()));
        }
        let decoded = packets(&mut parts, protocol);
        let [Packet::Publish(p)] = &decoded[..] else {
            panic!("expected one PUBLISH, got {decoded:?}");
        };
        assert_eq!(&p.payload[..], payload, "subscriber {i}");
        assert_eq!(p.topic.as_str(), "fan/t");
        assert_eq!(p.qos, qos);
        assert_eq!(p.packet_id != 0, qos != QoS::AtMostOnce);
        if protocol.is_v5() {
            assert_eq!(
                p.properties.content_type.as_ref().map(|s| s.as_str()),
                Some("text/plain")
            );
            assert_eq!(p.properties.subscription_identifiers, subscription_ids);
        } else {
            assert!(p.properties.content_type.is_none());
        }
    }
    // Every body (and every whole QoS 0 packet) of one protocol is the same allocation.
    for protocol in [Protocol::V5, Protocol::V3_1_1] {
        for (what, list) in [("body", &bodies), ("QoS 0 packet", &qos0_packets)] {
            let mut ptrs: Vec<_> = list
                .iter()
                .filter(|(p, _)| *p == protocol)
                .map(|(_, ptr)| *ptr)
                .collect();
            assert!(ptrs.len() > 5, "{what} {protocol:?}: too few cases");
            ptrs.dedup();
            assert_eq!(ptrs.len(), 1, "{what} {protocol:?} copied per subscriber");
        }
    }
    // The 3.1.1 body is the publisher's payload itself: zero copies end to end.
    let v3_body = bodies.iter().find(|(p, _)| *p == Protocol::V3_1_1).unwrap();
    assert_eq!(v3_body.1, msg.payload.as_ptr());
}

/// A message routed to one session only (not marked fan-out) whose body is its payload builds
/// no template: its head and payload are written into the batch buffer, one part per packet,
/// and the subscriber decodes exactly what was published (3.1.1 and 5.0, QoS 0 and 1).
#[tokio::test]
async fn a_single_subscriber_message_is_one_part_of_the_batch_buffer() {
    let payload: &'static [u8] = b"for one subscriber";
    for protocol in [Protocol::V3_1_1, Protocol::V5] {
        for qos in [QoS::AtMostOnce, QoS::AtLeastOnce] {
            let msg = message("one/t", payload, Properties::default());
            let mut f = Fixture::new(16);
            f.writer = WriterState::new(protocol, u32::MAX, 0);
            for _ in 0..2 {
                f.push(Outgoing {
                    message: msg.clone(),
                    qos,
                    retain: false,
                    subscription_ids: Vec::new(),
                    share: None,
                });
            }
            let mut parts = Vec::new();
            let env = batch::BatchEnv {
                config: &f.config,
                metrics: &f.metrics,
                store: &crate::persist::MemoryStore,
                client_id: "c",
                persistent: false,
                now: Instant::now(),
            };
            f.out.fill_batch(&mut f.writer, &env, &mut parts);
            assert_eq!(
                parts.len(),
                1,
                "{protocol:?} {qos:?}: both in the batch buffer"
            );
            assert_ne!(parts[0].as_ptr(), msg.payload.as_ptr());
            let decoded = packets(&mut parts, protocol);
            assert_eq!(decoded.len(), 2);
            for packet in decoded {
                let Packet::Publish(p) = packet else {
                    panic!("expected a PUBLISH, got {packet:?}");
                };
                assert_eq!(&p.payload[..], payload);
                assert_eq!(p.topic.as_str(), "one/t");
                assert_eq!(p.qos, qos);
                assert_eq!(p.packet_id != 0, qos != QoS::AtMostOnce);
                assert!(p.properties.is_empty());
            }
        }
    }
}

/// Issue 11 item 2: an offline session keeps at most `max_queued_bytes` of QoS>0 messages,
/// dropping the oldest (as many as it takes); a message alone over the limit is kept alone.
#[tokio::test]
async fn max_queued_bytes_keeps_the_newest_and_drops_the_oldest_offline() {
    let mut f = Fixture::new(10);
    let len = item(b"1", QoS::AtLeastOnce).message.approx_len();
    f.config.max_queued_bytes = 3 * len;
    let now = Instant::now();
    for payload in [b"1", b"2", b"3", b"4", b"5"] {
        f.out
            .push(item(payload, QoS::AtLeastOnce), false, &f.config, now);
    }
    assert_eq!(f.out.dropped_oldest, 2);
    assert_eq!(f.out.queued_reliable, 3);
    assert_eq!(f.out.queued_reliable_bytes, 3 * len);
    assert_eq!(f.out.queued_bytes, 3 * len);
    let got: Vec<Vec<u8>> = publish_summary(&f.drain())
        .into_iter()
        .map(|p| p.0)
        .collect();
    assert_eq!(got, vec![b"3".to_vec(), b"4".to_vec(), b"5".to_vec()]);

    // One message bigger than the limit replaces everything queued and is kept alone.
    f.config.max_queued_bytes = len;
    f.out
        .push(item(b"a", QoS::AtLeastOnce), false, &f.config, now);
    assert_eq!(
        f.out
            .push(item(b"big!", QoS::AtLeastOnce), false, &f.config, now),
        PushResult::QueuedDroppedOldest
    );
    assert_eq!(f.out.queued_reliable, 1);
    assert_eq!(f.out.dropped_oldest, 3);
}

/// An idle session keeps no queues (ARCHITECTURE §6.2): the first packet allocates them, and
/// the batch that finds nothing to send once everything is acknowledged frees them.
#[tokio::test]
async fn queues_exist_only_while_they_hold_something() {
    let mut f = Fixture::new(10);
    assert!(!f.out.queues.is_allocated());
    f.out.push_control(Bytes::from_static(&[0xd0, 0]));
    f.push(item(b"a", QoS::AtLeastOnce));
    assert!(f.out.queues.is_allocated());
    assert_eq!(f.drain().len(), 2);
    // The PUBLISH is in flight: the queues stay.
    assert!(f.drain().is_empty());
    assert!(f.out.queues.is_allocated());
    let id = f.out.queues.inflight[0].packet_id;
    assert!(f.out.on_puback(id).is_some());
    assert!(f.drain().is_empty());
    assert!(!f.out.queues.is_allocated());
    // Ids keep rotating across the release (MQTT-2.2.1-3 holds either way; a late duplicate
    // PUBACK then names no new message).
    f.push(item(b"b", QoS::AtLeastOnce));
    assert_eq!(f.drain().len(), 1);
    assert_ne!(f.out.queues.inflight[0].packet_id, id);
}
