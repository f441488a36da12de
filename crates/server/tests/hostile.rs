//! Hostile and malformed input, as literal bytes: strict string rules (control characters,
//! MQTT 5 §1.5.4 lets a server refuse them; mosquitto does), CONNECT edge cases, zero-length
//! filters, Response Topic wildcards, and the limits (topic levels, topic length, connect rate
//! per source IP).

mod common;

use common::Broker;
use common::raw::*;

/// A packet from its first byte and body (remaining length < 128).
fn packet(first: u8, body: &[u8]) -> Vec<u8> {
    assert!(body.len() < 128);
    let mut out = vec![first, body.len() as u8];
    out.extend_from_slice(body);
    out
}

fn string(s: &[u8]) -> Vec<u8> {
    let mut out = (s.len() as u16).to_be_bytes().to_vec();
    out.extend_from_slice(s);
    out
}

/// PUBLISH QoS 0 to raw topic bytes; `v5` adds an empty property block.
fn publish0(topic: &[u8], v5: bool) -> Vec<u8> {
    let mut body = string(topic);
    if v5 {
        body.push(0);
    }
    body.extend_from_slice(b"x");
    packet(0x30, &body)
}

fn subscribe_raw(first: u8, filter: &[u8], v5: bool, with_options: bool) -> Vec<u8> {
    let mut body = vec![0x00, 0x01];
    if v5 {
        body.push(0);
    }
    body.extend_from_slice(&string(filter));
    if with_options {
        body.push(0x01);
    }
    packet(first, &body)
}

/// Sends `v5` on a v5 connection and `v4` on a 3.1.1 one; both must be closed, the v5 one at
/// most after a DISCONNECT with `reason`.
async fn assert_closes(b: &Broker, v5: &[u8], v4: &[u8], reason: ReasonCode) {
    let mut c = RawClient::v5(b.addr, "h5").await;
    c.send_bytes(v5).await;
    let before = c.expect_closed().await;
    assert!(
        before
            .iter()
            .all(|p| matches!(p, Packet::Disconnect(d) if d.reason == reason)),
        "v5: expected DISCONNECT {reason:?} then close, got {}",
        briefs(&before)
    );
    let mut c = RawClient::v4(b.addr, "h4").await;
    c.send_bytes(v4).await;
    c.expect_closed_silently().await;
}

/// MQTT-3.1.2-1: a protocol name other than "MQTT" (or "MQIsdp" at level 3): closed without a
/// CONNACK.
#[tokio::test]
async fn wrong_protocol_name_closes_without_connack() {
    let b = Broker::start();
    for level in [4u8, 5] {
        let mut bytes = connect_bytes(level, 0x02, 0, "badname", &[]);
        bytes[5] = b'X';
        let mut c = RawClient::open(b.addr, Protocol::V3_1_1).await;
        c.send_bytes(&bytes).await;
        assert_eq!(c.expect_closed_raw().await, b"", "level {level}");
    }
}

/// MQTT-3.1.2-2: an unsupported level gets return code 1 in the 3.1.1 form; a CONNECT of a
/// later level laid out as a v5 one (properties before the client id) gets the v5 form, 0x84.
#[tokio::test]
async fn unsupported_level_rc_1_in_v3_form_or_0x84_in_v5_form() {
    let b = Broker::start();
    let mut c = RawClient::open(b.addr, Protocol::V3_1_1).await;
    c.send_bytes(&connect_bytes(2, 0x02, 0, "lvl2", &[])).await;
    assert_eq!(c.expect_closed_raw().await, [0x20, 0x02, 0x00, 0x01]);
    let mut c = RawClient::open(b.addr, Protocol::V3_1_1).await;
    c.send_bytes(&connect_bytes(6, 0x02, 0, "lvl6", &[])).await;
    assert_eq!(
        c.expect_closed_raw().await,
        [0x20, 0x02, 0x00, 0x01],
        "3.x layout"
    );
    // Level 6 laid out as v5: a property block (empty) before the client id.
    let mut body = string(b"MQTT");
    body.extend_from_slice(&[6, 0x02, 0x00, 0x00, 0x00]);
    body.extend_from_slice(&string(b"lvl6"));
    let mut c = RawClient::open(b.addr, Protocol::V5).await;
    c.send_bytes(&packet(0x10, &body)).await;
    assert_eq!(
        c.expect_closed_raw().await,
        [0x20, 0x03, 0x00, 0x84, 0x00],
        "v5 layout"
    );
}

