//! QoS 0/1/2 in both directions and both versions, acknowledgement order, QoS downgrade,
//! packet identifiers, QoS 2 duplicate PUBLISH and PUBREL retransmission, malformed PUBLISH.

mod common;

use std::collections::HashSet;

use bytes::Bytes;
use common::Broker;
use common::raw::*;
use common::rumq::{v4, v5};

/// (3.1.1) MQTT-3.3.4-1, MQTT-4.3.1-1, MQTT-4.3.2-1, MQTT-4.3.3-1 through rumqttc v4: a QoS 2
/// subscriber receives what is published at QoS 0, 1 and 2, each at the published QoS.
#[tokio::test]
async fn v311_qos_0_1_2_round_trip_rumqttc() {
    let b = Broker::start();
    let mut sub = v4::connect(v4::options(b.addr, "q-sub4")).await;
    sub.subscribe("q4/t", v4::QoS::ExactlyOnce).await;
    let mut publ = v4::connect(v4::options(b.addr, "q-pub4")).await;
    for (i, q) in [
        v4::QoS::AtMostOnce,
        v4::QoS::AtLeastOnce,
        v4::QoS::ExactlyOnce,
    ]
    .into_iter()
    .enumerate()
    {
        let payload = format!("m{i}");
        publ.client
            .publish("q4/t", q, false, payload.clone())
            .await
            .unwrap();
        if q != v4::QoS::AtMostOnce {
            publ.expect_publish_done().await;
        }
        let got = sub.expect_publish().await;
        assert_eq!(got.topic, "q4/t");
        assert_eq!(&got.payload[..], payload.as_bytes());
        assert_eq!(got.qos, q);
        assert!(!got.retain);
    }
}

/// (v5) MQTT-3.3.4-1, MQTT-4.3.1-1, MQTT-4.3.2-1, MQTT-4.3.3-1 through rumqttc v5.
#[tokio::test]
async fn v5_qos_0_1_2_round_trip_rumqttc() {
    let b = Broker::start();
    let mut sub = v5::connect(v5::options(b.addr, "q-sub5")).await;
    sub.subscribe("q5/t", v5::QoS::ExactlyOnce).await;
    let mut publ = v5::connect(v5::options(b.addr, "q-pub5")).await;
    for (i, q) in [
        v5::QoS::AtMostOnce,
        v5::QoS::AtLeastOnce,
        v5::QoS::ExactlyOnce,
    ]
    .into_iter()
    .enumerate()
    {
        let payload = format!("m{i}");
        publ.client
            .publish("q5/t", q, false, payload.clone())
            .await
            .unwrap();
        if q != v5::QoS::AtMostOnce {
            publ.expect_publish_done().await;
        }
        let got = sub.expect_publish().await;
        assert_eq!(&got.topic[..], b"q5/t");
        assert_eq!(&got.payload[..], payload.as_bytes());
        assert_eq!(got.qos, q);
    }
}

/// A v5 publisher and a 3.1.1 subscriber (and the reverse) interoperate at every QoS.
#[tokio::test]
async fn cross_version_delivery() {
    let b = Broker::start();
    let mut s4 = RawClient::v4(b.addr, "x-s4").await;
    s4.sub("x/t", 2).await;
    let mut s5 = RawClient::v5(b.addr, "x-s5").await;
    s5.sub("x/t", 2).await;
    let mut p5 = RawClient::v5(b.addr, "x-p5").await;
    let mut p4 = RawClient::v4(b.addr, "x-p4").await;
    for q in 0..=2u8 {
        p5.publish_acked(publish(
            "x/t",
            format!("from5-{q}").as_bytes(),
            q,
            10 + q as u16,
        ))
        .await;
        for s in [&mut s4, &mut s5] {
            let got = s.receive_acked().await;
            assert_eq!(&got.payload[..], format!("from5-{q}").as_bytes());
            assert_eq!(got.qos, qos(q));
        }
        p4.publish_acked(publish(
            "x/t",
            format!("from4-{q}").as_bytes(),
            q,
            20 + q as u16,
        ))
        .await;
        for s in [&mut s4, &mut s5] {
            let got = s.receive_acked().await;
            assert_eq!(&got.payload[..], format!("from4-{q}").as_bytes());
        }
    }
}

