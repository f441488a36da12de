//! MQTT 5 per-message features: topic aliases both ways, maximum packet size both ways,
//! message expiry, payload format indicator, property forwarding, subscription identifiers,
//! session expiry on DISCONNECT. Flow control (receive maximum) is in v5_flow.rs.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::Broker;
use common::raw::*;
use common::rumq::v5;

/// (v5) MQTT-3.3.2-12: the server accepts topic aliases 1..=Topic Alias Maximum; a PUBLISH with
/// an empty topic and a known alias goes to the mapped topic; an alias can be remapped.
#[tokio::test]
async fn client_to_server_topic_alias() {
    let b = Broker::start_with("[limits]\ntopic_alias_maximum = 2\n");
    let mut s = RawClient::v5(b.addr, "ta-s").await;
    s.sub("ta/#", 0).await;
    let (mut p, ca) = RawClient::connect_ok(b.addr, v5_connect("ta-p")).await;
    assert_eq!(ca.properties.topic_alias_maximum, Some(2));
    let aliased = |topic: &str, alias: u16, payload: &[u8]| {
        let mut m = publish(topic, payload, 0, 0);
        m.properties.topic_alias = Some(alias);
        Packet::Publish(m)
    };
    p.send(&aliased("ta/one", 1, b"a")).await;
    p.send(&aliased("", 1, b"b")).await;
    p.send(&aliased("ta/two", 2, b"c")).await;
    p.send(&aliased("", 2, b"d")).await;
    p.send(&aliased("ta/three", 1, b"e")).await; // remap 1
    p.send(&aliased("", 1, b"f")).await;
    assert!(p.ping().await.is_empty());
    let want = [
        ("ta/one", "a"),
        ("ta/one", "b"),
        ("ta/two", "c"),
        ("ta/two", "d"),
        ("ta/three", "e"),
        ("ta/three", "f"),
    ];
    for (topic, payload) in want {
        let got = s.expect_publish().await;
        assert_eq!(
            (got.topic.as_str(), &got.payload[..]),
            (topic, payload.as_bytes())
        );
        assert_eq!(
            got.properties.topic_alias, None,
            "the subscriber asked for no aliases (MQTT-3.1.2-27)"
        );
    }
}

/// (v5) MQTT-3.2.2-17, MQTT-3.3.2-8 and §3.3.2.3.4: an alias above the maximum (or 0) is a
/// protocol error: DISCONNECT 0x94 (Topic Alias invalid). An empty topic with an alias never
/// mapped on this connection (MQTT-3.3.2-7: mappings do not carry over) is a protocol error.
#[tokio::test]
async fn invalid_topic_aliases_disconnect() {
    let b = Broker::start_with("[limits]\ntopic_alias_maximum = 2\n");
    for alias in [3u16, 0] {
        let mut p = RawClient::v5(b.addr, "tai").await;
        let mut m = publish("t", b"x", 0, 0);
        m.properties.topic_alias = Some(alias);
        if alias == 0 {
            // The codec may refuse to encode alias 0: write it by hand.
            // PUBLISH QoS 0, topic "t", props: 0x23 0x0000, payload "x".
            p.send_bytes(&[0x30, 0x08, 0x00, 0x01, b't', 0x03, 0x23, 0x00, 0x00, b'x'])
                .await;
        } else {
            p.send(&Packet::Publish(m)).await;
        }
        let reason = p.expect_disconnect().await;
        if alias == 0 {
            // 0 is never a valid alias: refused as a protocol error (0x94) or by the decoder.
            assert!(
                [
                    ReasonCode::TOPIC_ALIAS_INVALID,
                    ReasonCode::PROTOCOL_ERROR,
                    ReasonCode::MALFORMED_PACKET
                ]
                .contains(&reason),
                "alias 0: {reason:?}"
            );
        } else {
            assert_eq!(reason, ReasonCode::TOPIC_ALIAS_INVALID, "alias {alias}");
        }
    }
    let mut p = RawClient::v5(b.addr, "tai-unmapped").await;
    let mut m = publish("", b"x", 0, 0);
    m.properties.topic_alias = Some(1);
    p.send(&Packet::Publish(m)).await;
    let reason = p.expect_disconnect().await;
    assert!(
        reason == ReasonCode::PROTOCOL_ERROR || reason == ReasonCode::TOPIC_ALIAS_INVALID,
        "{reason:?}"
    );
}

