//! Topic matching (+, #, $-topics), overlapping subscriptions in both versions, subscription
//! identifiers, no local, subscription replacement, SUBACK/UNSUBACK reason codes.

mod common;

use common::Broker;
use common::raw::*;
use common::rumq::v5;

/// (v5) MQTT-4.7.1-1, MQTT-4.7.1-2, MQTT-3.3.2-3: `+` matches one level, `#` the parent and any
/// number of levels; the delivered Topic Name is the published one.
#[tokio::test]
async fn wildcards_match_per_spec() {
    let b = Broker::start();
    let filters = [
        "sport/+/player",
        "sport/#",
        "+/+/+",
        "+",
        "sport/tennis/+",
        "#",
    ];
    let topics = [
        "sport",
        "sport/tennis/player",
        "sport/tennis",
        "sport/x/y/z",
        "a/b/c",
        "/x",
    ];
    let mut subs = Vec::new();
    for (i, f) in filters.iter().enumerate() {
        let mut c = RawClient::v5(b.addr, &format!("wild-{i}")).await;
        c.sub(f, 0).await;
        subs.push(c);
    }
    let mut p = RawClient::v5(b.addr, "wild-p").await;
    for t in topics {
        p.publish_acked(publish(t, t.as_bytes(), 0, 0)).await;
    }
    p.publish_acked(publish("zz/end", b"zz/end", 0, 0)).await;
    let expect: [&[&str]; 6] = [
        &["sport/tennis/player"],
        &[
            "sport",
            "sport/tennis/player",
            "sport/tennis",
            "sport/x/y/z",
        ],
        &["sport/tennis/player", "a/b/c"],
        &["sport"],
        &["sport/tennis/player"],
        &[
            "sport",
            "sport/tennis/player",
            "sport/tennis",
            "sport/x/y/z",
            "a/b/c",
            "/x",
            "zz/end",
        ],
    ];
    // Each subscriber gets exactly its matches, in publish order; "#" also sees "zz/end". The
    // others get "zz/end" only if they match it, so we ask with a ping barrier after it.
    for (i, c) in subs.iter_mut().enumerate() {
        let mut got = Vec::new();
        let want = expect[i];
        for _ in 0..want.len() {
            let m = c.expect_publish().await;
            assert_eq!(
                m.topic.as_bytes(),
                &m.payload,
                "MQTT-3.3.2-3: topic is the published one"
            );
            got.push(m.topic.to_string());
        }
        assert_eq!(got, want, "filter {}", filters[i]);
        let extra: Vec<_> = c.ping().await;
        assert!(
            extra.is_empty(),
            "filter {}: unexpected {extra:?}",
            filters[i]
        );
    }
}

/// (v5) MQTT-4.7.2-1 / (3.1.1) MQTT-4.7.2-1: filters starting with a wildcard do not match
/// topics starting with `$`; an explicit `$...` filter does.
#[tokio::test]
async fn dollar_topics_not_matched_by_leading_wildcards() {
    let b = Broker::start_with("[sys]\ninterval_s = 1\n");
    let mut hash = RawClient::v5(b.addr, "dl-hash").await;
    hash.sub("#", 0).await;
    let mut plus = RawClient::v5(b.addr, "dl-plus").await;
    plus.sub("+/broker/#", 0).await;
    let mut sys = RawClient::v5(b.addr, "dl-sys").await;
    sys.sub("$SYS/#", 0).await;
    let got = sys.expect_publish().await;
    assert!(got.topic.starts_with("$SYS/"), "{got:?}");
    // Wait for a second $SYS round so both wildcard subscribers had the chance to (wrongly)
    // receive one, then a marker.
    // (Bounded: at most 3 s of $SYS traffic.)
    let until = tokio::time::Instant::now() + std::time::Duration::from_secs(3);
    let first_topic = got.topic.clone();
    while tokio::time::Instant::now() < until {
        match sys.recv(std::time::Duration::from_millis(200)).await {
            Recv::Packet(Packet::Publish(m)) if m.topic == first_topic => break,
            Recv::Packet(_) | Recv::Timeout => {}
            other => panic!("{other:?}"),
        }
    }
    let mut p = RawClient::v5(b.addr, "dl-p").await;
    p.publish_acked(publish("x/broker/y", b"marker", 0, 0))
        .await;
    assert_eq!(hash.expect_publish().await.topic.as_str(), "x/broker/y");
    assert_eq!(plus.expect_publish().await.topic.as_str(), "x/broker/y");
}