/// (v5) MQTT-3.8.4-8 / (3.1.1) MQTT-3.8.4-6: delivery QoS is the minimum of the published QoS
/// and the granted QoS.
#[tokio::test]
async fn qos_is_downgraded_to_the_subscription() {
    let b = Broker::start();
    let mut s0 = RawClient::v5(b.addr, "dg-s0").await;
    s0.sub("dg/t", 0).await;
    let mut s1 = RawClient::v4(b.addr, "dg-s1").await;
    s1.sub("dg/t", 1).await;
    let mut p = RawClient::v5(b.addr, "dg-p").await;
    p.publish_acked(publish("dg/t", b"two", 2, 5)).await;
    let g0 = s0.expect_publish().await;
    assert_eq!(g0.qos, QoS::AtMostOnce);
    assert_eq!(g0.packet_id, 0, "MQTT-2.2.1-2: no packet id at QoS 0");
    assert!(!g0.dup, "MQTT-3.3.1-2: DUP 0 at QoS 0");
    let g1 = s1.receive_acked().await;
    assert_eq!(g1.qos, QoS::AtLeastOnce);
    assert_ne!(g1.packet_id, 0);
}

/// Acknowledgements go out in the order of the PUBLISH packets (design §2.5; the order rule
/// MQTT-4.6.0-2/-3 applied to the server), for a burst mixing QoS 1 and QoS 2.
#[tokio::test]
async fn acks_are_sent_in_packet_order() {
    let b = Broker::start();
    let mut p = RawClient::v5(b.addr, "order-p").await;
    let mut expected = Vec::new();
    let mut bytes = bytes::BytesMut::new();
    for i in 1..=40u16 {
        let q = if i % 3 == 0 { 2 } else { 1 };
        let pkt = Packet::Publish(publish("order/t", format!("{i}").as_bytes(), q, i));
        tern_wire::encode(&pkt, Protocol::V5, &mut bytes).unwrap();
        expected.push((q, i));
    }
    p.send_bytes(&bytes).await; // one write: the broker sees a pipelined burst
    for (q, i) in expected {
        match (q, p.expect_packet().await) {
            (1, Packet::PubAck(a)) if a.packet_id == i => {}
            (2, Packet::PubRec(a)) if a.packet_id == i => {}
            (_, other) => panic!("expected ack of {i} (QoS {q}), got {other:?}"),
        }
    }
}

/// (v5) MQTT-2.2.1-4 / (3.1.1) MQTT-2.3.1-4: packet ids of PUBLISHes in flight to a subscriber
/// are non-zero and distinct.
#[tokio::test]
async fn outbound_packet_ids_are_unique_while_in_flight() {
    let b = Broker::start();
    let mut s = RawClient::v5(b.addr, "pid-s").await;
    s.sub("pid/t", 1).await;
    let mut p = RawClient::v5(b.addr, "pid-p").await;
    for i in 1..=30u16 {
        p.publish_acked(publish("pid/t", b"x", 1, i)).await;
    }
    let mut ids = HashSet::new();
    for _ in 0..30 {
        let got = s.expect_publish().await; // not acknowledged: all stay in flight
        assert_ne!(got.packet_id, 0);
        assert!(
            ids.insert(got.packet_id),
            "packet id {} reused while in flight",
            got.packet_id
        );
    }
}