/// (v5) MQTT-3.2.2-18: with topic_alias_maximum 0 the server accepts no alias at all.
#[tokio::test]
async fn topic_aliases_disabled_by_config() {
    let b = Broker::start_with("[limits]\ntopic_alias_maximum = 0\n");
    let (mut p, ca) = RawClient::connect_ok(b.addr, v5_connect("tad")).await;
    assert!(matches!(ca.properties.topic_alias_maximum, None | Some(0)));
    let mut m = publish("t", b"x", 0, 0);
    m.properties.topic_alias = Some(1);
    p.send(&Packet::Publish(m)).await;
    assert_eq!(p.expect_disconnect().await, ReasonCode::TOPIC_ALIAS_INVALID);
}

/// (v5) MQTT-3.1.2-26, MQTT-3.3.2-11, MQTT-3.3.2-10: the server uses topic aliases towards a
/// client that allows them, never above the client's Topic Alias Maximum (2 here); every
/// delivery resolves to the right topic.
#[tokio::test]
async fn server_to_client_topic_alias() {
    let b = Broker::start();
    let mut c = v5_connect("sta-s");
    c.properties.topic_alias_maximum = Some(2);
    let (mut s, _) = RawClient::connect_ok(b.addr, c).await;
    s.sub("sta/#", 0).await;
    let mut p = RawClient::v5(b.addr, "sta-p").await;
    let topics = [
        "sta/a", "sta/a", "sta/b", "sta/a", "sta/c", "sta/c", "sta/b", "sta/a",
    ];
    for (i, t) in topics.iter().enumerate() {
        p.publish_acked(publish(t, format!("{i}").as_bytes(), 0, 0))
            .await;
    }
    let mut map: std::collections::HashMap<u16, String> = Default::default();
    let mut used_alias_only = false;
    for (i, t) in topics.iter().enumerate() {
        let got = s.expect_publish().await;
        assert_eq!(&got.payload[..], format!("{i}").as_bytes());
        let topic = match got.properties.topic_alias {
            None => got.topic.to_string(),
            Some(a) => {
                assert!((1..=2).contains(&a), "alias {a} outside 1..=2");
                if got.topic.is_empty() {
                    used_alias_only = true;
                    map.get(&a)
                        .cloned()
                        .unwrap_or_else(|| panic!("alias {a} used before being set"))
                } else {
                    map.insert(a, got.topic.to_string());
                    got.topic.to_string()
                }
            }
        };
        assert_eq!(topic, *t, "delivery {i}");
    }
    assert!(
        used_alias_only,
        "Tern sends topic aliases to clients that allow them"
    );
}

/// (v5) MQTT-3.2.2-15 (the client must not exceed the server's Maximum Packet Size) and
/// §3.2.2.3.6: an oversize packet gets DISCONNECT 0x95 (Packet too large); in 3.1.1 the
/// connection is closed. Nothing is delivered.
#[tokio::test]
async fn oversize_packet_from_client_is_rejected() {
    let b = Broker::start_with("[limits]\nmax_packet_size_bytes = 1024\n");
    let mut s = RawClient::v5(b.addr, "big-s").await;
    s.sub("big/#", 0).await;
    let mut c = RawClient::v5(b.addr, "big-5").await;
    c.send(&Packet::Publish(publish("big/t", &[7u8; 2000], 0, 0)))
        .await;
    assert_eq!(c.expect_disconnect().await, ReasonCode::PACKET_TOO_LARGE);
    let mut c = RawClient::v4(b.addr, "big-4").await;
    c.send(&Packet::Publish(publish("big/t", &[7u8; 2000], 0, 0)))
        .await;
    c.expect_closed_silently().await;
    // Only the header of a huge packet is needed to refuse it (declared 200 MB, nothing sent).
    let mut c = RawClient::v5(b.addr, "big-hdr").await;
    c.send_bytes(&[0x30, 0x80, 0x80, 0x80, 0x60]).await;
    assert_eq!(c.expect_disconnect().await, ReasonCode::PACKET_TOO_LARGE);
    let mut p = RawClient::v5(b.addr, "big-p").await;
    p.publish_acked(publish("big/t", b"marker", 0, 0)).await;
    assert_eq!(&s.expect_publish().await.payload[..], b"marker");
}

/// (v5) MQTT-3.1.2-24, MQTT-3.1.2-25: the server never sends a packet larger than the client's
/// Maximum Packet Size: such a message is dropped for that client (and treated as delivered,
/// so a QoS 1 one does not block later ones); other clients get it.
#[tokio::test]
async fn oversize_packet_to_client_is_not_sent() {
    let b = Broker::start();
    let mut c = v5_connect("small-s");
    c.properties.maximum_packet_size = Some(256);
    let (mut small, _) = RawClient::connect_ok(b.addr, c).await;
    small.sub("mps/t", 1).await;
    let mut large = RawClient::v5(b.addr, "large-s").await;
    large.sub("mps/t", 1).await;
    let mut p = RawClient::v5(b.addr, "mps-p").await;
    p.publish_acked(publish("mps/t", &[1u8; 1000], 1, 1)).await;
    p.publish_acked(publish("mps/t", b"small", 1, 2)).await;
    assert_eq!(large.receive_acked().await.payload.len(), 1000);
    assert_eq!(&large.receive_acked().await.payload[..], b"small");
    assert_eq!(
        &small.receive_acked().await.payload[..],
        b"small",
        "oversize message was sent"
    );
}

