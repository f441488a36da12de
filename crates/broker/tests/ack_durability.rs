//! Issue 11 item 7, "every acknowledgement means durable", through a real connection with a
//! store whose tickets the test completes by hand: SUBACK / UNSUBACK of a persistent session
//! wait for the subscription record, the PUBACK / PUBREC of a retained PUBLISH waits for the
//! retained record (set or clear), while routing and delivery are not delayed, and every
//! acknowledgement of a connection still leaves in packet order (ARCHITECTURE §2.5, §5).
//!
//! The SIGKILL tests in `crates/server/tests/durability_acks.rs` show the writes are issued and
//! replayed; these show the acks wait for durability (kill -9 keeps the page cache, so it
//! cannot tell "written" from "durable").

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use parking_lot::Mutex;
use tern_broker::Message;
use tern_broker::{
    Appended, Broker, MemoryStore, MessageLog, PersistError, Persistence, QueueFull, RetainedStore,
    SessionStore, Ticket, TicketCompleter, WriterWakes,
};
use tern_wire::{
    Packet, Properties, Protocol, QoS, ReasonCode, Subscribe, SubscriptionOptions, Unsubscribe,
};
use tokio::net::TcpListener;

/// Which write a held ticket belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Write {
    Subscribed(String),
    Unsubscribed(String),
    /// Topic, and whether it sets (`true`) or clears the retained message.
    Retained(String, bool),
    /// An inbound PUBLISH (only for topics under `w/`: the others need no write).
    Publish(String),
    /// A persistent session's record (only for client ids under `held/`).
    Session(String),
}

/// A store that keeps every ticket it hands out until the test completes it.
#[derive(Default)]
struct HandStore {
    persistent: Mutex<HashSet<String>>,
    held: Mutex<Vec<(Write, TicketCompleter)>>,
}

impl HandStore {
    fn hold(&self, write: Write) -> Option<Ticket> {
        let (done, ticket) = Ticket::pair();
        self.held.lock().push((write, done));
        Some(ticket)
    }