/// MQTT 3.1 (MQIsdp): a client identifier of 1 to 23 characters; outside that, return code 2
/// (identifier rejected).
#[tokio::test]
async fn mqtt_3_1_client_id_outside_1_to_23_characters_gets_rc_2() {
    let b = Broker::start();
    let connect31 = |id: &str| {
        let mut body = string(b"MQIsdp");
        body.extend_from_slice(&[3, 0x02, 0x00, 0x00]);
        body.extend_from_slice(&string(id.as_bytes()));
        packet(0x10, &body)
    };
    for id in ["", "abcdefghijklmnopqrstuvwx"] {
        let mut c = RawClient::open(b.addr, Protocol::V3_1).await;
        c.send_bytes(&connect31(id)).await;
        assert_eq!(
            c.expect_closed_raw().await,
            [0x20, 0x02, 0x00, 0x02],
            "id {id:?}"
        );
    }
    let mut c = RawClient::open(b.addr, Protocol::V3_1).await;
    c.send_bytes(&connect31("abcdefghijklmnopqrstuvw")).await;
    match c.expect_packet().await {
        Packet::ConnAck(ca) => assert_eq!(ca.reason, ReasonCode::SUCCESS),
        other => panic!("expected CONNACK, got {}", brief(&other)),
    }
}

/// MQTT-4.7.3-1: topic filters are at least one character long; a zero-length one in
/// SUBSCRIBE or UNSUBSCRIBE closes the connection (v5: DISCONNECT 0x81 first).
#[tokio::test]
async fn zero_length_filter_in_subscribe_or_unsubscribe_closes() {
    let b = Broker::start();
    for (first, options) in [(0x82, true), (0xA2, false)] {
        assert_closes(
            &b,
            &subscribe_raw(first, b"", true, options),
            &subscribe_raw(first, b"", false, options),
            ReasonCode::MALFORMED_PACKET,
        )
        .await;
    }
}

/// MQTT 5 §1.5.4 (and 3.1.1 §1.5.3): a server may treat U+0001..U+001F and U+007F..U+009F as
/// malformed; strict by default: the connection closes (v5: DISCONNECT 0x81).
#[tokio::test]
async fn control_characters_in_topics_and_filters_close_the_connection() {
    let b = Broker::start();
    let bad: [&[u8]; 4] = [b"a\x01", b"a/\x1f", b"\x7fb", b"a\xc2\x85"];
    for topic in bad {
        assert_closes(
            &b,
            &publish0(topic, true),
            &publish0(topic, false),
            ReasonCode::MALFORMED_PACKET,
        )
        .await;
        for (first, options) in [(0x82, true), (0xA2, false)] {
            assert_closes(
                &b,
                &subscribe_raw(first, topic, true, options),
                &subscribe_raw(first, topic, false, options),
                ReasonCode::MALFORMED_PACKET,
            )
            .await;
        }
    }
}

/// The same rule for the CONNECT's client id and username: v5 CONNACK 0x81, 3.1.1 closed
/// without a CONNACK (it has no code for a malformed packet).
#[tokio::test]
async fn control_characters_in_client_id_or_username_refuse_the_connect() {
    let b = Broker::start();
    let user_tail = string(b"us\x1ber");
    for (id, flags, tail) in [("c\x07", 0x02, &[][..]), ("cid", 0x82, &user_tail[..])] {
        let mut c = RawClient::open(b.addr, Protocol::V5).await;
        c.send_bytes(&connect_bytes(5, flags, 0, id, tail)).await;
        assert_eq!(
            c.expect_closed_raw().await,
            [0x20, 0x03, 0x00, 0x81, 0x00],
            "{id:?}"
        );
        let mut c = RawClient::open(b.addr, Protocol::V3_1_1).await;
        c.send_bytes(&connect_bytes(4, flags, 0, id, tail)).await;
        assert_eq!(c.expect_closed_raw().await, b"", "{id:?}");
    }
}

