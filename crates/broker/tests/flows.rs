//! Protocol flows through a real socket: QoS 2 exactly-once, Receive Maximum, takeover,
//! persistent sessions, shared subscriptions, shutdown.

mod common;

use std::time::Duration;

use common::*;
use tern_wire::{Packet, Protocol, QoS, ReasonCode};

#[tokio::test]
async fn qos2_duplicate_publish_gets_pubrec_only_and_unknown_pubrel_gets_0x92() {
    let b = TestBroker::start(config()).await;
    let mut sub = Client::v5(b.addr, "q2-sub").await;
    sub.subscribe("q2/t", 2).await;
    let mut p = Client::v5(b.addr, "q2-pub").await;
    let m = publish("q2/t", b"once", 2, 7);
    p.send(&Packet::Publish(m.clone())).await;
    assert!(matches!(p.recv().await, Some(Packet::PubRec(a)) if a.packet_id == 7));
    let mut again = m.clone();
    again.dup = true;
    p.send(&Packet::Publish(again)).await;
    assert!(matches!(p.recv().await, Some(Packet::PubRec(a)) if a.packet_id == 7));
    p.send(&Packet::PubRel(ack(7))).await;
    assert!(
        matches!(p.recv().await, Some(Packet::PubComp(a)) if a.packet_id == 7 && a.reason == ReasonCode::SUCCESS)
    );
    p.send(&Packet::PubRel(ack(7))).await;
    assert!(
        matches!(p.recv().await, Some(Packet::PubComp(a)) if a.reason == ReasonCode::PACKET_IDENTIFIER_NOT_FOUND)
    );
    let got = sub.expect_publish().await;
    assert_eq!(&got.payload[..], b"once");
    sub.send(&Packet::PubRec(ack(got.packet_id))).await;
    assert!(matches!(sub.recv().await, Some(Packet::PubRel(a)) if a.packet_id == got.packet_id));
    sub.send(&Packet::PubComp(ack(got.packet_id))).await;
    sub.send(&Packet::PingReq).await;
    assert_eq!(
        sub.recv().await,
        Some(Packet::PingResp),
        "delivered exactly once"
    );
}

#[tokio::test]
async fn exceeding_our_receive_maximum_is_0x93_mqtt_3_3_4_9() {
    let mut cfg = config();
    cfg.receive_maximum = 2;
    let b = TestBroker::start(cfg).await;
    let (mut p, ca) =
        Client::connect(b.addr, connect_packet(Protocol::V5, "greedy", true, 0)).await;
    assert_eq!(ca.properties.receive_maximum, Some(2));
    for id in 1..=2 {
        p.send(&Packet::Publish(publish("rm/t", b"x", 2, id))).await;
        assert!(matches!(p.recv().await, Some(Packet::PubRec(_))));
    }
    p.send(&Packet::Publish(publish("rm/t", b"x", 2, 3))).await;
    assert_eq!(
        p.expect_disconnect().await,
        ReasonCode::RECEIVE_MAXIMUM_EXCEEDED
    );
}

#[tokio::test]
async fn broker_respects_the_client_receive_maximum_mqtt_3_3_4_7() {
    let b = TestBroker::start(config()).await;
    let mut c = connect_packet(Protocol::V5, "slow-acker", true, 0);
    c.properties.receive_maximum = Some(2);
    let (mut sub, _) = Client::connect(b.addr, c).await;
    sub.subscribe("rx/t", 1).await;
    let mut p = Client::v5(b.addr, "rx-pub").await;
    for id in 1..=4u16 {
        p.send(&Packet::Publish(publish("rx/t", b"m", 1, id))).await;
        assert!(matches!(p.recv().await, Some(Packet::PubAck(_))));
    }
    let a = sub.expect_publish().await;
    let b2 = sub.expect_publish().await;
    sub.expect_silence(Duration::from_millis(200)).await;
    sub.send(&Packet::PubAck(ack(a.packet_id))).await;
    let c3 = sub.expect_publish().await;
    assert_ne!(c3.packet_id, b2.packet_id);
    sub.expect_silence(Duration::from_millis(200)).await;
}

#[tokio::test]
async fn takeover_sends_0x8e_to_the_old_connection_mqtt_3_1_4_3() {
    let b = TestBroker::start(config()).await;
    let mut old = Client::v5(b.addr, "twin").await;
    let _new = Client::v5(b.addr, "twin").await;
    assert_eq!(
        old.expect_disconnect().await,
        ReasonCode::SESSION_TAKEN_OVER
    );
    old.expect_closed().await;
}

#[tokio::test]
async fn persistent_session_queues_offline_and_resends_inflight_with_dup() {
    let b = TestBroker::start(config()).await;
    let c = connect_packet(Protocol::V3_1_1, "durable", false, 0);
    let (mut s, ca) = Client::connect(b.addr, c.clone()).await;
    assert!(!ca.session_present);
    s.subscribe("d/t", 1).await;
    let mut p = Client::v5(b.addr, "d-pub").await;
    p.send(&Packet::Publish(publish("d/t", b"1", 1, 1))).await;
    p.recv().await;
    let first = s.expect_publish().await; // not acknowledged
    assert!(!first.dup);
    drop(s);
    tokio::time::sleep(Duration::from_millis(100)).await;
    for (id, payload) in [(2u16, &b"2"[..]), (3, b"3")] {
        let mut m = publish("d/t", b"", 1, id);
        m.payload = bytes::Bytes::copy_from_slice(payload);
        p.send(&Packet::Publish(m)).await;
        p.recv().await;
    }
    let (mut s, ca) = Client::connect(b.addr, c).await;
    assert!(ca.session_present, "MQTT-3.2.2-2");
    let again = s.expect_publish().await;
    assert!(again.dup, "MQTT-4.4.0-1: resent with DUP");
    assert_eq!(again.packet_id, first.packet_id);
    assert_eq!(&again.payload[..], b"1");
    assert_eq!(&s.expect_publish().await.payload[..], b"2");
    assert_eq!(&s.expect_publish().await.payload[..], b"3");
}