/// (v5) MQTT-4.3.3-10 / (3.1.1) MQTT-4.3.3-2: until PUBREL, a repeated QoS 2 PUBLISH with the
/// same packet id is answered with PUBREC and is NOT delivered again.
#[tokio::test]
async fn qos2_duplicate_publish_is_not_delivered_twice() {
    for protocol in [Protocol::V5, Protocol::V3_1_1] {
        let b = Broker::start();
        let mut s = RawClient::connect_ok(b.addr, connect_packet(protocol, "dup2-s", true, 0))
            .await
            .0;
        s.sub("dup2/t", 2).await;
        let mut p = RawClient::connect_ok(b.addr, connect_packet(protocol, "dup2-p", true, 0))
            .await
            .0;
        let first = publish("dup2/t", b"once", 2, 7);
        p.send(&Packet::Publish(first.clone())).await;
        assert!(matches!(p.expect_packet().await, Packet::PubRec(a) if a.packet_id == 7));
        let mut again = first;
        again.dup = true;
        p.send(&Packet::Publish(again)).await;
        assert!(
            matches!(p.expect_packet().await, Packet::PubRec(a) if a.packet_id == 7),
            "{protocol:?}"
        );
        // MQTT-4.3.3-10 says "any subsequent PUBLISH" with that id: also one without DUP.
        p.send(&Packet::Publish(publish("dup2/t", b"once", 2, 7)))
            .await;
        assert!(
            matches!(p.expect_packet().await, Packet::PubRec(a) if a.packet_id == 7),
            "{protocol:?}"
        );
        p.send(&Packet::PubRel(ack(7))).await;
        assert!(matches!(p.expect_packet().await, Packet::PubComp(a) if a.packet_id == 7));
        p.publish_acked(publish("dup2/t", b"marker", 0, 0)).await;
        assert_eq!(&s.receive_acked().await.payload[..], b"once");
        assert_eq!(
            &s.receive_acked().await.payload[..],
            b"marker",
            "{protocol:?}: duplicate delivered"
        );
    }
}

/// (v5) MQTT-4.3.3-11: every PUBREL is answered with PUBCOMP, also a retransmitted one after
/// the PUBCOMP was sent (v5: reason 0x00 or 0x92 Packet Identifier not found); the message is
/// delivered once. (3.1.1) MQTT-4.3.3-2 covers the same response.
#[tokio::test]
async fn qos2_pubrel_retransmission_gets_pubcomp() {
    let b = Broker::start();
    let mut s = RawClient::v5(b.addr, "rel-s").await;
    s.sub("rel/t", 2).await;
    let mut p = RawClient::v5(b.addr, "rel-p").await;
    p.publish_acked(publish("rel/t", b"one", 2, 9)).await;
    p.send(&Packet::PubRel(ack(9))).await;
    match p.expect_packet().await {
        Packet::PubComp(a) => {
            assert_eq!(a.packet_id, 9);
            assert!(
                a.reason == ReasonCode::SUCCESS
                    || a.reason == ReasonCode::PACKET_IDENTIFIER_NOT_FOUND,
                "{:?}",
                a.reason
            );
        }
        other => panic!("expected PUBCOMP, got {other:?}"),
    }
    p.publish_acked(publish("rel/t", b"marker", 0, 0)).await;
    assert_eq!(&s.receive_acked().await.payload[..], b"one");
    assert_eq!(&s.receive_acked().await.payload[..], b"marker");

    // 3.1.1: same exchange.
    let mut p4 = RawClient::v4(b.addr, "rel-p4").await;
    p4.publish_acked(publish("rel/t", b"two", 2, 9)).await;
    p4.send(&Packet::PubRel(ack(9))).await;
    assert!(matches!(p4.expect_packet().await, Packet::PubComp(a) if a.packet_id == 9));
}

