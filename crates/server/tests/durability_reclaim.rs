//! Reclamation by interest (issue 11 items 1, 3, 8): a message stream's blocks go once no one
//! needs them, an offline persistent session's queue and an open QoS 2 exchange are never
//! reclaimed (nor removed by `max_msgs_per_topic`), across `kill -9`.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::Broker;
use common::raw::*;

/// A message with a 200-byte payload starting with its number.
fn big(topic: &str, n: usize, qos_level: u8, packet_id: u16) -> Publish {
    let mut p = publish(topic, b"", qos_level, packet_id);
    p.payload = bytes::Bytes::from(format!("{n}:{}", "x".repeat(200)));
    p
}

fn number(p: &Publish) -> usize {
    let text = std::str::from_utf8(&p.payload).unwrap();
    text.split(':').next().unwrap().parse().unwrap()
}

/// Bytes of the block files of one message stream.
fn blocks_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == "blk"))
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// Sends `n` QoS 1 PUBLISHes without waiting, then takes their PUBACKs.
async fn publish_pipelined(p: &mut RawClient, topic: &str, range: std::ops::Range<usize>) {
    let n = range.len();
    for i in range {
        p.send(&Packet::Publish(big(topic, i, 1, (i % 60_000 + 1) as u16)))
            .await;
    }
    let mut acks = 0;
    while acks < n {
        match p.expect_non_publish().await {
            Packet::PubAck(_) => acks += 1,
            other => panic!("expected PUBACK, got {}", brief(&other)),
        }
    }
}

const SMALL_BLOCKS: &str = "[[stream]]\nname = \"messages\"\nblock_size_bytes = 4096\n";

/// A persistent subscriber that keeps up: once it has received everything, the blocks go
/// and the data dir shrinks; a kill -9 and restart afterwards serve on.
#[tokio::test]
async fn blocks_go_once_a_subscriber_that_keeps_up_has_everything() {
    let mut b = Broker::start_with(SMALL_BLOCKS);
    let messages = b.data_dir().join("streams").join("messages");
    let connect = || connect_packet(Protocol::V3_1_1, "keep-sub", false, 0);
    let mut s = RawClient::connect_ok(b.addr, connect()).await.0;
    s.sub("keep/#", 1).await;
    let mut p = RawClient::v4(b.addr, "keep-pub").await;
    const N: usize = 1500;
    publish_pipelined(&mut p, "keep/t", 0..N).await;
    let peak = blocks_bytes(&messages);
    assert!(peak > 300_000, "held while the session holds them: {peak}");
    for i in 0..N {
        assert_eq!(number(&s.receive_acked().await), i);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut now = blocks_bytes(&messages);
    while now > 64 * 1024 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        now = blocks_bytes(&messages);
    }
    assert!(now <= 64 * 1024, "blocks reclaimed: {peak} -> {now} bytes");
    drop(s);
    b.restart_after_kill();
    let mut s = RawClient::connect_ok(b.addr, connect()).await.0;
    // At most a few QoS 1 redeliveries from the last checkpoint, nothing older.
    let mut p = RawClient::v4(b.addr, "keep-pub").await;
    p.publish_acked(big("keep/t", N, 1, 1)).await;
    loop {
        let m = s.receive_acked().await;
        assert!(
            number(&m) + 100 >= N,
            "an old message came back: {}",
            number(&m)
        );
        if number(&m) == N {
            break;
        }
    }
}

/// An offline persistent session's queue pins its blocks, even as other traffic moves on,
/// and is delivered whole after kill -9 and restart.
#[tokio::test]
async fn an_offline_sessions_queue_is_not_reclaimed_and_survives_kill() {
    let mut b = Broker::start_with(SMALL_BLOCKS);
    let connect = || connect_packet(Protocol::V3_1_1, "off-sub", false, 0);
    let mut s = RawClient::connect_ok(b.addr, connect()).await.0;
    s.sub("off/#", 1).await;
    s.disconnect().await;
    let mut p = RawClient::v4(b.addr, "off-pub").await;
    const N: usize = 300;
    publish_pipelined(&mut p, "off/t", 0..N).await;
    // Traffic no one wants, after the queue: it could go, the queue before it may not.
    publish_pipelined(&mut p, "nobody/t", 0..N).await;
    // Several reclamation passes.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    b.restart_after_kill();
    let (mut s, ca) = RawClient::connect_ok(b.addr, connect()).await;
    assert!(ca.session_present);
    for i in 0..N {
        assert_eq!(
            number(&s.receive_acked().await),
            i,
            "queued in order, none lost"
        );
    }
}

