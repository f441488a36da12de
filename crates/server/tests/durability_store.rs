//! The durable store under the broker (issue "a durable broker"): ordering across durability
//! policies, retained messages across restarts, and a damaged data dir.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::Broker;
use common::raw::*;

fn numbered(topic: &str, n: usize, qos_level: u8, packet_id: u16) -> Publish {
    let mut p = publish(topic, b"", qos_level, packet_id);
    p.payload = bytes::Bytes::from(n.to_string());
    p
}

/// ARCHITECTURE §4.3: QoS 0, 1 and 2 interleaved from one publisher on one topic arrive in
/// publish order, on a stream with durability `always` (every message written) and on one
/// with `default` (QoS 0 not written, so its entries wait for nothing but their turn).
#[tokio::test]
async fn mixed_qos_and_durability_keep_publish_order() {
    let b = Broker::start_with(
        "[[stream]]\nname = \"all\"\nfilters = [\"mix/always/#\"]\ndurability = \"always\"\n\
         [[stream]]\nname = \"rest\"\n",
    );
    let mut sub = RawClient::v5(b.addr, "mix-sub").await;
    sub.sub("mix/#", 2).await;
    let mut p = RawClient::v5(b.addr, "mix-pub").await;
    const N: usize = 150;
    for (t, topic) in ["mix/always/t", "mix/default/t"].iter().enumerate() {
        for i in 0..N {
            let qos = (i % 3) as u8;
            let packet_id = if qos == 0 { 0 } else { (t * N + i + 1) as u16 };
            p.send(&Packet::Publish(numbered(topic, i, qos, packet_id)))
                .await;
        }
    }
    // Every publish is acknowledged in packet order (PUBREC answered with PUBREL).
    let mut acks = Vec::new();
    while acks.len() < 2 * (N - N / 3) {
        match p.expect_packet().await {
            Packet::PubAck(a) => acks.push(a.packet_id),
            Packet::PubRec(a) => {
                acks.push(a.packet_id);
                p.send(&Packet::PubRel(ack(a.packet_id))).await;
            }
            Packet::PubComp(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    let expected: Vec<u16> = (0..2)
        .flat_map(|t| {
            (0..N)
                .filter(|i| i % 3 != 0)
                .map(move |i| (t * N + i + 1) as u16)
        })
        .collect();
    assert_eq!(acks, expected, "acknowledgements in packet order");
    let mut got: Vec<(String, usize)> = Vec::new();
    while got.len() < 2 * N {
        match sub.expect_packet().await {
            Packet::Publish(m) => {
                match m.qos {
                    QoS::AtMostOnce => {}
                    QoS::AtLeastOnce => sub.send(&Packet::PubAck(ack(m.packet_id))).await,
                    QoS::ExactlyOnce => sub.send(&Packet::PubRec(ack(m.packet_id))).await,
                }
                got.push((
                    m.topic.to_string(),
                    std::str::from_utf8(&m.payload).unwrap().parse().unwrap(),
                ));
            }
            Packet::PubRel(a) => sub.send(&Packet::PubComp(ack(a.packet_id))).await,
            other => panic!("unexpected {other:?}"),
        }
    }
    for topic in ["mix/always/t", "mix/default/t"] {
        let order: Vec<usize> = got
            .iter()
            .filter(|(t, _)| t == topic)
            .map(|(_, n)| *n)
            .collect();
        assert_eq!(order, (0..N).collect::<Vec<_>>(), "{topic}: publish order");
    }
}

/// Retained messages survive a kill -9, and so does clearing one (an empty retained PUBLISH).
#[tokio::test]
async fn retained_set_and_cleared_survive_kill() {
    let mut b = Broker::start();
    let mut p = RawClient::v4(b.addr, "ret-pub").await;
    for (topic, payload, id) in [
        ("ret/a", &b"a"[..], 1),
        ("ret/b", &b"b"[..], 2),
        ("ret/a", &b""[..], 3),
    ] {
        let mut m = publish(topic, b"", 1, id);
        m.payload = bytes::Bytes::copy_from_slice(payload);
        m.retain = true;
        p.publish_acked(m).await;
    }
    // No pause: a retained PUBLISH's PUBACK waits for its retained record (issue 11 item 7).
    b.restart_after_kill();
    let mut s = RawClient::v4(b.addr, "ret-sub").await;
    s.sub("ret/#", 1).await;
    let m = s.receive_acked().await;
    assert_eq!((&*m.topic, &m.payload[..]), ("ret/b", &b"b"[..]));
    assert!(m.retain);
    s.expect_nothing(common::QUIET).await;
}

fn blocks(dir: PathBuf) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("stream dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "blk"))
        .collect();
    v.sort();
    v
}

/// A data dir with a flipped byte in a sealed block and a torn tail: the broker starts,
/// reports both in its log, and serves everything undamaged: the retained message, the
/// persistent session with its subscription and the messages outside the damage.
#[tokio::test]
async fn damaged_data_dir_is_reported_and_the_rest_served() {
    let mut b = Broker::start_with("[[stream]]\nname = \"messages\"\nblock_size_bytes = 4096\n");
    let mut s = RawClient::connect_ok(
        b.addr,
        connect_packet(Protocol::V3_1_1, "dmg-sub", false, 0),
    )
    .await
    .0;
    s.sub("dmg/t", 1).await;
    s.disconnect().await;
    let mut r = publish("dmg/retained", b"kept", 1, 1);
    r.retain = true;
    let mut p = RawClient::v4(b.addr, "dmg-pub").await;
    p.publish_acked(r).await;
    const N: usize = 300;
    for i in 0..N {
        let mut m = numbered("dmg/t", i, 1, (i % 60000 + 1) as u16);
        let mut padded = m.payload.to_vec();
        padded.resize(100, b' ');
        m.payload = padded.into();
        p.publish_acked(m).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    b.kill();

    let dir = b.data_dir().join("streams/messages");
    let blks = blocks(dir);
    assert!(blks.len() >= 4, "{blks:?}");
    let victim = &blks[1];
    let mut bytes = std::fs::read(victim).expect("read block");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x5a;
    std::fs::write(victim, bytes).expect("write block");
    let active = blks.last().expect("active block");
    // The active block is reserved to the block size: its records end where its zeros
    // start. Tear the last one: its last 7 bytes lost.
    let mut bytes = std::fs::read(active).expect("read active");
    let end = bytes.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
    bytes[end - 7..end].fill(0);
    std::fs::write(active, bytes).expect("write active");

    b.restart_after_kill();
    let (mut s, ca) = RawClient::connect_ok(
        b.addr,
        connect_packet(Protocol::V3_1_1, "dmg-sub", false, 0),
    )
    .await;
    assert!(ca.session_present, "the session survived");
    let mut got = Vec::new();
    loop {
        match s.recv(Duration::from_millis(500)).await {
            Recv::Packet(Packet::Publish(m)) => {
                s.send(&Packet::PubAck(ack(m.packet_id))).await;
                let n: usize = std::str::from_utf8(&m.payload)
                    .unwrap()
                    .trim()
                    .parse()
                    .unwrap();
                got.push(n);
            }
            Recv::Timeout => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    let log = b.log_tail(400);
    assert!(log.contains("torn tail truncated"), "{log}");
    assert!(
        log.contains("damaged records skipped") || log.contains("quarantined"),
        "{log}"
    );
    // Messages before and after the damaged block are there, in order; the torn last one
    // and the damaged block's are not.
    assert!(got.contains(&0), "{got:?}");
    assert!(got.contains(&(N - 2)), "{got:?}");
    assert!(!got.contains(&(N - 1)), "the torn record: {got:?}");
    assert!(got.len() < N - 1, "some records were in the damaged block");
    assert!(got.windows(2).all(|w| w[0] < w[1]), "{got:?}");
    // Still serving: the retained message and new publishes.
    s.sub("dmg/retained", 1).await;
    let m = s.receive_acked().await;
    assert_eq!(&m.payload[..], b"kept");
    let mut p = RawClient::v4(b.addr, "dmg-pub2").await;
    p.publish_acked(numbered("dmg/t", 1000, 1, 1)).await;
    let m = s.receive_acked().await;
    assert_eq!(&m.payload[..], b"1000");
}

/// Retention limits apply while the broker runs: with `max_msgs = 10`, an offline persistent
/// session that had 50 messages queued skips ahead over the removed range once and gets only
/// what the stream still holds, newest last, in order.
#[tokio::test]
async fn retention_limit_applies_while_running_and_sessions_skip_ahead() {
    let b = Broker::start_with("[[stream]]\nname = \"messages\"\nmax_msgs = 10\n");
    let connect = || connect_packet(Protocol::V3_1_1, "lim-sub", false, 0);
    let mut s = RawClient::connect_ok(b.addr, connect()).await.0;
    s.sub("lim/t", 1).await;
    s.disconnect().await;
    let mut p = RawClient::v4(b.addr, "lim-pub").await;
    const N: usize = 50;
    for i in 0..N {
        p.publish_acked(numbered("lim/t", i, 1, (i + 1) as u16))
            .await;
    }
    // The checkpoint task applies removed ranges every 25 ms.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut s = RawClient::connect_ok(b.addr, connect()).await.0;
    let mut got = Vec::new();
    let mut resent = Vec::new();
    while let Recv::Packet(Packet::Publish(m)) = s.recv(Duration::from_millis(500)).await {
        s.send(&Packet::PubAck(ack(m.packet_id))).await;
        let n = std::str::from_utf8(&m.payload)
            .unwrap()
            .parse::<usize>()
            .unwrap();
        // A message that was already in flight when the first connection went away must be
        // resent (DUP=1) whatever retention did since [MQTT-4.4.0-1]; it comes before the
        // queue. Only queued messages skip ahead.
        if m.dup && got.is_empty() {
            resent.push(n);
        } else {
            got.push(n);
        }
    }
    assert!(
        resent.len() <= 1,
        "at most the one message in flight at disconnect: {resent:?}"
    );
    assert!(!got.is_empty() && got.len() <= 10, "{got:?}");
    assert_eq!(got.last(), Some(&(N - 1)));
    assert!(got.windows(2).all(|w| w[0] < w[1]), "{got:?}");
    assert!(b.log_tail(200).contains("session skips ahead"));
}

/// Session expiry ends a persistent session for good: after it expired, a kill -9 and restart
/// bring nothing back (Session Present 0) [MQTT-3.1.2-23 with MQTT 5 session expiry].
#[tokio::test]
async fn an_expired_session_does_not_come_back_after_a_restart() {
    let mut b = Broker::start();
    let connect = |clean| {
        let mut c = connect_packet(Protocol::V5, "exp-sub", clean, 0);
        c.properties.session_expiry_interval_s = Some(1);
        c
    };
    let mut s = RawClient::connect_ok(b.addr, connect(true)).await.0;
    s.sub("exp/t", 1).await;
    s.drop_connection().await;
    tokio::time::sleep(Duration::from_millis(1800)).await;
    b.restart_after_kill();
    let (_s, ca) = RawClient::connect_ok(b.addr, connect(false)).await;
    assert!(!ca.session_present, "the expired session stayed gone");
}

/// `max_queued_messages` also bounds what a restart brings back for an offline session: the
/// newest are kept, in order, and the drop is logged with its count.
#[tokio::test]
async fn queued_messages_beyond_the_limit_are_dropped_oldest_first_across_a_restart() {
    let mut b = Broker::start_with("[limits]\nmax_queued_messages = 5\n");
    let connect = || connect_packet(Protocol::V3_1_1, "cap-sub", false, 0);
    let mut s = RawClient::connect_ok(b.addr, connect()).await.0;
    s.sub("cap/t", 1).await;
    s.disconnect().await;
    let mut p = RawClient::v4(b.addr, "cap-pub").await;
    for i in 0..20 {
        p.publish_acked(numbered("cap/t", i, 1, (i + 1) as u16))
            .await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    b.restart_after_kill();
    let mut s = RawClient::connect_ok(b.addr, connect()).await.0;
    let mut got = Vec::new();
    while let Recv::Packet(Packet::Publish(m)) = s.recv(Duration::from_millis(500)).await {
        s.send(&Packet::PubAck(ack(m.packet_id))).await;
        got.push(
            std::str::from_utf8(&m.payload)
                .unwrap()
                .parse::<usize>()
                .unwrap(),
        );
    }
    assert_eq!(got, vec![15, 16, 17, 18, 19]);
    assert!(b.log_tail(200).contains("dropped"), "{}", b.log_tail(50));
}

/// A session's expiry keeps running while the broker is down: a session that lost its
/// connection and whose interval passed before the restart does not come back.
#[tokio::test]
async fn session_expiry_counts_the_time_the_broker_was_down() {
    let mut b = Broker::start();
    let connect = |clean| {
        let mut c = connect_packet(Protocol::V5, "down-sub", clean, 0);
        c.properties.session_expiry_interval_s = Some(2);
        c
    };
    let mut s = RawClient::connect_ok(b.addr, connect(true)).await.0;
    s.sub("down/t", 1).await;
    s.drop_connection().await;
    // Killed well before the expiry, restarted after it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    b.kill();
    tokio::time::sleep(Duration::from_millis(2200)).await;
    b.restart_after_kill();
    let (_s, ca) = RawClient::connect_ok(b.addr, connect(false)).await;
    assert!(!ca.session_present);
}
