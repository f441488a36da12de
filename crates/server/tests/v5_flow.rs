//! MQTT 5 flow control: receive maximum both ways, the send quota of QoS 1 and QoS 2
//! exchanges, acknowledgements that end an exchange. Per-message features (topic aliases,
//! packet sizes, expiry, properties) are in v5_features.rs.

mod common;

use common::raw::*;
use common::{Broker, QUIET};

/// (v5) MQTT-3.3.4-7 (the client must not exceed the server's Receive Maximum) and §3.3.4: the
/// server answers an excess QoS>0 PUBLISH with DISCONNECT 0x93 (Receive Maximum exceeded).
/// QoS 2 messages count until PUBCOMP, so three PUBLISHes without PUBREL exceed a maximum of 2.
#[tokio::test]
async fn receive_maximum_exceeded_disconnect_0x93() {
    let b = Broker::start_with("[limits]\nreceive_maximum = 2\n");
    let (mut c, ca) = RawClient::connect_ok(b.addr, v5_connect("rm-x")).await;
    assert_eq!(ca.properties.receive_maximum, Some(2));
    for id in 1..=2u16 {
        c.send(&Packet::Publish(publish("rm/t", b"x", 2, id))).await;
        assert!(matches!(c.expect_packet().await, Packet::PubRec(a) if a.packet_id == id));
    }
    c.send(&Packet::Publish(publish("rm/t", b"x", 2, 3))).await;
    assert_eq!(
        c.expect_disconnect().await,
        ReasonCode::RECEIVE_MAXIMUM_EXCEEDED
    );
}

/// Within the Receive Maximum, completing an exchange frees a slot (no disconnect).
#[tokio::test]
async fn receive_maximum_slot_is_freed_by_pubcomp() {
    let b = Broker::start_with("[limits]\nreceive_maximum = 2\n");
    let (mut c, _) = RawClient::connect_ok(b.addr, v5_connect("rm-ok")).await;
    for round in 0..3u16 {
        let (a, bb) = (round * 2 + 1, round * 2 + 2);
        for id in [a, bb] {
            c.send(&Packet::Publish(publish("rm/t", b"x", 2, id))).await;
            assert!(matches!(c.expect_packet().await, Packet::PubRec(r) if r.packet_id == id));
        }
        for id in [a, bb] {
            c.send(&Packet::PubRel(ack(id))).await;
            assert!(matches!(c.expect_packet().await, Packet::PubComp(r) if r.packet_id == id));
        }
    }
    // QoS 0 never counts.
    for _ in 0..5 {
        c.send(&Packet::Publish(publish("rm/t", b"x", 0, 0))).await;
    }
    assert!(c.ping().await.is_empty());
}

/// Receive Maximum of the small-window tests below.
const RM: u16 = 4;
const RM_CONFIG: &str = "[limits]\nreceive_maximum = 4\n";

fn publishes(level: u8, ids: std::ops::RangeInclusive<u16>) -> Vec<Packet> {
    ids.map(|id| Packet::Publish(publish("rm/t", b"x", level, id)))
        .collect()
}

fn pubrels(ids: std::ops::RangeInclusive<u16>) -> Vec<Packet> {
    ids.map(|id| Packet::PubRel(ack(id))).collect()
}

/// Which acknowledgement [`expect_acks`] waits for.
#[derive(Debug, Clone, Copy)]
enum AckOf {
    Puback,
    Pubrec,
    Pubcomp,
}

/// Reads one successful acknowledgement of `kind` per id, in order (acks leave in packet order).
async fn expect_acks(c: &mut RawClient, kind: AckOf, ids: std::ops::RangeInclusive<u16>) {
    for id in ids {
        let p = c.expect_packet().await;
        let ok = match (&p, kind) {
            (Packet::PubAck(a), AckOf::Puback)
            | (Packet::PubRec(a), AckOf::Pubrec)
            | (Packet::PubComp(a), AckOf::Pubcomp) => a.packet_id == id && a.reason.is_success(),
            _ => false,
        };
        assert!(ok, "expected {kind:?} {id}, got {}", brief(&p));
    }
}

/// A small-window connection: asserts the CONNACK's Receive Maximum.
async fn rm_client(b: &Broker, id: &str, maximum: u16) -> RawClient {
    let (c, ca) = RawClient::connect_ok(b.addr, v5_connect(id)).await;
    assert_eq!(ca.properties.receive_maximum, Some(maximum));
    c
}

