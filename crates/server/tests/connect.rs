//! CONNECT / CONNACK: every CONNACK code path of both versions, client identifiers,
//! first/second CONNECT rules. Takeover is in sessions.rs. Keep alive and the CONNECT timeout are in keep_alive.rs.
//! Statement ids name the version: "(v5)" = MQTT 5.0, "(3.1.1)" = MQTT 3.1.1.

mod common;

use std::time::Duration;

use common::Broker;
use common::raw::*;
use common::rumq::{v4, v5};

/// (3.1.1) MQTT-3.2.0-1, MQTT-3.2.2-1; (v5) MQTT-3.1.4-5, MQTT-3.2.2-2: a valid CONNECT with
/// clean start gets CONNACK 0x00 with Session Present 0 — through rumqttc, both versions.
#[tokio::test]
async fn connack_success_both_versions_rumqttc() {
    let b = Broker::start();
    let c4 = v4::connect(v4::options(b.addr, "ok-v4")).await;
    assert_eq!(c4.connack.code, v4::ConnectReturnCode::Success);
    assert!(!c4.connack.session_present);
    let c5 = v5::connect(v5::options(b.addr, "ok-v5")).await;
    assert_eq!(c5.connack.code, v5::ConnectReturnCode::Success);
    assert!(!c5.connack.session_present);
}

/// (3.1.1) MQTT-3.1.2-2: an unsupported protocol level gets CONNACK return code 0x01 and the
/// connection is closed; (v5) MQTT-3.1.2-2 allows the v5 form, 0x84. Either encoding passes.
#[tokio::test]
async fn unsupported_protocol_level_connack_0x01_or_0x84_then_close() {
    let b = Broker::start();
    let mut c = RawClient::open(b.addr, Protocol::V3_1_1).await;
    c.send_bytes(&connect_bytes(6, 0x02, 0, "lvl6", &[])).await;
    let bytes = c.expect_closed_raw().await;
    let v311 = [0x20, 0x02, 0x00, 0x01];
    let v5 = [0x20, 0x03, 0x00, 0x84, 0x00];
    assert!(
        bytes == v311 || bytes == v5,
        "expected CONNACK 0x01 (3.1.1 form) or 0x84 (v5 form) then close, got {bytes:02x?}"
    );
}

/// (v5) MQTT-3.1.2-1: a protocol name other than "MQTT" (here "MXTT", level 4): the server
/// closes the connection, optionally after a CONNACK 0x84/0x01; never a successful CONNACK.
#[tokio::test]
async fn wrong_protocol_name_is_refused_and_closed() {
    let b = Broker::start();
    let mut c = RawClient::open(b.addr, Protocol::V3_1_1).await;
    let mut bytes = connect_bytes(4, 0x02, 0, "badname", &[]);
    bytes[5] = b'X';
    c.send_bytes(&bytes).await;
    let got = c.expect_closed_raw().await;
    assert!(
        got.is_empty() || got == [0x20, 0x02, 0x00, 0x01] || got == [0x20, 0x03, 0x00, 0x84, 0x00],
        "expected a close (optionally after CONNACK 0x01/0x84), got {got:02x?}"
    );
}

/// (3.1.1) MQTT-3.1.2-3 / (v5) MQTT-3.1.2-3: the reserved CONNECT flag must be 0; otherwise
/// the packet is malformed and the connection is closed (v5 may first send CONNACK ≥ 0x80).
#[tokio::test]
async fn reserved_connect_flag_set_closes_connection() {
    let b = Broker::start();
    for level in [4u8, 5] {
        let protocol = if level == 5 {
            Protocol::V5
        } else {
            Protocol::V3_1_1
        };
        let mut c = RawClient::open(b.addr, protocol).await;
        c.send_bytes(&connect_bytes(level, 0x03, 0, "resv", &[]))
            .await;
        let before = c.expect_closed().await;
        for p in &before {
            match p {
                Packet::ConnAck(ca) => {
                    assert!(
                        !ca.reason.is_success(),
                        "level {level}: reserved flag accepted: {ca:?}"
                    );
                    assert!(!ca.session_present, "MQTT-3.2.2-6 (v5)");
                }
                other => panic!("level {level}: unexpected {other:?}"),
            }
        }
    }
}