/// (v5) MQTT-3.3.2-5: a message whose expiry interval passed while the subscriber was offline
/// is not delivered; MQTT-3.3.2-6: the one still valid is delivered with the remaining
/// interval (waited ≥ 2 s, so at most 98 of 100 s are left).
#[tokio::test]
async fn message_expiry_while_offline() {
    let b = Broker::start();
    let mut c = connect_packet(Protocol::V5, "mx-s", true, 0);
    c.properties.session_expiry_interval_s = Some(300);
    let (mut s, _) = RawClient::connect_ok(b.addr, c.clone()).await;
    s.sub("mx/t", 1).await;
    s.disconnect().await;
    let mut p = RawClient::v5(b.addr, "mx-p").await;
    let mut short = publish("mx/t", b"short", 1, 1);
    short.properties.message_expiry_interval_s = Some(1);
    p.publish_acked(short).await;
    let mut long = publish("mx/t", b"long", 1, 2);
    long.properties.message_expiry_interval_s = Some(100);
    p.publish_acked(long).await;
    tokio::time::sleep(Duration::from_millis(2200)).await;
    c.clean_start = false;
    let (mut s, ca) = RawClient::connect_ok(b.addr, c).await;
    assert!(ca.session_present);
    let got = s.receive_acked().await;
    assert_eq!(&got.payload[..], b"long", "expired message was delivered");
    let left = got
        .properties
        .message_expiry_interval_s
        .expect("remaining expiry is forwarded");
    assert!(left <= 98 && left > 0, "remaining interval {left}");
}

/// (v5) MQTT-3.3.2-5: an expired retained message is not sent to a new subscriber.
#[tokio::test]
async fn expired_retained_message_is_not_sent() {
    let b = Broker::start();
    let mut p = RawClient::v5(b.addr, "mxr-p").await;
    let mut m = publish("mxr/t", b"old", 1, 1);
    m.retain = true;
    m.properties.message_expiry_interval_s = Some(1);
    p.publish_acked(m).await;
    tokio::time::sleep(Duration::from_millis(2200)).await;
    let mut s = RawClient::v5(b.addr, "mxr-s").await;
    s.sub("mxr/t", 1).await;
    assert!(
        s.ping().await.is_empty(),
        "expired retained message was sent"
    );
}

/// (v5) MQTT-3.3.2-6: an online subscriber receives the Message Expiry Interval (at most the
/// published value).
#[tokio::test]
async fn message_expiry_is_forwarded_online() {
    let b = Broker::start();
    let mut s = RawClient::v5(b.addr, "mxo-s").await;
    s.sub("mxo/t", 0).await;
    let mut p = RawClient::v5(b.addr, "mxo-p").await;
    let mut m = publish("mxo/t", b"x", 0, 0);
    m.properties.message_expiry_interval_s = Some(60);
    p.publish_acked(m).await;
    let left = s
        .expect_publish()
        .await
        .properties
        .message_expiry_interval_s
        .expect("forwarded");
    assert!((1..=60).contains(&left), "{left}");
}

/// (v5) §3.3.2.3.2: Payload Format Indicator 1 with a payload that is not UTF-8: the server
/// answers PUBACK 0x99 (Payload format invalid) or DISCONNECT 0x99, and does not forward it.
#[tokio::test]
async fn invalid_utf8_payload_with_format_indicator_is_refused_0x99() {
    let b = Broker::start();
    let mut s = RawClient::v5(b.addr, "pfi-s").await;
    s.sub("pfi/t", 1).await;
    let mut p = RawClient::v5(b.addr, "pfi-p").await;
    let mut m = publish("pfi/t", &[0xff, 0xfe, 0x00], 1, 1);
    m.properties.payload_format_indicator = Some(1);
    p.send(&Packet::Publish(m)).await;
    match p.expect_packet().await {
        Packet::PubAck(a) => {
            assert_eq!(a.reason, ReasonCode::PAYLOAD_FORMAT_INVALID);
        }
        Packet::Disconnect(d) => {
            assert_eq!(d.reason, ReasonCode::PAYLOAD_FORMAT_INVALID);
            p = RawClient::v5(b.addr, "pfi-p2").await;
        }
        other => panic!("expected PUBACK/DISCONNECT 0x99, got {other:?}"),
    }
    // A valid UTF-8 payload with the indicator is forwarded with it (MQTT-3.3.2-4).
    let mut ok = publish("pfi/t", "héllo".as_bytes(), 1, 2);
    ok.properties.payload_format_indicator = Some(1);
    p.publish_acked(ok).await;
    let got = s.receive_acked().await;
    assert_eq!(
        &got.payload[..],
        "héllo".as_bytes(),
        "the invalid payload was forwarded"
    );
    assert_eq!(got.properties.payload_format_indicator, Some(1));
}

