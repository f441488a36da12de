//! Malformed packets and protocol errors, written as literal bytes so that no codec stands
//! between the test and the broker; plus string rules (UTF-8, U+0000, BOM, no normalisation).

mod common;

use bytes::Bytes;
use common::Broker;
use common::raw::*;

/// Opens a v5 and a 3.1.1 connection, writes `v5_bytes` / `v4_bytes`, and asserts each
/// connection is closed; a v5 DISCONNECT before the close must carry one of `v5_reasons`.
async fn assert_closes(b: &Broker, v5_bytes: &[u8], v4_bytes: &[u8], v5_reasons: &[ReasonCode]) {
    let mut c = RawClient::v5(b.addr, "mal5").await;
    c.send_bytes(v5_bytes).await;
    let before = c.expect_closed().await;
    for p in &before {
        assert!(
            matches!(p, Packet::Disconnect(d) if v5_reasons.contains(&d.reason)),
            "v5: got {} (allowed DISCONNECT reasons {v5_reasons:?})",
            briefs(&before)
        );
    }
    let mut c = RawClient::v4(b.addr, "mal4").await;
    c.send_bytes(v4_bytes).await;
    c.expect_closed_silently().await;
}

const MALFORMED: &[ReasonCode] = &[ReasonCode::MALFORMED_PACKET];
const MALFORMED_OR_PROTOCOL: &[ReasonCode] =
    &[ReasonCode::MALFORMED_PACKET, ReasonCode::PROTOCOL_ERROR];

/// (v5) MQTT-1.5.5-1 / §2.1.4: a Remaining Length of more than four bytes is malformed.
#[tokio::test]
async fn remaining_length_over_four_bytes_closes() {
    let b = Broker::start();
    let bytes = [0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F];
    assert_closes(&b, &bytes, &bytes, MALFORMED).await;
}

/// (v5) MQTT-1.5.4-1 / (3.1.1) MQTT-1.5.3-1: ill-formed UTF-8 in a topic closes the connection.
#[tokio::test]
async fn invalid_utf8_topic_closes() {
    let b = Broker::start();
    let v5 = [0x30, 0x06, 0x00, 0x02, 0xC3, 0x28, 0x00, b'x'];
    let v4 = [0x30, 0x05, 0x00, 0x02, 0xC3, 0x28, b'x'];
    assert_closes(&b, &v5, &v4, MALFORMED).await;
}

/// (v5) MQTT-1.5.4-2 / (3.1.1) MQTT-1.5.3-2: U+0000 in a string closes the connection.
#[tokio::test]
async fn null_character_in_topic_closes() {
    let b = Broker::start();
    let v5 = [0x30, 0x06, 0x00, 0x02, b'a', 0x00, 0x00, b'x'];
    let v4 = [0x30, 0x05, 0x00, 0x02, b'a', 0x00, b'x'];
    assert_closes(&b, &v5, &v4, MALFORMED).await;
}

/// (v5) MQTT-3.6.1-1 / (3.1.1) MQTT-3.6.1-1: PUBREL flags must be 0010.
#[tokio::test]
async fn pubrel_with_bad_flags_closes() {
    let b = Broker::start();
    let v5 = [0x60, 0x02, 0x00, 0x01];
    assert_closes(&b, &v5, &v5, MALFORMED).await;
}

/// (v5) MQTT-3.10.1-1 / (3.1.1) MQTT-3.10.1-1: UNSUBSCRIBE flags must be 0010.
#[tokio::test]
async fn unsubscribe_with_bad_flags_closes() {
    let b = Broker::start();
    let v5 = [0xA0, 0x06, 0x00, 0x01, 0x00, 0x00, 0x01, b'a'];
    let v4 = [0xA0, 0x05, 0x00, 0x01, 0x00, 0x01, b'a'];
    assert_closes(&b, &v5, &v4, MALFORMED).await;
}

/// (v5) §3.3.2.3.4 / (3.1.1) MQTT-4.7.3-1: an empty Topic Name without a Topic Alias is a
/// Protocol Error (v5: DISCONNECT 0x82); in 3.1.1 topic names have at least one character.
#[tokio::test]
async fn empty_topic_without_alias_closes() {
    let b = Broker::start();
    let v5 = [0x30, 0x04, 0x00, 0x00, 0x00, b'x'];
    let v4 = [0x30, 0x03, 0x00, 0x00, b'x'];
    assert_closes(&b, &v5, &v4, &[ReasonCode::PROTOCOL_ERROR]).await;
}

/// (v5) MQTT-2.2.1-3 / (3.1.1) MQTT-2.3.1-1: a QoS 1 PUBLISH needs a non-zero packet id.
#[tokio::test]
async fn qos1_publish_with_packet_id_zero_closes() {
    let b = Broker::start();
    let v5 = [0x32, 0x07, 0x00, 0x01, b'a', 0x00, 0x00, 0x00, b'x'];
    let v4 = [0x32, 0x06, 0x00, 0x01, b'a', 0x00, 0x00, b'x'];
    assert_closes(&b, &v5, &v4, MALFORMED_OR_PROTOCOL).await;
}

/// A client sending a server-only packet (SUBACK, CONNACK) commits a protocol error.
#[tokio::test]
async fn server_only_packets_from_client_close() {
    let b = Broker::start();
    let suback5 = [0x90, 0x04, 0x00, 0x01, 0x00, 0x00];
    let suback4 = [0x90, 0x03, 0x00, 0x01, 0x00];
    assert_closes(&b, &suback5, &suback4, MALFORMED_OR_PROTOCOL).await;
    let connack5 = [0x20, 0x03, 0x00, 0x00, 0x00];
    let connack4 = [0x20, 0x02, 0x00, 0x00];
    assert_closes(&b, &connack5, &connack4, MALFORMED_OR_PROTOCOL).await;
}

