//! Wills recovered from the store (issue 11 item 6), under paused time: a will due at once is
//! published when the broker starts serving; one whose delay still runs waits on its restored
//! session for the rest of the delay, and a reconnect within it cancels it (MQTT-3.1.3-9).

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use tern_broker::Message;
use tern_broker::{Broker, Persistence, Recovery};
use tern_broker::{Recovered, StoredSession, StoredWill};
use tern_wire::{Properties, Protocol, QoS, Str, SubscriptionOptions};
use tokio::net::TcpListener;
use tokio::time::Instant;

fn msg(topic: &'static str, payload: &'static [u8]) -> Message {
    Message::new(
        Str::from_static(topic),
        Bytes::from_static(payload),
        QoS::AtLeastOnce,
        false,
        Properties::default(),
        None,
        Instant::now(),
    )
}

fn session(client_id: &str, filters: &[&str]) -> StoredSession {
    StoredSession {
        client_id: client_id.into(),
        protocol: Protocol::V5,
        expiry_interval_s: 600,
        subscriptions: filters
            .iter()
            .map(|f| {
                let options = SubscriptionOptions {
                    qos: QoS::AtLeastOnce,
                    ..SubscriptionOptions::default()
                };
                (f.to_string(), options, None)
            })
            .collect(),
        qos2_received: Vec::new(),
        inflight: Vec::new(),
        queued: Vec::new(),
        dropped_queue_limit: 0,
    }
}

/// Recovers a watcher subscribed to `wills/#`, the offline session `delayed` whose will has
/// 30 s of its delay left, and the will of `gone` (no session left: due now).
struct RecoveringWills;

impl Recovery for RecoveringWills {
    fn recover(&self) -> Recovered {
        Recovered {
            sessions: vec![session("watcher", &["wills/#"]), session("delayed", &[])],
            wills: vec![
                StoredWill {
                    client_id: "delayed".into(),
                    message: msg("wills/delayed", b"later"),
                    due_in: Duration::from_secs(30),
                    token: 1,
                },
                StoredWill {
                    client_id: "gone".into(),
                    message: msg("wills/gone", b"now"),
                    due_in: Duration::ZERO,
                    token: 2,
                },
            ],
            ..Recovered::default()
        }
    }
}

async fn start() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let broker = Broker::with_persistence(
        config(),
        Persistence {
            recovery: Arc::new(RecoveringWills),
            ..Persistence::memory()
        },
    )
    .unwrap();
    tokio::spawn(async move { broker.serve(listener, std::future::pending()).await });
    addr
}

async fn watcher(addr: std::net::SocketAddr) -> Client {
    let mut c = connect_packet(Protocol::V5, "watcher", false, 0);
    c.properties.session_expiry_interval_s = Some(600);
    let (w, ca) = Client::connect(addr, c).await;
    assert!(ca.session_present);
    w
}

#[tokio::test(start_paused = true)]
async fn recovered_wills_fire_now_or_after_the_rest_of_their_delay() {
    let addr = start().await;
    let mut w = watcher(addr).await;
    assert_eq!(&w.expect_publish().await.payload[..], b"now");
    w.expect_silence(Duration::from_secs(25)).await;
    assert_eq!(&w.expect_publish().await.payload[..], b"later");
}

#[tokio::test(start_paused = true)]
async fn reconnect_within_the_rest_of_the_delay_cancels_a_recovered_will() {
    let addr = start().await;
    let mut c = connect_packet(Protocol::V5, "delayed", false, 0);
    c.properties.session_expiry_interval_s = Some(600);
    let (_back, ca) = Client::connect(addr, c).await;
    assert!(ca.session_present);
    let mut w = watcher(addr).await;
    assert_eq!(&w.expect_publish().await.payload[..], b"now");
    w.expect_silence(Duration::from_secs(60)).await;
}
