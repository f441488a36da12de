//! ARCHITECTURE §2.5–2.6, §4.3 through a real connection with a store whose writes take time:
//! acks leave in packet order once durable, a QoS 2 message is not delivered before its write
//! is durable, and nothing published after it overtakes it (QoS 0 included).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use tern_broker::Message;
use tern_broker::{
    Appended, Broker, ExchangeStore, MemoryStore, MessageLog, OutboundSent, PersistError,
    Persistence, QueueFull, StoreRef, Ticket, WriterWakes,
};
use tern_wire::{Packet, QoS, ReasonCode};
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

impl MessageLog for SlowStore {
    fn qos2_release_retry(&self, client_id: &str, packet_id: u16) -> Option<Ticket> {
        MemoryStore.qos2_release_retry(client_id, packet_id)
    }
    fn append_publish(&self, _: &str, m: &Message, _: Option<u16>) -> Option<Appended> {
        // Durability `default`: QoS 0 is not written.
        if m.qos() == QoS::AtMostOnce {
            return None;
        }
        self.ticket().map(Appended::unplaced)
    }
    /// Never full: the same as `append_publish`.
    fn try_append_publish(
        &self,
        client_id: &str,
        m: &Message,
        qos2_packet_id: Option<u16>,
    ) -> Result<Option<Appended>, QueueFull> {
        Ok(self.append_publish(client_id, m, qos2_packet_id))
    }
    fn wait_for_room(&self, _: &str, _: &Message, _: bool) {}
    fn qos2_retry(&self, client_id: &str, packet_id: u16) -> Option<Ticket> {
        MemoryStore.qos2_retry(client_id, packet_id)
    }
    fn qos2_released(&self, _: &str, _: u16) -> Option<Ticket> {
        self.ticket()
    }
    fn message_released(&self, message: &Message) {
        MemoryStore.message_released(message)
    }
    fn defer_writer_wakes(&self) -> WriterWakes {
        MemoryStore.defer_writer_wakes()
    }
    fn disk_budget_reached(&self, topic: &str, qos: QoS) -> bool {
        MemoryStore.disk_budget_reached(topic, qos)
    }
}

impl ExchangeStore for SlowStore {
    fn outbound_sent(&self, client_id: &str, packet_id: u16, stored: StoreRef) -> OutboundSent {
        MemoryStore.outbound_sent(client_id, packet_id, stored)
    }
    fn outbound_pubrel_pending(&self, _: &str, _: u16, _: Option<StoreRef>) -> Option<Ticket> {
        self.ticket()
    }
    fn outbound_completed(&self, client_id: &str, packet_id: u16) {
        MemoryStore.outbound_completed(client_id, packet_id)
    }
}