#[tokio::test]
async fn share_group_member_leaving_hands_its_unacked_messages_to_another() {
    let b = TestBroker::start(config()).await;
    let mut a = Client::v5(b.addr, "member-a").await;
    a.subscribe("$share/g/jobs/#", 1).await;
    let mut bm = Client::v5(b.addr, "member-b").await;
    bm.subscribe("$share/g/jobs/#", 1).await;
    let mut p = Client::v5(b.addr, "jobs-pub").await;
    for id in 1..=2u16 {
        p.send(&Packet::Publish(publish("jobs/1", b"job", 1, id)))
            .await;
        p.recv().await;
    }
    // One each, round robin.
    let _ = a.expect_publish().await;
    let _ = bm.expect_publish().await;
    drop(a); // never acknowledged
    let handed = bm.expect_publish().await;
    assert_eq!(&handed.payload[..], b"job");
}

#[tokio::test]
async fn shutdown_sends_0x8b_to_v5_clients() {
    let b = TestBroker::start(config()).await;
    let mut c = Client::v5(b.addr, "bye").await;
    let (mut old, _) =
        Client::connect(b.addr, connect_packet(Protocol::V3_1_1, "bye3", true, 0)).await;
    b.shutdown().await;
    assert_eq!(
        c.expect_disconnect().await,
        ReasonCode::SERVER_SHUTTING_DOWN
    );
    old.expect_closed().await;
}

#[tokio::test]
async fn unsupported_protocol_level_gets_v311_return_code_1_mqtt_3_1_2_2() {
    let b = TestBroker::start(config()).await;
    let mut c = Client::open(b.addr, Protocol::V3_1_1).await;
    // CONNECT, protocol "MQTT" level 6.
    let raw = [
        0x10, 0x0d, 0, 4, b'M', b'Q', b'T', b'T', 6, 0x02, 0, 0, 0, 1, b'x',
    ];
    tokio::io::AsyncWriteExt::write_all(&mut c.stream, &raw)
        .await
        .unwrap();
    let mut buf = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut c.stream, &mut buf)
        .await
        .unwrap();
    assert_eq!(buf, vec![0x20, 0x02, 0x00, 0x01]);
}

#[tokio::test]
async fn v311_empty_client_id_needs_clean_session_mqtt_3_1_3_8() {
    let b = TestBroker::start(config()).await;
    let (_c, ca) = Client::connect(b.addr, connect_packet(Protocol::V3_1_1, "", false, 0)).await;
    assert_eq!(ca.reason, ReasonCode::CLIENT_IDENTIFIER_NOT_VALID);
    let (_c, ca) = Client::connect(b.addr, connect_packet(Protocol::V5, "", false, 0)).await;
    assert_eq!(ca.reason, ReasonCode::SUCCESS);
    assert!(ca.properties.assigned_client_identifier.is_some());
}

#[tokio::test]
async fn inbound_topic_alias_resolves_and_out_of_range_is_0x94() {
    let mut cfg = config();
    cfg.topic_alias_maximum = 2;
    let b = TestBroker::start(cfg).await;
    let mut sub = Client::v5(b.addr, "alias-sub").await;
    sub.subscribe("al/t", 0).await;
    let mut p = Client::v5(b.addr, "alias-pub").await;
    let mut m = publish("al/t", b"1", 0, 0);
    m.properties.topic_alias = Some(1);
    p.send(&Packet::Publish(m)).await;
    let mut m = publish("", b"2", 0, 0);
    m.properties.topic_alias = Some(1);
    p.send(&Packet::Publish(m)).await;
    assert_eq!(sub.expect_publish().await.topic.as_str(), "al/t");
    let second = sub.expect_publish().await;
    assert_eq!(second.topic.as_str(), "al/t");
    assert_eq!(&second.payload[..], b"2");
    let mut m = publish("al/t", b"3", 0, 0);
    m.properties.topic_alias = Some(3);
    p.send(&Packet::Publish(m)).await;
    assert_eq!(p.expect_disconnect().await, ReasonCode::TOPIC_ALIAS_INVALID);
}

#[tokio::test]
async fn retained_message_sent_on_subscribe_with_retain_flag_then_cleared() {
    let b = TestBroker::start(config()).await;
    let mut p = Client::v5(b.addr, "ret-pub").await;
    let mut m = publish("ret/t", b"kept", 1, 1);
    m.retain = true;
    p.send(&Packet::Publish(m)).await;
    p.recv().await;
    let mut s1 = Client::v5(b.addr, "ret-s1").await;
    s1.subscribe("ret/#", 1).await;
    let got = s1.expect_publish().await;
    assert!(got.retain, "MQTT-3.3.1-8");
    assert_eq!(got.qos, QoS::AtLeastOnce);
    let mut clear = publish("ret/t", b"", 0, 0);
    clear.retain = true;
    p.send(&Packet::Publish(clear)).await;
    let live = s1.expect_publish().await;
    assert!(
        !live.retain,
        "live delivery: RETAIN 0 without retain-as-published"
    );
    let mut s2 = Client::v5(b.addr, "ret-s2").await;
    s2.subscribe("ret/#", 1).await;
    s2.expect_silence(Duration::from_millis(200)).await;
}