/// (v5) MQTT-4.4.0-1, MQTT-4.3.3-10: the QoS 2 received state belongs to the session: after a
/// reconnect (clean start 0) the client's retried PUBLISH gets PUBREC without a second
/// delivery, and its PUBREL gets PUBCOMP 0x00.
#[tokio::test]
async fn qos2_state_survives_reconnect() {
    let b = Broker::start();
    let mut s = RawClient::v5(b.addr, "rc2-s").await;
    s.sub("rc2/t", 2).await;
    let mut c = connect_packet(Protocol::V5, "rc2-p", true, 0);
    c.properties.session_expiry_interval_s = Some(60);
    let mut p = RawClient::connect_ok(b.addr, c.clone()).await.0;
    let msg = publish("rc2/t", b"exactly-once", 2, 33);
    p.send(&Packet::Publish(msg.clone())).await;
    assert!(matches!(p.expect_packet().await, Packet::PubRec(a) if a.packet_id == 33));
    p.drop_connection().await;

    c.clean_start = false;
    let (mut p, ca) = RawClient::connect_ok(b.addr, c).await;
    assert!(ca.session_present, "MQTT-3.2.2-3");
    let mut retry = msg;
    retry.dup = true;
    p.send(&Packet::Publish(retry)).await;
    assert!(matches!(p.expect_packet().await, Packet::PubRec(a) if a.packet_id == 33));
    p.send(&Packet::PubRel(ack(33))).await;
    match p.expect_packet().await {
        Packet::PubComp(a) => assert_eq!((a.packet_id, a.reason), (33, ReasonCode::SUCCESS)),
        other => panic!("expected PUBCOMP, got {other:?}"),
    }
    p.publish_acked(publish("rc2/t", b"marker", 0, 0)).await;
    assert_eq!(&s.receive_acked().await.payload[..], b"exactly-once");
    assert_eq!(&s.receive_acked().await.payload[..], b"marker");
}

/// (v5) MQTT-4.3.3-12: after PUBCOMP, a PUBLISH reusing the packet id is a new message.
#[tokio::test]
async fn qos2_packet_id_reuse_after_pubcomp_is_new_message() {
    let b = Broker::start();
    let mut s = RawClient::v5(b.addr, "reuse-s").await;
    s.sub("reuse/t", 2).await;
    let mut p = RawClient::v5(b.addr, "reuse-p").await;
    p.publish_acked(publish("reuse/t", b"first", 2, 1)).await;
    p.publish_acked(publish("reuse/t", b"second", 2, 1)).await;
    assert_eq!(&s.receive_acked().await.payload[..], b"first");
    assert_eq!(&s.receive_acked().await.payload[..], b"second");
}

/// (v5) MQTT-4.3.2-5: after PUBACK, a QoS 1 PUBLISH with the same packet id is a new message.
#[tokio::test]
async fn qos1_packet_id_reuse_after_puback_is_new_message() {
    let b = Broker::start();
    let mut s = RawClient::v5(b.addr, "reuse1-s").await;
    s.sub("reuse1/t", 1).await;
    let mut p = RawClient::v5(b.addr, "reuse1-p").await;
    p.publish_acked(publish("reuse1/t", b"a", 1, 4)).await;
    let mut second = publish("reuse1/t", b"b", 1, 4);
    second.dup = true;
    p.publish_acked(second).await;
    assert_eq!(&s.receive_acked().await.payload[..], b"a");
    assert_eq!(&s.receive_acked().await.payload[..], b"b");
}

/// Outbound QoS 2 to a subscriber: PUBLISH → PUBREC → PUBREL → PUBCOMP with the same id
/// (v5 MQTT-4.3.3-4, MQTT-2.2.1-5), and a DUP 0 first transmission (MQTT-4.3.3-2).
#[tokio::test]
async fn outbound_qos2_handshake() {
    let b = Broker::start();
    let mut s = RawClient::v5(b.addr, "out2-s").await;
    s.sub("out2/t", 2).await;
    let mut p = RawClient::v5(b.addr, "out2-p").await;
    p.publish_acked(publish("out2/t", b"x", 2, 3)).await;
    let got = s.expect_publish().await;
    assert_eq!(got.qos, QoS::ExactlyOnce);
    assert!(!got.dup);
    s.send(&Packet::PubRec(ack(got.packet_id))).await;
    match s.expect_packet().await {
        Packet::PubRel(a) => assert_eq!(a.packet_id, got.packet_id),
        other => panic!("expected PUBREL, got {other:?}"),
    }
    s.send(&Packet::PubComp(ack(got.packet_id))).await;
    assert!(s.ping().await.is_empty(), "nothing more after PUBCOMP");
}

