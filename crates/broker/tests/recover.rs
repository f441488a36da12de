//! A store that recovered state from a previous run: the broker rebuilds the session
//! (subscriptions, QoS 2 received set, in-flight and queued messages) and retained messages.

mod common;

use std::sync::Arc;

use bytes::Bytes;
use common::*;
use tern_broker::Message;
use tern_broker::{Broker, Persistence, Recovery};
use tern_broker::{Recovered, StoredInflight, StoredSession};
use tern_wire::{Packet, Properties, Protocol, QoS, ReasonCode, Str, SubscriptionOptions};
use tokio::net::TcpListener;
use tokio::time::Instant;

fn msg(topic: &'static str, payload: &'static [u8], qos: QoS, retain: bool) -> Message {
    Message::new(
        Str::from_static(topic),
        Bytes::from_static(payload),
        qos,
        retain,
        Properties::default(),
        None,
        Instant::now(),
    )
}

struct Recovering;

impl Recovery for Recovering {
    fn recover(&self) -> Recovered {
        Recovered {
            sessions: vec![StoredSession {
                client_id: "survivor".into(),
                protocol: Protocol::V5,
                expiry_interval_s: 600,
                subscriptions: vec![(
                    "live/#".into(),
                    SubscriptionOptions {
                        qos: QoS::AtLeastOnce,
                        ..SubscriptionOptions::default()
                    },
                    None,
                )],
                qos2_received: vec![42],
                inflight: vec![
                    StoredInflight {
                        packet_id: 7,
                        message: msg("live/a", b"unacked", QoS::AtLeastOnce, false).into(),
                        qos: QoS::AtLeastOnce,
                        pubrel_pending: false,
                    },
                    StoredInflight {
                        packet_id: 8,
                        message: msg("live/b", b"recd", QoS::ExactlyOnce, false).into(),
                        qos: QoS::ExactlyOnce,
                        pubrel_pending: true,
                    },
                ],
                dropped_queue_limit: 0,
                queued: vec![(
                    msg("live/c", b"queued", QoS::AtLeastOnce, false).into(),
                    QoS::AtLeastOnce,
                )],
            }],
            retained: vec![msg("kept/t", b"retained", QoS::AtMostOnce, true)],
            ..Recovered::default()
        }
    }
}

#[tokio::test]
async fn recovered_session_resumes_where_it_stopped() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let broker = Broker::with_persistence(
        config(),
        Persistence {
            recovery: Arc::new(Recovering),
            ..Persistence::memory()
        },
    )
    .unwrap();
    tokio::spawn(async move { broker.serve(listener, std::future::pending()).await });

    let mut c = connect_packet(Protocol::V5, "survivor", false, 0);
    c.properties.session_expiry_interval_s = Some(600);
    let (mut s, ca) = Client::connect(addr, c).await;
    assert!(ca.session_present);
    let resent = s.expect_publish().await;
    assert!(resent.dup && resent.packet_id == 7 && &resent.payload[..] == b"unacked");
    assert!(matches!(s.recv().await, Some(Packet::PubRel(a)) if a.packet_id == 8));
    let queued = s.expect_publish().await;
    assert!(!queued.dup && &queued.payload[..] == b"queued");
    assert_ne!(queued.packet_id, 7);
    assert_ne!(queued.packet_id, 8);

    // The QoS 2 received set survived: a retried PUBLISH 42 is a duplicate (PUBREC only).
    s.send(&Packet::PubRel(ack(42))).await;
    assert!(matches!(s.recv().await, Some(Packet::PubComp(a)) if a.reason == ReasonCode::SUCCESS));

    // The subscription survived.
    let mut p = Client::v5(addr, "pub").await;
    p.send(&Packet::Publish(publish("live/x", b"fresh", 1, 1)))
        .await;
    assert!(matches!(p.recv().await, Some(Packet::PubAck(_))));
    assert_eq!(&s.expect_publish().await.payload[..], b"fresh");

    // Retained messages survived.
    let mut r = Client::v5(addr, "reader").await;
    r.subscribe("kept/#", 0).await;
    let got = r.expect_publish().await;
    assert!(got.retain);
    assert_eq!(&got.payload[..], b"retained");
}

/// A store whose recovery already left 2 old messages out, handing back 5 more than the
/// broker's `max_queued_bytes` holds.
struct OverLimit;

impl Recovery for OverLimit {
    fn recover(&self) -> Recovered {
        let payloads: [&'static [u8]; 5] = [b"1", b"2", b"3", b"4", b"5"];
        Recovered {
            sessions: vec![StoredSession {
                client_id: "backlog".into(),
                protocol: Protocol::V5,
                expiry_interval_s: 600,
                subscriptions: vec![(
                    "q/#".into(),
                    SubscriptionOptions {
                        qos: QoS::AtLeastOnce,
                        ..SubscriptionOptions::default()
                    },
                    None,
                )],
                qos2_received: Vec::new(),
                inflight: Vec::new(),
                dropped_queue_limit: 2,
                queued: payloads
                    .iter()
                    .map(|p| {
                        (
                            std::sync::Arc::new(msg("q/t", p, QoS::AtLeastOnce, false)),
                            QoS::AtLeastOnce,
                        )
                    })
                    .collect(),
            }],
            retained: Vec::new(),
            ..Recovered::default()
        }
    }
}

/// Issue 11 item 2, the restart path: recovered messages go through the session queue limits
/// (`max_queued_bytes` here), the newest kept; what the store left out and what the queue
/// dropped are counted in `messages_dropped_queue_limit`, and the queue's bytes in the
/// broker-wide total.
#[tokio::test]
async fn restored_queue_keeps_the_newest_within_max_queued_bytes() {
    let len = msg("q/t", b"1", QoS::AtLeastOnce, false).approx_len();
    let mut limits = config();
    limits.max_queued_bytes = 3 * len;
    let broker = Broker::with_persistence(
        limits,
        Persistence {
            recovery: Arc::new(OverLimit),
            ..Persistence::memory()
        },
    )
    .unwrap();
    let shared = broker.shared();
    let session = shared.sessions().get("backlog").expect("restored");
    let kept: Vec<Vec<u8>> = session
        .state
        .lock()
        .out
        .queued()
        .map(|o| o.message.payload().to_vec())
        .collect();
    assert_eq!(kept, vec![b"3".to_vec(), b"4".to_vec(), b"5".to_vec()]);
    let m = shared.metrics();
    assert_eq!(
        m.count(tern_broker::__internal::Counter::MessagesDroppedQueueLimit),
        4
    );
    assert_eq!(m.queued_bytes(), 3 * len);
}