/// `reject_control_chars = false` lets them through (the rule is configurable).
#[tokio::test]
async fn control_characters_are_allowed_when_configured() {
    let b = Broker::start_with("[limits]\nreject_control_chars = false\n");
    let mut sub = RawClient::v5(b.addr, "s").await;
    sub.sub("a/#", 0).await;
    let mut p = RawClient::v5(b.addr, "p").await;
    p.send_bytes(&publish0(b"a/\x01", true)).await;
    assert_eq!(&*sub.expect_publish().await.topic, "a/\u{1}");
}

/// MQTT-3.3.2-14 (v5): the Response Topic is a Topic Name; a wildcard in it is a protocol
/// error (DISCONNECT 0x82).
#[tokio::test]
async fn v5_response_topic_with_wildcard_is_a_protocol_error() {
    let b = Broker::start();
    let with_response = |response: &[u8]| {
        let mut props = vec![0x08];
        props.extend_from_slice(&string(response));
        let mut body = string(b"t");
        body.push(props.len() as u8);
        body.extend_from_slice(&props);
        body.extend_from_slice(b"x");
        packet(0x30, &body)
    };
    let mut ok = RawClient::v5(b.addr, "rt-ok").await;
    ok.send_bytes(&with_response(b"reply/here")).await;
    assert!(
        ok.ping()
            .await
            .iter()
            .all(|p| !matches!(p, Packet::Disconnect(_)))
    );
    for response in [&b"reply/#"[..], b"reply/+/x"] {
        let mut c = RawClient::v5(b.addr, "rt").await;
        c.send_bytes(&with_response(response)).await;
        assert_eq!(c.expect_disconnect().await, ReasonCode::PROTOCOL_ERROR);
    }
}

/// `max_topic_levels` and `max_topic_length_bytes`: a PUBLISH beyond them is an invalid topic
/// name (v5 DISCONNECT 0x90, 3.1.1 closed), a filter beyond them is refused in the SUBACK
/// (0x8F / 0x80).
#[tokio::test]
async fn topic_level_and_length_limits() {
    let b = Broker::start_with("[limits]\nmax_topic_levels = 3\nmax_topic_length_bytes = 16\n");
    for topic in [&b"a/b/c/d"[..], b"abcdefghijklmnopq"] {
        assert_closes(
            &b,
            &publish0(topic, true),
            &publish0(topic, false),
            ReasonCode::TOPIC_NAME_INVALID,
        )
        .await;
    }
    let mut c = RawClient::v5(b.addr, "lim5").await;
    let reasons = c
        .subscribe(subscribe(1, &[("a/b/c", opts(0)), ("a/b/c/#", opts(0))]))
        .await;
    assert_eq!(reasons, [ReasonCode(0), ReasonCode::TOPIC_FILTER_INVALID]);
    let mut c = RawClient::v4(b.addr, "lim4").await;
    let reasons = c
        .subscribe(subscribe(1, &[("abcdefghijklmnopq", opts(0))]))
        .await;
    assert_eq!(reasons, [ReasonCode::UNSPECIFIED_ERROR]);
    c.publish_acked(publish("a/b/c", b"ok", 1, 1)).await;
}

/// `max_connect_rate_per_ip` / `connect_rate_burst`: a token bucket per source address; a
/// CONNECT beyond it gets v5 CONNACK 0x9F (Connection rate exceeded) / 3.1.1 return code 3.
#[tokio::test]
async fn connect_rate_per_source_address() {
    let b = Broker::start_with("[limits]\nmax_connect_rate_per_ip = 1\nconnect_rate_burst = 3\n");
    let mut refused = 0;
    let mut kept = Vec::new();
    for i in 0..10 {
        let (c, first) = RawClient::connect_with(
            b.addr,
            connect_packet(Protocol::V5, &format!("r{i}"), true, 0),
        )
        .await;
        match first {
            Packet::ConnAck(ca) if ca.reason == ReasonCode::SUCCESS => {
                assert_eq!(
                    refused, 0,
                    "accepted after a refusal within the same second?"
                );
                kept.push(c);
            }
            Packet::ConnAck(ca) => {
                assert_eq!(ca.reason, ReasonCode::CONNECTION_RATE_EXCEEDED);
                refused += 1;
            }
            other => panic!("expected CONNACK, got {}", brief(&other)),
        }
    }
    assert!(kept.len() >= 3, "the burst is admitted");
    assert!(
        refused > 0,
        "10 connects from one address in well under 7 s"
    );
}
