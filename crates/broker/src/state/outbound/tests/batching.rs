//! The write batch: its size limit, one shared buffer for every subscriber of a fan-out, and
//! the batch buffer holding single-subscriber packets contiguously.

use super::*;

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
        let mut parts = f.fill_parts();
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
            let mut parts = f.fill_parts();
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
