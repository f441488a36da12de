//! Keep alive, will delay, session expiry and the CONNECT timeout, under paused time.

mod common;

use std::time::Duration;

use common::*;
use tern_wire::{Packet, Protocol, ReasonCode};

#[tokio::test(start_paused = true)]
async fn keep_alive_timeout_at_one_and_a_half_sends_0x8d_and_the_will_mqtt_3_1_2_22() {
    let b = TestBroker::start(config()).await;
    let mut watcher = Client::v5(b.addr, "watcher").await;
    watcher.subscribe("wills/#", 1).await;
    let mut c = connect_packet(Protocol::V5, "sleepy", true, 2);
    c.will = Some(will("wills/sleepy", b"gone", None));
    let (mut sleepy, _) = Client::connect(b.addr, c).await;
    let start = tokio::time::Instant::now();
    assert_eq!(
        sleepy.expect_disconnect().await,
        ReasonCode::KEEP_ALIVE_TIMEOUT
    );
    let waited = start.elapsed();
    assert!(waited >= Duration::from_millis(3_000), "{waited:?}");
    assert!(waited < Duration::from_millis(3_500), "{waited:?}");
    let will = watcher.expect_publish().await;
    assert_eq!(&will.payload[..], b"gone");
}

#[tokio::test(start_paused = true)]
async fn ping_keeps_the_connection_alive() {
    let b = TestBroker::start(config()).await;
    let (mut c, _) =
        Client::connect(b.addr, connect_packet(Protocol::V3_1_1, "pinger", true, 2)).await;
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(1_900)).await;
        c.send(&Packet::PingReq).await;
        assert_eq!(c.recv().await, Some(Packet::PingResp));
    }
}

#[tokio::test(start_paused = true)]
async fn v5_keep_alive_above_maximum_is_replaced_by_server_keep_alive_mqtt_3_2_2_21() {
    let mut cfg = config();
    cfg.max_keep_alive_s = 10;
    let b = TestBroker::start(cfg).await;
    let (_c, ca) = Client::connect(b.addr, connect_packet(Protocol::V5, "ka", true, 60)).await;
    assert_eq!(ca.properties.server_keep_alive_s, Some(10));
    let (_c, ca) = Client::connect(b.addr, connect_packet(Protocol::V5, "ka0", true, 0)).await;
    assert_eq!(ca.properties.server_keep_alive_s, Some(10));
    let (_c, ca) = Client::connect(b.addr, connect_packet(Protocol::V5, "ka5", true, 5)).await;
    assert_eq!(ca.properties.server_keep_alive_s, None);
}

#[tokio::test(start_paused = true)]
async fn will_delay_publishes_after_the_delay_mqtt_3_1_3_9() {
    let b = TestBroker::start(config()).await;
    let mut watcher = Client::v5(b.addr, "watcher").await;
    watcher.subscribe("wills/#", 1).await;
    let mut c = connect_packet(Protocol::V5, "delayed", false, 0);
    c.properties.session_expiry_interval_s = Some(60);
    c.will = Some(will("wills/delayed", b"late", Some(5)));
    let (delayed, _) = Client::connect(b.addr, c).await;
    drop(delayed); // abnormal close
    watcher.expect_silence(Duration::from_secs(4)).await;
    let will = watcher.expect_publish().await;
    assert_eq!(&will.payload[..], b"late");
    assert_eq!(will.properties.will_delay_interval_s, None);
}

#[tokio::test(start_paused = true)]
async fn reconnect_within_will_delay_cancels_the_will() {
    let b = TestBroker::start(config()).await;
    let mut watcher = Client::v5(b.addr, "watcher").await;
    watcher.subscribe("wills/#", 1).await;
    let mut c = connect_packet(Protocol::V5, "back", false, 0);
    c.properties.session_expiry_interval_s = Some(60);
    c.will = Some(will("wills/back", b"never", Some(5)));
    let (first, _) = Client::connect(b.addr, c.clone()).await;
    drop(first);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (_second, ca) = Client::connect(b.addr, c).await;
    assert!(ca.session_present);
    watcher.expect_silence(Duration::from_secs(10)).await;
}

#[tokio::test(start_paused = true)]
async fn session_ending_before_will_delay_sends_the_will_at_session_end() {
    let b = TestBroker::start(config()).await;
    let mut watcher = Client::v5(b.addr, "watcher").await;
    watcher.subscribe("wills/#", 1).await;
    let mut c = connect_packet(Protocol::V5, "short", false, 0);
    c.properties.session_expiry_interval_s = Some(2);
    c.will = Some(will("wills/short", b"session over", Some(100)));
    let (short, _) = Client::connect(b.addr, c).await;
    drop(short);
    let start = tokio::time::Instant::now();
    let will = watcher.expect_publish().await;
    assert_eq!(&will.payload[..], b"session over");
    assert!(start.elapsed() < Duration::from_secs(3));
}

#[tokio::test(start_paused = true)]
async fn disconnect_0x00_discards_the_will_and_0x04_sends_it_mqtt_3_14_4_3() {
    let b = TestBroker::start(config()).await;
    let mut watcher = Client::v5(b.addr, "watcher").await;
    watcher.subscribe("wills/#", 1).await;
    for (reason, payload) in [(0x00u8, &b"normal"[..]), (0x04, &b"with will"[..])] {
        let mut c = connect_packet(Protocol::V5, "leaver", true, 0);
        c.will = Some(will(
            "wills/leaver",
            if reason == 0 { b"normal" } else { b"with will" },
            None,
        ));
        let (mut leaver, _) = Client::connect(b.addr, c).await;
        leaver
            .send(&Packet::Disconnect(tern_wire::Disconnect {
                reason: ReasonCode(reason),
                properties: Default::default(),
            }))
            .await;
        leaver.expect_closed().await;
        if reason == 0 {
            watcher.expect_silence(Duration::from_secs(1)).await;
        } else {
            assert_eq!(&watcher.expect_publish().await.payload[..], payload);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn session_expires_after_its_interval_mqtt_4_1_0_2() {
    let b = TestBroker::start(config()).await;
    let mut c = connect_packet(Protocol::V5, "exp", false, 0);
    c.properties.session_expiry_interval_s = Some(3);
    let (mut first, _) = Client::connect(b.addr, c.clone()).await;
    first.subscribe("exp/t", 1).await;
    drop(first);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (second, ca) = Client::connect(b.addr, c.clone()).await;
    assert!(ca.session_present, "within the interval");
    drop(second);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (_third, ca) = Client::connect(b.addr, c).await;
    assert!(!ca.session_present, "expired");
}

#[tokio::test(start_paused = true)]
async fn no_connect_within_the_timeout_closes_the_socket() {
    let b = TestBroker::start(config()).await;
    let mut idle = Client::open(b.addr, Protocol::V3_1_1).await;
    let start = tokio::time::Instant::now();
    idle.expect_closed().await;
    assert!(start.elapsed() >= Duration::from_millis(10_000));
}