/// (3.1.1) MQTT-3.1.2-14 / (v5) MQTT-3.1.2-12: Will QoS 3 is malformed: the connection is
/// closed, no successful CONNACK.
#[tokio::test]
async fn will_qos_3_closes_connection() {
    let b = Broker::start();
    // flags: will flag (0x04) + will QoS 3 (0x18) + clean (0x02); will topic "w", payload "x".
    let tail = [0x00, 0x01, b'w', 0x00, 0x01, b'x'];
    let mut c = RawClient::open(b.addr, Protocol::V3_1_1).await;
    c.send_bytes(&connect_bytes(4, 0x1E, 0, "willq3", &tail))
        .await;
    let before = c.expect_closed().await;
    assert!(
        before
            .iter()
            .all(|p| matches!(p, Packet::ConnAck(ca) if !ca.reason.is_success())),
        "expected close (optionally CONNACK ≥ 0x80), got {before:?}"
    );
}

/// (3.1.1) MQTT-3.1.3-8: an empty client id with CleanSession 0 gets CONNACK 0x02 (identifier
/// rejected), Session Present 0 (MQTT-3.2.2-4), then the close (MQTT-3.2.2-5).
#[tokio::test]
async fn v311_empty_client_id_without_clean_session_rejected_0x02() {
    let b = Broker::start();
    let mut c = RawClient::open(b.addr, Protocol::V3_1_1).await;
    c.send_bytes(&connect_bytes(4, 0x00, 0, "", &[])).await;
    let bytes = c.expect_closed_raw().await;
    assert_eq!(
        bytes,
        [0x20, 0x02, 0x00, 0x02],
        "CONNACK identifier rejected, then close"
    );
}

/// (3.1.1) MQTT-3.1.3-6: an empty client id with CleanSession 1 is accepted.
#[tokio::test]
async fn v311_empty_client_id_with_clean_session_accepted() {
    let b = Broker::start();
    let (mut c, ca) =
        RawClient::connect_ok(b.addr, connect_packet(Protocol::V3_1_1, "", true, 0)).await;
    assert!(!ca.session_present);
    assert!(c.ping().await.is_empty());
}

/// (v5) MQTT-3.1.3-6, MQTT-3.1.3-7, MQTT-3.2.2-16: an empty client id with clean start gets a
/// unique Assigned Client Identifier in CONNACK.
#[tokio::test]
async fn v5_empty_client_id_gets_unique_assigned_identifier() {
    let b = Broker::start();
    let (_c1, ca1) = RawClient::connect_ok(b.addr, connect_packet(Protocol::V5, "", true, 0)).await;
    let (_c2, ca2) = RawClient::connect_ok(b.addr, connect_packet(Protocol::V5, "", true, 0)).await;
    let id1 = ca1
        .properties
        .assigned_client_identifier
        .clone()
        .expect("Assigned Client Identifier");
    let id2 = ca2
        .properties
        .assigned_client_identifier
        .clone()
        .expect("Assigned Client Identifier");
    assert!(!id1.is_empty() && !id2.is_empty());
    assert_ne!(id1, id2, "assigned ids must be unique (MQTT-3.2.2-16)");
}

/// (v5) MQTT-3.1.3-5: the server must accept 1..=23 character alphanumeric client ids.
#[tokio::test]
async fn v5_23_char_alphanumeric_client_id_accepted() {
    let b = Broker::start();
    let id = "abcdefghijKLMNOPQRST012";
    assert_eq!(id.len(), 23);
    let (_c, ca) = RawClient::connect_ok(b.addr, connect_packet(Protocol::V5, id, true, 0)).await;
    assert!(ca.properties.assigned_client_identifier.is_none());
}