/// (3.1.1) MQTT-3.3.1-4 / (v5) MQTT-3.3.1-4: a PUBLISH with both QoS bits set is malformed and
/// closes the connection (hand-written bytes: 0x36).
#[tokio::test]
async fn publish_qos_3_closes_connection() {
    let b = Broker::start();
    let mut c = RawClient::v4(b.addr, "qos3").await;
    // PUBLISH flags 0110 (QoS 3), topic "a", packet id 1, payload "x".
    c.send_bytes(&[0x36, 0x06, 0x00, 0x01, b'a', 0x00, 0x01, b'x'])
        .await;
    c.expect_closed_silently().await;
    let mut c = RawClient::v5(b.addr, "qos3-5").await;
    c.send_bytes(&[0x36, 0x07, 0x00, 0x01, b'a', 0x00, 0x01, 0x00, b'x'])
        .await;
    let before = c.expect_closed().await;
    assert!(
        before.iter().all(
            |p| matches!(p, Packet::Disconnect(d) if d.reason == ReasonCode::MALFORMED_PACKET)
        ),
        "{before:?}"
    );
}

/// (3.1.1) MQTT-3.3.2-2 / (v5) MQTT-3.3.2-2: a Topic Name with a wildcard closes the
/// connection (v5: DISCONNECT 0x90 Topic Name invalid, if sent); nothing is delivered.
#[tokio::test]
async fn publish_to_wildcard_topic_closes_connection() {
    let b = Broker::start();
    let mut s = RawClient::v5(b.addr, "wc-s").await;
    s.sub("#", 0).await;
    let mut c = RawClient::v5(b.addr, "wc-5").await;
    // v5 PUBLISH QoS 0 topic "a/+" props 0 payload "x"
    c.send_bytes(&[0x30, 0x07, 0x00, 0x03, b'a', b'/', b'+', 0x00, b'x'])
        .await;
    let before = c.expect_closed().await;
    assert!(before.iter().all(|p| matches!(p, Packet::Disconnect(d) if d.reason == ReasonCode::TOPIC_NAME_INVALID || d.reason == ReasonCode::MALFORMED_PACKET || d.reason == ReasonCode::PROTOCOL_ERROR)), "{before:?}");
    let mut c = RawClient::v4(b.addr, "wc-4").await;
    c.send_bytes(&[0x30, 0x06, 0x00, 0x03, b'a', b'/', b'#', b'x'])
        .await;
    c.expect_closed_silently().await;
    let mut p = RawClient::v5(b.addr, "wc-p").await;
    p.publish_acked(publish("m", b"marker", 0, 0)).await;
    assert_eq!(&s.expect_publish().await.payload[..], b"marker");
}

/// (v5) MQTT-3.3.1-2 / MQTT-4.3.1-1: QoS 0 deliveries have DUP 0 and no packet id; the payload
/// arrives byte for byte (binary, empty, and 100 KiB).
#[tokio::test]
async fn qos0_payloads_arrive_intact() {
    let b = Broker::start();
    let mut s = RawClient::v5(b.addr, "pl-s").await;
    s.sub("pl/#", 0).await;
    let mut p = RawClient::v5(b.addr, "pl-p").await;
    let big: Vec<u8> = (0..100 * 1024).map(|i| (i % 251) as u8).collect();
    for payload in [vec![], vec![0u8, 0xff, 0x80], big] {
        p.publish_acked(publish("pl/x", &payload, 0, 0)).await;
        let got = s.expect_publish().await;
        assert_eq!(got.payload, Bytes::from(payload));
        assert!(!got.dup);
        assert_eq!(got.packet_id, 0);
    }
}