/// An open inbound QoS 2 exchange (PUBREC sent, PUBREL not yet received) survives
/// reclamation and `max_msgs_per_topic = 1` (every rx record of a client shares one topic),
/// across kill -9: the publisher's retried PUBLISH is answered as a duplicate, PUBREC and no
/// second delivery.
#[tokio::test]
async fn an_open_qos2_exchange_survives_reclamation_and_per_topic_limits() {
    let mut b = Broker::start_with(
        "[[stream]]\nname = \"messages\"\nblock_size_bytes = 4096\nmax_msgs_per_topic = 1\n",
    );
    let pub_connect = || connect_packet(Protocol::V3_1_1, "q2-pub", false, 0);
    let mut p = RawClient::connect_ok(b.addr, pub_connect()).await.0;
    let mut s = RawClient::v4(b.addr, "q2-sub").await;
    s.sub("q2/#", 1).await;
    let mut filler = RawClient::v4(b.addr, "q2-fill").await;
    publish_pipelined(&mut filler, "fill/a", 0..200).await;
    // pi 7: PUBREC, and the publisher "crashes" before PUBREL.
    p.send(&Packet::Publish(big("q2/open", 7, 2, 7))).await;
    match p.expect_non_publish().await {
        Packet::PubRec(a) if a.packet_id == 7 => {}
        other => panic!("expected PUBREC 7, got {}", brief(&other)),
    }
    assert_eq!(number(&s.receive_acked().await), 7);
    // More exchanges of the same client complete: more `$tern/rx/q2-pub` records.
    for i in 0..50 {
        p.publish_acked(big("q2/done", 100 + i, 2, 100 + i as u16))
            .await;
        assert_eq!(number(&s.receive_acked().await), 100 + i);
    }
    publish_pipelined(&mut filler, "fill/b", 0..200).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    b.restart_after_kill();
    let mut s = RawClient::v4(b.addr, "q2-sub").await;
    s.sub("q2/#", 1).await;
    let (mut p, ca) = RawClient::connect_ok(b.addr, pub_connect()).await;
    assert!(ca.session_present);
    let mut retry = big("q2/open", 7, 2, 7);
    retry.dup = true;
    p.send(&Packet::Publish(retry)).await;
    match p.expect_non_publish().await {
        Packet::PubRec(a) if a.packet_id == 7 => {}
        other => panic!("expected PUBREC 7, got {}", brief(&other)),
    }
    p.send(&Packet::PubRel(ack(7))).await;
    match p.expect_non_publish().await {
        Packet::PubComp(a) if a.packet_id == 7 => {}
        other => panic!("expected PUBCOMP 7, got {}", brief(&other)),
    }
    // No second delivery of pi 7's message.
    s.expect_nothing(Duration::from_millis(500)).await;
}

/// A clean-session publisher that vanishes between PUBREC and PUBREL leaves no open exchange
/// behind: its session ended with the connection (MQTT-3.1.2-6 (3.1.1)), so nothing can ever
/// release it, and it must not pin the stream's blocks (a disk that would never shrink).
/// Such a session's received set is not written at all (`connection::publish`); before that it
/// was written and dropped when the session ended, which this test also holds to.
#[tokio::test]
async fn a_clean_session_qos2_exchange_left_open_does_not_pin_blocks() {
    let b = Broker::start_with(SMALL_BLOCKS);
    let messages = b.data_dir().join("streams").join("messages");
    let mut p = RawClient::v4(b.addr, "clean-q2-pub").await;
    p.send(&Packet::Publish(big("open/q2", 0, 2, 9))).await;
    match p.expect_non_publish().await {
        Packet::PubRec(a) if a.packet_id == 9 => {}
        other => panic!("expected PUBREC 9, got {}", brief(&other)),
    }
    drop(p); // gone without PUBREL
    let mut filler = RawClient::v4(b.addr, "clean-q2-fill").await;
    publish_pipelined(&mut filler, "fill/c", 0..1500).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut now = blocks_bytes(&messages);
    while now > 64 * 1024 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        now = blocks_bytes(&messages);
    }
    assert!(
        now <= 64 * 1024,
        "blocks pinned by a dead exchange: {now} bytes"
    );
}