/// (v5) MQTT-3.3.2-4, -15, -16, -17, -18, -20: payload format indicator, response topic,
/// correlation data, user properties (order and duplicates kept) and content type reach the
/// subscriber unchanged — rumqttc v5 on both sides.
#[tokio::test]
async fn publish_properties_forwarded_unchanged_rumqttc() {
    let b = Broker::start();
    let mut s = v5::connect(v5::options(b.addr, "pp-s")).await;
    s.subscribe("pp/t", v5::QoS::AtLeastOnce).await;
    let p = v5::connect(v5::options(b.addr, "pp-p")).await;
    let props = v5::PublishProperties {
        payload_format_indicator: Some(1),
        message_expiry_interval: None,
        topic_alias: None,
        response_topic: Some("pp/reply".into()),
        correlation_data: Some(Bytes::from_static(b"\x00corr\xff")),
        user_properties: vec![
            ("b".into(), "1".into()),
            ("a".into(), "2".into()),
            ("b".into(), "3".into()),
        ],
        subscription_identifiers: vec![],
        content_type: Some("application/json".into()),
    };
    p.client
        .publish_with_properties("pp/t", v5::QoS::AtLeastOnce, false, "{}", props.clone())
        .await
        .unwrap();
    let got = s.expect_publish().await;
    let gp = got.properties.expect("properties forwarded");
    assert_eq!(gp.payload_format_indicator, props.payload_format_indicator);
    assert_eq!(gp.response_topic, props.response_topic);
    assert_eq!(gp.correlation_data, props.correlation_data);
    assert_eq!(gp.user_properties, props.user_properties);
    assert_eq!(gp.content_type, props.content_type);
}

/// A v5 message with properties reaches a 3.1.1 subscriber (without them) intact.
#[tokio::test]
async fn v5_properties_do_not_break_v311_subscribers() {
    let b = Broker::start();
    let mut s = RawClient::v4(b.addr, "pp4-s").await;
    s.sub("pp4/t", 1).await;
    let mut p = RawClient::v5(b.addr, "pp4-p").await;
    let mut m = publish("pp4/t", b"body", 1, 1);
    m.properties.user = vec![(s_("k"), s_("v"))];
    m.properties.content_type = Some(s_("text/plain"));
    p.publish_acked(m).await;
    let got = s.receive_acked().await;
    assert_eq!(&got.payload[..], b"body");
    assert!(got.properties.is_empty());
}

/// (v5) MQTT-3.3.4-6: a PUBLISH from a client must not carry a Subscription Identifier — a
/// protocol error (DISCONNECT 0x82), or refused by the decoder as malformed (0x81).
#[tokio::test]
async fn subscription_identifier_from_client_is_protocol_error() {
    let b = Broker::start();
    let mut p = RawClient::v5(b.addr, "sidc").await;
    // PUBLISH QoS 0 topic "t", props: 0x0B 0x05 (subscription identifier 5), payload "x".
    p.send_bytes(&[0x30, 0x07, 0x00, 0x01, b't', 0x02, 0x0B, 0x05, b'x'])
        .await;
    let reason = p.expect_disconnect().await;
    assert!(
        reason == ReasonCode::PROTOCOL_ERROR || reason == ReasonCode::MALFORMED_PACKET,
        "{reason:?}"
    );
}

fn s_(text: &str) -> Str {
    s(text)
}

