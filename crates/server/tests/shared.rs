//! Shared subscriptions `$share/{group}/{filter}` (v5 §4.8.2): one member per message,
//! redistribution of unacknowledged messages when a member leaves, groups independent of each
//! other and of normal subscriptions, filter validation.

mod common;

use std::collections::{BTreeSet, HashMap};

use common::Broker;
use common::raw::*;

async fn member(b: &Broker, id: &str, filter: &str, qos_level: u8) -> RawClient {
    let mut c = RawClient::v5(b.addr, id).await;
    c.sub(filter, qos_level).await;
    c
}

/// Drains PUBLISHes from `c` (acknowledging them) until a ping round trip shows nothing more.
async fn drain(c: &mut RawClient) -> Vec<Publish> {
    let mut got = Vec::new();
    loop {
        let before = c.ping().await;
        if before.is_empty() {
            return got;
        }
        for p in before {
            match p {
                Packet::Publish(p) => {
                    if p.qos == QoS::AtLeastOnce {
                        c.send(&Packet::PubAck(ack(p.packet_id))).await;
                    }
                    got.push(p);
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }
}

/// (v5) §4.8.2: each message matching a shared subscription goes to exactly one member of the
/// group; with 20 messages and two members both receive some (Tern distributes round-robin).
/// A normal subscriber of the same filter still receives every message.
#[tokio::test]
async fn shared_group_delivers_each_message_to_one_member() {
    let b = Broker::start();
    let mut m1 = member(&b, "sh-m1", "$share/g/sh/t", 1).await;
    let mut m2 = member(&b, "sh-m2", "$share/g/sh/t", 1).await;
    let mut plain = member(&b, "sh-plain", "sh/t", 1).await;
    let mut p = RawClient::v5(b.addr, "sh-p").await;
    for i in 0..20u16 {
        p.publish_acked(publish("sh/t", format!("{i}").as_bytes(), 1, i + 1))
            .await;
    }
    let mut all = Vec::new();
    for _ in 0..20 {
        all.push(plain.receive_acked().await.payload);
    }
    assert_eq!(all.len(), 20);
    // Bounded collection: until the two members together hold 20 messages.
    let mut counts: HashMap<Vec<u8>, u32> = HashMap::new();
    let (mut n1, mut n2) = (0, 0);
    let deadline = tokio::time::Instant::now() + common::WAIT;
    while n1 + n2 < 20 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} of 20 messages reached the group",
            n1 + n2
        );
        for (m, n) in [(&mut m1, &mut n1), (&mut m2, &mut n2)] {
            for got in drain(m).await {
                assert_eq!(
                    got.topic.as_str(),
                    "sh/t",
                    "shared delivery carries the topic, not the $share filter"
                );
                *counts.entry(got.payload.to_vec()).or_default() += 1;
                *n += 1;
            }
        }
    }
    assert_eq!(n1 + n2, 20, "each message exactly once across the group");
    assert!(
        counts.values().all(|&c| c == 1),
        "a message went to two members: {counts:?}"
    );
    assert!(n1 > 0 && n2 > 0, "distribution: m1 got {n1}, m2 got {n2}");
}

/// (v5) §4.8.2 (redistribution): QoS 1 messages in flight to a member that leaves (its session
/// ends: clean start, no session expiry) without acknowledging are sent to another member.
#[tokio::test]
async fn unacked_messages_go_to_another_member_when_one_leaves() {
    let b = Broker::start();
    let mut leaver = member(&b, "rd-leaver", "$share/rd/rd/t", 1).await;
    let mut stayer = member(&b, "rd-stayer", "$share/rd/rd/t", 1).await;
    let mut p = RawClient::v5(b.addr, "rd-p").await;
    for i in 0..10u16 {
        p.publish_acked(publish("rd/t", format!("{i}").as_bytes(), 1, i + 1))
            .await;
    }
    // The leaver reads (and never acknowledges) whatever it was given, then drops.
    let mut leaver_got = BTreeSet::new();
    loop {
        let before = leaver.ping().await;
        if before.is_empty() {
            break;
        }
        for pkt in before {
            if let Packet::Publish(m) = pkt {
                leaver_got.insert(m.payload.to_vec());
            }
        }
    }
    assert!(
        !leaver_got.is_empty(),
        "round-robin gave the leaver nothing to lose"
    );
    leaver.drop_connection().await;
    let mut stayer_got = BTreeSet::new();
    let deadline = tokio::time::Instant::now() + common::WAIT;
    while stayer_got.len() < 10 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "stayer has {} of 10 (leaver had {} unacked)",
            stayer_got.len(),
            leaver_got.len()
        );
        for m in drain(&mut stayer).await {
            stayer_got.insert(m.payload.to_vec());
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let all: BTreeSet<Vec<u8>> = (0..10).map(|i: i32| i.to_string().into_bytes()).collect();
    assert_eq!(stayer_got, all);
}

