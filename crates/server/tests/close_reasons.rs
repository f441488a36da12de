//! A close the broker starts after it sent its reason (a v5 DISCONNECT, a refusing CONNACK)
//! lets the client read that reason, also when the client keeps writing (issue 24 item 1):
//! the broker shuts its side down, reads and discards what the client still sends for a
//! bounded linger, then closes. Closing with the client's bytes unread made the kernel send
//! RST instead of FIN, and the client's kernel could throw away the reason still in flight
//! (Eclipse Paho's `test_flow_control2` got EPIPE and never read its DISCONNECT 0x93).
//!
//! Every client here writes until it has read the reason ([`common::chatty`]); each test
//! asserts the reason is read and the stream then ends with EOF.

mod common;

use std::time::Duration;

use bytes::BytesMut;
use common::chatty::{Chatty, Ending, assert_all};
use common::http::request;
use common::raw::*;
use common::{Broker, WAIT};

fn encoded(packets: &[Packet], protocol: Protocol) -> Vec<u8> {
    let mut out = BytesMut::new();
    for packet in packets {
        tern_wire::encode(packet, protocol, &mut out).expect("encode test packet");
    }
    out.to_vec()
}

fn v5_connect(client_id: &str) -> Packet {
    Packet::Connect(Box::new(connect_packet(Protocol::V5, client_id, true, 0)))
}

/// The default Receive Maximum (1,024).
const RECEIVE_MAXIMUM: u16 = 1024;

/// (v5) MQTT-3.3.4-9 and §3.3.4, Eclipse Paho's `test_flow_control2`: Receive Maximum + 1 QoS 2
/// PUBLISHes, every PUBREC answered with a PUBREL, PINGREQs in between: the client reads
/// DISCONNECT 0x93 (Receive Maximum exceeded), then EOF.
#[tokio::test]
async fn receive_maximum_exceeded_0x93_is_read_by_a_client_that_keeps_writing() {
    let b = Broker::start();
    let mut first = vec![v5_connect("close-rm")];
    for id in 1..=RECEIVE_MAXIMUM + 1 {
        first.push(Packet::Publish(publish("close/rm", b"x", 2, id)));
    }
    let c = Chatty::open(b.addr, Protocol::V5, &encoded(&first, Protocol::V5)).await;
    let ending = c.read_to_end().await;
    ending.assert_reason(ReasonCode::RECEIVE_MAXIMUM_EXCEEDED, "0x93");
}

/// Opens a chatty client whose first write is `first`, and reads to the end.
async fn chatty_to_end(b: &Broker, protocol: Protocol, first: &[u8]) -> Ending {
    Chatty::open(b.addr, protocol, first)
        .await
        .read_to_end()
        .await
}

/// A v5 CONNECT followed, in the same write, by `then` (raw bytes).
fn v5_connect_then(client_id: &str, then: &[u8]) -> Vec<u8> {
    let mut first = encoded(&[v5_connect(client_id)], Protocol::V5);
    first.extend_from_slice(then);
    first
}

/// A Remaining Length of five bytes.
const MALFORMED_PUBLISH: &[u8] = &[0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F];

/// Reasons a default broker closes with, each to a client that keeps writing:
/// - (v5) MQTT-4.13.1-1, MQTT-1.5.5-1: a malformed packet (a five-byte Remaining Length):
///   DISCONNECT 0x81, then the close.
/// - (v5) MQTT-3.1.0-2, MQTT-4.13.1-1: a second CONNECT is a Protocol Error: DISCONNECT 0x82.
/// - (3.1.1) MQTT-3.1.2-2: an unsupported protocol level: CONNACK return code 1, then the close
///   (MQTT-3.2.2-5).
/// - (3.1.1) MQTT-3.1.3-8: a zero-byte client id with CleanSession 0: CONNACK return code 2.
#[tokio::test]
async fn malformed_protocol_error_and_311_connack_codes_are_read_by_a_client_that_keeps_writing() {
    let mut checks = Vec::new();
    let b = Broker::start();
    let ending = chatty_to_end(
        &b,
        Protocol::V5,
        &v5_connect_then("close-81", MALFORMED_PUBLISH),
    )
    .await;
    checks.push(ending.check(ReasonCode::MALFORMED_PACKET, "v5 malformed 0x81"));

    let second = encoded(&[v5_connect("close-82")], Protocol::V5);
    let ending = chatty_to_end(&b, Protocol::V5, &v5_connect_then("close-82", &second)).await;
    checks.push(ending.check(ReasonCode::PROTOCOL_ERROR, "v5 second CONNECT 0x82"));

    let level_6 = connect_bytes(6, 0x02, 0, "close-rc1", &[]);
    let ending = chatty_to_end(&b, Protocol::V3_1_1, &level_6).await;
    checks.push(ending.check(
        ReasonCode::UNSUPPORTED_PROTOCOL_VERSION,
        "3.1.1 return code 1",
    ));

    let empty_id_persistent = connect_bytes(4, 0x00, 0, "", &[]);
    let ending = chatty_to_end(&b, Protocol::V3_1_1, &empty_id_persistent).await;
    checks.push(ending.check(
        ReasonCode::CLIENT_IDENTIFIER_NOT_VALID,
        "3.1.1 return code 2",
    ));
    assert_all(&checks);
}

