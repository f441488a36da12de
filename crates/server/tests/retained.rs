//! Retained messages: set, replace, clear, RETAIN flag on delivery, retain handling 0/1/2 and
//! retain as published (v5).

mod common;

use common::Broker;
use common::raw::*;
use common::rumq::{v4, v5};

fn retained(topic: &str, payload: &[u8], qos_level: u8, packet_id: u16) -> Publish {
    let mut p = publish(topic, payload, qos_level, packet_id);
    p.retain = true;
    p
}

fn sub_opts(qos_level: u8, rh: RetainHandling, rap: bool) -> SubscriptionOptions {
    SubscriptionOptions {
        qos: qos(qos_level),
        no_local: false,
        retain_as_published: rap,
        retain_handling: rh,
    }
}

/// (3.1.1) MQTT-3.3.1-5, MQTT-3.3.1-6, MQTT-3.3.1-8 / (v5) MQTT-3.3.1-5, MQTT-3.3.1-9: a retained
/// message is stored and sent to a later subscriber with RETAIN 1 — through rumqttc v4.
#[tokio::test]
async fn retained_message_sent_to_new_subscriber_rumqttc_v4() {
    let b = Broker::start();
    let mut p = v4::connect(v4::options(b.addr, "ret-p")).await;
    p.client
        .publish("ret/a", v4::QoS::AtLeastOnce, true, "kept")
        .await
        .unwrap();
    p.expect_publish_done().await;
    let mut s = v4::connect(v4::options(b.addr, "ret-s")).await;
    s.subscribe("ret/#", v4::QoS::AtLeastOnce).await;
    let got = s.expect_publish().await;
    assert_eq!(got.topic, "ret/a");
    assert_eq!(&got.payload[..], b"kept");
    assert!(
        got.retain,
        "MQTT-3.3.1-8 (3.1.1): RETAIN 1 for a retained message sent on subscribe"
    );
    assert_eq!(got.qos, v4::QoS::AtLeastOnce);
}

/// Same through rumqttc v5 (MQTT-3.3.1-9 (v5): retain handling 0 by default).
#[tokio::test]
async fn retained_message_sent_to_new_subscriber_rumqttc_v5() {
    let b = Broker::start();
    let mut p = v5::connect(v5::options(b.addr, "ret5-p")).await;
    p.client
        .publish("ret5/a", v5::QoS::AtLeastOnce, true, "kept")
        .await
        .unwrap();
    p.expect_publish_done().await;
    let mut s = v5::connect(v5::options(b.addr, "ret5-s")).await;
    s.subscribe("ret5/+", v5::QoS::AtLeastOnce).await;
    let got = s.expect_publish().await;
    assert_eq!(&got.topic[..], b"ret5/a");
    assert!(got.retain);
}

/// (v5) MQTT-3.3.1-5: a new retained message replaces the old one for the topic.
#[tokio::test]
async fn retained_message_is_replaced() {
    let b = Broker::start();
    let mut p = RawClient::v5(b.addr, "rep-p").await;
    p.publish_acked(retained("rep/t", b"old", 1, 1)).await;
    p.publish_acked(retained("rep/t", b"new", 0, 0)).await;
    p.ping().await; // the QoS 0 retained publish has been processed before the PINGRESP
    let mut s = RawClient::v5(b.addr, "rep-s").await;
    s.sub("rep/t", 1).await;
    let got = s.expect_publish().await;
    assert_eq!(&got.payload[..], b"new");
    assert!(got.retain);
    assert!(
        s.ping().await.is_empty(),
        "only one retained message per topic"
    );
}

/// (v5) MQTT-3.3.1-6, MQTT-3.3.1-7 / (3.1.1) MQTT-3.3.1-10, MQTT-3.3.1-11: a retained PUBLISH
/// with an empty payload removes the retained message and is not stored itself; it is still
/// delivered to current subscribers as a normal message.
#[tokio::test]
async fn empty_retained_payload_clears_retained_message() {
    let b = Broker::start();
    let mut live = RawClient::v4(b.addr, "clr-live").await;
    live.sub("clr/t", 1).await;
    let mut p = RawClient::v4(b.addr, "clr-p").await;
    p.publish_acked(retained("clr/t", b"v", 1, 1)).await;
    p.publish_acked(retained("clr/t", b"", 1, 2)).await;
    assert_eq!(&live.receive_acked().await.payload[..], b"v");
    assert!(
        live.receive_acked().await.payload.is_empty(),
        "the empty message is processed normally"
    );
    let mut s = RawClient::v4(b.addr, "clr-s").await;
    s.sub("clr/t", 1).await;
    assert!(
        s.ping().await.is_empty(),
        "no retained message after clearing"
    );
}

