//! Will messages: abnormal close, keep-alive expiry, not on normal DISCONNECT, DISCONNECT 0x04,
//! will retain, will delay (v5), will properties (v5).

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::Broker;
use common::raw::*;
use common::rumq::{v4, v5};

fn will(topic: &str, payload: &[u8], qos_level: u8, retain: bool) -> Will {
    Will {
        topic: s(topic),
        payload: Bytes::copy_from_slice(payload),
        qos: qos(qos_level),
        retain,
        properties: Properties::default(),
    }
}

fn with_will(protocol: Protocol, id: &str, keep_alive_s: u16, w: Will) -> Connect {
    let mut c = connect_packet(protocol, id, true, keep_alive_s);
    c.will = Some(w);
    c
}

/// (3.1.1) MQTT-3.1.2-8: the will is published when the connection closes without DISCONNECT
/// (rumqttc v4 client whose socket is dropped).
#[tokio::test]
async fn v311_will_on_abnormal_close_rumqttc() {
    let b = Broker::start();
    let mut s = v4::connect(v4::options(b.addr, "w4-s")).await;
    s.subscribe("will4/#", v4::QoS::AtLeastOnce).await;
    let mut o = v4::options(b.addr, "w4-c");
    o.set_last_will(v4::LastWill::new(
        "will4/c",
        "gone",
        v4::QoS::AtLeastOnce,
        false,
    ));
    let c = v4::connect(o).await;
    drop(c); // aborts the event loop: the socket closes without DISCONNECT
    let got = s.expect_publish().await;
    assert_eq!(got.topic, "will4/c");
    assert_eq!(&got.payload[..], b"gone");
    assert_eq!(got.qos, v4::QoS::AtLeastOnce);
    assert!(
        !got.retain,
        "MQTT-3.1.2-16 (3.1.1): will retain 0 → non-retained"
    );
}

/// (v5) MQTT-3.1.2-8 through rumqttc v5.
#[tokio::test]
async fn v5_will_on_abnormal_close_rumqttc() {
    let b = Broker::start();
    let mut s = v5::connect(v5::options(b.addr, "w5-s")).await;
    s.subscribe("will5/#", v5::QoS::AtLeastOnce).await;
    let mut o = v5::options(b.addr, "w5-c");
    o.set_last_will(v5::LastWill::new(
        "will5/c",
        "gone",
        v5::QoS::AtLeastOnce,
        false,
        None,
    ));
    drop(v5::connect(o).await);
    let got = s.expect_publish().await;
    assert_eq!(&got.topic[..], b"will5/c");
    assert_eq!(&got.payload[..], b"gone");
}

/// (3.1.1) MQTT-3.1.2-8 with MQTT-3.1.2-24 / (v5) MQTT-3.1.2-8 with MQTT-3.1.2-22: when the
/// keep alive expires (1 s → closed after 1.5 s of silence), the will is published.
#[tokio::test]
async fn will_on_keep_alive_expiry() {
    let b = Broker::start();
    let mut s = RawClient::v5(b.addr, "wka-s").await;
    s.sub("wka/#", 1).await;
    for (protocol, id) in [(Protocol::V3_1_1, "wka-4"), (Protocol::V5, "wka-5")] {
        let topic = format!("wka/{id}");
        let (mut c, _) = RawClient::connect_ok(
            b.addr,
            with_will(protocol, id, 1, will(&topic, b"timeout", 1, false)),
        )
        .await;
        // Silent client: no PINGREQ.
        c.expect_closed().await;
        let got = s.receive_acked().await;
        assert_eq!(got.topic.as_str(), topic);
        assert_eq!(&got.payload[..], b"timeout");
    }
}

/// (3.1.1) MQTT-3.1.2-10 / (v5) MQTT-3.1.2-10, MQTT-3.14.4-3: DISCONNECT (0x00) discards the
/// will; it is never published.
#[tokio::test]
async fn no_will_after_normal_disconnect() {
    let b = Broker::start();
    let mut s = RawClient::v5(b.addr, "nw-s").await;
    s.sub("nw/#", 0).await;
    for (protocol, id) in [(Protocol::V3_1_1, "nw-4"), (Protocol::V5, "nw-5")] {
        let (c, _) = RawClient::connect_ok(
            b.addr,
            with_will(protocol, id, 0, will("nw/will", b"bad", 0, false)),
        )
        .await;
        c.disconnect().await;
    }
    // rumqttc's clean disconnect too.
    let mut o = v4::options(b.addr, "nw-r");
    o.set_last_will(v4::LastWill::new(
        "nw/will",
        "bad",
        v4::QoS::AtMostOnce,
        false,
    ));
    v4::connect(o).await.disconnect().await;
    // The will would have been published when the connection closed; a marker published after
    // every close must be the first (and only) message.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut p = RawClient::v5(b.addr, "nw-p").await;
    p.publish_acked(publish("nw/marker", b"marker", 0, 0)).await;
    let got = s.expect_publish().await;
    assert_eq!(
        &got.payload[..],
        b"marker",
        "a will was published after DISCONNECT: {got:?}"
    );
}

