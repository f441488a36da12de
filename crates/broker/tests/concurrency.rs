//! Several publishers and subscribers at once on a multi-threaded runtime: every subscriber
//! gets every QoS 1/2 message exactly once and, per publisher, in publish order
//! (MQTT-4.6.0-6: ordered topic), with acks flowing both ways.

mod common;

use std::collections::HashMap;

use bytes::Bytes;
use common::*;
use tern_wire::{Packet, QoS};

const PUBLISHERS: usize = 4;
const MESSAGES: usize = 200;
const SUBSCRIBERS: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_publishers_many_subscribers_exactly_once_in_order() {
    run(None).await;
}

/// The same with a subscriber Receive Maximum of 3: the in-flight window is full most of the
/// time, so queued deliveries wait and acks/PUBRELs overtake them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_client_receive_maximum_still_exactly_once_in_order_mqtt_3_3_4_7() {
    run(Some(3)).await;
}

async fn run(receive_maximum: Option<u16>) {
    let b = TestBroker::start(config()).await;
    let mut subscribers = Vec::new();
    for i in 0..SUBSCRIBERS {
        let mut c = connect_packet(tern_wire::Protocol::V5, &format!("cc-sub-{i}"), true, 0);
        c.properties.receive_maximum = receive_maximum;
        let (mut s, _) = Client::connect(b.addr, c).await;
        s.subscribe("cc/#", 2).await;
        subscribers.push(s);
    }
    let addr = b.addr;
    let readers: Vec<_> = subscribers
        .into_iter()
        .map(|mut s| {
            tokio::spawn(async move {
                let mut next: HashMap<String, usize> = HashMap::new();
                for _ in 0..PUBLISHERS * MESSAGES {
                    let p = s.expect_publish().await;
                    let text = String::from_utf8(p.payload.to_vec()).unwrap();
                    let (publisher, seq) = text.split_once(':').unwrap();
                    let seq: usize = seq.parse().unwrap();
                    let want = next.entry(publisher.to_string()).or_insert(0);
                    assert_eq!(
                        seq, *want,
                        "publisher {publisher}: out of order or duplicate"
                    );
                    *want += 1;
                    match p.qos {
                        QoS::AtLeastOnce => s.send(&Packet::PubAck(ack(p.packet_id))).await,
                        QoS::ExactlyOnce => {
                            s.send(&Packet::PubRec(ack(p.packet_id))).await;
                            // PUBREL is read later, among the next PUBLISHes: track it lazily.
                            s.pending_pubrel(p.packet_id);
                        }
                        QoS::AtMostOnce => {}
                    }
                }
                s.finish_pubrels().await;
                s.send(&Packet::PingReq).await;
                loop {
                    match s.recv().await {
                        Some(Packet::PingResp) => break,
                        Some(Packet::PubRel(a)) => s.send(&Packet::PubComp(ack(a.packet_id))).await,
                        other => panic!("nothing else expected, got {other:?}"),
                    }
                }
            })
        })
        .collect();
    let writers: Vec<_> = (0..PUBLISHERS)
        .map(|p| {
            tokio::spawn(async move {
                let mut c = Client::v5(addr, &format!("cc-pub-{p}")).await;
                let qos = if p % 2 == 0 { 1 } else { 2 };
                for i in 0..MESSAGES {
                    let mut m = publish("cc/t", b"", qos, (i % 60_000 + 1) as u16);
                    m.payload = Bytes::from(format!("p{p}:{i}"));
                    c.send(&Packet::Publish(m)).await;
                    match c.recv().await {
                        Some(Packet::PubAck(_)) => {}
                        Some(Packet::PubRec(a)) => {
                            c.send(&Packet::PubRel(ack(a.packet_id))).await;
                            assert!(matches!(c.recv().await, Some(Packet::PubComp(_))));
                        }
                        other => panic!("{other:?}"),
                    }
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    for r in readers {
        r.await.unwrap();
    }
}