/// (v5) MQTT-3.2.2-15 and §3.2.2.3.6: a PUBLISH over the server's Maximum Packet Size gets
/// DISCONNECT 0x95 (Packet too large) read by a client that keeps writing; the rest of the big
/// packet is still unread in the broker's buffer when it decides.
#[tokio::test]
async fn packet_too_large_0x95_is_read_by_a_client_that_keeps_writing() {
    let b = Broker::start_with("[limits]\nmax_packet_size_bytes = 1024\n");
    let big = encoded(
        &[Packet::Publish(publish(
            "close/big",
            &[7u8; 64 * 1024],
            0,
            0,
        ))],
        Protocol::V5,
    );
    let ending = chatty_to_end(&b, Protocol::V5, &v5_connect_then("close-95", &big)).await;
    ending.assert_reason(ReasonCode::PACKET_TOO_LARGE, "0x95");
}

/// (v5) MQTT-3.1.4-3: a CONNECT with the client id of a connected client takes the session
/// over; the old connection, which keeps writing, reads DISCONNECT 0x8E (Session taken over).
#[tokio::test]
async fn session_taken_over_0x8e_is_read_by_a_client_that_keeps_writing() {
    let b = Broker::start();
    let first = encoded(&[v5_connect("close-8e")], Protocol::V5);
    let mut old = Chatty::open(b.addr, Protocol::V5, &first).await;
    assert!(matches!(old.expect_packet().await, Packet::ConnAck(ca) if ca.reason.is_success()));
    let _new = RawClient::v5(b.addr, "close-8e").await;
    old.read_to_end()
        .await
        .assert_reason(ReasonCode::SESSION_TAKEN_OVER, "0x8E");
}

/// The admin API's token (`[http] token`).
const TOKEN: &str = "test-token-0123456789";

/// (v5) §3.14.2.1, reason 0x98 (Administrative action): a client the admin API disconnects
/// reads its DISCONNECT while it keeps writing. The lingering closes are counted in
/// `tern_close_lingers_total`.
#[tokio::test]
async fn administrative_action_0x98_is_read_by_a_client_that_keeps_writing() {
    let config = format!("[http]\ntoken = \"{TOKEN}\"\n");
    let b = Broker::start_with_args(&config, &["--bind", "127.0.0.1:0", "--http", "127.0.0.1:0"]);
    let http = b.http.expect("the broker printed `tern http on ADDR`");
    let first = encoded(&[v5_connect("close-98")], Protocol::V5);
    let mut c = Chatty::open(b.addr, Protocol::V5, &first).await;
    assert!(matches!(c.expect_packet().await, Packet::ConnAck(ca) if ca.reason.is_success()));
    let r = request(http, "DELETE", "/api/v1/clients/close-98", Some(TOKEN));
    assert_eq!(r.status, 200, "{}", r.body);
    c.read_to_end()
        .await
        .assert_reason(ReasonCode::ADMINISTRATIVE_ACTION, "0x98");
    let r = request(http, "GET", "/metrics", None);
    let m = common::prom::parse(&r.body).expect("exposition");
    let lingered = m.value("tern_close_lingers_total", &[("outcome", "lingered")]);
    assert!(lingered >= Some(1.0), "{lingered:?}");
    assert_eq!(
        m.value("tern_close_lingers_total", &[("outcome", "over_limit")]),
        Some(0.0)
    );
}

/// `max_connections = 1`: the next client gets CONNACK 0x97 (Quota exceeded; v5 MQTT-3.2.2-8:
/// then the close) or 3.1.1 return code 3 (MQTT-3.2.2-5), read while it keeps writing.
#[tokio::test]
async fn quota_exceeded_0x97_and_311_code_3_are_read_by_a_client_that_keeps_writing() {
    let mut checks = Vec::new();
    let b = Broker::start_with("[limits]\nmax_connections = 1\n");
    let _only = RawClient::v5(b.addr, "close-only").await;
    let first = encoded(&[v5_connect("close-97")], Protocol::V5);
    let ending = chatty_to_end(&b, Protocol::V5, &first).await;
    checks.push(ending.check(ReasonCode::QUOTA_EXCEEDED, "v5 0x97"));
    let ending = chatty_to_end(
        &b,
        Protocol::V3_1_1,
        &connect_bytes(4, 0x02, 0, "close-rc3", &[]),
    )
    .await;
    checks.push(ending.check(ReasonCode::SERVER_UNAVAILABLE, "3.1.1 return code 3"));
    assert_all(&checks);
}