/// (3.1.1) MQTT-3.3.5-1: overlapping subscriptions (QoS 0 `ov/#`, QoS 2 `ov/t`, QoS 1 `+/t`):
/// the message is delivered respecting the maximum QoS — Tern sends one copy at that QoS.
#[tokio::test]
async fn v311_overlapping_subscriptions_one_copy_at_max_qos() {
    let b = Broker::start();
    let mut s = RawClient::v4(b.addr, "ov4-s").await;
    let reasons = s
        .subscribe(subscribe(
            1,
            &[("ov/#", opts(0)), ("ov/t", opts(2)), ("+/t", opts(1))],
        ))
        .await;
    assert_eq!(reasons, vec![ReasonCode(0), ReasonCode(2), ReasonCode(1)]);
    let mut p = RawClient::v4(b.addr, "ov4-p").await;
    p.publish_acked(publish("ov/t", b"x", 2, 1)).await;
    p.publish_acked(publish("ov/t", b"marker", 0, 0)).await;
    let got = s.receive_acked().await;
    assert_eq!(&got.payload[..], b"x");
    assert_eq!(got.qos, QoS::ExactlyOnce);
    assert_eq!(
        &s.receive_acked().await.payload[..],
        b"marker",
        "one copy only"
    );
}

/// (v5) MQTT-3.3.4-2, MQTT-3.3.4-3, MQTT-3.3.4-4, MQTT-3.3.4-5: overlapping subscriptions with
/// subscription identifiers 1 and 2. Either one copy at the maximum QoS carrying both ids, or
/// one copy per subscription each carrying its own id.
#[tokio::test]
async fn v5_overlapping_subscriptions_carry_subscription_identifiers() {
    let b = Broker::start();
    let mut s = RawClient::v5(b.addr, "ov5-s").await;
    let mut sub1 = subscribe(1, &[("ov5/#", opts(0))]);
    sub1.properties.subscription_identifiers = vec![1];
    s.subscribe(sub1).await;
    let mut sub2 = subscribe(2, &[("ov5/t", opts(1))]);
    sub2.properties.subscription_identifiers = vec![2];
    s.subscribe(sub2).await;
    let mut p = RawClient::v5(b.addr, "ov5-p").await;
    p.publish_acked(publish("ov5/t", b"x", 1, 1)).await;
    p.publish_acked(publish("ov5/t", b"marker", 0, 0)).await;
    let mut copies = Vec::new();
    loop {
        let got = s.receive_acked().await;
        if &got.payload[..] == b"marker" {
            break;
        }
        copies.push(got);
    }
    match copies.len() {
        1 => {
            let mut ids = copies[0].properties.subscription_identifiers.clone();
            ids.sort();
            assert_eq!(
                ids,
                [1, 2],
                "single copy carries every matching id (MQTT-3.3.4-4)"
            );
            assert_eq!(
                copies[0].qos,
                QoS::AtLeastOnce,
                "maximum QoS (MQTT-3.3.4-2)"
            );
        }
        2 => {
            let mut pairs: Vec<(Vec<u32>, QoS)> = copies
                .iter()
                .map(|c| (c.properties.subscription_identifiers.clone(), c.qos))
                .collect();
            pairs.sort_by_key(|p| p.0.clone());
            assert_eq!(
                pairs,
                [(vec![1], QoS::AtMostOnce), (vec![2], QoS::AtLeastOnce)],
                "MQTT-3.3.4-5"
            );
        }
        n => panic!("expected 1 or 2 copies, got {n}: {copies:?}"),
    }
}

/// (v5) MQTT-3.3.4-3: a subscription identifier given at SUBSCRIBE is sent with each matching
/// PUBLISH — through rumqttc v5.
#[tokio::test]
async fn v5_subscription_identifier_is_delivered_rumqttc() {
    let b = Broker::start();
    let mut s = v5::connect(v5::options(b.addr, "sid-s")).await;
    let props = v5::SubscribeProperties {
        id: Some(77),
        user_properties: vec![],
    };
    s.client
        .subscribe_with_properties("sid/+", v5::QoS::AtLeastOnce, props)
        .await
        .unwrap();
    s.expect_suback().await;
    let p = v5::connect(v5::options(b.addr, "sid-p")).await;
    p.client
        .publish("sid/x", v5::QoS::AtLeastOnce, false, "v")
        .await
        .unwrap();
    let got = s.expect_publish().await;
    let ids = got
        .properties
        .map(|p| p.subscription_identifiers)
        .unwrap_or_default();
    assert_eq!(ids, vec![77]);
}

/// (v5) MQTT-3.8.3-3: with No Local, the client's own messages are not sent back to it; other
/// subscribers still get them.
#[tokio::test]
async fn v5_no_local() {
    let b = Broker::start();
    let mut me = RawClient::v5(b.addr, "nl-me").await;
    let o = SubscriptionOptions {
        qos: qos(1),
        no_local: true,
        ..SubscriptionOptions::default()
    };
    me.subscribe(subscribe(1, &[("nl/t", o)])).await;
    let mut other = RawClient::v5(b.addr, "nl-other").await;
    other.sub("nl/t", 1).await;
    me.publish_acked(publish("nl/t", b"mine", 1, 1)).await;
    assert_eq!(&other.receive_acked().await.payload[..], b"mine");
    other.publish_acked(publish("nl/t", b"theirs", 1, 2)).await;
    assert_eq!(
        &me.receive_acked().await.payload[..],
        b"theirs",
        "own message was not sent back first"
    );
}

