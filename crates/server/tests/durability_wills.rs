//! Wills are durable (issue 11 item 6): a pending delayed will and the will of a connection
//! that was open when the broker died are published after a kill -9 and restart; a cancelled
//! will and a will already published are not.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::Broker;
use common::raw::*;

fn will(topic: &str, payload: &[u8], delay_s: Option<u32>) -> Will {
    let mut w = Will {
        topic: s(topic),
        payload: Bytes::copy_from_slice(payload),
        qos: qos(1),
        retain: false,
        properties: Properties::default(),
    };
    w.properties.will_delay_interval_s = delay_s;
    w
}

fn connect(id: &str, clean_start: bool, expiry_s: u32, w: Option<Will>) -> Connect {
    let mut c = connect_packet(Protocol::V5, id, clean_start, 0);
    c.properties.session_expiry_interval_s = Some(expiry_s);
    c.will = w;
    c
}

/// A persistent subscriber of `filter` (QoS 1), offline when this returns.
async fn offline_subscriber(b: &Broker, id: &str, filter: &str) {
    let (mut s, _) = RawClient::connect_ok(b.addr, connect(id, true, 3600, None)).await;
    s.sub(filter, 1).await;
    s.disconnect().await;
}

/// The subscriber back (session present); the first PUBLISH it gets, acknowledged.
async fn first_message(b: &Broker, id: &str) -> (RawClient, Publish) {
    let (mut s, ca) = RawClient::connect_ok(b.addr, connect(id, false, 3600, None)).await;
    assert!(ca.session_present);
    let m = s.receive_acked().await;
    (s, m)
}

async fn publish_marker(b: &Broker, topic: &str) {
    let mut p = RawClient::v5(b.addr, "dw-marker").await;
    p.publish_acked(publish(topic, b"marker", 1, 1)).await;
}

/// MQTT-3.1.3-9 across a crash: a delayed will still pending when the broker was killed is
/// published after the restart, once its delay (counted from the disconnect) has passed.
#[tokio::test]
async fn pending_delayed_will_is_published_after_kill() {
    let mut b = Broker::start();
    offline_subscriber(&b, "dwd-s", "dwd/#").await;
    let c = connect(
        "dwd-c",
        true,
        3600,
        Some(will("dwd/will", b"late", Some(2))),
    );
    let (conn, _) = RawClient::connect_ok(b.addr, c).await;
    conn.drop_connection().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    b.restart_after_kill();
    let (_s, m) = first_message(&b, "dwd-s").await;
    assert_eq!(&m.payload[..], b"late");
}

/// MQTT-3.1.2-8 across a crash: the will of a client still connected when the broker died is
/// published after the restart (its network connection closed without DISCONNECT), also for
/// a session that ended with the connection (expiry 0).
#[tokio::test]
async fn will_of_a_client_connected_at_kill_is_published_after_restart() {
    let mut b = Broker::start();
    offline_subscriber(&b, "dwc-s", "dwc/#").await;
    let (_conn, _) = RawClient::connect_ok(
        b.addr,
        connect("dwc-c", true, 0, Some(will("dwc/will", b"gone", None))),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    b.restart_after_kill();
    let (_s, m) = first_message(&b, "dwc-s").await;
    assert_eq!(&m.payload[..], b"gone");
}

/// A connected client with a delayed will and a persistent session: after the restart the
/// will is published once its delay passed (here short), not at once.
#[tokio::test]
async fn delayed_will_of_a_client_connected_at_kill_is_published_after_restart() {
    let mut b = Broker::start();
    offline_subscriber(&b, "dwk-s", "dwk/#").await;
    let (_conn, _) = RawClient::connect_ok(
        b.addr,
        connect(
            "dwk-c",
            true,
            3600,
            Some(will("dwk/will", b"later", Some(1))),
        ),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    b.restart_after_kill();
    let (_s, m) = first_message(&b, "dwk-s").await;
    assert_eq!(&m.payload[..], b"later");
}

/// MQTT-3.1.2-10: a will removed by a clean DISCONNECT (0x00) stays removed across a crash.
#[tokio::test]
async fn no_will_after_clean_disconnect_and_kill() {
    let mut b = Broker::start();
    offline_subscriber(&b, "dwn-s", "dwn/#").await;
    let (conn, _) = RawClient::connect_ok(
        b.addr,
        connect("dwn-c", true, 3600, Some(will("dwn/will", b"no", Some(1)))),
    )
    .await;
    conn.disconnect().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    b.restart_after_kill();
    // Past the delay, then a marker: it must be the first thing the subscriber gets.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    publish_marker(&b, "dwn/marker").await;
    let (_s, m) = first_message(&b, "dwn-s").await;
    assert_eq!(&m.payload[..], b"marker");
}

/// A will published (and delivered) before the crash is not published again after it.
#[tokio::test]
async fn will_published_before_kill_is_not_published_again() {
    let mut b = Broker::start();
    offline_subscriber(&b, "dwo-s", "dwo/#").await;
    let (conn, _) = RawClient::connect_ok(
        b.addr,
        connect("dwo-c", true, 0, Some(will("dwo/will", b"once", None))),
    )
    .await;
    conn.drop_connection().await;
    let (s, m) = first_message(&b, "dwo-s").await;
    assert_eq!(&m.payload[..], b"once");
    s.disconnect().await;
    // Let the subscriber's cursor pass the will (a QoS 1 message may otherwise be resent).
    tokio::time::sleep(Duration::from_millis(300)).await;
    b.restart_after_kill();
    tokio::time::sleep(Duration::from_millis(300)).await;
    publish_marker(&b, "dwo/marker").await;
    let (_s, m) = first_message(&b, "dwo-s").await;
    assert_eq!(&m.payload[..], b"marker");
}

/// v5 §3.1.2.5: a graceful shutdown closes the client's connection without its DISCONNECT, so
/// its will is still owed; the broker keeps the record and the next start publishes it.
#[tokio::test]
async fn will_of_a_client_connected_at_graceful_shutdown_is_published_after_restart() {
    let mut b = Broker::start();
    offline_subscriber(&b, "dws-s", "dws/#").await;
    let (_conn, _) = RawClient::connect_ok(
        b.addr,
        connect("dws-c", true, 0, Some(will("dws/will", b"shutdown", None))),
    )
    .await;
    b.signal(libc::SIGTERM);
    assert!(b.wait_exit(Duration::from_secs(10)).success());
    b.restart_after_kill();
    let (_s, m) = first_message(&b, "dws-s").await;
    assert_eq!(&m.payload[..], b"shutdown");
}