/// (v5) MQTT-3.1.3-8, MQTT-3.2.2-6, MQTT-3.2.2-7: a client id the server rejects (longer than
/// `max_client_id_len`) gets CONNACK 0x85, Session Present 0, then the close. (3.1.1)
/// MQTT-3.1.3-9: the same in 3.1.1 is return code 0x02.
#[tokio::test]
async fn client_id_too_long_rejected_0x85_v5_and_0x02_v311() {
    let b = Broker::start_with("[limits]\nmax_client_id_len = 8\n");
    let (mut c, first) =
        RawClient::connect_with(b.addr, connect_packet(Protocol::V5, "nine-char", true, 0)).await;
    match first {
        Packet::ConnAck(ca) => {
            assert_eq!(ca.reason, ReasonCode::CLIENT_IDENTIFIER_NOT_VALID);
            assert!(!ca.session_present);
        }
        other => panic!("expected CONNACK 0x85, got {other:?}"),
    }
    c.expect_closed_silently().await;

    let mut c = RawClient::open(b.addr, Protocol::V3_1_1).await;
    c.send_bytes(&connect_bytes(4, 0x02, 0, "nine-char", &[]))
        .await;
    assert_eq!(c.expect_closed_raw().await, [0x20, 0x02, 0x00, 0x02]);

    // At the limit is fine.
    let _ok = RawClient::v5(b.addr, "eight-ch").await;
}

/// rumqttc sees the refusal as well (3.1.1 MQTT-3.1.3-9 via a real client).
#[tokio::test]
async fn client_id_rejection_seen_by_rumqttc_v4() {
    let b = Broker::start_with("[limits]\nmax_client_id_len = 4\n");
    let err = match v4::try_connect(v4::options(b.addr, "too-long")).await {
        Ok(_) => panic!("connection accepted"),
        Err(e) => e,
    };
    assert!(
        err.to_lowercase().contains("refused") || err.contains("Identifier"),
        "{err}"
    );
}

/// (3.1.1) MQTT-3.1.0-1 / (v5) MQTT-3.1.0-1: the first packet must be CONNECT; anything else
/// ends the connection without CONNACK.
#[tokio::test]
async fn first_packet_not_connect_closes_connection() {
    let b = Broker::start();
    let mut c = RawClient::open(b.addr, Protocol::V3_1_1).await;
    c.send_bytes(&[0xC0, 0x00]).await; // PINGREQ
    let got = c.expect_closed_raw().await;
    assert!(
        got.is_empty(),
        "no packet may be sent before a CONNECT; got {got:02x?}"
    );
}

/// (v5) MQTT-3.1.0-2: a second CONNECT is a Protocol Error: DISCONNECT 0x82 (if sent) and close.
/// (3.1.1) MQTT-3.1.0-2: the server disconnects the client.
#[tokio::test]
async fn second_connect_is_protocol_error() {
    let b = Broker::start();
    let mut c = RawClient::v5(b.addr, "twice-v5").await;
    c.send(&Packet::Connect(Box::new(connect_packet(
        Protocol::V5,
        "twice-v5",
        true,
        0,
    ))))
    .await;
    let before = c.expect_closed().await;
    for p in &before {
        match p {
            Packet::Disconnect(d) => assert_eq!(d.reason, ReasonCode::PROTOCOL_ERROR),
            other => panic!("unexpected {other:?}"),
        }
    }

    let mut c = RawClient::v4(b.addr, "twice-v4").await;
    c.send(&Packet::Connect(Box::new(connect_packet(
        Protocol::V3_1_1,
        "twice-v4",
        true,
        0,
    ))))
    .await;
    c.expect_closed_silently().await;
}

