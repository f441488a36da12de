//! Several publishers and subscribers at once on a multi-threaded runtime: every subscriber
//! gets every QoS 1/2 message exactly once and, per publisher, in publish order
//! (MQTT-4.6.0-6: ordered topic), with acks flowing both ways.

mod common;

use std::collections::HashMap;

use bytes::Bytes;
use common::*;
use tern_wire::{Packet, QoS};

const PUBLISHERS: usize = 4;
const MESSAGES: usize = 200;
const SUBSCRIBERS: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_publishers_many_subscribers_exactly_once_in_order() {
    run(None).await;
}

/// The same with a subscriber Receive Maximum of 3: the in-flight window is full most of the
/// time, so queued deliveries wait and acks/PUBRELs overtake them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_client_receive_maximum_still_exactly_once_in_order_mqtt_3_3_4_7() {
    run(Some(3)).await;
}

async fn run(receive_maximum: Option<u16>) {
    let b = TestBroker::start(config()).await;
    let mut subscribers = Vec::new();
    for i in 0..SUBSCRIBERS {
        let mut c = connect_packet(tern_wire::Protocol::V5, &format!("cc-sub-{i}"), true, 0);
        c.properties.receive_maximum = receive_maximum;
        let (mut s, _) = Client::connect(b.addr, c).await;
        s.subscribe("cc/#", 2).await;
        subscribers.push(s);
    }
    let addr = b.addr;
    let readers: Vec<_> = subscribers
        .into_iter()
        .map(|mut s| {
            tokio::spawn(async move {
                let mut next: HashMap<String, usize> = HashMap::new();
                for _ in 0..PUBLISHERS * MESSAGES {
                    let p = s.expect_publish().await;
                    let text = String::from_utf8(p.payload.to_vec()).unwrap();
                    let (publisher, seq) = text.split_once(':').unwrap();
                    let seq: usize = seq.parse().unwrap();
                    let want = next.entry(publisher.to_string()).or_insert(0);
                    assert_eq!(
                        seq, *want,
                        "publisher {publisher}: out of order or duplicate"
                    );
                    *want += 1;
                    match p.qos {
                        QoS::AtLeastOnce => s.send(&Packet::PubAck(ack(p.packet_id))).await,
                        QoS::ExactlyOnce => {
                            s.send(&Packet::PubRec(ack(p.packet_id))).await;
                            // PUBREL is read later, among the next PUBLISHes: track it lazily.
                            s.pending_pubrel(p.packet_id);
                        }
                        QoS::AtMostOnce => {}
                    }
                }
                s.finish_pubrels().await;
                s.send(&Packet::PingReq).await;
                loop {
                    match s.recv().await {
                        Some(Packet::PingResp) => break,
                        Some(Packet::PubRel(a)) => s.send(&Packet::PubComp(ack(a.packet_id))).await,
                        other => panic!("nothing else expected, got {other:?}"),
                    }
                }
            })
        })
        .collect();
    let writers: Vec<_> = (0..PUBLISHERS)
        .map(|p| {
            tokio::spawn(async move {
                let mut c = Client::v5(addr, &format!("cc-pub-{p}")).await;
                let qos = if p % 2 == 0 { 1 } else { 2 };
                for i in 0..MESSAGES {
                    let mut m = publish("cc/t", b"", qos, (i % 60_000 + 1) as u16);
                    m.payload = Bytes::from(format!("p{p}:{i}"));
                    c.send(&Packet::Publish(m)).await;
                    match c.recv().await {
                        Some(Packet::PubAck(_)) => {}
                        Some(Packet::PubRec(a)) => {
                            c.send(&Packet::PubRel(ack(a.packet_id))).await;
                            assert!(matches!(c.recv().await, Some(Packet::PubComp(_))));
                        }
                        other => panic!("{other:?}"),
                    }
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    for r in readers {
        r.await.unwrap();
    }
}

/// ARCHITECTURE §2.1: packets take effect in the order the broker reads them, across
/// connections. Client B sends SUBSCRIBE without waiting for SUBACK, client A publishes on B's
/// topic right after (QoS 0 and 1 alternately): B must get the message, every round, on a
/// runtime with two workers (the LIFO slot runs the task woken last first, and the other worker
/// steals). After B's SUBACK, a marker from client C on the same topic shows whether A's message
/// came (read before the marker, it reaches B before it). The clients write from the test's
/// thread pinned to one CPU, so that the kernel delivers B's SUBSCRIBE first (on loopback a
/// segment goes through the sending CPU's backlog; from two CPUs a later segment could reach
/// its socket first when one backlog's softirq is deferred). B and A are each one of `ROTATION`
/// connections used in turn, so that the broker is not still inside a write to the socket a
/// round's packet arrives on (such a segment waits in the kernel's socket backlog until the
/// write returns: tern's `ordering.rs` explains it). tern's `ordering.rs` has the same test
/// against the binary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_takes_effect_before_a_later_publish_from_another_client() {
    const ROUNDS: usize = 1000;
    const ROTATION: usize = 4;
    let b = TestBroker::start(config()).await;
    // SAFETY: plain syscalls on the calling thread (the one that runs this test body and so
    // writes for every client) with a zeroed, locally owned cpu_set_t.
    unsafe {
        let cpu = libc::sched_getcpu();
        if cpu >= 0 {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu as usize, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    }
    let mut subs = Vec::new();
    let mut pubs = Vec::new();
    for i in 0..ROTATION {
        subs.push(Client::v5(b.addr, &format!("ord-b{i}")).await);
        pubs.push(Client::v5(b.addr, &format!("ord-a{i}")).await);
    }
    let mut marker = Client::v5(b.addr, "ord-c").await;
    for c in subs.iter().chain(&pubs).chain([&marker]) {
        // Without it Nagle holds A's PUBLISH back while A's previous one is unacknowledged.
        c.stream.set_nodelay(true).unwrap();
    }
    let mut missed = Vec::new();
    let mut late = Vec::new();
    for round in 0..ROUNDS {
        let sub = &mut subs[round % ROTATION];
        let publ = &mut pubs[round % ROTATION];
        let topic = format!("ord/{round}");
        let packet_id = (round % 60_000) as u16 + 1;
        let qos = (round % 2) as u8;
        sub.send(&Packet::Subscribe(tern_wire::Subscribe {
            packet_id,
            properties: Default::default(),
            filters: vec![(s(&topic), Default::default())],
        }))
        .await;
        publ.send(&Packet::Publish(publish(&topic, b"first", qos, packet_id)))
            .await;
        let mut got_first = false;
        loop {
            match sub.recv().await {
                Some(Packet::SubAck(a)) if a.packet_id == packet_id => break,
                Some(Packet::Publish(p))
                    if p.topic.as_str() == topic && &p.payload[..] == b"first" =>
                {
                    got_first = true
                }
                // An earlier round's message after that round's marker: out of order.
                Some(Packet::Publish(p)) if &p.payload[..] == b"first" => {
                    late.push(p.topic.to_string())
                }
                other => panic!("round {round}: unexpected {other:?}"),
            }
        }
        marker
            .send(&Packet::Publish(publish(&topic, b"marker", 0, 0)))
            .await;
        loop {
            let p = sub.expect_publish().await;
            if p.topic.as_str() != topic {
                late.push(p.topic.to_string());
                continue;
            }
            match &p.payload[..] {
                b"first" => got_first = true,
                b"marker" => break,
                other => panic!("round {round}: unexpected payload {other:?}"),
            }
        }
        if qos == 1 {
            match publ.recv().await {
                Some(Packet::PubAck(a)) if a.packet_id == packet_id => {}
                other => panic!("round {round}: expected PUBACK, got {other:?}"),
            }
        }
        if !got_first {
            missed.push(round);
        }
    }
    eprintln!(
        "missed {} of {ROUNDS}: {missed:?}; after the marker: {late:?}",
        missed.len()
    );
    assert!(
        missed.is_empty(),
        "the PUBLISH read after B's SUBSCRIBE missed B in {} of {ROUNDS} rounds: {missed:?} \
         (of those, delivered after the marker read after them: {late:?})",
        missed.len()
    );
    b.shutdown().await;
}