    /// Waits (bounded, virtual time) until `write` is held, and takes its completer.
    async fn take(&self, write: Write) -> TicketCompleter {
        for _ in 0..1000 {
            {
                let mut held = self.held.lock();
                if let Some(i) = held.iter().position(|(w, _)| *w == write) {
                    return held.remove(i).1;
                }
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("no ticket for {write:?}; held: {:?}", self.writes());
    }

    fn writes(&self) -> Vec<Write> {
        self.held.lock().iter().map(|(w, _)| w.clone()).collect()
    }
}

impl MessageLog for HandStore {
    fn qos2_release_retry(&self, client_id: &str, packet_id: u16) -> Option<Ticket> {
        MemoryStore.qos2_release_retry(client_id, packet_id)
    }
    fn append_publish(&self, _: &str, m: &Message, _: Option<u16>) -> Option<Appended> {
        if m.topic().starts_with("w/") {
            return self
                .hold(Write::Publish(m.topic().to_string()))
                .map(Appended::unplaced);
        }
        None
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

impl SessionStore for HandStore {
    fn session_opened(&self, client_id: &str, _: Protocol, _: u32, _: bool) -> Option<Ticket> {
        self.persistent.lock().insert(client_id.to_string());
        if client_id.starts_with("held/") {
            return self.hold(Write::Session(client_id.to_string()));
        }
        None
    }
    fn session_closed(&self, client_id: &str, expiry_interval_s: u32) {
        MemoryStore.session_closed(client_id, expiry_interval_s)
    }
    fn session_ended(&self, client_id: &str) {
        MemoryStore.session_ended(client_id)
    }
    fn session_subscribed(
        &self,
        client_id: &str,
        filter: &str,
        _: SubscriptionOptions,
        _: Option<u32>,
    ) -> Option<Ticket> {
        if !self.persistent.lock().contains(client_id) {
            return None;
        }
        self.hold(Write::Subscribed(filter.to_string()))
    }
    fn session_unsubscribed(&self, client_id: &str, filter: &str) -> Option<Ticket> {
        if !self.persistent.lock().contains(client_id) {
            return None;
        }
        self.hold(Write::Unsubscribed(filter.to_string()))
    }
    fn state_barrier(&self) -> Option<Ticket> {
        MemoryStore.state_barrier()
    }
}

impl RetainedStore for HandStore {
    fn retained_changed(&self, topic: &str, message: Option<&Message>) -> Option<Ticket> {
        self.hold(Write::Retained(topic.to_string(), message.is_some()))
    }
}

/// Clients send back to back while the broker holds their acks: without TCP_NODELAY the
/// kernel would hold a later small packet for a delayed ACK, which takes real time the paused
/// clock of these tests does not wait for.
fn nodelay(c: Client) -> Client {
    c.stream.set_nodelay(true).unwrap();
    c
}

async fn start() -> (std::net::SocketAddr, Arc<HandStore>) {
    let store = Arc::new(HandStore::default());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let broker = Broker::with_persistence(
        config(),
        Persistence {
            messages: store.clone(),
            sessions: store.clone(),
            retained: store.clone(),
            ..Persistence::memory()
        },
    )
    .unwrap();
    tokio::spawn(async move { broker.serve(listener, std::future::pending()).await });
    (addr, store)
}

fn subscribe(packet_id: u16, filter: &str, qos: u8) -> Packet {
    Packet::Subscribe(Subscribe {
        packet_id,
        properties: Properties::default(),
        filters: vec![(
            s(filter),
            SubscriptionOptions {
                qos: QoS::from_u8(qos).unwrap(),
                ..SubscriptionOptions::default()
            },
        )],
    })
}

fn retained(topic: &str, payload: &'static [u8], qos: u8, packet_id: u16) -> Packet {
    let mut p = publish(topic, payload, qos, packet_id);
    p.retain = true;
    Packet::Publish(p)
}

/// The CONNACK of a persistent session leaves once the session's record is durable; when that
/// write fails, the connection closes without a CONNACK (ARCHITECTURE §4: nothing acknowledged
/// that was not written), and nothing else is written on it.
#[tokio::test(start_paused = true)]
async fn connack_waits_for_the_session_record_and_a_failed_record_closes_without_it() {
    let (addr, store) = start().await;
    let mut failing = Client::open(addr, Protocol::V3_1_1).await;
    let connect = connect_packet(Protocol::V3_1_1, "held/a", false, 0);
    failing.send(&Packet::Connect(Box::new(connect))).await;
    let done = store.take(Write::Session("held/a".into())).await;
    failing.expect_silence(Duration::from_millis(200)).await;
    done.complete(Err(PersistError("disk full".into())));
    assert_eq!(failing.recv().await, None, "closed, and no CONNACK");

    let mut kept = Client::open(addr, Protocol::V3_1_1).await;
    let connect = connect_packet(Protocol::V3_1_1, "held/b", false, 0);
    kept.send(&Packet::Connect(Box::new(connect))).await;
    let done = store.take(Write::Session("held/b".into())).await;
    kept.expect_silence(Duration::from_millis(200)).await;
    done.complete(Ok(()));
    match kept.recv().await {
        Some(Packet::ConnAck(ca)) => assert_eq!(ca.reason, ReasonCode::SUCCESS),
        other => panic!("expected CONNACK once durable, got {other:?}"),
    }
}

/// A persistent session's SUBACK is held until its subscription record is durable; the
/// subscription routes meanwhile (a message published before the SUBACK reaches it). A clean
/// session's SUBACK, with no write issued, is not held. UNSUBACK waits for the removal.
#[tokio::test(start_paused = true)]
async fn suback_and_unsuback_wait_for_the_subscription_record() {
    let (addr, store) = start().await;
    let (mut sub, ca) =
        Client::connect(addr, connect_packet(Protocol::V3_1_1, "hs-sub", false, 0)).await;
    assert_eq!(ca.reason, ReasonCode::SUCCESS);
    sub.send(&subscribe(7, "hs/t", 1)).await;
    let done = store.take(Write::Subscribed("hs/t".into())).await;
    sub.expect_silence(Duration::from_millis(200)).await;

    // Routing is not delayed: the subscription already gets messages.
    let mut p = Client::v5(addr, "hs-pub").await;
    p.send(&Packet::Publish(publish("hs/t", b"early", 1, 1)))
        .await;
    assert!(matches!(p.recv().await, Some(Packet::PubAck(a)) if a.packet_id == 1));
    let m = sub.expect_publish().await;
    assert_eq!(&m.payload[..], b"early");
    sub.send(&Packet::PubAck(ack(m.packet_id))).await;
    sub.expect_silence(Duration::from_millis(200)).await;

    done.complete(Ok(()));
    match sub.recv().await {
        Some(Packet::SubAck(a)) => {
            assert_eq!(a.packet_id, 7);
            assert_eq!(a.reasons, vec![ReasonCode::GRANTED_QOS_1]);
        }
        other => panic!("expected SUBACK once durable, got {other:?}"),
    }

    sub.send(&Packet::Unsubscribe(Unsubscribe {
        packet_id: 8,
        properties: Properties::default(),
        filters: vec![s("hs/t")],
    }))
    .await;
    let done = store.take(Write::Unsubscribed("hs/t".into())).await;
    sub.expect_silence(Duration::from_millis(200)).await;
    done.complete(Ok(()));
    assert!(matches!(sub.recv().await, Some(Packet::UnsubAck(a)) if a.packet_id == 8));

    // A clean session issues no write: its SUBACK is not held.
    let (mut clean, _) =
        Client::connect(addr, connect_packet(Protocol::V3_1_1, "hs-clean", true, 0)).await;
    clean.send(&subscribe(9, "hs/t", 1)).await;
    assert!(matches!(clean.recv().await, Some(Packet::SubAck(a)) if a.packet_id == 9));
    assert!(store.writes().is_empty(), "{:?}", store.writes());
}

/// SUBACK takes its place among the connection's other acknowledgements: behind a PUBACK that
/// waits for its write, a SUBACK needing no write still leaves second; and a SUBACK that waits
/// holds back the PUBACK of a later PUBLISH (packet order, MQTT-4.6.0-2 for the PUBACKs).
#[tokio::test(start_paused = true)]
async fn suback_keeps_packet_order_with_pubacks() {
    let (addr, store) = start().await;
    let (c, _) = Client::connect(addr, connect_packet(Protocol::V5, "ord-c", true, 0)).await;
    let mut c = nodelay(c);
    c.send(&Packet::Publish(publish("w/one", b"1", 1, 1))).await;
    c.send(&subscribe(2, "ord/t", 0)).await;
    let done = store.take(Write::Publish("w/one".into())).await;
    c.expect_silence(Duration::from_millis(200)).await;
    done.complete(Ok(()));
    assert!(matches!(c.recv().await, Some(Packet::PubAck(a)) if a.packet_id == 1));
    assert!(matches!(c.recv().await, Some(Packet::SubAck(a)) if a.packet_id == 2));

    let (d, _) = Client::connect(addr, connect_packet(Protocol::V3_1_1, "ord-d", false, 0)).await;
    let mut d = nodelay(d);
    d.send(&subscribe(3, "ord/u", 1)).await;
    d.send(&Packet::Publish(publish("ord/x", b"x", 1, 4))).await;
    let done = store.take(Write::Subscribed("ord/u".into())).await;
    d.expect_silence(Duration::from_millis(200)).await;
    done.complete(Ok(()));
    assert!(matches!(d.recv().await, Some(Packet::SubAck(a)) if a.packet_id == 3));
    assert!(matches!(d.recv().await, Some(Packet::PubAck(a)) if a.packet_id == 4));
}

/// The PUBACK of a retained QoS 1 PUBLISH waits for the retained record (the message itself
/// needed no write here), while subscribers get the message at once; the PUBACK of the empty
/// retained PUBLISH that clears it waits for the delete; a QoS 2 retained PUBLISH's PUBREC
/// waits for both its message write and its retained record. Retained writes are issued in
/// the publisher's order.
#[tokio::test(start_paused = true)]
async fn retained_ack_waits_for_the_retained_record() {
    let (addr, store) = start().await;
    let mut sub = Client::v5(addr, "rt-sub").await;
    sub.subscribe("rt/#", 1).await;
    sub.subscribe("w/#", 2).await;
    let mut p = nodelay(Client::v5(addr, "rt-pub").await);

    p.send(&retained("rt/a", b"kept", 1, 1)).await;
    let set = store.take(Write::Retained("rt/a".into(), true)).await;
    let m = sub.expect_publish().await;
    assert_eq!(&m.payload[..], b"kept", "delivery is not delayed");
    sub.send(&Packet::PubAck(ack(m.packet_id))).await;
    p.expect_silence(Duration::from_millis(200)).await;
    set.complete(Ok(()));
    assert!(matches!(p.recv().await, Some(Packet::PubAck(a)) if a.packet_id == 1));

    // Clearing: the empty retained PUBLISH's PUBACK waits for the delete.
    p.send(&retained("rt/a", b"", 1, 2)).await;
    let clear = store.take(Write::Retained("rt/a".into(), false)).await;
    p.expect_silence(Duration::from_millis(200)).await;
    clear.complete(Ok(()));
    assert!(matches!(p.recv().await, Some(Packet::PubAck(a)) if a.packet_id == 2));

    // QoS 2 with a message write: PUBREC needs both; the retained record is written once the
    // message is (QoS 2 is applied when durable), and the PUBREC waits for it too.
    p.send(&retained("w/q2", b"two", 2, 3)).await;
    let message = store.take(Write::Publish("w/q2".into())).await;
    assert!(
        !store
            .writes()
            .contains(&Write::Retained("w/q2".into(), true)),
        "a QoS 2 message is applied only once durable"
    );
    message.complete(Ok(()));
    let record = store.take(Write::Retained("w/q2".into(), true)).await;
    p.expect_silence(Duration::from_millis(200)).await;
    record.complete(Ok(()));
    assert!(matches!(p.recv().await, Some(Packet::PubRec(a)) if a.packet_id == 3));

    // Publisher order: three retained updates of one topic issue their writes in that order,
    // and the acks wait for all of them.
    for (i, payload) in [&b"x"[..], b"", b"z"].into_iter().enumerate() {
        let mut m = publish("rt/o", b"", 1, 10 + i as u16);
        m.retain = true;
        m.payload = bytes::Bytes::copy_from_slice(payload);
        p.send(&Packet::Publish(m)).await;
    }
    let mut order = Vec::new();
    for _ in 0..1000 {
        order = store.writes();
        if order.len() == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(
        order,
        vec![
            Write::Retained("rt/o".into(), true),
            Write::Retained("rt/o".into(), false),
            Write::Retained("rt/o".into(), true),
        ]
    );
    let held: Vec<TicketCompleter> = store.held.lock().drain(..).map(|(_, c)| c).collect();
    p.expect_silence(Duration::from_millis(200)).await;
    for c in held.into_iter().rev() {
        c.complete(Ok(()));
    }
    for id in 10..13 {
        assert!(matches!(p.recv().await, Some(Packet::PubAck(a)) if a.packet_id == id));
    }
}

/// A retained record that cannot be written is not acknowledged: the publisher is
/// disconnected (v5: 0x80) so that it resends.
#[tokio::test(start_paused = true)]
async fn failed_retained_write_is_not_acknowledged() {
    let (addr, store) = start().await;
    let mut p = Client::v5(addr, "rf-pub").await;
    p.send(&retained("rf/a", b"v", 1, 1)).await;
    store
        .take(Write::Retained("rf/a".into(), true))
        .await
        .complete(Err(PersistError("injected".into())));
    assert_eq!(p.expect_disconnect().await, ReasonCode::UNSPECIFIED_ERROR);
}

mod durable {
    //! The same promises at the `DurableStore` seam: the writes SUBACK and a retained PUBACK
    //! wait for are issued on the state streams, which sync on their own policy; a topic no
    //! configured stream captures is written to the default stream.

    use std::time::Duration;

    use bytes::Bytes;
    use tern_broker::Message;
    use tern_broker::{
        DurableConfig, DurableStore, MessageLog, RetainedStore, SessionStore, StreamSpec,
        SyncPolicy, Ticket,
    };
    use tern_wire::{Properties, Protocol, QoS, Str, SubscriptionOptions};
    use tokio::time::Instant;

    fn msg(topic: &'static str, payload: &'static [u8], qos: QoS, retain: bool) -> Message {
        Message::new(
            Str::from_static(topic),
            Bytes::from_static(payload),
            qos,
            retain,
            Properties::default(),
            Some("pub".into()),
            Instant::now(),
        )
    }

    async fn durable(t: Option<Ticket>) {
        let mut t = t.expect("a write was issued");
        tokio::time::timeout(Duration::from_secs(5), t.wait())
            .await
            .expect("durable in time")
            .expect("durable");
    }

    /// A first stream with `sync = never` and the README's shape (a filtered stream only).
    fn config() -> DurableConfig {
        let mut fast = StreamSpec::default_stream();
        fast.name = "fast".into();
        fast.filters = vec!["sensors/#".into()];
        fast.store.sync = SyncPolicy::Never;
        DurableConfig {
            streams: vec![fast],
            ..DurableConfig::default()
        }
    }

    /// Issue 11 item 7: the state streams sync under `state_sync` (default `always`), not the
    /// first stream's `never`: the subscription record a SUBACK waits for and the retained
    /// record a PUBACK waits for were fdatasync'ed, while the first stream never syncs.
    #[tokio::test]
    async fn state_streams_sync_on_their_own_policy_not_the_first_streams() {
        let dir = tempfile::tempdir().unwrap();
        let store = DurableStore::open(dir.path(), config()).unwrap();
        let [sessions, retained] = store.state_streams();
        assert_eq!(sessions.config().sync, SyncPolicy::Always);
        assert_eq!(retained.config().sync, SyncPolicy::Always);
        store.session_opened("s", Protocol::V5, 60, true);
        let options = SubscriptionOptions::default();
        durable(store.session_subscribed("s", "sensors/#", options, None)).await;
        assert!(sessions.metrics().syncs >= 1, "{:?}", sessions.metrics());
        let r = msg("sensors/r", b"v", QoS::AtLeastOnce, true);
        durable(store.retained_changed("sensors/r", Some(&r))).await;
        durable(store.retained_changed("sensors/r", None)).await;
        assert!(retained.metrics().syncs >= 1, "{:?}", retained.metrics());
        let m = msg("sensors/t", b"1", QoS::AtLeastOnce, false);
        durable(
            store
                .append_publish("pub", &m, None)
                .map(|a| a.record_on(&m)),
        )
        .await;
        let first = store.streams().next().unwrap();
        assert_eq!(first.name(), "fast");
        assert_eq!(
            first.metrics().syncs,
            0,
            "the first stream keeps its own `never`"
        );

        // And `state_sync` is what sets them.
        drop(store);
        let store = DurableStore::open(
            dir.path(),
            DurableConfig {
                state_sync: SyncPolicy::Never,
                ..config()
            },
        )
        .unwrap();
        assert_eq!(store.state_streams()[0].config().sync, SyncPolicy::Never);
    }

    /// Issue 11 item 4: a QoS 1 message to a topic no configured stream captures is written
    /// (to the default stream appended after the configured ones), so its PUBACK waits for it.
    #[tokio::test]
    async fn uncaptured_topic_is_written_to_the_default_stream() {
        let dir = tempfile::tempdir().unwrap();
        let store = DurableStore::open(dir.path(), config()).unwrap();
        let names: Vec<&str> = store.streams().map(|s| s.name()).collect();
        assert_eq!(names, vec!["fast", "messages"]);
        let m = msg("other/x", b"1", QoS::AtLeastOnce, false);
        durable(
            store
                .append_publish("pub", &m, None)
                .map(|a| a.record_on(&m)),
        )
        .await;
        assert_eq!(m.store_ref().map(|r| r.stream), Some(1));
        // `$` topics, which `#` would not capture, too.
        let m = msg("$app/x", b"1", QoS::AtLeastOnce, false);
        durable(
            store
                .append_publish("pub", &m, None)
                .map(|a| a.record_on(&m)),
        )
        .await;
        assert_eq!(m.store_ref().map(|r| r.stream), Some(1));
    }

    /// Only a persistent session's subscriptions are written (and waited for).
    #[tokio::test]
    async fn only_persistent_sessions_issue_subscription_writes() {
        let dir = tempfile::tempdir().unwrap();
        let store = DurableStore::open(dir.path(), DurableConfig::default()).unwrap();
        let options = SubscriptionOptions::default();
        assert!(
            store
                .session_subscribed("clean", "a", options, None)
                .is_none()
        );
        assert!(store.session_unsubscribed("clean", "a").is_none());
        store.session_opened("kept", Protocol::V3_1_1, u32::MAX, true);
        durable(store.session_subscribed("kept", "a", options, None)).await;
        durable(store.session_unsubscribed("kept", "a")).await;
    }
}
