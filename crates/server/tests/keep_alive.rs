//! Keep alive: 1.5× the interval with no packet from the client closes the connection (v5:
//! DISCONNECT 0x8D), traffic resets it, Server Keep Alive; PINGREQ/PINGRESP; the CONNECT
//! timeout of a socket that never sends CONNECT.
//! Statement ids name the version: "(v5)" = MQTT 5.0, "(3.1.1)" = MQTT 3.1.1.

mod common;

use std::time::Duration;

use common::raw::*;
use common::{Broker, WAIT};

/// A connection that never sends CONNECT is closed after `connect_timeout_ms` (server policy;
/// the specs leave the time to the server).
#[tokio::test]
async fn connect_timeout_closes_idle_socket() {
    let b = Broker::start_with("[limits]\nconnect_timeout_ms = 200\n");
    let mut c = RawClient::open(b.addr, Protocol::V3_1_1).await;
    let got = c.expect_closed_raw().await;
    assert!(got.is_empty(), "{got:02x?}");
    // A partial CONNECT does not keep the socket alive either.
    let mut c = RawClient::open(b.addr, Protocol::V3_1_1).await;
    c.send_bytes(&[0x10, 0x0E, 0x00]).await;
    let got = c.expect_closed_raw().await;
    assert!(got.is_empty(), "{got:02x?}");
}

/// (3.1.1) MQTT-3.12.4-1 / (v5) MQTT-3.12.4-1: PINGREQ is answered with PINGRESP.
#[tokio::test]
async fn pingreq_gets_pingresp() {
    let b = Broker::start();
    let mut c = RawClient::v4(b.addr, "pinger").await;
    c.send_bytes(&[0xC0, 0x00]).await;
    assert!(matches!(c.expect_packet().await, Packet::PingResp));
}

/// (3.1.1) MQTT-3.1.2-24: no packet within 1.5 × Keep Alive (1 s here) closes the connection.
#[tokio::test]
async fn v311_keep_alive_expiry_closes_connection() {
    let b = Broker::start();
    let (mut c, _) =
        RawClient::connect_ok(b.addr, connect_packet(Protocol::V3_1_1, "ka-v4", true, 1)).await;
    c.expect_closed_silently().await;
}

/// (v5) MQTT-3.1.2-22: no packet within 1.5 × Keep Alive closes the connection; a DISCONNECT,
/// if sent, carries 0x8D (Keep Alive timeout).
#[tokio::test]
async fn v5_keep_alive_expiry_disconnect_0x8d() {
    let b = Broker::start();
    let (mut c, _) =
        RawClient::connect_ok(b.addr, connect_packet(Protocol::V5, "ka-v5", true, 1)).await;
    let before = c.expect_closed().await;
    for p in &before {
        match p {
            Packet::Disconnect(d) => assert_eq!(d.reason, ReasonCode::KEEP_ALIVE_TIMEOUT),
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// (v5) MQTT-3.1.2-22: a client that keeps sending PINGREQ well inside its Keep Alive (2 s,
/// expiry at 3 s) stays connected for longer than the expiry time.
#[tokio::test]
async fn keep_alive_is_reset_by_traffic() {
    let b = Broker::start();
    let (mut c, _) =
        RawClient::connect_ok(b.addr, connect_packet(Protocol::V5, "ka-alive", true, 2)).await;
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(c.ping().await.is_empty());
    }
}

/// (v5) MQTT-3.2.2-21, MQTT-3.2.2-22: with `max_keep_alive_s = 1` a client asking for 60 s (or 0)
/// is told Server Keep Alive 1 in CONNACK, and the server enforces that value (1.5 s).
#[tokio::test]
async fn v5_server_keep_alive_is_advertised_and_enforced() {
    let b = Broker::start_with("[limits]\nmax_keep_alive_s = 1\n");
    let (_c0, ca0) =
        RawClient::connect_ok(b.addr, connect_packet(Protocol::V5, "ska-0", true, 0)).await;
    assert_eq!(
        ca0.properties.server_keep_alive_s,
        Some(1),
        "keep alive 0 exceeds the maximum"
    );
    let (mut c, ca) =
        RawClient::connect_ok(b.addr, connect_packet(Protocol::V5, "ska-60", true, 60)).await;
    assert_eq!(ca.properties.server_keep_alive_s, Some(1));
    let before = c.expect_closed_within(WAIT).await;
    assert!(
        before.iter().all(
            |p| matches!(p, Packet::Disconnect(d) if d.reason == ReasonCode::KEEP_ALIVE_TIMEOUT)
        ),
        "{before:?}"
    );
}

/// (v5) MQTT-3.2.2-22: a Keep Alive within the maximum is used as sent (no Server Keep Alive,
/// or the same value).
#[tokio::test]
async fn v5_keep_alive_within_maximum_is_kept() {
    let b = Broker::start_with("[limits]\nmax_keep_alive_s = 100\n");
    let (_c, ca) =
        RawClient::connect_ok(b.addr, connect_packet(Protocol::V5, "ska-ok", true, 30)).await;
    assert!(
        matches!(ca.properties.server_keep_alive_s, None | Some(30)),
        "{:?}",
        ca.properties
    );
}

/// (3.1.1) MQTT-3.1.2-24 / (v5) MQTT-3.1.2-22: only packets FROM the client count: a client that
/// receives a steady stream of messages but sends nothing is still closed after 1.5 × Keep
/// Alive.
#[tokio::test]
async fn keep_alive_counts_only_packets_from_the_client() {
    let b = Broker::start();
    let (mut c, _) =
        RawClient::connect_ok(b.addr, connect_packet(Protocol::V3_1_1, "ka-rx", true, 1)).await;
    c.sub("ka-rx/t", 0).await;
    let mut p = RawClient::v5(b.addr, "ka-rx-p").await;
    let feeder = tokio::spawn(async move {
        for _ in 0..60 {
            p.publish_acked(publish("ka-rx/t", b"tick", 0, 0)).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let before = c.expect_closed_within(WAIT).await;
    assert!(
        before.iter().all(|p| matches!(p, Packet::Publish(_))),
        "{}",
        briefs(&before)
    );
    feeder.abort();
}
