//! Sessions: clean start / clean session, session present, v5 session expiry, queued QoS>0
//! messages for offline persistent sessions, in-flight resend with DUP in order, outbound
//! PUBREL resend, per-session queue limit, takeover of a connected client's session.

mod common;

use std::time::Duration;

use common::Broker;
use common::raw::*;
use common::rumq::{v4, v5};

fn persistent_v5(id: &str, expiry_s: u32) -> Connect {
    let mut c = connect_packet(Protocol::V5, id, true, 0);
    c.properties.session_expiry_interval_s = Some(expiry_s);
    c
}

fn resume(mut c: Connect) -> Connect {
    c.clean_start = false;
    c
}

/// (3.1.1) MQTT-3.1.2-4, MQTT-3.1.2-5, MQTT-3.2.2-2: CleanSession 0 resumes the session
/// (Session Present 1, subscriptions kept) and QoS 1/2 messages published while the client
/// was away are delivered — rumqttc v4.
#[tokio::test]
async fn v311_persistent_session_receives_queued_messages_rumqttc() {
    let b = Broker::start();
    let mut o = v4::options(b.addr, "ps4");
    o.set_clean_session(false);
    let mut s = v4::connect(o.clone()).await;
    assert!(
        !s.connack.session_present,
        "MQTT-3.2.2-3 (3.1.1): no session yet"
    );
    s.subscribe("ps4/t", v4::QoS::ExactlyOnce).await;
    s.disconnect().await;
    let mut p = v4::connect(v4::options(b.addr, "ps4-p")).await;
    p.client
        .publish("ps4/t", v4::QoS::AtLeastOnce, false, "q1")
        .await
        .unwrap();
    p.expect_publish_done().await;
    p.client
        .publish("ps4/t", v4::QoS::ExactlyOnce, false, "q2")
        .await
        .unwrap();
    p.expect_publish_done().await;
    let mut s = v4::connect(o).await;
    assert!(s.connack.session_present, "MQTT-3.2.2-2 (3.1.1)");
    let a = s.expect_publish().await;
    let c = s.expect_publish().await;
    assert_eq!((&a.payload[..], a.qos), (&b"q1"[..], v4::QoS::AtLeastOnce));
    assert_eq!((&c.payload[..], c.qos), (&b"q2"[..], v4::QoS::ExactlyOnce));
}

/// (3.1.1) MQTT-3.1.2-6, MQTT-3.2.2-1: CleanSession 1 discards the previous session: Session
/// Present 0, no subscriptions, no queued messages.
#[tokio::test]
async fn v311_clean_session_discards_state() {
    let b = Broker::start();
    let (mut s, _) =
        RawClient::connect_ok(b.addr, connect_packet(Protocol::V3_1_1, "cs4", false, 0)).await;
    s.sub("cs4/t", 1).await;
    s.disconnect().await;
    let mut p = RawClient::v4(b.addr, "cs4-p").await;
    p.publish_acked(publish("cs4/t", b"queued", 1, 1)).await;
    let (mut s, ca) =
        RawClient::connect_ok(b.addr, connect_packet(Protocol::V3_1_1, "cs4", true, 0)).await;
    assert!(!ca.session_present);
    p.publish_acked(publish("cs4/t", b"live", 1, 2)).await;
    assert!(
        s.ping().await.is_empty(),
        "no queued message and no subscription after clean session"
    );
}

/// (v5) MQTT-3.1.2-5, MQTT-3.2.2-3, MQTT-3.1.2-23, MQTT-4.5.0-1: with a Session Expiry
/// Interval > 0 the session survives the disconnect: Session Present 1, subscriptions kept,
/// QoS 1 and 2 messages queued while offline are delivered in order.
#[tokio::test]
async fn v5_session_resumed_within_expiry() {
    let b = Broker::start();
    let c = persistent_v5("ps5", 60);
    let (mut s, ca) = RawClient::connect_ok(b.addr, c.clone()).await;
    assert!(!ca.session_present, "MQTT-3.2.2-2");
    s.sub("ps5/t", 2).await;
    s.disconnect().await;
    let mut p = RawClient::v5(b.addr, "ps5-p").await;
    for i in 1..=6u16 {
        let q = if i % 2 == 0 { 2 } else { 1 };
        p.publish_acked(publish("ps5/t", format!("{i}").as_bytes(), q, i))
            .await;
    }
    let (mut s, ca) = RawClient::connect_ok(b.addr, resume(c)).await;
    assert!(ca.session_present, "MQTT-3.2.2-3");
    for i in 1..=6u16 {
        let got = s.receive_acked().await;
        assert_eq!(
            &got.payload[..],
            format!("{i}").as_bytes(),
            "in order (MQTT-4.6.0-6)"
        );
        assert!(!got.dup, "first transmission");
    }
}