/// (v5) §4.8.2: every group receives each message once, independently of other groups.
#[tokio::test]
async fn groups_are_independent() {
    let b = Broker::start();
    let mut a = member(&b, "gi-a", "$share/ga/gi/#", 0).await;
    let mut c = member(&b, "gi-c", "$share/gc/gi/#", 0).await;
    let mut p = RawClient::v5(b.addr, "gi-p").await;
    for i in 0..5u8 {
        p.publish_acked(publish("gi/x", &[i], 0, 0)).await;
    }
    for m in [&mut a, &mut c] {
        for i in 0..5u8 {
            assert_eq!(&m.expect_publish().await.payload[..], &[i]);
        }
    }
}

/// (v5) MQTT-4.8.2-3: the server respects the QoS granted to the member's subscription.
#[tokio::test]
async fn shared_delivery_respects_granted_qos() {
    let b = Broker::start();
    let mut m = member(&b, "sq-m", "$share/sq/sq/t", 0).await;
    let mut p = RawClient::v5(b.addr, "sq-p").await;
    p.publish_acked(publish("sq/t", b"x", 2, 1)).await;
    assert_eq!(m.expect_publish().await.qos, QoS::AtMostOnce);
}

/// (v5) MQTT-4.8.2-1, MQTT-4.8.2-2: a share filter needs a non-empty ShareName without `+`, `#`
/// or `/`, followed by `/` and a filter: otherwise SUBACK 0x8F (Topic Filter invalid), or the
/// packet is treated as malformed (DISCONNECT 0x81 / close).
#[tokio::test]
async fn invalid_share_filters_are_rejected() {
    let b = Broker::start();
    for f in [
        "$share//t",
        "$share/g",
        "$share/g+/t",
        "$share/g#/t",
        "$share/g/",
    ] {
        let mut c = RawClient::v5(b.addr, "sbad").await;
        match c.try_subscribe(subscribe(1, &[(f, opts(0))])).await {
            SubOutcome::Acked(r) => assert_eq!(r, vec![ReasonCode::TOPIC_FILTER_INVALID], "{f}"),
            SubOutcome::Closed(reason) => assert!(
                matches!(
                    reason,
                    None | Some(ReasonCode::MALFORMED_PACKET) | Some(ReasonCode::PROTOCOL_ERROR)
                ),
                "{f}: {reason:?}"
            ),
        }
    }
}

/// Unsubscribing from a shared subscription removes the member: the other one gets all.
#[tokio::test]
async fn unsubscribed_member_gets_nothing() {
    let b = Broker::start();
    let mut m1 = member(&b, "su-1", "$share/su/su/t", 0).await;
    let mut m2 = member(&b, "su-2", "$share/su/su/t", 0).await;
    m1.send(&Packet::Unsubscribe(Unsubscribe {
        packet_id: 3,
        properties: Properties::default(),
        filters: vec![s("$share/su/su/t")],
    }))
    .await;
    match m1.expect_packet().await {
        Packet::UnsubAck(ua) => assert_eq!(ua.reasons, vec![ReasonCode::SUCCESS]),
        other => panic!("{other:?}"),
    }
    let mut p = RawClient::v5(b.addr, "su-p").await;
    for i in 0..4u8 {
        p.publish_acked(publish("su/t", &[i], 0, 0)).await;
    }
    for i in 0..4u8 {
        assert_eq!(&m2.expect_publish().await.payload[..], &[i]);
    }
    assert!(m1.ping().await.is_empty());
}

/// (v5) MQTT-4.8.2-6: a member that answers PUBACK ≥ 0x80 makes the server discard the
/// message: it is not sent to another member.
#[tokio::test]
async fn refused_shared_message_is_not_redistributed() {
    let b = Broker::start();
    let mut m1 = member(&b, "rf-1", "$share/rf/rf/t", 1).await;
    let mut m2 = member(&b, "rf-2", "$share/rf/rf/t", 1).await;
    let mut p = RawClient::v5(b.addr, "rf-p").await;
    p.publish_acked(publish("rf/t", b"x", 1, 1)).await;
    // Whoever got it refuses it and leaves; the other must not get it.
    let deadline = tokio::time::Instant::now() + common::WAIT;
    let (mut got_it, mut other) = loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no member received the message"
        );
        if let Recv::Packet(Packet::Publish(m)) =
            m1.recv(std::time::Duration::from_millis(50)).await
        {
            break ((m1, m), m2);
        }
        if let Recv::Packet(Packet::Publish(m)) =
            m2.recv(std::time::Duration::from_millis(50)).await
        {
            break ((m2, m), m1);
        }
    };
    got_it
        .0
        .send(&Packet::PubAck(Ack {
            packet_id: got_it.1.packet_id,
            reason: ReasonCode::UNSPECIFIED_ERROR,
            properties: Properties::default(),
        }))
        .await;
    assert!(got_it.0.ping().await.is_empty());
    got_it.0.drop_connection().await;
    p.publish_acked(publish("rf/t", b"marker", 1, 2)).await;
    assert_eq!(
        &other.receive_acked().await.payload[..],
        b"marker",
        "the refused message was redistributed"
    );
}

