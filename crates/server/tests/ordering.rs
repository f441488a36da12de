//! Order of effect across connections (ARCHITECTURE §2.1): packets that arrive on different
//! connections take effect in the order the broker reads them, as in a single-threaded broker.
//! Test suites everywhere subscribe without waiting for SUBACK and publish from another client
//! right after; the message must reach the new subscription.

mod common;

use common::Broker;
use common::raw::*;

/// Rounds of SUBSCRIBE-then-PUBLISH in one broker process.
const ROUNDS: usize = 1000;

/// §2.1: client B sends SUBSCRIBE and does not wait for SUBACK; client A publishes on B's topic
/// immediately after (QoS 0 and QoS 1 alternately). B must receive the message, every time:
/// B's SUBSCRIBE reached the broker first, so it takes effect first. A fresh topic per round;
/// after B's SUBACK, A publishes a marker on the same topic, and B reads up to the marker (one
/// publisher's messages reach one subscriber in order), so a miss is seen without waiting.
#[tokio::test]
async fn subscribe_takes_effect_before_a_later_publish_from_another_client() {
    let b = Broker::start();
    let mut sub = RawClient::v5(b.addr, "order-b").await;
    let mut publ = RawClient::v5(b.addr, "order-a").await;
    // Both connections are idle and waiting for data before the first round.
    assert!(sub.ping().await.is_empty());
    assert!(publ.ping().await.is_empty());
    let mut missed = Vec::new();
    for round in 0..ROUNDS {
        let topic = format!("order/{round}");
        let packet_id = (round % 60_000) as u16 + 1;
        let level = (round % 2) as u8;
        sub.send(&Packet::Subscribe(subscribe(
            packet_id,
            &[(&topic, opts(0))],
        )))
        .await;
        publ.send(&Packet::Publish(publish(
            &topic, b"first", level, packet_id,
        )))
        .await;
        let mut got_first = false;
        loop {
            match sub.expect_packet().await {
                Packet::SubAck(a) => {
                    assert_eq!(a.packet_id, packet_id);
                    assert_eq!(a.reasons, vec![ReasonCode::GRANTED_QOS_0]);
                    break;
                }
                Packet::Publish(p) if p.topic.as_str() == topic && &p.payload[..] == b"first" => {
                    got_first = true;
                }
                other => panic!("round {round}: unexpected {}", brief(&other)),
            }
        }
        // The subscription is in place now: the marker reaches B whatever happened before.
        publ.send(&Packet::Publish(publish(&topic, b"marker", 0, 0)))
            .await;
        loop {
            let p = sub.expect_publish().await;
            assert_eq!(p.topic.as_str(), topic, "round {round}");
            match &p.payload[..] {
                b"first" => got_first = true,
                b"marker" => break,
                other => panic!("round {round}: unexpected payload {other:?}"),
            }
        }
        if level == 1 {
            match publ.expect_packet().await {
                Packet::PubAck(a) if a.packet_id == packet_id => {}
                other => panic!("round {round}: expected PUBACK, got {}", brief(&other)),
            }
        }
        if !got_first {
            missed.push(round);
        }
    }
    eprintln!("missed {} of {ROUNDS}: {missed:?}", missed.len());
    assert!(
        missed.is_empty(),
        "the PUBLISH read after B's SUBSCRIBE missed B in {} of {ROUNDS} rounds: {missed:?}",
        missed.len()
    );
}