/// (v5) MQTT-3.8.3-4: No Local on a shared subscription is a Protocol Error (DISCONNECT 0x82).
#[tokio::test]
async fn v5_no_local_on_shared_subscription_is_protocol_error() {
    let b = Broker::start();
    let mut c = RawClient::v5(b.addr, "nls").await;
    let o = SubscriptionOptions {
        qos: qos(0),
        no_local: true,
        ..SubscriptionOptions::default()
    };
    c.send(&Packet::Subscribe(subscribe(1, &[("$share/g/t", o)])))
        .await;
    assert_eq!(c.expect_disconnect().await, ReasonCode::PROTOCOL_ERROR);
}

/// (v5) MQTT-3.8.4-3 / (3.1.1) MQTT-3.8.4-3: subscribing again to an identical filter replaces
/// the subscription (new QoS), it does not add a second one.
#[tokio::test]
async fn resubscribe_replaces_subscription() {
    let b = Broker::start();
    for protocol in [Protocol::V3_1_1, Protocol::V5] {
        let mut s = RawClient::connect_ok(b.addr, connect_packet(protocol, "rs-s", true, 0))
            .await
            .0;
        s.sub("rs/t", 0).await;
        s.sub("rs/t", 1).await;
        let mut p = RawClient::v5(b.addr, "rs-p").await;
        p.publish_acked(publish("rs/t", b"x", 1, 1)).await;
        p.publish_acked(publish("rs/t", b"marker", 0, 0)).await;
        let got = s.receive_acked().await;
        assert_eq!(got.qos, QoS::AtLeastOnce, "{protocol:?}: new QoS applies");
        assert_eq!(
            &s.receive_acked().await.payload[..],
            b"marker",
            "{protocol:?}: one subscription"
        );
    }
}

/// (v5) MQTT-3.8.4-5, MQTT-3.8.4-6, MQTT-3.9.3-1, MQTT-3.9.3-2: one SUBSCRIBE with several
/// filters gets one reason code per filter, in order, and the valid ones are active.
/// (3.1.1) MQTT-3.8.4-4, MQTT-3.8.4-5 likewise.
#[tokio::test]
async fn suback_has_one_reason_per_filter_in_order() {
    let b = Broker::start();
    let mut s = RawClient::v5(b.addr, "sa5").await;
    let reasons = s
        .subscribe(subscribe(
            9,
            &[("a/b", opts(1)), ("c/+", opts(2)), ("d/#", opts(0))],
        ))
        .await;
    assert_eq!(reasons, vec![ReasonCode(1), ReasonCode(2), ReasonCode(0)]);
    let mut s4 = RawClient::v4(b.addr, "sa4").await;
    let reasons = s4
        .subscribe(subscribe(9, &[("c/+", opts(0)), ("a/b", opts(2))]))
        .await;
    assert_eq!(reasons, vec![ReasonCode(0), ReasonCode(2)]);
    let mut p = RawClient::v5(b.addr, "sa-p").await;
    p.publish_acked(publish("c/d", b"x", 0, 0)).await;
    assert_eq!(s.expect_publish().await.topic.as_str(), "c/d");
    assert_eq!(s4.expect_publish().await.topic.as_str(), "c/d");
}

/// (v5) MQTT-4.7.1-1, MQTT-3.9.3-1 / (3.1.1) MQTT-4.7.1-2, MQTT-3.8.4-5: an invalid filter
/// (`#` not last) is refused — either with a failure code (≥ 0x80; v5 0x8F) in its position of
/// the SUBACK while the other filters succeed, or by closing the connection as for a malformed
/// packet (v5: DISCONNECT 0x81).
#[tokio::test]
async fn invalid_topic_filter_is_refused() {
    let b = Broker::start();
    for protocol in [Protocol::V5, Protocol::V3_1_1] {
        let mut s = RawClient::connect_ok(b.addr, connect_packet(protocol, "badf", true, 0))
            .await
            .0;
        match s
            .try_subscribe(subscribe(
                9,
                &[("a/b", opts(1)), ("a/#/b", opts(0)), ("c/+", opts(2))],
            ))
            .await
        {
            SubOutcome::Acked(r) => {
                assert_eq!(r.len(), 3, "{protocol:?}: {r:?}");
                assert_eq!((r[0], r[2]), (ReasonCode(1), ReasonCode(2)), "{protocol:?}");
                assert!(
                    !r[1].is_success(),
                    "{protocol:?}: invalid filter granted: {r:?}"
                );
                if protocol == Protocol::V5 {
                    assert_eq!(r[1], ReasonCode::TOPIC_FILTER_INVALID);
                }
            }
            SubOutcome::Closed(reason) => {
                assert!(
                    matches!(
                        reason,
                        None | Some(ReasonCode::MALFORMED_PACKET)
                            | Some(ReasonCode::PROTOCOL_ERROR)
                    ),
                    "{protocol:?}: {reason:?}"
                );
            }
        }
    }
}