/// (v5) MQTT-3.1.2-4, MQTT-3.2.2-2: Clean Start 1 discards the existing session.
#[tokio::test]
async fn v5_clean_start_discards_session() {
    let b = Broker::start();
    let c = persistent_v5("cs5", 60);
    let (mut s, _) = RawClient::connect_ok(b.addr, c.clone()).await;
    s.sub("cs5/t", 1).await;
    s.disconnect().await;
    let mut p = RawClient::v5(b.addr, "cs5-p").await;
    p.publish_acked(publish("cs5/t", b"queued", 1, 1)).await;
    let (mut s, ca) = RawClient::connect_ok(b.addr, c).await; // clean start 1 again
    assert!(!ca.session_present);
    p.publish_acked(publish("cs5/t", b"live", 1, 2)).await;
    assert!(s.ping().await.is_empty());
}

/// (v5) MQTT-3.1.2-23 (only a Session Expiry Interval > 0 keeps the state): with no Session
/// Expiry Interval the session ends with the connection, even with Clean Start 0.
#[tokio::test]
async fn v5_session_expiry_zero_ends_session_at_close() {
    let b = Broker::start();
    let c = resume(connect_packet(Protocol::V5, "se0", true, 0));
    let (mut s, ca) = RawClient::connect_ok(b.addr, c.clone()).await;
    assert!(!ca.session_present, "MQTT-3.2.2-3: no session existed");
    s.sub("se0/t", 1).await;
    s.disconnect().await;
    let (_s, ca) = RawClient::connect_ok(b.addr, c).await;
    assert!(!ca.session_present);
}

/// (v5) MQTT-4.1.0-2: the session is discarded once the Session Expiry Interval (1 s) has
/// passed after the close; queued messages go with it.
#[tokio::test]
async fn v5_session_expires_after_interval() {
    let b = Broker::start();
    let c = persistent_v5("se1", 1);
    let (mut s, _) = RawClient::connect_ok(b.addr, c.clone()).await;
    s.sub("se1/t", 1).await;
    s.disconnect().await;
    let mut p = RawClient::v5(b.addr, "se1-p").await;
    p.publish_acked(publish("se1/t", b"queued", 1, 1)).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (mut s, ca) = RawClient::connect_ok(b.addr, resume(c)).await;
    assert!(!ca.session_present, "session outlived its expiry interval");
    assert!(s.ping().await.is_empty());
}

/// (v5) §3.14.2.2.2: a DISCONNECT can lower the Session Expiry Interval to 0, ending the
/// session at the close.
#[tokio::test]
async fn v5_disconnect_can_set_session_expiry_to_zero() {
    let b = Broker::start();
    let c = persistent_v5("sed", 60);
    let (mut s, _) = RawClient::connect_ok(b.addr, c.clone()).await;
    s.sub("sed/t", 1).await;
    let mut d = Disconnect {
        reason: ReasonCode::NORMAL_DISCONNECTION,
        properties: Properties::default(),
    };
    d.properties.session_expiry_interval_s = Some(0);
    s.send(&Packet::Disconnect(d)).await;
    s.expect_closed().await;
    let (_s, ca) = RawClient::connect_ok(b.addr, resume(c)).await;
    assert!(!ca.session_present);
}

/// (v5) MQTT-4.4.0-1, MQTT-3.3.1-1, MQTT-4.6.0-1 (the same order rule for the server): unacked
/// QoS 1 PUBLISHes are resent on reconnect with DUP 1, their original packet ids, in order.
#[tokio::test]
async fn inflight_messages_resent_with_dup_in_order() {
    let b = Broker::start();
    let c = persistent_v5("inf", 60);
    let (mut s, _) = RawClient::connect_ok(b.addr, c.clone()).await;
    s.sub("inf/t", 1).await;
    let mut p = RawClient::v5(b.addr, "inf-p").await;
    for i in 1..=4u16 {
        p.publish_acked(publish("inf/t", format!("{i}").as_bytes(), 1, i))
            .await;
    }
    let mut first = Vec::new();
    for _ in 0..4 {
        let m = s.expect_publish().await;
        assert!(!m.dup);
        first.push((m.packet_id, m.payload.clone()));
    }
    // Acknowledge only the second one, then vanish.
    s.send(&Packet::PubAck(ack(first[1].0))).await;
    assert!(s.ping().await.is_empty());
    s.drop_connection().await;
    let (mut s, ca) = RawClient::connect_ok(b.addr, resume(c)).await;
    assert!(ca.session_present);
    for (id, payload) in [&first[0], &first[2], &first[3]] {
        let m = s.expect_publish().await;
        assert!(m.dup, "MQTT-3.3.1-1: DUP 1 on redelivery");
        assert_eq!(
            (m.packet_id, &m.payload),
            (*id, payload),
            "same id, original order"
        );
        s.send(&Packet::PubAck(ack(m.packet_id))).await;
    }
    assert!(
        s.ping().await.is_empty(),
        "the acknowledged message is not resent (MQTT-4.4.0-1)"
    );
}