/// (v5) §3.2.2.3: CONNACK carries the limits the config sets (Receive Maximum, Topic Alias
/// Maximum, Maximum Packet Size) so that clients can obey MQTT-3.3.4-7, MQTT-3.2.2-17 and
/// MQTT-3.2.2-15.
#[tokio::test]
async fn v5_connack_advertises_configured_limits() {
    let b = Broker::start_with(
        "[limits]\nreceive_maximum = 7\ntopic_alias_maximum = 3\nmax_packet_size_bytes = 4096\n",
    );
    let (_c, ca) =
        RawClient::connect_ok(b.addr, connect_packet(Protocol::V5, "limits", true, 0)).await;
    assert_eq!(ca.properties.receive_maximum, Some(7));
    assert_eq!(ca.properties.topic_alias_maximum, Some(3));
    assert_eq!(ca.properties.maximum_packet_size, Some(4096));
}

/// (v5) MQTT-3.2.0-2: only one CONNACK per connection, and (MQTT-3.1.4-6) nothing the client
/// sends after a rejected CONNECT is processed: a PUBLISH pipelined behind a rejected CONNECT
/// reaches no subscriber.
#[tokio::test]
async fn data_after_rejected_connect_is_not_processed() {
    let b = Broker::start_with("[limits]\nmax_client_id_len = 4\n");
    let mut sub = RawClient::v5(b.addr, "sub1").await;
    sub.sub("after/reject", 0).await;
    let mut c = RawClient::open(b.addr, Protocol::V5).await;
    let mut bytes = connect_bytes(5, 0x02, 0, "much-too-long", &[]);
    // PUBLISH QoS 0 "after/reject" payload "x" (v5, empty properties).
    bytes.extend_from_slice(&[0x30, 0x10, 0x00, 0x0C]);
    bytes.extend_from_slice(b"after/reject");
    bytes.extend_from_slice(&[0x00, b'x']);
    c.send_bytes(&bytes).await;
    let before = c.expect_closed().await;
    assert_eq!(before.len(), 1, "exactly one CONNACK: {before:?}");
    // Marker through a valid client: it must be the first thing the subscriber sees.
    let mut p = RawClient::v5(b.addr, "pub1").await;
    p.publish_acked(publish("after/reject", b"marker", 0, 0))
        .await;
    assert_eq!(&sub.expect_publish().await.payload[..], b"marker");
}

/// (v5) MQTT-4.12.0-1: an Authentication Method the server does not support gets CONNACK 0x8C
/// (Bad authentication method) and the connection is closed.
#[tokio::test]
async fn v5_unsupported_authentication_method_connack_0x8c() {
    let b = Broker::start();
    let mut c = connect_packet(Protocol::V5, "auth", true, 0);
    c.properties.authentication_method = Some(s("SCRAM-SHA-1"));
    let (mut conn, first) = RawClient::connect_with(b.addr, c).await;
    match first {
        Packet::ConnAck(ca) => {
            assert_eq!(ca.reason, ReasonCode::BAD_AUTHENTICATION_METHOD);
            assert!(!ca.session_present, "MQTT-3.2.2-6");
        }
        other => panic!("expected CONNACK 0x8C, got {other:?}"),
    }
    conn.expect_closed_silently().await;
}

/// (v5) MQTT-4.7.0-1 (no wildcards in a topic name; the Will Topic is one): CONNACK 0x90
/// (Topic Name invalid) or 0x81 (Malformed Packet — a decoder may treat it as such) and close. (3.1.1) MQTT-3.1.4-1: the connection is closed
/// (a CONNACK, if any, is not a success).
#[tokio::test]
async fn will_topic_with_wildcard_is_refused() {
    let b = Broker::start();
    for protocol in [Protocol::V5, Protocol::V3_1_1] {
        let mut c = connect_packet(protocol, "badwill", true, 0);
        c.will = Some(Will {
            topic: s("will/+"),
            payload: bytes::Bytes::from_static(b"x"),
            qos: QoS::AtMostOnce,
            retain: false,
            properties: Properties::default(),
        });
        let mut conn = RawClient::open(b.addr, protocol).await;
        conn.send(&Packet::Connect(Box::new(c))).await;
        let before = conn.expect_closed().await;
        if protocol == Protocol::V5 {
            assert!(
                matches!(before.as_slice(), [Packet::ConnAck(ca)] if (ca.reason == ReasonCode::TOPIC_NAME_INVALID || ca.reason == ReasonCode::MALFORMED_PACKET) && !ca.session_present),
                "{before:?}"
            );
        } else {
            assert!(
                before
                    .iter()
                    .all(|p| matches!(p, Packet::ConnAck(ca) if !ca.reason.is_success())),
                "{before:?}"
            );
        }
    }
}