/// (v5) MQTT-3.10.4-1, MQTT-3.10.4-2, MQTT-3.10.4-4, MQTT-3.10.4-5, MQTT-3.11.3-1,
/// MQTT-3.11.3-2: UNSUBACK has one reason per filter, in order: 0x00 for a removed
/// subscription, 0x11 (No subscription existed) otherwise; filters compare character by
/// character (`u/+` does not remove `u/x`); removed subscriptions get no more messages.
#[tokio::test]
async fn v5_unsubscribe_reason_codes_per_filter() {
    let b = Broker::start();
    let mut s = RawClient::v5(b.addr, "us5").await;
    s.subscribe(subscribe(1, &[("u/x", opts(0)), ("u/y", opts(0))]))
        .await;
    s.send(&Packet::Unsubscribe(Unsubscribe {
        packet_id: 5,
        properties: Properties::default(),
        filters: vec![s_("u/y"), s_("u/+"), s_("never")],
    }))
    .await;
    match s.expect_packet().await {
        Packet::UnsubAck(ua) => {
            assert_eq!(ua.packet_id, 5);
            assert_eq!(
                ua.reasons,
                vec![
                    ReasonCode::SUCCESS,
                    ReasonCode::NO_SUBSCRIPTION_EXISTED,
                    ReasonCode::NO_SUBSCRIPTION_EXISTED
                ]
            );
        }
        other => panic!("expected UNSUBACK, got {other:?}"),
    }
    let mut p = RawClient::v5(b.addr, "us-p").await;
    p.publish_acked(publish("u/y", b"gone", 0, 0)).await;
    p.publish_acked(publish("u/x", b"kept", 0, 0)).await;
    assert_eq!(&s.expect_publish().await.payload[..], b"kept");
}

/// (3.1.1) MQTT-3.10.4-4, MQTT-3.10.4-5: UNSUBACK with the same packet id, also when nothing
/// was subscribed.
#[tokio::test]
async fn v311_unsuback_even_without_subscription() {
    let b = Broker::start();
    let mut s = RawClient::v4(b.addr, "us4").await;
    s.send(&Packet::Unsubscribe(Unsubscribe {
        packet_id: 77,
        properties: Properties::default(),
        filters: vec![s_("nothing/here")],
    }))
    .await;
    assert!(matches!(s.expect_packet().await, Packet::UnsubAck(ua) if ua.packet_id == 77));
}

/// (3.1.1) MQTT-3.8.1-1 / (v5) MQTT-3.8.1-1: SUBSCRIBE with fixed-header flags other than 0010
/// is malformed: the connection is closed (hand-written bytes).
#[tokio::test]
async fn subscribe_with_bad_fixed_header_flags_closes() {
    let b = Broker::start();
    let mut c = RawClient::v4(b.addr, "badsub").await;
    // 0x80: SUBSCRIBE with flags 0000; packet id 1, filter "a", QoS 0.
    c.send_bytes(&[0x80, 0x06, 0x00, 0x01, 0x00, 0x01, b'a', 0x00])
        .await;
    c.expect_closed_silently().await;
}

/// (3.1.1) MQTT-3.8.3-3 / (v5) MQTT-3.8.3-2: a SUBSCRIBE without any filter is malformed.
#[tokio::test]
async fn subscribe_without_filters_closes() {
    let b = Broker::start();
    let mut c = RawClient::v4(b.addr, "nosub").await;
    c.send_bytes(&[0x82, 0x02, 0x00, 0x01]).await;
    c.expect_closed_silently().await;
}

/// (v5) MQTT-3.8.3-5: reserved bits of the subscription options must be 0.
#[tokio::test]
async fn v5_subscription_options_reserved_bits_close() {
    let b = Broker::start();
    let mut c = RawClient::v5(b.addr, "resvopt").await;
    // SUBSCRIBE id 1, props 0, filter "a", options 0xC0 (reserved bits set).
    c.send_bytes(&[0x82, 0x07, 0x00, 0x01, 0x00, 0x00, 0x01, b'a', 0xC0])
        .await;
    let before = c.expect_closed().await;
    assert!(
        before.iter().all(
            |p| matches!(p, Packet::Disconnect(d) if d.reason == ReasonCode::MALFORMED_PACKET)
        ),
        "{before:?}"
    );
}

fn s_(text: &str) -> Str {
    s(text)
}