/// (v5) MQTT-3.3.1-8 / (3.1.1) MQTT-3.3.1-12: a PUBLISH with RETAIN 0 neither stores nor
/// removes the retained message.
#[tokio::test]
async fn non_retained_publish_leaves_retained_message_alone() {
    let b = Broker::start();
    let mut p = RawClient::v4(b.addr, "nr-p").await;
    p.publish_acked(retained("nr/t", b"kept", 1, 1)).await;
    p.publish_acked(publish("nr/t", b"live", 1, 2)).await;
    p.publish_acked(publish("nr/t", b"", 1, 3)).await;
    let mut s = RawClient::v4(b.addr, "nr-s").await;
    s.sub("nr/t", 1).await;
    let got = s.receive_acked().await;
    assert_eq!(&got.payload[..], b"kept");
    assert!(s.ping().await.is_empty());
}

/// (3.1.1) MQTT-3.3.1-9: a retained message published to an established subscription is
/// forwarded with RETAIN 0.
#[tokio::test]
async fn v311_live_delivery_clears_retain_flag() {
    let b = Broker::start();
    let mut s = RawClient::v4(b.addr, "live-s").await;
    s.sub("live/t", 0).await;
    let mut p = RawClient::v4(b.addr, "live-p").await;
    p.publish_acked(retained("live/t", b"x", 0, 0)).await;
    assert!(!s.expect_publish().await.retain);
}

/// (v5) MQTT-3.3.1-12, MQTT-3.3.1-13: Retain As Published 0 → RETAIN 0 on live delivery;
/// Retain As Published 1 → RETAIN as published.
#[tokio::test]
async fn v5_retain_as_published() {
    let b = Broker::start();
    let mut s0 = RawClient::v5(b.addr, "rap0").await;
    s0.subscribe(subscribe(
        1,
        &[("rap/t", sub_opts(0, RetainHandling::SendAtSubscribe, false))],
    ))
    .await;
    let mut s1 = RawClient::v5(b.addr, "rap1").await;
    s1.subscribe(subscribe(
        1,
        &[("rap/t", sub_opts(0, RetainHandling::SendAtSubscribe, true))],
    ))
    .await;
    let mut p = RawClient::v5(b.addr, "rap-p").await;
    p.publish_acked(retained("rap/t", b"r", 0, 0)).await;
    p.publish_acked(publish("rap/t", b"n", 0, 0)).await;
    let (a, b2) = (s0.expect_publish().await, s0.expect_publish().await);
    assert!(!a.retain && !b2.retain, "RAP 0: RETAIN 0 (MQTT-3.3.1-12)");
    let (a, b2) = (s1.expect_publish().await, s1.expect_publish().await);
    assert!(a.retain, "RAP 1: RETAIN as published (MQTT-3.3.1-13)");
    assert!(!b2.retain);
}

/// (v5) MQTT-3.3.1-9, MQTT-3.8.4-4: Retain Handling 0 sends retained messages at every
/// subscribe, also when the subscription already existed.
#[tokio::test]
async fn v5_retain_handling_0_sends_on_every_subscribe() {
    let b = Broker::start();
    let mut p = RawClient::v5(b.addr, "rh0-p").await;
    p.publish_acked(retained("rh0/t", b"r", 1, 1)).await;
    let mut s = RawClient::v5(b.addr, "rh0-s").await;
    for round in 0..2 {
        s.subscribe(subscribe(
            1,
            &[("rh0/t", sub_opts(1, RetainHandling::SendAtSubscribe, false))],
        ))
        .await;
        let got = s.receive_acked().await;
        assert_eq!(&got.payload[..], b"r", "round {round}");
        assert!(got.retain);
    }
}

/// (v5) MQTT-3.3.1-10: Retain Handling 1 sends retained messages only when the subscription did
/// not exist yet.
#[tokio::test]
async fn v5_retain_handling_1_sends_only_for_new_subscription() {
    let b = Broker::start();
    let mut p = RawClient::v5(b.addr, "rh1-p").await;
    p.publish_acked(retained("rh1/t", b"r", 1, 1)).await;
    let mut s = RawClient::v5(b.addr, "rh1-s").await;
    s.subscribe(subscribe(
        1,
        &[("rh1/t", sub_opts(1, RetainHandling::SendIfNew, false))],
    ))
    .await;
    assert_eq!(&s.receive_acked().await.payload[..], b"r");
    s.subscribe(subscribe(
        2,
        &[("rh1/t", sub_opts(1, RetainHandling::SendIfNew, false))],
    ))
    .await;
    assert!(
        s.ping().await.is_empty(),
        "subscription existed: no retained message"
    );
}