/// (v5) §3.1.3.2.3 / §3.3.2.3.2: a will with Payload Format Indicator 1 whose payload is not
/// UTF-8 gets CONNACK 0x99 (Payload format invalid) and close.
#[tokio::test]
async fn v5_will_payload_not_utf8_connack_0x99() {
    let b = Broker::start();
    let mut c = connect_packet(Protocol::V5, "pfiwill", true, 0);
    let props: Properties = tern_wire::PropertyValues {
        payload_format_indicator: Some(1),
        ..tern_wire::PropertyValues::default()
    }
    .into();
    c.will = Some(Will {
        topic: s("will/t"),
        payload: bytes::Bytes::from_static(&[0xff, 0xfe]),
        qos: QoS::AtMostOnce,
        retain: false,
        properties: props,
    });
    let (mut conn, first) = RawClient::connect_with(b.addr, c).await;
    assert!(
        matches!(&first, Packet::ConnAck(ca) if ca.reason == ReasonCode::PAYLOAD_FORMAT_INVALID),
        "{first:?}"
    );
    conn.expect_closed_silently().await;
}

/// (v5) MQTT-3.2.2-15 with §3.2.2.2: a CONNECT larger than the server's maximum packet size is
/// refused with CONNACK 0x95 (Packet too large) and close; in 3.1.1 (no such code) the
/// connection is closed without a successful CONNACK.
#[tokio::test]
async fn oversize_connect_is_refused() {
    let b = Broker::start_with("[limits]\nmax_packet_size_bytes = 128\n");
    for protocol in [Protocol::V5, Protocol::V3_1_1] {
        let mut c = connect_packet(protocol, "bigconnect", true, 0);
        c.will = Some(Will {
            topic: s("will/t"),
            payload: bytes::Bytes::from(vec![b'x'; 300]),
            qos: QoS::AtMostOnce,
            retain: false,
            properties: Properties::default(),
        });
        let mut conn = RawClient::open(b.addr, protocol).await;
        conn.send(&Packet::Connect(Box::new(c))).await;
        let before = conn.expect_closed().await;
        if protocol == Protocol::V5 {
            assert!(
                matches!(before.as_slice(), [Packet::ConnAck(ca)] if ca.reason == ReasonCode::PACKET_TOO_LARGE),
                "{before:?}"
            );
        } else {
            assert!(
                before
                    .iter()
                    .all(|p| matches!(p, Packet::ConnAck(ca) if !ca.reason.is_success())),
                "{before:?}"
            );
        }
    }
}

/// (v5) MQTT-3.1.2-3 / MQTT-3.1.4-1: a v5 CONNECT with the reserved flag set is malformed: when
/// a CONNACK is sent before the close it carries 0x81 (Malformed Packet).
#[tokio::test]
async fn v5_malformed_connect_connack_is_0x81() {
    let b = Broker::start();
    let mut c = RawClient::open(b.addr, Protocol::V5).await;
    c.send_bytes(&connect_bytes(5, 0x03, 0, "resv5", &[])).await;
    let before = c.expect_closed().await;
    for p in &before {
        assert!(
            matches!(p, Packet::ConnAck(ca) if ca.reason == ReasonCode::MALFORMED_PACKET),
            "{before:?}"
        );
    }
}