/// Design §2.6/§4.3 ("test the mixed cases on purpose") and (v5) MQTT-4.6.0-5/-6: a pipelined
/// burst mixing QoS 0, 1 and 2 on one topic reaches every subscriber in the publisher's order,
/// whatever the subscription QoS (2, 1, 0) and protocol version; the publisher's acks come in
/// packet order.
#[tokio::test]
async fn mixed_qos_burst_keeps_publisher_order() {
    const N: u16 = 90;
    let b = Broker::start();
    let mut s2 = RawClient::v5(b.addr, "mix-s2").await;
    s2.sub("mix/t", 2).await;
    let mut s1 = RawClient::v4(b.addr, "mix-s1").await;
    s1.sub("mix/t", 1).await;
    let mut s0 = RawClient::v5(b.addr, "mix-s0").await;
    s0.sub("mix/t", 0).await;
    let mut p = RawClient::v5(b.addr, "mix-p").await;
    let mut bytes = bytes::BytesMut::new();
    let mut acks = Vec::new();
    for i in 0..N {
        let q = (i % 3) as u8;
        let id = if q == 0 { 0 } else { i + 1 };
        let pkt = Packet::Publish(publish("mix/t", format!("{i}").as_bytes(), q, id));
        tern_wire::encode(&pkt, Protocol::V5, &mut bytes).unwrap();
        if q > 0 {
            acks.push((q, id));
        }
    }
    p.send_bytes(&bytes).await;
    let mut next_ack = 0;
    let mut pubcomps = 0;
    while next_ack < acks.len() || pubcomps < acks.iter().filter(|a| a.0 == 2).count() {
        match p.expect_packet().await {
            Packet::PubAck(a) => {
                assert_eq!((1, a.packet_id), acks[next_ack], "ack order");
                next_ack += 1;
            }
            Packet::PubRec(a) => {
                assert_eq!((2, a.packet_id), acks[next_ack], "ack order");
                next_ack += 1;
                p.send(&Packet::PubRel(ack(a.packet_id))).await;
            }
            Packet::PubComp(_) => pubcomps += 1,
            other => panic!("publisher got {}", brief(&other)),
        }
    }
    for (name, s) in [
        ("qos2 sub", &mut s2),
        ("qos1 sub (3.1.1)", &mut s1),
        ("qos0 sub", &mut s0),
    ] {
        for i in 0..N {
            let got = s.receive_acked().await;
            assert_eq!(
                &got.payload[..],
                format!("{i}").as_bytes(),
                "{name}: order broken at {i}"
            );
        }
    }
}

/// Fan-out: five subscribers (both versions) each get all 100 QoS 1 messages in order.
#[tokio::test]
async fn fan_out_to_many_subscribers_in_order() {
    let b = Broker::start();
    let mut subs = Vec::new();
    for i in 0..5 {
        let protocol = if i % 2 == 0 {
            Protocol::V5
        } else {
            Protocol::V3_1_1
        };
        let mut s = RawClient::connect_ok(
            b.addr,
            connect_packet(protocol, &format!("fan-{i}"), true, 0),
        )
        .await
        .0;
        s.sub("fan/+", 1).await;
        subs.push(s);
    }
    let mut p = RawClient::v5(b.addr, "fan-p").await;
    for i in 1..=100u16 {
        p.publish_acked(publish("fan/x", format!("{i}").as_bytes(), 1, i))
            .await;
    }
    for (n, s) in subs.iter_mut().enumerate() {
        for i in 1..=100u16 {
            let got = s.receive_acked().await;
            assert_eq!(
                &got.payload[..],
                format!("{i}").as_bytes(),
                "subscriber {n}"
            );
        }
    }
}