/// (v5) §3.14.2.1 reason 0x04 "Disconnect with Will Message": the will is published.
#[tokio::test]
async fn v5_disconnect_0x04_publishes_will() {
    let b = Broker::start();
    let mut s = RawClient::v5(b.addr, "w04-s").await;
    s.sub("w04/#", 0).await;
    let (mut c, _) = RawClient::connect_ok(
        b.addr,
        with_will(Protocol::V5, "w04", 0, will("w04/will", b"asked", 0, false)),
    )
    .await;
    c.send(&Packet::Disconnect(Disconnect {
        reason: ReasonCode::DISCONNECT_WITH_WILL_MESSAGE,
        properties: Properties::default(),
    }))
    .await;
    c.expect_closed().await;
    assert_eq!(&s.expect_publish().await.payload[..], b"asked");
}

/// (3.1.1) MQTT-3.1.2-17 / (v5) MQTT-3.1.2-15: a will with Will Retain 1 is published retained:
/// a live subscriber sees it (RETAIN 0 on an established 3.1.1 subscription, MQTT-3.3.1-9),
/// and a later subscriber receives it with RETAIN 1.
#[tokio::test]
async fn will_retain_is_published_as_retained() {
    let b = Broker::start();
    let mut live = RawClient::v4(b.addr, "wr-live").await;
    live.sub("wret/t", 1).await;
    let (c, _) = RawClient::connect_ok(
        b.addr,
        with_will(
            Protocol::V3_1_1,
            "wr-c",
            0,
            will("wret/t", b"last", 1, true),
        ),
    )
    .await;
    c.drop_connection().await;
    let got = live.receive_acked().await;
    assert_eq!(&got.payload[..], b"last");
    let mut s = RawClient::v4(b.addr, "wr-s").await;
    s.sub("wret/t", 1).await;
    let got = s.receive_acked().await;
    assert_eq!(&got.payload[..], b"last");
    assert!(got.retain, "the will was not retained");
}

/// (v5) MQTT-3.1.2-8, MQTT-3.1.3-9: with a Will Delay Interval, a reconnect of the same
/// session before the delay ends means the will is NOT sent.
#[tokio::test]
async fn v5_will_delay_cancelled_by_reconnect() {
    let b = Broker::start();
    let mut s = RawClient::v5(b.addr, "wd-s").await;
    s.sub("wd/#", 0).await;
    let mut w = will("wd/will", b"late", 0, false);
    w.properties.will_delay_interval_s = Some(2);
    let mut c = with_will(Protocol::V5, "wd-c", 0, w);
    c.properties.session_expiry_interval_s = Some(60);
    let (conn, _) = RawClient::connect_ok(b.addr, c.clone()).await;
    conn.drop_connection().await;
    c.clean_start = false;
    c.will = None;
    let (_conn2, ca) = RawClient::connect_ok(b.addr, c).await;
    assert!(ca.session_present);
    // Past the delay: still nothing but the marker.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let mut p = RawClient::v5(b.addr, "wd-p").await;
    p.publish_acked(publish("wd/marker", b"marker", 0, 0)).await;
    assert_eq!(&s.expect_publish().await.payload[..], b"marker");
}

/// (v5) MQTT-3.1.2-8: with a Will Delay Interval and no reconnect, the will is published after
/// the delay (bounded wait).
#[tokio::test]
async fn v5_will_delay_elapses_then_will_is_sent() {
    let b = Broker::start();
    let mut s = RawClient::v5(b.addr, "wde-s").await;
    s.sub("wde/#", 0).await;
    let mut w = will("wde/will", b"delayed", 0, false);
    w.properties.will_delay_interval_s = Some(1);
    let mut c = with_will(Protocol::V5, "wde-c", 0, w);
    c.properties.session_expiry_interval_s = Some(60);
    let (conn, _) = RawClient::connect_ok(b.addr, c).await;
    conn.drop_connection().await;
    assert_eq!(&s.expect_publish().await.payload[..], b"delayed");
}

/// (v5) MQTT-3.1.2-8: "... or the Session ends, whichever first": with session expiry 0 the
/// session ends at the close, so a long will delay does not hold the will back.
#[tokio::test]
async fn v5_will_sent_when_session_ends_before_delay() {
    let b = Broker::start();
    let mut s = RawClient::v5(b.addr, "wse-s").await;
    s.sub("wse/#", 0).await;
    let mut w = will("wse/will", b"session-ended", 0, false);
    w.properties.will_delay_interval_s = Some(3600);
    let (conn, _) = RawClient::connect_ok(b.addr, with_will(Protocol::V5, "wse-c", 0, w)).await;
    conn.drop_connection().await;
    assert_eq!(&s.expect_publish().await.payload[..], b"session-ended");
}