/// (v5) MQTT-4.4.0-1, MQTT-4.3.3-6: after the subscriber's PUBREC, a reconnect resends the
/// PUBREL (same packet id), never the PUBLISH.
#[tokio::test]
async fn outbound_pubrel_resent_after_reconnect() {
    let b = Broker::start();
    let c = persistent_v5("prl", 60);
    let (mut s, _) = RawClient::connect_ok(b.addr, c.clone()).await;
    s.sub("prl/t", 2).await;
    let mut p = RawClient::v5(b.addr, "prl-p").await;
    p.publish_acked(publish("prl/t", b"x", 2, 1)).await;
    let m = s.expect_publish().await;
    s.send(&Packet::PubRec(ack(m.packet_id))).await;
    assert!(matches!(s.expect_packet().await, Packet::PubRel(a) if a.packet_id == m.packet_id));
    s.drop_connection().await;
    let (mut s, ca) = RawClient::connect_ok(b.addr, resume(c)).await;
    assert!(ca.session_present);
    match s.expect_packet().await {
        Packet::PubRel(a) => assert_eq!(a.packet_id, m.packet_id),
        other => panic!("expected PUBREL resend, got {other:?}"),
    }
    s.send(&Packet::PubComp(ack(m.packet_id))).await;
    assert!(s.ping().await.is_empty());
}

/// (v5) MQTT-3.1.4-3 with MQTT-3.1.2-5: a takeover with Clean Start 0 keeps the session
/// (Session Present 1, subscriptions still active).
#[tokio::test]
async fn takeover_with_clean_start_0_keeps_session() {
    let b = Broker::start();
    let c = persistent_v5("tko", 60);
    let (mut old, _) = RawClient::connect_ok(b.addr, c.clone()).await;
    old.sub("tko/t", 1).await;
    let (mut new, ca) = RawClient::connect_ok(b.addr, resume(c)).await;
    assert!(ca.session_present);
    assert_eq!(
        old.expect_disconnect().await,
        ReasonCode::SESSION_TAKEN_OVER
    );
    let mut p = RawClient::v5(b.addr, "tko-p").await;
    p.publish_acked(publish("tko/t", b"after", 1, 1)).await;
    assert_eq!(&new.receive_acked().await.payload[..], b"after");
}

/// Per-session queue bound (`max_queued_messages` = 3, in flight 1): while the client is away
/// the oldest queued messages are dropped and the newest kept, order preserved. Whether the
/// in-flight slot holds message 1 or 3 is the broker's choice, so both are accepted.
#[tokio::test]
async fn queued_messages_are_bounded_oldest_dropped() {
    let b = Broker::start_with("[limits]\nmax_queued_messages = 3\nmax_inflight_messages = 1\n");
    let c = persistent_v5("qb", 60);
    let (mut s, _) = RawClient::connect_ok(b.addr, c.clone()).await;
    s.sub("qb/t", 1).await;
    s.disconnect().await;
    let mut p = RawClient::v5(b.addr, "qb-p").await;
    for i in 1..=6u16 {
        p.publish_acked(publish("qb/t", format!("{i}").as_bytes(), 1, i))
            .await;
    }
    let (mut s, _) = RawClient::connect_ok(b.addr, resume(c)).await;
    let mut got: Vec<u32> = Vec::new();
    loop {
        let m = s.receive_acked().await;
        got.push(
            String::from_utf8(m.payload.to_vec())
                .unwrap()
                .parse()
                .unwrap(),
        );
        if got.last() == Some(&6) {
            break;
        }
    }
    assert!(s.ping().await.is_empty());
    assert!(got.windows(2).all(|w| w[0] < w[1]), "order kept: {got:?}");
    assert!(got.ends_with(&[4, 5, 6]), "newest kept: {got:?}");
    assert!(got.len() <= 4, "the queue bound dropped nothing: {got:?}");
}