/// Several publishers at once, QoS 2, pipelined: every message reaches the subscriber exactly
/// once, each publisher's messages in its order (MQTT-4.3.3-10 / MQTT-4.6.0-6 under load).
#[tokio::test]
async fn concurrent_qos2_publishers_exactly_once_in_order() {
    const PUBLISHERS: u32 = 4;
    const EACH: u32 = 150;
    let b = Broker::start();
    let mut s = RawClient::v5(b.addr, "cc-s").await;
    s.sub("cc/#", 2).await;
    let mut tasks = Vec::new();
    for n in 0..PUBLISHERS {
        let mut p = RawClient::v5(b.addr, &format!("cc-p{n}")).await;
        tasks.push(tokio::spawn(async move {
            let mut bytes = bytes::BytesMut::new();
            for i in 0..EACH {
                let m = publish(&format!("cc/{n}"), &i.to_be_bytes(), 2, i as u16 + 1);
                tern_wire::encode(&Packet::Publish(m), Protocol::V5, &mut bytes).unwrap();
            }
            p.send_bytes(&bytes).await;
            let mut comps = 0;
            while comps < EACH {
                match p.expect_packet().await {
                    Packet::PubRec(a) => p.send(&Packet::PubRel(ack(a.packet_id))).await,
                    Packet::PubComp(_) => comps += 1,
                    other => panic!("publisher {n}: {}", brief(&other)),
                }
            }
        }));
    }
    let mut next = vec![0u32; PUBLISHERS as usize];
    for _ in 0..PUBLISHERS * EACH {
        let m = s.receive_acked().await;
        let n: usize = m.topic.as_str()["cc/".len()..].parse().unwrap();
        let i = u32::from_be_bytes(m.payload[..4].try_into().unwrap());
        assert_eq!(i, next[n], "publisher {n}: duplicate, gap or reorder");
        next[n] += 1;
    }
    for t in tasks {
        t.await.expect("publisher task");
    }
    assert!(s.ping().await.is_empty(), "extra deliveries");
}

/// MQTT 3.1.1 has no Receive Maximum: a client with more QoS 1 and QoS 2 exchanges open than
/// ours (here 4) is slowed down by backpressure, never disconnected (paho resends everything it
/// holds at once after a reconnect; a disconnect there is a reconnect loop).
#[tokio::test]
async fn a_3_1_1_client_over_our_receive_maximum_gets_backpressure_not_a_disconnect() {
    let b = Broker::start_with("[limits]\nreceive_maximum = 4\n");
    let mut c = RawClient::v4(b.addr, "burst-311").await;
    let n: u16 = 40;
    let burst: Vec<Packet> = (1..=n)
        .map(|i| Packet::Publish(publish("burst/1", b"x", 1, i)))
        .collect();
    c.send_all(&burst).await;
    for i in 1..=n {
        match c.expect_packet().await {
            Packet::PubAck(a) => assert_eq!(a.packet_id, i),
            other => panic!("expected PUBACK {i}, got {}", brief(&other)),
        }
    }
    // QoS 2: every PUBLISH before any PUBREL, then every PUBREL.
    let burst: Vec<Packet> = (1..=n)
        .map(|i| Packet::Publish(publish("burst/2", b"y", 2, i)))
        .collect();
    c.send_all(&burst).await;
    for i in 1..=n {
        match c.expect_packet().await {
            Packet::PubRec(a) => assert_eq!(a.packet_id, i),
            other => panic!("expected PUBREC {i}, got {}", brief(&other)),
        }
    }
    let rels: Vec<Packet> = (1..=n).map(|i| Packet::PubRel(ack(i))).collect();
    c.send_all(&rels).await;
    for i in 1..=n {
        match c.expect_packet().await {
            Packet::PubComp(a) => assert_eq!(a.packet_id, i),
            other => panic!("expected PUBCOMP {i}, got {}", brief(&other)),
        }
    }
}