/// (v5) MQTT-3.1.3-10 and the forwarding rules MQTT-3.3.2-4, -15, -16, -17, -18, -20: will
/// properties (payload format, content type, response topic, correlation data, user
/// properties in order) reach the subscriber unchanged.
#[tokio::test]
async fn v5_will_properties_are_forwarded() {
    let b = Broker::start();
    let mut s = RawClient::v5(b.addr, "wp-s").await;
    s.sub("wp/#", 1).await;
    let mut w = will("wp/will", b"props", 1, false);
    w.properties.payload_format_indicator = Some(1);
    w.properties.content_type = Some(s_("text/plain"));
    w.properties.response_topic = Some(s_("wp/reply"));
    w.properties.correlation_data = Some(Bytes::from_static(b"\x00\x01corr"));
    w.properties.user = vec![(s_("k"), s_("1")), (s_("a"), s_("2")), (s_("k"), s_("3"))];
    w.properties.message_expiry_interval_s = Some(300);
    let (conn, _) =
        RawClient::connect_ok(b.addr, with_will(Protocol::V5, "wp-c", 0, w.clone())).await;
    conn.drop_connection().await;
    let got = s.receive_acked().await;
    assert_eq!(&got.payload[..], b"props");
    let pr = &got.properties;
    assert_eq!(pr.payload_format_indicator, Some(1));
    assert_eq!(pr.content_type, w.properties.content_type);
    assert_eq!(pr.response_topic, w.properties.response_topic);
    assert_eq!(pr.correlation_data, w.properties.correlation_data);
    assert_eq!(
        pr.user, w.properties.user,
        "user properties in order (MQTT-3.1.3-10)"
    );
    let left = pr
        .message_expiry_interval_s
        .expect("message expiry forwarded (MQTT-3.3.2-6)");
    assert!(left <= 300 && left > 0);
}

fn s_(text: &str) -> Str {
    s(text)
}

/// (v5) MQTT-3.1.2-8: "the Will Delay Interval has elapsed or the Session ends" — whichever
/// comes first: with a will delay of 60 s and a session expiry of 1 s, the will is published
/// when the session expires (bounded wait).
#[tokio::test]
async fn v5_will_sent_when_session_expires_before_delay() {
    let b = Broker::start();
    let mut s = RawClient::v5(b.addr, "wsx-s").await;
    s.sub("wsx/#", 0).await;
    let mut w = will("wsx/will", b"expired", 0, false);
    w.properties.will_delay_interval_s = Some(60);
    let mut c = with_will(Protocol::V5, "wsx-c", 0, w);
    c.properties.session_expiry_interval_s = Some(1);
    let (conn, _) = RawClient::connect_ok(b.addr, c).await;
    conn.drop_connection().await;
    assert_eq!(&s.expect_publish().await.payload[..], b"expired");
}

/// (v5) MQTT-3.1.3-9: a takeover (clean start 0) is a new network connection to the session
/// before the Will Delay Interval has passed: the old connection's will is not sent.
#[tokio::test]
async fn v5_takeover_within_will_delay_sends_no_will() {
    let b = Broker::start();
    let mut s = RawClient::v5(b.addr, "wtk-s").await;
    s.sub("wtk/#", 0).await;
    let mut w = will("wtk/will", b"taken", 0, false);
    w.properties.will_delay_interval_s = Some(2);
    let mut c = with_will(Protocol::V5, "wtk-c", 0, w);
    c.properties.session_expiry_interval_s = Some(60);
    let (mut old, _) = RawClient::connect_ok(b.addr, c.clone()).await;
    c.clean_start = false;
    c.will = None;
    let (_new, ca) = RawClient::connect_ok(b.addr, c).await;
    assert!(ca.session_present);
    assert_eq!(
        old.expect_disconnect().await,
        ReasonCode::SESSION_TAKEN_OVER
    );
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let mut p = RawClient::v5(b.addr, "wtk-p").await;
    p.publish_acked(publish("wtk/marker", b"marker", 0, 0))
        .await;
    assert_eq!(&s.expect_publish().await.payload[..], b"marker");
}

/// (v5) MQTT-3.1.2-8 ("... or the Session ends"): a takeover with Clean Start 1 ends the old
/// session, so the old connection's will is published at once despite its 60 s delay.
#[tokio::test]
async fn v5_clean_start_takeover_ends_session_and_sends_will() {
    let b = Broker::start();
    let mut s = RawClient::v5(b.addr, "wcs-s").await;
    s.sub("wcs/#", 0).await;
    let mut w = will("wcs/will", b"session-ended", 0, false);
    w.properties.will_delay_interval_s = Some(60);
    let mut c = with_will(Protocol::V5, "wcs-c", 0, w);
    c.properties.session_expiry_interval_s = Some(60);
    let (mut old, _) = RawClient::connect_ok(b.addr, c.clone()).await;
    c.will = None; // clean start 1 again
    let (_new, ca) = RawClient::connect_ok(b.addr, c).await;
    assert!(!ca.session_present);
    assert_eq!(
        old.expect_disconnect().await,
        ReasonCode::SESSION_TAKEN_OVER
    );
    assert_eq!(&s.expect_publish().await.payload[..], b"session-ended");
}