#[tokio::test(start_paused = true)]
async fn mixed_qos_keeps_order_and_acks_wait_for_durability() {
    let store = Arc::new(SlowStore {
        delay: Duration::from_millis(50),
        writes: AtomicUsize::new(0),
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let broker = Broker::with_persistence(
        config(),
        Persistence {
            messages: store.clone(),
            exchanges: store.clone(),
            ..Persistence::memory()
        },
    )
    .unwrap();
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

/// Publish writes complete after the delay of their turn in `delays_ms` (then at once), each
/// on its own timer: a later write may complete before an earlier one. `fail_at` makes that
/// write fail instead.
struct ScriptedStore {
    delays_ms: Vec<u64>,
    fail_at: Option<usize>,
    writes: AtomicUsize,
}

impl MessageLog for ScriptedStore {
    fn qos2_release_retry(&self, client_id: &str, packet_id: u16) -> Option<Ticket> {
        MemoryStore.qos2_release_retry(client_id, packet_id)
    }
    fn append_publish(&self, _: &str, m: &Message, _: Option<u16>) -> Option<Appended> {
        if m.qos() == QoS::AtMostOnce {
            return None;
        }
        let n = self.writes.fetch_add(1, Ordering::Relaxed);
        let delay = Duration::from_millis(self.delays_ms.get(n).copied().unwrap_or(0));
        let fail = self.fail_at == Some(n);
        let (done, ticket) = Ticket::pair();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            done.complete(if fail {
                Err(PersistError("injected".into()))
            } else {
                Ok(())
            });
        });
        Some(Appended::unplaced(ticket))
    }
    /// Never full: the same as `append_publish`.
    fn try_append_publish(
        &self,
        client_id: &str,
        m: &Message,
        qos2_packet_id: Option<u16>,
    ) -> Result<Option<Appended>, QueueFull> {
        Ok(self.append_publish(client_id, m, qos2_packet_id))
    }
    fn wait_for_room(&self, _: &str, _: &Message, _: bool) {}
    fn qos2_retry(&self, client_id: &str, packet_id: u16) -> Option<Ticket> {
        MemoryStore.qos2_retry(client_id, packet_id)
    }
    fn qos2_released(&self, client_id: &str, packet_id: u16) -> Option<Ticket> {
        MemoryStore.qos2_released(client_id, packet_id)
    }
    fn message_released(&self, message: &Message) {
        MemoryStore.message_released(message)
    }
    fn defer_writer_wakes(&self) -> WriterWakes {
        MemoryStore.defer_writer_wakes()
    }
    fn disk_budget_reached(&self, topic: &str, qos: QoS) -> bool {
        MemoryStore.disk_budget_reached(topic, qos)
    }
}

async fn scripted(delays_ms: Vec<u64>, fail_at: Option<usize>) -> std::net::SocketAddr {
    let store = Arc::new(ScriptedStore {
        delays_ms,
        fail_at,
        writes: AtomicUsize::new(0),
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let broker = Broker::with_persistence(
        config(),
        Persistence {
            messages: store,
            ..Persistence::memory()
        },
    )
    .unwrap();
    tokio::spawn(async move { broker.serve(listener, std::future::pending()).await });
    addr
}

/// The first write completes late, the second early: acks and deliveries still follow packet
/// order, and the QoS 0 message between them (no write) waits its turn.
#[tokio::test(start_paused = true)]
async fn ticket_late_then_early_keeps_packet_order() {
    let addr = scripted(vec![80, 5, 40], None).await;
    let mut sub = Client::v5(addr, "le-sub").await;
    sub.subscribe("le/t", 2).await;
    let mut p = Client::v5(addr, "le-pub").await;
    p.send(&Packet::Publish(publish("le/t", b"1-qos2-late", 2, 1)))
        .await;
    p.send(&Packet::Publish(publish("le/t", b"2-qos0", 0, 0)))
        .await;
    p.send(&Packet::Publish(publish("le/t", b"3-qos2-early", 2, 2)))
        .await;
    p.send(&Packet::Publish(publish("le/t", b"4-qos1", 1, 3)))
        .await;
    let mut got = Vec::new();
    for _ in 0..4 {
        let m = sub.expect_publish().await;
        got.push(String::from_utf8(m.payload.to_vec()).unwrap());
    }
    assert_eq!(got, vec!["1-qos2-late", "2-qos0", "3-qos2-early", "4-qos1"]);
    assert!(matches!(p.recv().await, Some(Packet::PubRec(a)) if a.packet_id == 1));
    assert!(matches!(p.recv().await, Some(Packet::PubRec(a)) if a.packet_id == 2));
    assert!(matches!(p.recv().await, Some(Packet::PubAck(a)) if a.packet_id == 3));
}

/// A failed store write is not acknowledged: the publisher is disconnected (v5: 0x80) so that
/// it resends, and nothing after the failed message is acknowledged either.
#[tokio::test(start_paused = true)]
async fn failed_write_disconnects_without_ack() {
    let addr = scripted(vec![10, 10], Some(0)).await;
    let mut p = Client::v5(addr, "fw-pub").await;
    p.send(&Packet::Publish(publish("fw/t", b"a", 1, 1))).await;
    p.send(&Packet::Publish(publish("fw/t", b"b", 1, 2))).await;
    assert_eq!(p.expect_disconnect().await, ReasonCode::UNSPECIFIED_ERROR);
}