/// (v5) MQTT-3.3.4-9, §4.9: a QoS 1 exchange counts from its PUBLISH until its PUBACK is sent.
/// Exactly Receive Maximum QoS 1 PUBLISHes sent at once, without waiting, are all accepted;
/// acknowledged, their slots serve again.
#[tokio::test]
async fn receive_maximum_qos1_exactly_at_the_limit_is_accepted() {
    let b = Broker::start_with(RM_CONFIG);
    let mut c = rm_client(&b, "rm1-ok", RM).await;
    for round in 0..3u16 {
        let ids = round * RM + 1..=round * RM + RM;
        c.send_all(&publishes(1, ids.clone())).await;
        expect_acks(&mut c, AckOf::Puback, ids).await;
    }
    assert!(c.ping().await.is_empty());
}

/// (v5) MQTT-3.3.4-9, §3.3.4: Receive Maximum + 1 QoS 1 PUBLISHes sent at once: the last one
/// exceeds it (none is acknowledged yet when it is read), DISCONNECT 0x93. The broker must not
/// stop reading at the limit and then take the extra PUBLISH once the first are acknowledged.
#[tokio::test]
async fn receive_maximum_qos1_one_over_the_limit_disconnect_0x93() {
    let b = Broker::start_with(RM_CONFIG);
    let mut c = rm_client(&b, "rm1-over", RM).await;
    c.send_all(&publishes(1, 1..=RM + 1)).await;
    assert_eq!(
        c.expect_disconnect().await,
        ReasonCode::RECEIVE_MAXIMUM_EXCEEDED
    );
}

/// (v5) MQTT-3.3.4-9, §4.9: a QoS 2 exchange counts once, from its PUBLISH until its PUBCOMP
/// is sent (not once in flight and once more awaiting PUBREL). Exactly Receive Maximum QoS 2
/// PUBLISHes sent at once (PUBRECs outstanding) are accepted.
#[tokio::test]
async fn receive_maximum_qos2_exactly_at_the_limit_with_pubrecs_outstanding() {
    let b = Broker::start_with(RM_CONFIG);
    let mut c = rm_client(&b, "rm2-ok", RM).await;
    for round in 0..3u16 {
        let ids = round * RM + 1..=round * RM + RM;
        c.send_all(&publishes(2, ids.clone())).await;
        expect_acks(&mut c, AckOf::Pubrec, ids.clone()).await;
        c.send_all(&pubrels(ids.clone())).await;
        expect_acks(&mut c, AckOf::Pubcomp, ids).await;
    }
    assert!(c.ping().await.is_empty());
}

/// (v5) MQTT-3.3.4-9, §3.3.4: Receive Maximum + 1 QoS 2 PUBLISHes sent at once: DISCONNECT 0x93.
#[tokio::test]
async fn receive_maximum_qos2_one_over_the_limit_with_pubrecs_outstanding_0x93() {
    let b = Broker::start_with(RM_CONFIG);
    let mut c = rm_client(&b, "rm2-over", RM).await;
    c.send_all(&publishes(2, 1..=RM + 1)).await;
    assert_eq!(
        c.expect_disconnect().await,
        ReasonCode::RECEIVE_MAXIMUM_EXCEEDED
    );
}

/// (v5) MQTT-3.3.4-9, §4.9: after the PUBRECs, exchanges whose PUBREL is not sent yet still
/// count: Receive Maximum of them is fine, one more PUBLISH is DISCONNECT 0x93.
#[tokio::test]
async fn receive_maximum_qos2_with_pubrels_not_yet_sent() {
    let b = Broker::start_with(RM_CONFIG);
    let mut c = rm_client(&b, "rm2-rel", RM).await;
    for id in 1..=RM {
        c.send(&Packet::Publish(publish("rm/t", b"x", 2, id))).await;
        expect_acks(&mut c, AckOf::Pubrec, id..=id).await;
    }
    assert!(
        c.ping().await.is_empty(),
        "exactly Receive Maximum in flight"
    );
    c.send(&Packet::Publish(publish("rm/t", b"x", 2, RM + 1)))
        .await;
    assert_eq!(
        c.expect_disconnect().await,
        ReasonCode::RECEIVE_MAXIMUM_EXCEEDED
    );
}