/// (v5) MQTT-3.1.4-2, MQTT-3.2.2-8 / (3.1.1) MQTT-3.1.4-2, MQTT-3.2.2-5: refused credentials
/// (CONNACK 0x86 / return code 4) and no credentials where they are required (0x87 / 5), read
/// by a client that keeps writing.
#[tokio::test]
async fn bad_credentials_and_not_authorized_are_read_by_a_client_that_keeps_writing() {
    let mut checks = Vec::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("passwd");
    let p = path.to_str().expect("utf-8 path");
    let done = common::run_to_exit(&["passwd", "-c", "-b", p, "carol", "pw3"], dir.path(), WAIT);
    assert!(done.status.success(), "tern passwd: {}", done.stderr);
    let b = Broker::start_with(&format!(
        "[auth]\nallow_anonymous = false\npassword_file = \"{p}\"\n"
    ));
    let mut wrong = connect_packet(Protocol::V5, "close-86", true, 0);
    wrong.username = Some(s("carol"));
    wrong.password = Some(bytes::Bytes::from_static(b"wrong"));
    let first = encoded(&[Packet::Connect(Box::new(wrong.clone()))], Protocol::V5);
    let ending = chatty_to_end(&b, Protocol::V5, &first).await;
    checks.push(ending.check(ReasonCode::BAD_USER_NAME_OR_PASSWORD, "v5 0x86"));
    let anonymous = encoded(&[v5_connect("close-87")], Protocol::V5);
    let ending = chatty_to_end(&b, Protocol::V5, &anonymous).await;
    checks.push(ending.check(ReasonCode::NOT_AUTHORIZED, "v5 0x87"));

    wrong.protocol = Protocol::V3_1_1;
    let first = encoded(&[Packet::Connect(Box::new(wrong))], Protocol::V3_1_1);
    let ending = chatty_to_end(&b, Protocol::V3_1_1, &first).await;
    checks.push(ending.check(ReasonCode::BAD_USER_NAME_OR_PASSWORD, "3.1.1 return code 4"));
    let anonymous = connect_bytes(4, 0x02, 0, "close-rc5", &[]);
    let ending = chatty_to_end(&b, Protocol::V3_1_1, &anonymous).await;
    checks.push(ending.check(ReasonCode::NOT_AUTHORIZED, "3.1.1 return code 5"));
    assert_all(&checks);
}

/// (v5) §4.13, reason 0x8B: SIGTERM's DISCONNECT 0x8B is read by a client that keeps writing
/// (the shutdown waits for the lingering socket), and the broker exits 0.
#[tokio::test]
async fn server_shutting_down_0x8b_is_read_by_a_client_that_keeps_writing() {
    let mut b = Broker::start();
    let first = encoded(&[v5_connect("close-8b")], Protocol::V5);
    let mut c = Chatty::open(b.addr, Protocol::V5, &first).await;
    assert!(matches!(c.expect_packet().await, Packet::ConnAck(ca) if ca.reason.is_success()));
    b.signal(libc::SIGTERM);
    c.read_to_end()
        .await
        .assert_reason(ReasonCode::SERVER_SHUTTING_DOWN, "0x8B");
    let status = b.wait_exit(WAIT);
    assert_eq!(status.code(), Some(0), "exit status {status:?}");
}

/// The linger is of the socket only, after the close path ran: a client closed for a malformed
/// packet (0x81) that goes on writing and reads nothing keeps neither its session nor its will
/// waiting. While its socket still lingers (its writes still succeed), its will is published
/// (v5 MQTT-3.1.2-8: the will on a close without DISCONNECT 0x00) and a new connection under its
/// client id resumes its session (MQTT-3.1.4-3, MQTT-3.2.2-2: Session Present 1).
#[tokio::test]
async fn a_lingering_socket_holds_neither_its_session_nor_its_will() {
    let b = Broker::start();
    let mut watcher = RawClient::v5(b.addr, "close-watch").await;
    watcher.sub("close/will", 1).await;
    let mut connect = connect_packet(Protocol::V5, "close-linger", true, 0);
    connect.properties.session_expiry_interval_s = Some(60);
    connect.will = Some(Will {
        topic: s("close/will"),
        payload: bytes::Bytes::from_static(b"gone"),
        qos: qos(1),
        retain: false,
        properties: Properties::default(),
    });
    let mut first = encoded(&[Packet::Connect(Box::new(connect.clone()))], Protocol::V5);
    first.extend_from_slice(MALFORMED_PUBLISH);
    let lingering = Chatty::open(b.addr, Protocol::V5, &first).await;
    assert_eq!(&watcher.expect_publish().await.payload[..], b"gone");
    connect.clean_start = false;
    connect.will = None;
    let (_again, ca) = RawClient::connect_ok(b.addr, connect).await;
    assert!(
        ca.session_present,
        "the session was detached at the close, before the linger"
    );
    // Writes every CHATTER_INTERVAL: a closed socket would have failed one by now.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !lingering.write_failed(),
        "the socket still lingers while the will and the resumed session went ahead"
    );
    lingering
        .read_to_end()
        .await
        .assert_reason(ReasonCode::MALFORMED_PACKET, "0x81 after the linger");
}
