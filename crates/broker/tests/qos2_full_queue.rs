//! Issue 24 item 5: a QoS 2 PUBLISH is written under its session's lock (its packet id and its
//! write change together), and the store's writer queue can be full for as long as the disk
//! stalls. The wait for room must not happen under that lock: routers delivering to the
//! publishing session take it, and would stall with it (and their own publishers with them).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use parking_lot::{Condvar, Mutex};
use tern_broker::Message;
use tern_broker::{
    Appended, Broker, MemoryStore, MessageLog, Persistence, QueueFull, Ticket, TicketCompleter,
    WriterWakes,
};
use tern_wire::{Packet, QoS};
use tokio::net::TcpListener;

/// A store whose writer queue is full for QoS 2 writes while `full`: a waiting append
/// (`append_publish`) and `wait_for_room` block the calling thread as a full `tern-store` queue
/// does, `try_append_publish` reports `QueueFull`. A QoS 2 write that finds room is durable
/// when the test says so ([`FullQueue::complete_writes`]); other writes are not made.
#[derive(Default)]
struct FullQueue {
    full: Mutex<bool>,
    room: Condvar,
    /// Threads that blocked for room (in either call).
    waiting: AtomicUsize,
    writes: Mutex<Vec<TicketCompleter>>,
}

impl FullQueue {
    fn block_while_full(&self) {
        let mut full = self.full.lock();
        if *full {
            self.waiting.fetch_add(1, Ordering::SeqCst);
        }
        while *full {
            self.room.wait(&mut full);
        }
    }

    fn set_full(&self, full: bool) {
        *self.full.lock() = full;
        self.room.notify_all();
    }

    fn write(&self) -> Option<Ticket> {
        let (done, ticket) = Ticket::pair();
        self.writes.lock().push(done);
        Some(ticket)
    }

    /// Completes the writes issued so far; how many.
    fn complete_writes(&self) -> usize {
        let writes = std::mem::take(&mut *self.writes.lock());
        let n = writes.len();
        for done in writes {
            done.complete(Ok(()));
        }
        n
    }
}

impl MessageLog for FullQueue {
    fn append_publish(&self, _: &str, m: &Message, _: Option<u16>) -> Option<Appended> {
        if m.qos() != QoS::ExactlyOnce {
            return None;
        }
        self.block_while_full();
        self.write().map(Appended::unplaced)
    }
    fn try_append_publish(
        &self,
        _: &str,
        m: &Message,
        _: Option<u16>,
    ) -> Result<Option<Appended>, QueueFull> {
        if m.qos() != QoS::ExactlyOnce {
            return Ok(None);
        }
        if *self.full.lock() {
            return Err(QueueFull);
        }
        Ok(self.write().map(Appended::unplaced))
    }
    fn wait_for_room(&self, _: &str, _: &Message, _: bool) {
        self.block_while_full();
    }
    fn qos2_retry(&self, client_id: &str, packet_id: u16) -> Option<Ticket> {
        MemoryStore.qos2_retry(client_id, packet_id)
    }
    fn qos2_released(&self, client_id: &str, packet_id: u16) -> Option<Ticket> {
        MemoryStore.qos2_released(client_id, packet_id)
    }
    fn qos2_release_retry(&self, client_id: &str, packet_id: u16) -> Option<Ticket> {
        MemoryStore.qos2_release_retry(client_id, packet_id)
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

/// Q's QoS 2 message to `fq/t` is being written when the queue fills; S (subscribed to `fq/t`)
/// then publishes QoS 2 and its connection waits for room. Q's write completes: Q's pipeline
/// releases the delivery and routes it to S, which takes S's session lock, and Q gets its
/// PUBREC while S still waits. Then room is made, and S gets its PUBREC and Q's message.
/// (Packets read after S's wait for S's turn, `read_order`: the whole broker's reading
/// stops while one publisher waits for room. Deliveries released by the ack pipeline, wills
/// and the checkpointer are not read packets: those are what the session lock would stop.)
/// Real time, several worker threads: the waits block threads.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_qos2_publisher_waiting_for_room_does_not_block_routers_delivering_to_it() {
    let store = Arc::new(FullQueue::default());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let broker = Broker::with_persistence(
        config(),
        Persistence {
            messages: store.clone(),
            ..Persistence::memory()
        },
    )
    .unwrap();
    tokio::spawn(async move { broker.serve(listener, std::future::pending()).await });
    let mut s = Client::v5(addr, "fq-s").await;
    s.subscribe("fq/t", 1).await;
    let mut q = Client::v5(addr, "fq-q").await;
    q.send(&Packet::Publish(publish("fq/t", b"from-q", 2, 1)))
        .await;
    // Conditions, not delays: Q's write is issued, then S waits for room.
    while store.writes.lock().is_empty() {
        tokio::task::yield_now().await;
    }
    store.set_full(true);
    s.send(&Packet::Publish(publish("fq/x", b"qos2", 2, 7)))
        .await;
    while store.waiting.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    assert_eq!(store.complete_writes(), 1);
    let pubrec = tokio::time::timeout(WAIT, q.recv_forever()).await;
    // Room first, whatever happened: a blocked thread would hold the runtime's shutdown.
    store.set_full(false);
    let pubrec =
        pubrec.expect("Q's release blocked on the session of a publisher waiting for room");
    assert!(
        matches!(&pubrec, Some(Packet::PubRec(a)) if a.packet_id == 1),
        "{pubrec:?}"
    );
    // S's write, once it found room; then its PUBREC and Q's message, in either order.
    while store.complete_writes() == 0 {
        tokio::task::yield_now().await;
    }
    let (mut acked, mut delivered) = (false, false);
    while !(acked && delivered) {
        match s.recv().await {
            Some(Packet::PubRec(a)) if a.packet_id == 7 => acked = true,
            Some(Packet::Publish(m)) if &m.payload[..] == b"from-q" => delivered = true,
            other => panic!("unexpected {other:?}"),
        }
    }
}