/// (v5) MQTT-3.3.4-9, MQTT-4.3.3-10: a retried QoS 2 PUBLISH of a packet id in flight is the
/// same exchange and counts once, at the limit too; a new packet id beyond it is 0x93.
#[tokio::test]
async fn receive_maximum_retried_qos2_publish_counts_once() {
    let b = Broker::start_with(RM_CONFIG);
    let mut c = rm_client(&b, "rm2-dup", RM).await;
    let mut retry = publish("rm/t", b"x", 2, 2);
    retry.dup = true;
    let mut burst = publishes(2, 1..=RM);
    burst.push(Packet::Publish(retry.clone()));
    c.send_all(&burst).await;
    expect_acks(&mut c, AckOf::Pubrec, 1..=RM).await;
    expect_acks(&mut c, AckOf::Pubrec, 2..=2).await;
    // Again once its PUBREC is out (awaiting PUBREL).
    c.send(&Packet::Publish(retry)).await;
    expect_acks(&mut c, AckOf::Pubrec, 2..=2).await;
    assert!(c.ping().await.is_empty());
    c.send(&Packet::Publish(publish("rm/t", b"x", 2, RM + 1)))
        .await;
    assert_eq!(
        c.expect_disconnect().await,
        ReasonCode::RECEIVE_MAXIMUM_EXCEEDED
    );
}

/// (v5) MQTT-3.3.4-9, §4.9: the send quota starts afresh on every connection (it is not part of
/// the session): QoS 2 exchanges left from the previous connection, still awaiting PUBREL, do
/// not reduce the new connection's Receive Maximum.
#[tokio::test]
async fn receive_maximum_starts_afresh_on_a_resumed_session() {
    let b = Broker::start_with("[limits]\nreceive_maximum = 2\n");
    let mut connect = v5_connect("rm-resume");
    connect.properties.session_expiry_interval_s = Some(60);
    let (mut c, _) = RawClient::connect_ok(b.addr, connect.clone()).await;
    c.send_all(&publishes(2, 1..=2)).await;
    expect_acks(&mut c, AckOf::Pubrec, 1..=2).await;
    c.disconnect().await;
    connect.clean_start = false;
    let (mut c, ca) = RawClient::connect_ok(b.addr, connect).await;
    assert!(ca.session_present);
    c.send_all(&publishes(2, 3..=4)).await;
    expect_acks(&mut c, AckOf::Pubrec, 3..=4).await;
    c.send_all(&pubrels(1..=4)).await;
    expect_acks(&mut c, AckOf::Pubcomp, 1..=4).await;
    assert!(c.ping().await.is_empty());
}

/// (v5) MQTT-3.3.4-9 at the default Receive Maximum (1024): that many QoS 2 PUBLISHes sent
/// without waiting are all accepted (none has its PUBREL yet), the next one is 0x93.
#[tokio::test]
async fn receive_maximum_default_qos2_window_is_usable_to_the_limit() {
    let b = Broker::start();
    let maximum = 1024;
    let mut c = rm_client(&b, "rm-default", maximum).await;
    c.send_all(&publishes(2, 1..=maximum)).await;
    expect_acks(&mut c, AckOf::Pubrec, 1..=maximum).await;
    assert!(c.ping().await.is_empty());
    c.send(&Packet::Publish(publish("rm/t", b"x", 2, maximum + 1)))
        .await;
    assert_eq!(
        c.expect_disconnect().await,
        ReasonCode::RECEIVE_MAXIMUM_EXCEEDED
    );
}

/// (v5) MQTT-3.3.4-9, MQTT-4.9.0-2: the server sends no more than the client's Receive Maximum
/// (2) unacknowledged QoS>0 PUBLISHes; acknowledging one releases the next. MQTT-3.3.4-10 /
/// MQTT-4.9.0-3: other packets (PINGRESP) are not held back.
#[tokio::test]
async fn server_respects_client_receive_maximum() {
    let b = Broker::start();
    let mut c = v5_connect("crm-s");
    c.properties.receive_maximum = Some(2);
    let (mut s, _) = RawClient::connect_ok(b.addr, c).await;
    s.sub("crm/t", 1).await;
    let mut p = RawClient::v5(b.addr, "crm-p").await;
    for i in 1..=5u16 {
        p.publish_acked(publish("crm/t", format!("{i}").as_bytes(), 1, i))
            .await;
    }
    let first = s.expect_publish().await;
    let second = s.expect_publish().await;
    assert_eq!(
        (&first.payload[..], &second.payload[..]),
        (&b"1"[..], &b"2"[..])
    );
    // Window full: no third PUBLISH, but PINGRESP still comes.
    assert!(
        s.ping().await.is_empty(),
        "more than Receive Maximum in flight"
    );
    s.expect_nothing(QUIET).await;
    s.send(&Packet::PubAck(ack(first.packet_id))).await;
    let third = s.expect_publish().await;
    assert_eq!(&third.payload[..], b"3");
    s.expect_nothing(QUIET).await;
    s.send(&Packet::PubAck(ack(second.packet_id))).await;
    s.send(&Packet::PubAck(ack(third.packet_id))).await;
    assert_eq!(&s.receive_acked().await.payload[..], b"4");
    assert_eq!(&s.receive_acked().await.payload[..], b"5");
}

