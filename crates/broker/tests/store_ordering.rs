//! ARCHITECTURE §2.5–2.6, §4.3 through a real connection with a store whose writes take time:
//! acks leave in packet order once durable, a QoS 2 message is not delivered before its write
//! is durable, and nothing published after it overtakes it (QoS 0 included).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use tern_broker::message::Message;
use tern_broker::{Broker, MessageStore, Ticket};
use tern_wire::{Packet, SubscriptionOptions};
use tokio::net::TcpListener;

/// Every write becomes durable after `delay`, in issue order.
struct SlowStore {
    delay: Duration,
    writes: AtomicUsize,
}

impl SlowStore {
    fn ticket(&self) -> Option<Ticket> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        let (done, ticket) = Ticket::pair();
        let delay = self.delay;
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            done.complete(Ok(()));
        });
        Some(ticket)
    }
}

impl MessageStore for SlowStore {
    fn append_publish(&self, _: &str, _: &Message, _: Option<u16>) -> Option<Ticket> {
        self.ticket()
    }
    fn qos2_released(&self, _: &str, _: u16) -> Option<Ticket> {
        self.ticket()
    }
    fn outbound_pubrel_pending(&self, _: &str, _: u16) -> Option<Ticket> {
        self.ticket()
    }
    fn outbound_completed(&self, _: &str, _: u16) {}
    fn session_opened(&self, _: &str, _: u32) {}
    fn session_ended(&self, _: &str) {}
    fn session_subscribed(&self, _: &str, _: &str, _: SubscriptionOptions, _: Option<u32>) {}
    fn session_unsubscribed(&self, _: &str, _: &str) {}
    fn retained_changed(&self, _: &str, _: Option<&Message>) {}
}

#[tokio::test(start_paused = true)]
async fn mixed_qos_keeps_order_and_acks_wait_for_durability() {
    let store = Arc::new(SlowStore {
        delay: Duration::from_millis(50),
        writes: AtomicUsize::new(0),
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let broker = Broker::with_store(config(), store.clone()).unwrap();
    tokio::spawn(async move { broker.serve(listener, std::future::pending()).await });

    let mut sub = Client::v5(addr, "ord-sub").await;
    sub.subscribe("ord/t", 2).await;
    let mut p = Client::v5(addr, "ord-pub").await;
    p.send(&Packet::Publish(publish("ord/t", b"a-qos2", 2, 1)))
        .await;
    p.send(&Packet::Publish(publish("ord/t", b"b-qos0", 0, 0)))
        .await;
    p.send(&Packet::Publish(publish("ord/t", b"c-qos1", 1, 2)))
        .await;

    // Nothing leaves before the QoS 2 write is durable (50 ms of virtual time).
    sub.expect_silence(Duration::from_millis(40)).await;
    // Subscriber: publisher order, whatever the QoS mix.
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(sub.expect_publish().await);
    }
    let payloads: Vec<&[u8]> = got.iter().map(|m| &m.payload[..]).collect();
    assert_eq!(payloads, vec![&b"a-qos2"[..], b"b-qos0", b"c-qos1"]);
    sub.send(&Packet::PubRec(ack(got[0].packet_id))).await;
    sub.send(&Packet::PubAck(ack(got[2].packet_id))).await;
    assert!(matches!(sub.recv().await, Some(Packet::PubRel(a)) if a.packet_id == got[0].packet_id));
    sub.send(&Packet::PubComp(ack(got[0].packet_id))).await;
    // Publisher: acks in packet order.
    assert!(matches!(p.recv().await, Some(Packet::PubRec(a)) if a.packet_id == 1));
    assert!(matches!(p.recv().await, Some(Packet::PubAck(a)) if a.packet_id == 2));
    p.send(&Packet::PubRel(ack(1))).await;
    assert!(matches!(p.recv().await, Some(Packet::PubComp(a)) if a.packet_id == 1));
    // Two appends, one release, one PUBREL-pending write.
    assert_eq!(store.writes.load(Ordering::Relaxed), 4);
}
