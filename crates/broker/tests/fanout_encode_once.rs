//! ARCHITECTURE §2.6 / §6: a message fanned out to many subscribers is encoded once per
//! protocol version. Alone in its test binary: the template counter is process-wide.
//! Per-subscriber encoding would build 100 templates here, not 2; a per-subscriber copy of a
//! shared body is caught by `outbound::tests::one_shared_buffer_reaches_every_subscriber_unchanged`.

mod common;

use common::*;
use tern_wire::{Packet, Protocol, publish_templates_built};

#[tokio::test]
async fn one_publish_to_many_subscribers_builds_one_template_per_protocol() {
    let b = TestBroker::start(config()).await;
    let mut subs = Vec::new();
    // 100 subscribers: 75 speak 5.0 (QoS 0, 1 and 2), 25 speak 3.1.1.
    for i in 0..75 {
        let mut c = Client::v5(b.addr, &format!("fan-{i}")).await;
        c.subscribe("fan/t", (i % 3) as u8).await;
        subs.push(c);
    }
    for i in 0..25 {
        let (mut c, _) = Client::connect(
            b.addr,
            connect_packet(Protocol::V3_1_1, &format!("fan3-{i}"), true, 0),
        )
        .await;
        c.subscribe("fan/#", 1).await;
        subs.push(c);
    }
    let before = publish_templates_built();
    let mut p = Client::v5(b.addr, "fan-pub").await;
    p.send(&Packet::Publish(publish("fan/t", b"hello", 2, 1)))
        .await;
    assert_eq!(subs.len(), 100);
    for s in &mut subs {
        assert_eq!(&s.expect_publish().await.payload[..], b"hello");
    }
    assert_eq!(
        publish_templates_built() - before,
        2,
        "one v5 + one v3 template for 100 subscribers, not one per subscriber"
    );
}