/// (v5) MQTT-3.3.2-7: topic alias mappings do not carry over to a new connection: after a
/// reconnect the server sends the topic name again before it uses an alias.
#[tokio::test]
async fn server_topic_aliases_reset_on_reconnect() {
    let b = Broker::start();
    let mut c = v5_connect("tar-s");
    c.properties.topic_alias_maximum = Some(5);
    c.properties.session_expiry_interval_s = Some(60);
    let (mut s, _) = RawClient::connect_ok(b.addr, c.clone()).await;
    s.sub("tar/t", 0).await;
    let mut p = RawClient::v5(b.addr, "tar-p").await;
    for _ in 0..3 {
        p.publish_acked(publish("tar/t", b"x", 0, 0)).await;
        s.expect_publish().await;
    }
    s.disconnect().await;
    c.clean_start = false;
    let (mut s, _) = RawClient::connect_ok(b.addr, c).await;
    p.publish_acked(publish("tar/t", b"y", 0, 0)).await;
    let got = s.expect_publish().await;
    assert_eq!(
        got.topic.as_str(),
        "tar/t",
        "first delivery on a new connection names the topic"
    );
}

/// (v5) §3.14.2.2.2: if CONNECT had no Session Expiry Interval (0), a DISCONNECT that sets a
/// non-zero one is a Protocol Error: the server answers DISCONNECT 0x82.
#[tokio::test]
async fn disconnect_raising_session_expiry_from_zero_is_protocol_error() {
    let b = Broker::start();
    let mut c = RawClient::v5(b.addr, "sez").await;
    let mut d = Disconnect {
        reason: ReasonCode::NORMAL_DISCONNECTION,
        properties: Properties::default(),
    };
    d.properties.session_expiry_interval_s = Some(60);
    c.send(&Packet::Disconnect(d)).await;
    let before = c.expect_closed().await;
    assert!(
        before
            .iter()
            .all(|p| matches!(p, Packet::Disconnect(d) if d.reason == ReasonCode::PROTOCOL_ERROR)),
        "{}",
        briefs(&before)
    );
    // And the session did not survive.
    let mut r = connect_packet(Protocol::V5, "sez", false, 0);
    r.properties.session_expiry_interval_s = Some(60);
    let (_c, ca) = RawClient::connect_ok(b.addr, r).await;
    assert!(!ca.session_present);
}

/// (v5) §3.8.2.1.2: a Subscription Identifier of 0 is a Protocol Error (hand-written bytes; a
/// codec may also call it malformed).
#[tokio::test]
async fn subscription_identifier_zero_is_refused() {
    let b = Broker::start();
    let mut c = RawClient::v5(b.addr, "sid0").await;
    // SUBSCRIBE id 1, props [0x0B 0x00], filter "a", options 0.
    c.send_bytes(&[
        0x82, 0x08, 0x00, 0x01, 0x02, 0x0B, 0x00, 0x00, 0x01, b'a', 0x00,
    ])
    .await;
    let reason = c.expect_disconnect().await;
    assert!(
        reason == ReasonCode::PROTOCOL_ERROR || reason == ReasonCode::MALFORMED_PACKET,
        "{reason:?}"
    );
}

/// (v5) MQTT-3.3.2-12 with MQTT-3.3.1-5: a retained PUBLISH sent with only a topic alias is
/// stored under the mapped topic name.
#[tokio::test]
async fn retained_publish_through_topic_alias() {
    let b = Broker::start();
    let mut p = RawClient::v5(b.addr, "rta-p").await;
    let mut m = publish("rta/t", b"first", 1, 1);
    m.properties.topic_alias = Some(1);
    p.publish_acked(m).await;
    let mut m = publish("", b"kept", 1, 2);
    m.retain = true;
    m.properties.topic_alias = Some(1);
    p.publish_acked(m).await;
    let mut s = RawClient::v5(b.addr, "rta-s").await;
    s.sub("rta/t", 1).await;
    let got = s.receive_acked().await;
    assert_eq!(
        (got.topic.as_str(), &got.payload[..], got.retain),
        ("rta/t", &b"kept"[..], true)
    );
}

/// (v5) MQTT-3.1.2-25: the Maximum Packet Size rule applies to retained messages sent at
/// subscribe time too: an oversize retained message is skipped, a small one is sent.
#[tokio::test]
async fn oversize_retained_message_is_not_sent() {
    let b = Broker::start();
    let mut p = RawClient::v5(b.addr, "mpr-p").await;
    let mut big = publish("mpr/big", &[1u8; 1000], 1, 1);
    big.retain = true;
    p.publish_acked(big).await;
    let mut small = publish("mpr/small", b"s", 1, 2);
    small.retain = true;
    p.publish_acked(small).await;
    let mut c = v5_connect("mpr-s");
    c.properties.maximum_packet_size = Some(256);
    let (mut s, _) = RawClient::connect_ok(b.addr, c).await;
    s.sub("mpr/#", 1).await;
    let got = s.receive_acked().await;
    assert_eq!(got.topic.as_str(), "mpr/small");
    assert!(
        s.ping().await.is_empty(),
        "the oversize retained message was sent"
    );
}
