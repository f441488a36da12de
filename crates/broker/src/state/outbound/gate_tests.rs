//! The release gate inside writer batches (ARCHITECTURE §3, outbound QoS 2): a PUBLISH whose
//! packet id is being recorded, and every PUBREL, leave only once their writes are durable,
//! in order, with the deliveries behind them kept behind them.

use bytes::BytesMut;
use parking_lot::Mutex;
use tern_wire::{Packet, Protocol, QoS, ReasonCode, decode};
use tokio::time::Instant;

use super::batch::BatchEnv;
use super::*;
use crate::config::BrokerConfig;
use crate::metrics::Metrics;
use crate::model::{ExchangeStore, MemoryStore, OutboundSent, StoreRef, Ticket, TicketCompleter};

/// Hands out a ticket per outbound record and keeps its completer, to complete by hand.
#[derive(Default)]
struct HandStore {
    pending: Mutex<Vec<(String, u16, TicketCompleter)>>,
}

impl HandStore {
    fn complete(&self, kind: &str, packet_id: u16) {
        let mut pending = self.pending.lock();
        let index = pending
            .iter()
            .position(|(k, pi, _)| k == kind && *pi == packet_id)
            .unwrap_or_else(|| {
                panic!(
                    "no pending {kind} {packet_id}: {:?}",
                    pending
                        .iter()
                        .map(|(k, p, _)| (k.clone(), *p))
                        .collect::<Vec<_>>()
                )
            });
        let (_, _, done) = pending.remove(index);
        done.complete(Ok(()));
    }

    fn ticket(&self, kind: &str, packet_id: u16) -> Option<Ticket> {
        let (done, ticket) = Ticket::pair();
        self.pending.lock().push((kind.into(), packet_id, done));
        Some(ticket)
    }
}

impl ExchangeStore for HandStore {
    fn outbound_sent(&self, _: &str, packet_id: u16, _: StoreRef) -> OutboundSent {
        match self.ticket("sent", packet_id) {
            Some(t) => OutboundSent::Recorded(t),
            None => OutboundSent::Untracked,
        }
    }
    fn outbound_pubrel_pending(
        &self,
        _: &str,
        packet_id: u16,
        _: Option<StoreRef>,
    ) -> Option<Ticket> {
        self.ticket("pubrel", packet_id)
    }
    fn outbound_completed(&self, client_id: &str, packet_id: u16) {
        MemoryStore.outbound_completed(client_id, packet_id)
    }
}

struct Fixture {
    out: Outbound,
    writer: WriterState,
    config: BrokerConfig,
    metrics: Metrics,
    store: HandStore,
}

impl Fixture {
    fn new(window: u16) -> Self {
        let mut out = Outbound::default();
        out.attach(window);
        Fixture {
            out,
            writer: WriterState::new(Protocol::V5, u32::MAX, 0),
            config: BrokerConfig::default(),
            metrics: Metrics::default(),
            store: HandStore::default(),
        }
    }

    fn push(&mut self, item: Outgoing) {
        self.out.push(item, true, &self.config, Instant::now());
    }

    /// `(kind, payload or "", packet id, dup)` of what one batch writes.
    fn drain(&mut self) -> Vec<(&'static str, Vec<u8>, u16, bool)> {
        let mut bufs = BatchBufs::default();
        let env = BatchEnv {
            config: &self.config,
            metrics: &self.metrics,
            store: &self.store,
            client_id: "c",
            persistent: true,
            now: Instant::now(),
        };
        self.out.fill_batch(&mut self.writer, &env, &mut bufs);
        let parts = bufs.take_parts();
        let mut buf = BytesMut::new();
        for part in parts {
            buf.extend_from_slice(&part);
        }
        let mut out = Vec::new();
        while let Some(packet) = decode(&mut buf, Protocol::V5, u32::MAX).unwrap() {
            out.push(match packet {
                Packet::Publish(p) => ("PUBLISH", p.payload.to_vec(), p.packet_id, p.dup),
                Packet::PubRel(a) => ("PUBREL", Vec::new(), a.packet_id, false),
                other => panic!("unexpected {other:?}"),
            });
        }
        out
    }
}

#[tokio::test]
async fn a_qos2_publish_waits_for_its_record_and_holds_what_follows_in_order() {
    let mut f = Fixture::new(8);
    f.push(stored_item(b"a", QoS::ExactlyOnce, 1));
    f.push(stored_item(b"b", QoS::AtMostOnce, 2));
    f.push(stored_item(b"c", QoS::AtLeastOnce, 3));
    f.push(stored_item(b"d", QoS::ExactlyOnce, 4));
    assert!(
        f.drain().is_empty(),
        "nothing leaves before the id of a is recorded"
    );
    // Ids: a 1, c 2, d 3 (b is QoS 0).
    f.store.complete("sent", 3);
    assert!(
        f.drain().is_empty(),
        "d's record alone releases nothing: a is first"
    );
    f.store.complete("sent", 1);
    assert_eq!(
        f.drain(),
        vec![
            ("PUBLISH", b"a".to_vec(), 1, false),
            ("PUBLISH", b"b".to_vec(), 0, false),
            ("PUBLISH", b"c".to_vec(), 2, false),
            ("PUBLISH", b"d".to_vec(), 3, false),
        ]
    );
}

#[tokio::test]
async fn pubrels_leave_in_pubrec_order_whatever_order_their_writes_complete_mqtt_4_6_0_3() {
    let mut f = Fixture::new(8);
    for seq in 1..=3 {
        f.push(stored_item(b"x", QoS::ExactlyOnce, seq));
    }
    f.drain();
    for pi in 1..=3 {
        f.store.complete("sent", pi);
    }
    assert_eq!(f.drain().len(), 3);
    for pi in [1, 2, 3] {
        assert!(f.out.on_pubrec(pi, true));
        let ticket = f.store.ticket("pubrel", pi);
        f.out.hold_pubrel(pi, ReasonCode::SUCCESS, ticket);
    }
    f.store.complete("pubrel", 3);
    f.store.complete("pubrel", 2);
    assert!(f.drain().is_empty(), "PUBREL 1 is not durable yet");
    f.store.complete("pubrel", 1);
    let order: Vec<u16> = f.drain().into_iter().map(|(_, _, pi, _)| pi).collect();
    assert_eq!(order, vec![1, 2, 3]);
}

#[tokio::test]
async fn a_held_publish_is_not_resent_on_reconnect_and_leaves_once_durable() {
    let mut f = Fixture::new(8);
    f.push(stored_item(b"a", QoS::ExactlyOnce, 1));
    f.push(stored_item(b"b", QoS::ExactlyOnce, 2));
    f.drain();
    f.store.complete("sent", 1);
    assert_eq!(f.drain(), vec![("PUBLISH", b"a".to_vec(), 1, false)]);
    // b's record is not durable when the connection drops.
    f.out.detach();
    f.out.attach(8);
    assert_eq!(
        f.drain(),
        vec![("PUBLISH", b"a".to_vec(), 1, true)],
        "only what was sent is resent (MQTT-4.4.0-1)"
    );
    assert!(
        !f.out.on_pubrec(2, true),
        "an ack for an unsent id is ignored"
    );
    f.store.complete("sent", 2);
    assert_eq!(f.drain(), vec![("PUBLISH", b"b".to_vec(), 2, false)]);
}