/// (v5) MQTT-4.9.0-2 with §4.9 (the send quota comes back on PUBACK, PUBCOMP, or a PUBREC with
/// a reason ≥ 0x80): with a client Receive Maximum of 1, a successful PUBREC does not free the
/// slot — the next PUBLISH waits for the PUBCOMP.
#[tokio::test]
async fn qos2_slot_is_freed_by_pubcomp_not_pubrec() {
    let b = Broker::start();
    let mut c = v5_connect("q2w-s");
    c.properties.receive_maximum = Some(1);
    let (mut s, _) = RawClient::connect_ok(b.addr, c).await;
    s.sub("q2w/t", 2).await;
    let mut p = RawClient::v5(b.addr, "q2w-p").await;
    p.publish_acked(publish("q2w/t", b"1", 2, 1)).await;
    p.publish_acked(publish("q2w/t", b"2", 2, 2)).await;
    let first = s.expect_publish().await;
    assert_eq!(&first.payload[..], b"1");
    s.send(&Packet::PubRec(ack(first.packet_id))).await;
    match s.expect_packet().await {
        Packet::PubRel(a) => assert_eq!(a.packet_id, first.packet_id),
        other => panic!("expected PUBREL, got {}", brief(&other)),
    }
    s.expect_nothing(QUIET).await;
    s.send(&Packet::PubComp(ack(first.packet_id))).await;
    assert_eq!(&s.receive_acked().await.payload[..], b"2");
}

/// (v5) MQTT-4.4.0-2: a PUBACK with a reason ≥ 0x80 acknowledges the message: it is not
/// retransmitted (not even after a reconnect) and its slot is free again.
#[tokio::test]
async fn puback_with_error_reason_is_final() {
    let b = Broker::start();
    let mut c = v5_connect("pae-s");
    c.properties.receive_maximum = Some(1);
    c.properties.session_expiry_interval_s = Some(60);
    let (mut s, _) = RawClient::connect_ok(b.addr, c.clone()).await;
    s.sub("pae/t", 1).await;
    let mut p = RawClient::v5(b.addr, "pae-p").await;
    p.publish_acked(publish("pae/t", b"refused", 1, 1)).await;
    p.publish_acked(publish("pae/t", b"next", 1, 2)).await;
    let m = s.expect_publish().await;
    assert_eq!(&m.payload[..], b"refused");
    s.send(&Packet::PubAck(Ack {
        packet_id: m.packet_id,
        reason: ReasonCode::IMPLEMENTATION_SPECIFIC_ERROR,
        properties: Properties::default(),
    }))
    .await;
    let n = s.expect_publish().await;
    assert_eq!(&n.payload[..], b"next", "slot freed by the error PUBACK");
    s.drop_connection().await;
    c.clean_start = false;
    let (mut s, _) = RawClient::connect_ok(b.addr, c).await;
    let again = s.receive_acked().await;
    assert_eq!(
        &again.payload[..],
        b"next",
        "only the unacknowledged message is resent"
    );
    assert!(s.ping().await.is_empty());
}

/// (v5) MQTT-4.3.3-11: a PUBREL for a packet id the server never saw still gets PUBCOMP, with
/// reason 0x92 (Packet Identifier not found).
#[tokio::test]
async fn pubrel_for_unknown_packet_id_gets_pubcomp_0x92() {
    let b = Broker::start();
    let mut c = RawClient::v5(b.addr, "unkrel").await;
    c.send(&Packet::PubRel(ack(4242))).await;
    match c.expect_packet().await {
        Packet::PubComp(a) => assert_eq!(
            (a.packet_id, a.reason),
            (4242, ReasonCode::PACKET_IDENTIFIER_NOT_FOUND)
        ),
        other => panic!("expected PUBCOMP, got {}", brief(&other)),
    }
}
