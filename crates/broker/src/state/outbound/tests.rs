use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tern_wire::{Packet, Properties, Protocol, QoS, Str, decode};
use tokio::time::Instant;

use super::holds::Removed;
use super::*;
use crate::config::BrokerConfig;
use crate::metrics::Metrics;
use crate::model::message::Message;

/// The write batch's tests.
mod batching;

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
    pub(super) fn new(window: u16) -> Self {
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

    /// One writer batch, as the parts a transport would write.
    pub(super) fn fill_parts(&mut self) -> Vec<Bytes> {
        let mut bufs = BatchBufs::default();
        let env = batch::BatchEnv {
            config: &self.config,
            metrics: &self.metrics,
            store: &crate::model::MemoryStore,
            client_id: "c",
            persistent: false,
            now: Instant::now(),
        };
        self.out.fill_batch(&mut self.writer, &env, &mut bufs);
        bufs.take_parts()
    }

    pub(super) fn drain(&mut self) -> Vec<Packet> {
        let mut parts = self.fill_parts();
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

/// Issue 24 item 3: retention removing a range drops the queued copies in it (the queue skips
/// ahead) and keeps the in-flight ones (resent from memory, MQTT-4.4.0-1), counting the QoS 1
/// ones among them as exposed: no record pins them across a restart.
#[test]
fn removed_ranges_drop_queued_copies_and_count_inflight_qos1_as_exposed() {
    let mut f = Fixture::new(2);
    for (seq, qos) in [
        (5, QoS::AtLeastOnce),
        (6, QoS::ExactlyOnce),
        (7, QoS::AtLeastOnce),
    ] {
        f.push(stored_item(b"x", qos, seq));
    }
    // The window of 2 takes seqs 5 and 6 in flight; 7 stays queued.
    f.fill_parts();
    let out = &mut f.out;
    assert_eq!(out.queues.inflight.len(), 2);
    let effect = out.drop_removed(&[(0, 1..=10)]);
    assert_eq!(
        effect,
        Removed {
            dropped: 1,
            inflight_exposed: 1
        }
    );
    assert_eq!(out.queues.inflight.len(), 2, "in-flight messages are kept");
    assert!(out.queues.queue.is_empty());
    // A range that holds none of them changes nothing.
    assert_eq!(
        out.drop_removed(&[(0, 20..=30)]),
        Removed {
            dropped: 0,
            inflight_exposed: 0
        }
    );
}