/// (v5) §3.2.2.3.2: the server may lower the Session Expiry Interval
/// (`max_session_expiry_interval_s`) and then tells the client the value it uses in CONNACK;
/// the session then ends after that (shorter) interval.
#[tokio::test]
async fn v5_session_expiry_is_capped_and_announced() {
    let b = Broker::start_with("[limits]\nmax_session_expiry_interval_s = 1\n");
    let mut c = connect_packet(Protocol::V5, "capped", true, 0);
    c.properties.session_expiry_interval_s = Some(3600);
    let (conn, ca) = RawClient::connect_ok(b.addr, c.clone()).await;
    assert_eq!(ca.properties.session_expiry_interval_s, Some(1));
    conn.disconnect().await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    c.clean_start = false;
    let (_conn, ca) = RawClient::connect_ok(b.addr, c).await;
    assert!(
        !ca.session_present,
        "session outlived the capped interval (MQTT-4.1.0-2)"
    );
}

/// (v5) MQTT-3.2.2-9 and friends: CONNACK tells what the server supports (retain, wildcard,
/// subscription identifiers, shared subscriptions); none of them is announced as 0 since Tern
/// supports all of them.
#[tokio::test]
async fn v5_connack_announces_no_unsupported_feature() {
    let b = Broker::start();
    let (_c, ca) =
        RawClient::connect_ok(b.addr, connect_packet(Protocol::V5, "feat", true, 0)).await;
    let p = &ca.properties;
    for (name, v) in [
        ("retain available", p.retain_available),
        (
            "wildcard subscription available",
            p.wildcard_subscription_available,
        ),
        (
            "subscription identifier available",
            p.subscription_identifier_available,
        ),
        (
            "shared subscription available",
            p.shared_subscription_available,
        ),
    ] {
        assert_ne!(v, Some(0), "{name} announced as unsupported");
    }
    assert!(
        matches!(p.maximum_qos, None | Some(2)),
        "maximum QoS {:?}",
        p.maximum_qos
    );
}

/// (v5) §3.1.2.11: a CONNECT whose properties break the rules — Receive Maximum 0, Maximum
/// Packet Size 0, a property given twice, a property CONNECT may not carry — is refused: a
/// CONNACK with 0x81/0x82 (if any) and the close; never a successful CONNACK.
#[tokio::test]
async fn v5_connect_with_invalid_properties_is_refused() {
    let b = Broker::start();
    let cases: [(&str, &[u8]); 4] = [
        ("receive maximum 0", &[0x21, 0x00, 0x00]),
        ("maximum packet size 0", &[0x27, 0x00, 0x00, 0x00, 0x00]),
        (
            "session expiry twice",
            &[0x11, 0, 0, 0, 1, 0x11, 0, 0, 0, 2],
        ),
        ("topic alias (PUBLISH only)", &[0x23, 0x00, 0x01]),
    ];
    for (name, props) in cases {
        let mut c = RawClient::open(b.addr, Protocol::V5).await;
        c.send_bytes(&connect_bytes_with_properties(
            5,
            0x02,
            0,
            props,
            "badprops",
            &[],
        ))
        .await;
        let before = c.expect_closed().await;
        assert!(
            before.iter().all(|p| matches!(p, Packet::ConnAck(ca)
                if ca.reason == ReasonCode::MALFORMED_PACKET || ca.reason == ReasonCode::PROTOCOL_ERROR)),
            "{name}: {}",
            briefs(&before)
        );
    }
}