/// (v5) MQTT-3.10.4-2, MQTT-3.10.4-3: after UNSUBSCRIBE no new message is queued for the
/// filter, but a QoS 1 message whose delivery had started is completed: resent on reconnect.
#[tokio::test]
async fn unsubscribe_completes_deliveries_already_started() {
    let b = Broker::start();
    let c = persistent_v5("uns", 60);
    let (mut s, _) = RawClient::connect_ok(b.addr, c.clone()).await;
    s.sub("uns/t", 1).await;
    let mut p = RawClient::v5(b.addr, "uns-p").await;
    p.publish_acked(publish("uns/t", b"started", 1, 1)).await;
    let first = s.expect_publish().await; // not acknowledged
    s.send(&Packet::Unsubscribe(Unsubscribe {
        packet_id: 9,
        properties: Properties::default(),
        filters: vec![s_("uns/t")],
    }))
    .await;
    assert!(matches!(s.expect_packet().await, Packet::UnsubAck(ua) if ua.packet_id == 9));
    p.publish_acked(publish("uns/t", b"after", 1, 2)).await;
    s.drop_connection().await;
    let (mut s, ca) = RawClient::connect_ok(b.addr, resume(c)).await;
    assert!(ca.session_present);
    let again = s.expect_publish().await;
    assert_eq!(
        (again.packet_id, &again.payload[..], again.dup),
        (first.packet_id, &b"started"[..], true)
    );
    s.send(&Packet::PubAck(ack(again.packet_id))).await;
    assert!(
        s.ping().await.is_empty(),
        "a message published after UNSUBSCRIBE was delivered"
    );
}

fn s_(text: &str) -> Str {
    s(text)
}

/// (v5) MQTT-3.1.4-3 with MQTT-4.4.0-1: messages in flight on the old connection are resent
/// (DUP 1, same ids, same order) on the connection that takes the session over.
#[tokio::test]
async fn takeover_resends_inflight_on_new_connection() {
    let b = Broker::start();
    let c = persistent_v5("tki", 60);
    let (mut old, _) = RawClient::connect_ok(b.addr, c.clone()).await;
    old.sub("tki/t", 1).await;
    let mut p = RawClient::v5(b.addr, "tki-p").await;
    for i in 1..=3u16 {
        p.publish_acked(publish("tki/t", format!("{i}").as_bytes(), 1, i))
            .await;
    }
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(old.expect_publish().await.packet_id);
    }
    let (mut new, ca) = RawClient::connect_ok(b.addr, resume(c)).await;
    assert!(ca.session_present);
    for (i, id) in ids.iter().enumerate() {
        let m = new.expect_publish().await;
        assert!(m.dup);
        assert_eq!(
            (m.packet_id, &m.payload[..]),
            (*id, format!("{}", i + 1).as_bytes())
        );
        new.send(&Packet::PubAck(ack(m.packet_id))).await;
    }
    assert!(new.ping().await.is_empty());
}

/// `max_inflight_messages = 3` caps the outbound window even when the client allows more.
#[tokio::test]
async fn outbound_window_is_capped_by_config() {
    let b = Broker::start_with("[limits]\nmax_inflight_messages = 3\n");
    let mut s = RawClient::v5(b.addr, "win-s").await;
    s.sub("win/t", 1).await;
    let mut p = RawClient::v5(b.addr, "win-p").await;
    for i in 1..=5u16 {
        p.publish_acked(publish("win/t", format!("{i}").as_bytes(), 1, i))
            .await;
    }
    let mut first = Vec::new();
    for _ in 0..3 {
        first.push(s.expect_publish().await);
    }
    s.expect_nothing(common::QUIET).await;
    for m in &first {
        s.send(&Packet::PubAck(ack(m.packet_id))).await;
    }
    assert_eq!(&s.receive_acked().await.payload[..], b"4");
    assert_eq!(&s.receive_acked().await.payload[..], b"5");
}

/// (3.1.1) MQTT-3.1.4-2: a CONNECT with the client id of a connected client disconnects the
/// existing client; the new one is accepted.
#[tokio::test]
async fn v311_takeover_closes_existing_connection() {
    let b = Broker::start();
    let mut old = RawClient::v4(b.addr, "dup-v4").await;
    let (mut new, ca) =
        RawClient::connect_ok(b.addr, connect_packet(Protocol::V3_1_1, "dup-v4", true, 0)).await;
    assert!(!ca.session_present);
    old.expect_closed_silently().await;
    assert!(new.ping().await.is_empty(), "new connection stays usable");
}

/// (v5) MQTT-3.1.4-3: the existing client receives DISCONNECT 0x8E (Session taken over) and
/// its connection is closed.
#[tokio::test]
async fn v5_takeover_sends_disconnect_0x8e() {
    let b = Broker::start();
    let mut old = RawClient::v5(b.addr, "dup-v5").await;
    let mut new = RawClient::v5(b.addr, "dup-v5").await;
    assert_eq!(
        old.expect_disconnect().await,
        ReasonCode::SESSION_TAKEN_OVER
    );
    assert!(new.ping().await.is_empty());
}

/// Takeover through rumqttc v5: the old client's event loop sees DISCONNECT 0x8E.
#[tokio::test]
async fn v5_takeover_seen_by_rumqttc() {
    let b = Broker::start();
    let mut old = v5::connect(v5::options(b.addr, "dup-rumq")).await;
    let _new = v5::connect(v5::options(b.addr, "dup-rumq")).await;
    assert_eq!(
        old.expect_closed().await,
        Some(v5::DisconnectReasonCode::SessionTakenOver)
    );
}
