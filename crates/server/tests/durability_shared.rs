//! Shared subscriptions are durable (issue 11 item 5, MQTT 5 §4.8.2): a group's queue belongs
//! to the group. With no member online, messages wait for the group (while any member's
//! session exists) and survive kill -9; a member that leaves hands what it had in flight to
//! an online member, or back to the group.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::Broker;
use common::raw::*;

fn persistent(id: &str, clean_start: bool) -> Connect {
    let mut c = connect_packet(Protocol::V5, id, clean_start, 0);
    c.properties.session_expiry_interval_s = Some(3600);
    c
}

fn numbered(topic: &str, n: usize, packet_id: u16) -> Publish {
    publish(topic, n.to_string().as_bytes(), 1, packet_id)
}

fn number(p: &Publish) -> usize {
    std::str::from_utf8(&p.payload).unwrap().parse().unwrap()
}

/// Receives (and acknowledges) PUBLISHes until `n` distinct numbers arrived, bounded by
/// [`common::WAIT`] per message; panics with what it got otherwise.
async fn collect(c: &mut RawClient, n: usize) -> BTreeSet<usize> {
    let mut got = BTreeSet::new();
    while got.len() < n {
        match c.recv(common::WAIT).await {
            Recv::Packet(Packet::Publish(m)) => {
                if m.qos == QoS::AtLeastOnce {
                    c.send(&Packet::PubAck(ack(m.packet_id))).await;
                }
                got.insert(number(&m));
            }
            Recv::Packet(other) => panic!("unexpected {}", brief(&other)),
            _ => panic!("got {} of {n}: {got:?}", got.len()),
        }
    }
    got
}

/// Reads (without acknowledging) every PUBLISH the broker sent before a ping round trip.
async fn read_unacked(c: &mut RawClient) -> BTreeSet<usize> {
    let mut got = BTreeSet::new();
    loop {
        let before = c.ping().await;
        if before.is_empty() {
            return got;
        }
        for p in before {
            if let Packet::Publish(m) = p {
                got.insert(number(&m));
            }
        }
    }
}

/// The user's report: 200 QoS 1 messages PUBACKed while the only member of `$share/g/jobs/#`
/// (v5, session expiry 3600) was offline, kill -9, restart: the member reconnects (session
/// present) and gets all 200.
#[tokio::test]
async fn queued_for_offline_sole_member_survive_kill() {
    let mut b = Broker::start();
    let (mut m, _) = RawClient::connect_ok(b.addr, persistent("dsh-m", true)).await;
    m.sub("$share/g/jobs/#", 1).await;
    m.disconnect().await;
    let mut p = RawClient::v5(b.addr, "dsh-p").await;
    for i in 0..200 {
        p.publish_acked(numbered("jobs/x", i, (i + 1) as u16)).await;
    }
    b.restart_after_kill();
    let (mut m, ca) = RawClient::connect_ok(b.addr, persistent("dsh-m", false)).await;
    assert!(ca.session_present);
    let got = collect(&mut m, 200).await;
    assert_eq!(got, (0..200).collect::<BTreeSet<_>>());
}

/// Messages a sole member had in flight (unacknowledged) when the broker was killed reach it
/// after the restart; messages it acknowledged (and the group's cursor passed) do not come
/// back.
#[tokio::test]
async fn in_flight_to_sole_member_survive_kill_and_acked_are_not_replayed() {
    let mut b = Broker::start();
    let (mut m, _) = RawClient::connect_ok(b.addr, persistent("dsi-m", true)).await;
    m.sub("$share/g/dsi/#", 1).await;
    let mut p = RawClient::v5(b.addr, "dsi-p").await;
    for i in 0..10 {
        p.publish_acked(numbered("dsi/t", i, (i + 1) as u16)).await;
    }
    // Acknowledge the first 10.
    assert_eq!(collect(&mut m, 10).await.len(), 10);
    // Let a checkpoint pass them.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in 10..20 {
        p.publish_acked(numbered("dsi/t", i, (i + 1) as u16)).await;
    }
    let unacked = read_unacked(&mut m).await;
    assert_eq!(unacked, (10..20).collect::<BTreeSet<_>>());
    b.restart_after_kill();
    let (mut m, ca) = RawClient::connect_ok(b.addr, persistent("dsi-m", false)).await;
    assert!(ca.session_present);
    let got = collect(&mut m, 10).await;
    assert_eq!(
        got,
        (10..20).collect::<BTreeSet<_>>(),
        "acked ones replayed"
    );
    assert!(
        m.ping().await.is_empty(),
        "more than the unacked ones came back"
    );
}