/// (v5) MQTT-3.1.2-28, MQTT-3.1.2-29: with Request Response Information 0 the CONNACK has no
/// Response Information; with Request Problem Information 0 no Reason String or User Property
/// comes on a SUBACK (here a refused filter) or UNSUBACK.
#[tokio::test]
async fn v5_request_problem_and_response_information_zero_are_respected() {
    let b = Broker::start();
    let mut c = connect_packet(Protocol::V5, "rpi0", true, 0);
    c.properties.request_problem_information = Some(0);
    c.properties.request_response_information = Some(0);
    let (mut conn, ca) = RawClient::connect_ok(b.addr, c).await;
    assert!(
        ca.properties.response_information.is_none(),
        "MQTT-3.1.2-28"
    );
    conn.send(&Packet::Subscribe(subscribe(
        1,
        &[("ok/t", opts(0)), ("bad/#/x", opts(0))],
    )))
    .await;
    match conn.expect_packet().await {
        Packet::SubAck(sa) => {
            assert!(
                sa.properties.reason_string.is_none() && sa.properties.user.is_empty(),
                "MQTT-3.1.2-29"
            );
        }
        // Refusing the filter as a malformed packet is allowed too (see invalid_topic_filter_is_refused).
        Packet::Disconnect(_) => return,
        other => panic!("expected SUBACK, got {}", brief(&other)),
    }
    conn.send(&Packet::Unsubscribe(Unsubscribe {
        packet_id: 2,
        properties: Properties::default(),
        filters: vec![s("nope")],
    }))
    .await;
    match conn.expect_packet().await {
        Packet::UnsubAck(ua) => {
            assert!(
                ua.properties.reason_string.is_none() && ua.properties.user.is_empty(),
                "MQTT-3.1.2-29"
            );
        }
        other => panic!("expected UNSUBACK, got {}", brief(&other)),
    }
}

/// MQTT 3.1 (protocol name "MQIsdp", level 3), which tern-wire models: a 3.1 client can connect,
/// subscribe and receive.
#[tokio::test]
async fn mqtt_3_1_client_works() {
    let b = Broker::start();
    let (mut c, ca) =
        RawClient::connect_ok(b.addr, connect_packet(Protocol::V3_1, "old31", true, 0)).await;
    assert!(!ca.session_present);
    c.sub("v31/t", 1).await;
    let mut p = RawClient::v5(b.addr, "v31-p").await;
    p.publish_acked(publish("v31/t", b"hello 3.1", 1, 1)).await;
    let got = c.receive_acked().await;
    assert_eq!(&got.payload[..], b"hello 3.1");
}

/// `[limits] max_sessions`: with one session allowed, a CONNECT that needs a second session is
/// refused with CONNACK 0x89 Server busy (v5, §3.2.2.2: "The Server is busy. Try again later")
/// or return code 3 Server unavailable (3.1.1, §3.2.2.3), then closed; the connected client is
/// unaffected. A CONNECT under the same client id reuses the session, so the takeover
/// (v5 MQTT-3.1.4-3: the old connection gets DISCONNECT 0x8E) is still allowed.
#[tokio::test]
async fn max_sessions_refuses_new_client_ids_but_not_takeover() {
    let b = Broker::start_with("[limits]\nmax_sessions = 1\n");
    let mut first = RawClient::v5(b.addr, "ms-first").await;
    first.sub("ms/t", 1).await;

    let (mut second, reply) =
        RawClient::connect_with(b.addr, connect_packet(Protocol::V5, "ms-second", true, 0)).await;
    match reply {
        Packet::ConnAck(ca) => {
            assert_eq!(ca.reason, ReasonCode::SERVER_BUSY, "v5: 0x89 Server busy");
            assert!(!ca.session_present);
        }
        other => panic!("expected CONNACK 0x89, got {other:?}"),
    }
    second.expect_closed_silently().await;

    let mut third = RawClient::open(b.addr, Protocol::V3_1_1).await;
    third
        .send_bytes(&connect_bytes(4, 0x02, 0, "ms-third", &[]))
        .await;
    assert_eq!(
        third.expect_closed_raw().await,
        [0x20, 0x02, 0x00, 0x03],
        "3.1.1: return code 3 Server unavailable"
    );

    // The first client keeps working.
    first
        .publish_acked(publish("ms/t", b"still here", 1, 1))
        .await;
    assert_eq!(&first.receive_acked().await.payload[..], b"still here");

    // Same client id: takeover, not a new session.
    let mut again = RawClient::v5(b.addr, "ms-first").await;
    assert_eq!(
        first.expect_disconnect().await,
        ReasonCode::SESSION_TAKEN_OVER
    );
    assert!(again.ping().await.is_empty(), "new connection stays usable");
}