/// (v5) MQTT-3.3.4-3 on a shared subscription: the member's Subscription Identifier comes with
/// the message.
#[tokio::test]
async fn shared_delivery_carries_subscription_identifier() {
    let b = Broker::start();
    let mut m = RawClient::v5(b.addr, "ssid").await;
    let mut sub = subscribe(1, &[("$share/ssid/ssid/t", opts(1))]);
    sub.properties.subscription_identifiers = vec![5];
    m.subscribe(sub).await;
    let mut p = RawClient::v5(b.addr, "ssid-p").await;
    p.publish_acked(publish("ssid/t", b"x", 1, 1)).await;
    assert_eq!(
        m.receive_acked().await.properties.subscription_identifiers,
        vec![5]
    );
}

/// (v5) §3.3.1.3 RETAIN: "When a new Non‑shared Subscription is made, the last retained
/// message, if any, on each matching topic name is sent to the Client as directed by the Retain
/// Handling Subscription Option" — retained messages are sent only for non-shared
/// subscriptions, so establishing a Shared Subscription (§4.8.2) sends none, whatever its Retain
/// Handling (0 here, which for a normal subscription means MQTT-3.3.1-9: send them). The same
/// SUBSCRIBE's normal filter does get the retained message (RETAIN 1), and a later publish
/// still reaches the shared member, with RETAIN 0 (Retain As Published 0, MQTT-3.3.1-12).
/// mosquitto (`retain__queue` returns early for `$share/`) behaves the same.
#[tokio::test]
async fn retained_messages_are_not_sent_when_a_shared_subscription_is_made() {
    let b = Broker::start();
    let mut p = RawClient::v5(b.addr, "shr-p").await;
    let mut kept = publish("shr/t", b"kept", 1, 1);
    kept.retain = true;
    p.publish_acked(kept).await;

    let mut m = RawClient::v5(b.addr, "shr-m").await;
    let send_at_subscribe = SubscriptionOptions {
        qos: qos(1),
        retain_handling: RetainHandling::SendAtSubscribe,
        ..SubscriptionOptions::default()
    };
    let reasons = m
        .subscribe(subscribe(1, &[("$share/g/shr/t", send_at_subscribe)]))
        .await;
    assert_eq!(reasons, vec![ReasonCode::GRANTED_QOS_1]);
    let after_shared = drain(&mut m).await;
    assert!(
        after_shared.is_empty(),
        "§3.3.1.3: no retained message for a new Shared Subscription, got {after_shared:?}"
    );

    // Contrast: a normal subscription to the same topic gets the retained message.
    let reasons = m
        .subscribe(subscribe(2, &[("shr/#", send_at_subscribe)]))
        .await;
    assert_eq!(reasons, vec![ReasonCode::GRANTED_QOS_1]);
    let got = m.receive_acked().await;
    assert_eq!(&got.payload[..], b"kept");
    assert!(
        got.retain,
        "MQTT-3.3.1-9: sent for the normal subscription, RETAIN 1"
    );
    assert!(
        drain(&mut m).await.is_empty(),
        "only the normal subscription's copy"
    );
    m.send(&Packet::Unsubscribe(Unsubscribe {
        packet_id: 3,
        properties: Properties::default(),
        filters: vec![s("shr/#")],
    }))
    .await;
    assert!(matches!(m.expect_packet().await, Packet::UnsubAck(_)));

    // The shared subscription is live: a later retained publish reaches the member, RETAIN 0.
    let mut again = publish("shr/t", b"later", 1, 2);
    again.retain = true;
    p.publish_acked(again).await;
    let got = m.receive_acked().await;
    assert_eq!(&got.payload[..], b"later");
    assert!(
        !got.retain,
        "MQTT-3.3.1-12: RETAIN 0 on an established subscription"
    );
}