/// A sole member that leaves with messages in flight (its session persists): they are not
/// dropped but wait for the group and arrive when it comes back.
#[tokio::test]
async fn sole_member_leaving_keeps_its_in_flight_for_the_group() {
    let b = Broker::start();
    let (mut m, _) = RawClient::connect_ok(b.addr, persistent("dsl-m", true)).await;
    m.sub("$share/g/dsl/#", 1).await;
    let mut p = RawClient::v5(b.addr, "dsl-p").await;
    for i in 0..10 {
        p.publish_acked(numbered("dsl/t", i, (i + 1) as u16)).await;
    }
    assert_eq!(read_unacked(&mut m).await.len(), 10);
    m.drop_connection().await;
    // Queued while it is away too.
    for i in 10..20 {
        p.publish_acked(numbered("dsl/t", i, (i + 1) as u16)).await;
    }
    let (mut m, ca) = RawClient::connect_ok(b.addr, persistent("dsl-m", false)).await;
    assert!(ca.session_present);
    let got = collect(&mut m, 20).await;
    assert_eq!(got, (0..20).collect::<BTreeSet<_>>());
}

/// A sole member that leaves cleanly (DISCONNECT, session persists): messages queue for the
/// group and arrive when it comes back.
#[tokio::test]
async fn sole_member_leaving_cleanly_gets_the_group_queue_back() {
    let b = Broker::start();
    let (mut m, _) = RawClient::connect_ok(b.addr, persistent("dsc-m", true)).await;
    m.sub("$share/g/dsc/#", 1).await;
    m.disconnect().await;
    let mut p = RawClient::v5(b.addr, "dsc-p").await;
    for i in 0..20 {
        p.publish_acked(numbered("dsc/t", i, (i + 1) as u16)).await;
    }
    let (mut m, ca) = RawClient::connect_ok(b.addr, persistent("dsc-m", false)).await;
    assert!(ca.session_present);
    assert_eq!(collect(&mut m, 20).await, (0..20).collect::<BTreeSet<_>>());
}

/// A member leaving (session persists) with messages in flight while another member is online:
/// the other gets them.
#[tokio::test]
async fn in_flight_of_a_leaving_member_go_to_the_online_one() {
    let b = Broker::start();
    let (mut leaver, _) = RawClient::connect_ok(b.addr, persistent("dso-l", true)).await;
    leaver.sub("$share/g/dso/#", 1).await;
    let (mut stayer, _) = RawClient::connect_ok(b.addr, persistent("dso-s", true)).await;
    stayer.sub("$share/g/dso/#", 1).await;
    let mut p = RawClient::v5(b.addr, "dso-p").await;
    for i in 0..20 {
        p.publish_acked(numbered("dso/t", i, (i + 1) as u16)).await;
    }
    let left = read_unacked(&mut leaver).await;
    assert!(!left.is_empty(), "round robin gave the leaver nothing");
    leaver.drop_connection().await;
    assert_eq!(
        collect(&mut stayer, 20).await,
        (0..20).collect::<BTreeSet<_>>()
    );
}

/// Two members, one offline: every message goes to the online one, nothing waits for the
/// offline one.
#[tokio::test]
async fn with_one_member_offline_all_go_to_the_online_one() {
    let b = Broker::start();
    let (mut away, _) = RawClient::connect_ok(b.addr, persistent("dsa-away", true)).await;
    away.sub("$share/g/dsa/#", 1).await;
    away.disconnect().await;
    let (mut on, _) = RawClient::connect_ok(b.addr, persistent("dsa-on", true)).await;
    on.sub("$share/g/dsa/#", 1).await;
    let mut p = RawClient::v5(b.addr, "dsa-p").await;
    for i in 0..20 {
        p.publish_acked(numbered("dsa/t", i, (i + 1) as u16)).await;
    }
    assert_eq!(collect(&mut on, 20).await, (0..20).collect::<BTreeSet<_>>());
    let (mut away, ca) = RawClient::connect_ok(b.addr, persistent("dsa-away", false)).await;
    assert!(ca.session_present);
    assert!(away.ping().await.is_empty(), "the offline member got some");
}