/// (v5) MQTT-4.12.0-7: without an Authentication Method in CONNECT the client must not send
/// AUTH; the server treats it as a protocol error.
#[tokio::test]
async fn v5_auth_without_method_is_protocol_error() {
    let b = Broker::start();
    let mut c = RawClient::v5(b.addr, "auth0").await;
    c.send_bytes(&[0xF0, 0x00]).await;
    let before = c.expect_closed().await;
    assert!(
        before.iter().all(
            |p| matches!(p, Packet::Disconnect(d) if MALFORMED_OR_PROTOCOL.contains(&d.reason))
        ),
        "{}",
        briefs(&before)
    );
}

/// (v5) MQTT-3.14.1-1 with MQTT-3.1.2-8: a DISCONNECT with reserved flags set is malformed —
/// it is not a normal disconnection, so the will IS published.
#[tokio::test]
async fn malformed_disconnect_does_not_suppress_the_will() {
    let b = Broker::start();
    let mut s = RawClient::v5(b.addr, "md-s").await;
    s.sub("md/will", 0).await;
    let mut c = connect_packet(Protocol::V5, "md-c", true, 0);
    c.will = Some(Will {
        topic: s_("md/will"),
        payload: Bytes::from_static(b"bad-disconnect"),
        qos: QoS::AtMostOnce,
        retain: false,
        properties: Properties::default(),
    });
    let (mut conn, _) = RawClient::connect_ok(b.addr, c).await;
    conn.send_bytes(&[0xE1, 0x00]).await;
    conn.expect_closed().await;
    assert_eq!(&s.expect_publish().await.payload[..], b"bad-disconnect");
}

/// (v5) MQTT-1.5.4-3: a BOM (U+FEFF) in a topic is a character like any other: not stripped,
/// matched only by a filter that has it.
#[tokio::test]
async fn bom_in_topic_is_not_stripped() {
    let b = Broker::start();
    let mut with = RawClient::v5(b.addr, "bom-with").await;
    with.sub("\u{FEFF}bom/t", 0).await;
    let mut without = RawClient::v5(b.addr, "bom-without").await;
    without.sub("bom/t", 0).await;
    let mut p = RawClient::v5(b.addr, "bom-p").await;
    p.publish_acked(publish("\u{FEFF}bom/t", b"x", 0, 0)).await;
    p.publish_acked(publish("bom/t", b"marker", 0, 0)).await;
    assert_eq!(with.expect_publish().await.topic.as_str(), "\u{FEFF}bom/t");
    assert_eq!(&without.expect_publish().await.payload[..], b"marker");
}

/// (v5) MQTT-4.7.3-4: no normalisation: `a/b`, `a//b`, `A/b` and `a/b/` are different topics.
#[tokio::test]
async fn topics_are_not_normalised() {
    let b = Broker::start();
    let mut s = RawClient::v5(b.addr, "norm-s").await;
    s.sub("a/b", 0).await;
    let mut p = RawClient::v5(b.addr, "norm-p").await;
    for t in ["a//b", "A/b", "a/b/", "/a/b", "a/b"] {
        p.publish_acked(publish(t, t.as_bytes(), 0, 0)).await;
    }
    let got = s.expect_publish().await;
    assert_eq!((got.topic.as_str(), &got.payload[..]), ("a/b", &b"a/b"[..]));
    assert!(s.ping().await.is_empty());
}

fn s_(text: &str) -> Str {
    s(text)
}

/// (3.1.1) MQTT-3.8.3-4 / (v5) MQTT-3.8.3-5 and §3.8.3.1: requested QoS 3 (3.1.1) or Retain
/// Handling 3 (v5) in the subscription options is malformed.
#[tokio::test]
async fn subscribe_with_invalid_options_closes() {
    let b = Broker::start();
    let v5 = [0x82, 0x07, 0x00, 0x01, 0x00, 0x00, 0x01, b'a', 0x30];
    let v4 = [0x82, 0x06, 0x00, 0x01, 0x00, 0x01, b'a', 0x03];
    assert_closes(&b, &v5, &v4, MALFORMED_OR_PROTOCOL).await;
}

/// MQTT-3.2.0-1: the first packet the server sends is the CONNACK, also when the client's
/// next packet, arriving in the same read as its CONNECT, is malformed and closes the
/// connection: the CONNACK still queued leaves ahead of the DISCONNECT 0x81 (it used to be
/// dropped with the session's queues at the close, found by the close-linger work).
#[tokio::test]
async fn a_malformed_packet_read_with_the_connect_still_gets_the_connack_first_mqtt_3_2_0_1() {
    let b = Broker::start();
    let mut c = RawClient::open(b.addr, Protocol::V5).await;
    let mut bytes = bytes::BytesMut::new();
    tern_wire::encode(
        &Packet::Connect(Box::new(connect_packet(Protocol::V5, "mal-first", true, 0))),
        Protocol::V5,
        &mut bytes,
    )
    .expect("encode CONNECT");
    // A PUBLISH whose Remaining Length runs past four bytes.
    bytes.extend_from_slice(&[0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F]);
    c.send_bytes(&bytes).await;
    let packets = c.expect_closed().await;
    assert!(
        matches!(packets.first(), Some(Packet::ConnAck(_))),
        "first packet: {}",
        briefs(&packets)
    );
    assert!(
        matches!(packets.last(), Some(Packet::Disconnect(d)) if d.reason == ReasonCode::MALFORMED_PACKET),
        "last packet: {}",
        briefs(&packets)
    );
}