/// (v5) MQTT-3.3.1-11: Retain Handling 2 never sends retained messages at subscribe; live
/// messages still flow.
#[tokio::test]
async fn v5_retain_handling_2_sends_nothing_at_subscribe() {
    let b = Broker::start();
    let mut p = RawClient::v5(b.addr, "rh2-p").await;
    p.publish_acked(retained("rh2/t", b"r", 1, 1)).await;
    let mut s = RawClient::v5(b.addr, "rh2-s").await;
    s.subscribe(subscribe(
        1,
        &[("rh2/t", sub_opts(1, RetainHandling::DoNotSend, false))],
    ))
    .await;
    p.publish_acked(publish("rh2/t", b"live", 1, 2)).await;
    assert_eq!(
        &s.receive_acked().await.payload[..],
        b"live",
        "first delivery is the live one"
    );
}

/// (v5) MQTT-3.3.1-9 with wildcards: every matching retained message is sent, each once.
#[tokio::test]
async fn wildcard_subscription_gets_all_matching_retained() {
    let b = Broker::start();
    let mut p = RawClient::v5(b.addr, "wr-p").await;
    for t in ["wr/a", "wr/b", "wr/c/d", "other/x"] {
        p.publish_acked(retained(t, t.as_bytes(), 1, 1)).await;
    }
    let mut s = RawClient::v5(b.addr, "wr-s").await;
    s.sub("wr/#", 1).await;
    let mut topics: Vec<String> = Vec::new();
    for _ in 0..3 {
        let got = s.receive_acked().await;
        assert!(got.retain);
        topics.push(got.topic.to_string());
    }
    topics.sort();
    assert_eq!(topics, ["wr/a", "wr/b", "wr/c/d"]);
    assert!(s.ping().await.is_empty());
}

/// (3.1.1) MQTT-3.1.2-7: retained messages outlive the publisher's session.
#[tokio::test]
async fn retained_message_outlives_publisher_session() {
    let b = Broker::start();
    let mut p = RawClient::v4(b.addr, "gone-p").await;
    p.publish_acked(retained("gone/t", b"still", 1, 1)).await;
    p.drop_connection().await;
    let mut s = RawClient::v4(b.addr, "gone-s").await;
    s.sub("gone/t", 1).await;
    assert_eq!(&s.receive_acked().await.payload[..], b"still");
}

/// (v5) MQTT-3.8.4-8: a retained message is sent at min(stored QoS, granted QoS).
#[tokio::test]
async fn retained_message_qos_is_downgraded() {
    let b = Broker::start();
    let mut p = RawClient::v5(b.addr, "rq-p").await;
    p.publish_acked(retained("rq/t", b"r", 2, 1)).await;
    let mut s = RawClient::v5(b.addr, "rq-s").await;
    s.sub("rq/t", 1).await;
    assert_eq!(s.receive_acked().await.qos, QoS::AtLeastOnce);
}

/// `max_retained_messages = 2`: a third topic is not retained, replacing or clearing an existing
/// one always works, and a cleared slot can be reused.
#[tokio::test]
async fn retained_store_is_bounded() {
    let b = Broker::start_with("[limits]\nmax_retained_messages = 2\n");
    let mut p = RawClient::v5(b.addr, "rl-p").await;
    p.publish_acked(retained("rl/a", b"a1", 1, 1)).await;
    p.publish_acked(retained("rl/b", b"b1", 1, 2)).await;
    p.publish_acked(retained("rl/c", b"c1", 1, 3)).await; // over the limit: not retained
    p.publish_acked(retained("rl/a", b"a2", 1, 4)).await; // replacing is fine
    let seen = |mut v: Vec<(String, Vec<u8>)>| {
        v.sort();
        v
    };
    let mut s = RawClient::v5(b.addr, "rl-s1").await;
    s.sub("rl/#", 1).await;
    let mut got = Vec::new();
    for _ in 0..2 {
        let m = s.receive_acked().await;
        got.push((m.topic.to_string(), m.payload.to_vec()));
    }
    assert!(s.ping().await.is_empty());
    assert_eq!(
        seen(got),
        [
            ("rl/a".to_string(), b"a2".to_vec()),
            ("rl/b".to_string(), b"b1".to_vec())
        ]
    );
    p.publish_acked(retained("rl/b", b"", 1, 5)).await; // clear b
    p.publish_acked(retained("rl/c", b"c2", 1, 6)).await; // now fits
    let mut s = RawClient::v5(b.addr, "rl-s2").await;
    s.sub("rl/#", 1).await;
    let mut got = Vec::new();
    for _ in 0..2 {
        let m = s.receive_acked().await;
        got.push((m.topic.to_string(), m.payload.to_vec()));
    }
    assert!(s.ping().await.is_empty());
    assert_eq!(
        seen(got),
        [
            ("rl/a".to_string(), b"a2".to_vec()),
            ("rl/c".to_string(), b"c2".to_vec())
        ]
    );
}