/// Exactly once for QoS 2 through a group across kill -9: what the member completed is not
/// replayed to the group, what it PUBRECed comes back as PUBREL only, and what it received but
/// did not answer is resent under the same packet id (DUP) — nothing else arrives.
#[tokio::test]
async fn qos2_through_a_group_is_exactly_once_across_kill() {
    let mut b = Broker::start();
    let (mut m, _) = RawClient::connect_ok(b.addr, persistent("dsq-m", true)).await;
    m.sub("$share/g/dsq/#", 2).await;
    let mut p = RawClient::v5(b.addr, "dsq-p").await;
    for i in 0..10u16 {
        p.publish_acked(publish("dsq/t", i.to_string().as_bytes(), 2, i + 1))
            .await;
    }
    let mut got = Vec::new();
    while got.len() < 10 {
        match m.expect_packet().await {
            Packet::Publish(x) => got.push(x),
            other => panic!("unexpected {}", brief(&other)),
        }
    }
    // Complete 5, PUBREC 3 (PUBREL pending), leave 2 unanswered.
    for x in &got[..5] {
        m.send(&Packet::PubRec(ack(x.packet_id))).await;
        match m.expect_packet().await {
            Packet::PubRel(a) if a.packet_id == x.packet_id => {}
            other => panic!("expected PUBREL, got {}", brief(&other)),
        }
        m.send(&Packet::PubComp(ack(x.packet_id))).await;
    }
    let mut pubrel_ids = BTreeSet::new();
    for x in &got[5..8] {
        m.send(&Packet::PubRec(ack(x.packet_id))).await;
        match m.expect_packet().await {
            Packet::PubRel(a) if a.packet_id == x.packet_id => pubrel_ids.insert(a.packet_id),
            other => panic!("expected PUBREL, got {}", brief(&other)),
        };
    }
    assert!(m.ping().await.is_empty());
    let unanswered: BTreeSet<(u16, Vec<u8>)> = got[8..]
        .iter()
        .map(|x| (x.packet_id, x.payload.to_vec()))
        .collect();
    // Once with the crash before any checkpoint would do as well; here the cursors moved.
    tokio::time::sleep(Duration::from_millis(300)).await;
    b.restart_after_kill();
    let (mut m, ca) = RawClient::connect_ok(b.addr, persistent("dsq-m", false)).await;
    assert!(ca.session_present);
    let (mut pubrels, mut publishes) = (BTreeSet::new(), BTreeSet::new());
    while pubrels.len() + publishes.len() < 5 {
        match m.expect_packet().await {
            Packet::PubRel(a) => assert!(pubrels.insert(a.packet_id)),
            Packet::Publish(x) => {
                assert!(x.dup, "a resend carries DUP");
                assert!(publishes.insert((x.packet_id, x.payload.to_vec())));
            }
            other => panic!("unexpected {}", brief(&other)),
        }
    }
    assert_eq!(pubrels, pubrel_ids);
    assert_eq!(publishes, unanswered);
    assert!(
        m.ping().await.is_empty(),
        "completed messages were replayed"
    );
}

/// Exactly once for QoS 2 when the group's cursor lags a member's: member B completes a
/// message while member A still holds an earlier one unanswered; after kill -9 the group does
/// not replay B's completed message (B's completion marker is kept until the group's cursor
/// passes it), and A gets its own back under the same packet id.
#[tokio::test]
async fn qos2_completed_by_one_member_is_not_replayed_while_another_holds_an_earlier_one() {
    let mut b = Broker::start();
    let (mut a, _) = RawClient::connect_ok(b.addr, persistent("dsx-a", true)).await;
    a.sub("$share/g/dsx/#", 2).await;
    let (mut bm, _) = RawClient::connect_ok(b.addr, persistent("dsx-b", true)).await;
    bm.sub("$share/g/dsx/#", 2).await;
    let mut p = RawClient::v5(b.addr, "dsx-p").await;
    p.publish_acked(publish("dsx/t", b"first", 2, 1)).await;
    p.publish_acked(publish("dsx/t", b"second", 2, 2)).await;
    // Round robin in subscription order: A gets the first, B the second.
    let held = a.expect_publish().await;
    assert_eq!(&held.payload[..], b"first");
    assert_eq!(&bm.receive_acked().await.payload[..], b"second");
    assert!(bm.ping().await.is_empty());
    tokio::time::sleep(Duration::from_millis(300)).await;
    b.restart_after_kill();
    let (mut bm, ca) = RawClient::connect_ok(b.addr, persistent("dsx-b", false)).await;
    assert!(ca.session_present);
    let (mut a, ca) = RawClient::connect_ok(b.addr, persistent("dsx-a", false)).await;
    assert!(ca.session_present);
    let again = a.expect_publish().await;
    assert_eq!(
        (again.packet_id, &again.payload[..]),
        (held.packet_id, &b"first"[..])
    );
    assert!(again.dup);
    assert!(a.ping().await.is_empty(), "A got more");
    assert!(
        bm.ping().await.is_empty(),
        "B's completed message was replayed"
    );
}
