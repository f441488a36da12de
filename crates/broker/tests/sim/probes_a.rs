//! Scripted probes for findings 3 and 4 (docs/simulation.md): a publisher's dropped connection
//! whose deliveries were overtaken by its next connection's, and a CONNACK sent before the
//! session's record was durable.

use std::time::Duration;

use bytes::Bytes;
use tern_broker::DurableConfig;
use tern_store::sim::{SimConfig, SimDisk};
use tern_wire::{Packet, Properties, Protocol, Publish, QoS, Subscribe, SubscriptionOptions};

use super::client::{Conn, ack, persistent_connect, s};
use super::tcp::{boot, kill, net};

fn publish(qos: QoS, packet_id: u16, payload: &'static [u8]) -> Packet {
    Packet::Publish(Publish {
        dup: false,
        qos,
        retain: false,
        topic: s("probe/order"),
        packet_id,
        properties: Properties::default(),
        payload: Bytes::from_static(payload),
    })
}

/// Until a packet `want` accepts comes (or the connection ends, or 2 s pass).
pub(super) async fn until(c: &mut Conn, want: impl Fn(&Packet) -> bool) -> Option<Packet> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while tokio::time::Instant::now() < deadline {
        match c.recv(Duration::from_millis(50)).await {
            Ok(Some(p)) if want(&p) => return Some(p),
            Err(()) => return None,
            _ => {}
        }
    }
    None
}

/// Finding 3 (`--pub-drops`, seeds 3, 14, 16, ...): a publisher's QoS 2 PUBLISH whose write is
/// pending (held in the disk) when the publisher drops its connection, then a QoS 1 PUBLISH on
/// the same topic on its next connection. The old connection's close path delivers the first
/// once its write is durable; the second, on the new connection, was routed at once, ahead of
/// it. Returns the payloads in the order a subscriber got them (first deliveries).
pub fn probe_reconnect_keeps_publisher_order() -> Vec<Bytes> {
    let dir = tempfile::tempdir().expect("tempdir");
    let disk = SimDisk::new(dir.path(), 4, SimConfig::default());
    let net = net(&disk);
    let b = boot(&disk, dir.path(), &DurableConfig::default(), &net).expect("boot");
    let clients = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let order = clients.block_on(async {
        let mut sub = Conn::connect(&net, persistent_connect(Protocol::V5, "sub"))
            .await
            .expect("subscriber connects");
        let subscribe = Subscribe {
            packet_id: 1,
            properties: Properties::default(),
            filters: vec![(
                s("probe/order"),
                SubscriptionOptions {
                    qos: QoS::AtLeastOnce,
                    ..Default::default()
                },
            )],
        };
        assert!(sub.send(&Packet::Subscribe(subscribe)).await);
        until(&mut sub, |p| matches!(p, Packet::SubAck(_)))
            .await
            .expect("SUBACK");
        let publisher = || persistent_connect(Protocol::V5, "pub");
        let mut old = Conn::connect(&net, publisher()).await.expect("connect");
        // The message's own record: a plain "next write" caught the `$tern/reset/pub` record
        // of the connect when a loaded machine wrote it late, and the connection was then
        // dropped before the broker had read the PUBLISH (1 run in ~30 under load).
        disk.hold_next_write_containing(&dir.path().join("streams").join("messages"), b"0:1:");
        assert!(old.send(&publish(QoS::ExactlyOnce, 1, b"0:1:")).await);
        assert!(
            // Blocking is fine here: the broker runs on its own runtime.
            disk.wait_held(Duration::from_secs(2)),
            "the write was not held"
        );
        drop(old); // at a packet boundary, no DISCONNECT
        let mut new = Conn::open(&net, publisher()).await.expect("reconnect");
        // Either the CONNACK comes while the first write is still held (the new connection may
        // publish before the old one's message is delivered), or it waits for it.
        let early = new.recv(Duration::from_millis(300)).await;
        let connack_early = matches!(early, Ok(Some(Packet::ConnAck(_))));
        eprintln!("DBG early={early:?}");
        if connack_early {
            assert!(new.send(&publish(QoS::AtLeastOnce, 2, b"0:2:")).await);
            // Routed at once (QoS 1 is not held for durability), unless something orders it.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        disk.release();
        if !connack_early {
            until(&mut new, |p| matches!(p, Packet::ConnAck(_)))
                .await
                .expect("CONNACK once the old connection's write is durable");
            assert!(new.send(&publish(QoS::AtLeastOnce, 2, b"0:2:")).await);
        }
        let mut order = Vec::new();
        while order.len() < 2 {
            let got = until(&mut sub, |p| matches!(p, Packet::Publish(_))).await;
            eprintln!("DBG sub got {got:?}");
            let Some(Packet::Publish(m)) = got else {
                break;
            };
            assert!(sub.send(&Packet::PubAck(ack(m.packet_id))).await);
            if !m.dup {
                order.push(m.payload);
            }
        }
        order
    });
    kill(b, &net);
    order
}

/// What [`probe_connack_then_power_loss`] saw.
#[derive(Debug, PartialEq, Eq)]
pub struct AfterPowerLoss {
    /// The publisher's Session Present on its reconnect after the power loss.
    pub session_present: bool,
    /// How many times the subscriber's application got the QoS 2 message (first deliveries).
    pub delivered: usize,
}

/// Finding 4 (seed 32, rare): the CONNACK of a new persistent session left before the session's
/// record was durable. The publisher then had a QoS 2 message PUBREC'd (its message and rx
/// records durable in the message stream), the power failed with the session record still
/// unwritten, and after the restart the session was gone: the rx record, of an incarnation
/// no session record names, was ignored, and the publisher's resend was taken as new. Here the
/// write of `tern.sessions` that the new session issues is held while the CONNACK may leave.
pub fn probe_connack_then_power_loss() -> AfterPowerLoss {
    let dir = tempfile::tempdir().expect("tempdir");
    let disk = SimDisk::new(dir.path(), 5, SimConfig::default());
    let net = net(&disk);
    let config = DurableConfig::default();
    let first = boot(&disk, dir.path(), &config, &net).expect("boot");
    let clients = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let subscriber = || persistent_connect(Protocol::V5, "sub");
    let publisher = || persistent_connect(Protocol::V3_1_1, "pub");
    let message = || publish(QoS::ExactlyOnce, 5, b"0:5:");
    let mut delivered = 0;
    clients.block_on(async {
        let mut sub = Conn::connect(&net, subscriber()).await.expect("subscriber");
        let subscribe = Subscribe {
            packet_id: 1,
            properties: Properties::default(),
            filters: vec![(
                s("probe/order"),
                SubscriptionOptions {
                    qos: QoS::ExactlyOnce,
                    ..Default::default()
                },
            )],
        };
        assert!(sub.send(&Packet::Subscribe(subscribe)).await);
        until(&mut sub, |p| matches!(p, Packet::SubAck(_)))
            .await
            .expect("SUBACK");
        // The publisher's session record (not a checkpoint of the subscriber's).
        disk.hold_next_write_containing(&dir.path().join("streams").join("tern.sessions"), b"pub");
        let mut p = Conn::open(&net, publisher()).await.expect("connect");
        let early = p.recv(Duration::from_millis(300)).await;
        if !matches!(early, Ok(Some(Packet::ConnAck(_)))) {
            // The CONNACK waits for the session's record: let it be written.
            disk.release();
            until(&mut p, |p| matches!(p, Packet::ConnAck(_)))
                .await
                .expect("CONNACK once the session record is durable");
        }
        assert!(p.send(&message()).await);
        until(&mut p, |p| matches!(p, Packet::PubRec(_)))
            .await
            .expect("PUBREC");
        delivered += qos2_deliveries(&mut sub).await;
        disk.power_loss();
    });
    disk.release();
    kill(first, &net);
    let second = boot(&disk, dir.path(), &config, &net).expect("restart");
    let session_present = clients.block_on(async {
        let mut sub = Conn::connect(&net, subscriber()).await.expect("subscriber");
        let mut p = Conn::connect(&net, publisher()).await.expect("reconnect");
        // The publisher resends what it had no PUBCOMP for (MQTT-4.4.0-1).
        let mut resend = message();
        if let Packet::Publish(m) = &mut resend {
            m.dup = true;
        }
        assert!(p.send(&resend).await);
        until(&mut p, |p| matches!(p, Packet::PubRec(_)))
            .await
            .expect("PUBREC of the resend");
        delivered += qos2_deliveries(&mut sub).await;
        p.session_present
    });
    kill(second, &net);
    AfterPowerLoss {
        session_present,
        delivered,
    }
}

/// The QoS 2 PUBLISHes a subscriber gets within 500 ms that are first deliveries (not DUP),
/// answering each exchange (PUBREC, then PUBCOMP).
async fn qos2_deliveries(sub: &mut Conn) -> usize {
    let mut first = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
    while tokio::time::Instant::now() < deadline {
        match sub.recv(Duration::from_millis(50)).await {
            Ok(Some(Packet::Publish(m))) => {
                first += usize::from(!m.dup);
                assert!(sub.send(&Packet::PubRec(ack(m.packet_id))).await);
            }
            Ok(Some(Packet::PubRel(a))) => {
                assert!(sub.send(&Packet::PubComp(ack(a.packet_id))).await);
            }
            Err(()) => break,
            _ => {}
        }
    }
    first
}

/// The will half of finding 4's fix: the CONNACK of a connection with a will waits for the
/// will's record too. A clean-start client connects with a retained will while the write of
/// `tern.sessions` is held, and the power fails once it has its CONNACK (its connection
/// never closed cleanly, so the will is owed). Returns what a client subscribed to the will's
/// topic after the restart gets (`None`: the will was lost).
pub fn probe_will_after_connack_and_power_loss() -> Option<Bytes> {
    use super::client::clean_connect;
    let dir = tempfile::tempdir().expect("tempdir");
    let disk = SimDisk::new(dir.path(), 6, SimConfig::default());
    let net = net(&disk);
    let config = DurableConfig::default();
    let first = boot(&disk, dir.path(), &config, &net).expect("boot");
    let clients = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    clients.block_on(async {
        let mut connect = clean_connect(Protocol::V5, "testament");
        connect.will = Some(tern_wire::Will {
            topic: s("probe/will"),
            payload: Bytes::from_static(b"gone"),
            qos: QoS::AtLeastOnce,
            retain: true,
            properties: Properties::default(),
        });
        disk.hold_next_write_containing(
            &dir.path().join("streams").join("tern.sessions"),
            b"testament",
        );
        let mut c = Conn::open(&net, connect).await.expect("connect");
        let early = c.recv(Duration::from_millis(300)).await;
        if !matches!(early, Ok(Some(Packet::ConnAck(_)))) {
            disk.release();
            until(&mut c, |p| matches!(p, Packet::ConnAck(_)))
                .await
                .expect("CONNACK once the will's record is durable");
        }
        disk.power_loss();
    });
    disk.release();
    kill(first, &net);
    let second = boot(&disk, dir.path(), &config, &net).expect("restart");
    let retained = clients.block_on(async {
        let mut reader = Conn::connect(&net, clean_connect(Protocol::V5, "reader"))
            .await
            .expect("reader connects");
        let subscribe = Subscribe {
            packet_id: 1,
            properties: Properties::default(),
            filters: vec![(s("probe/will"), SubscriptionOptions::default())],
        };
        assert!(reader.send(&Packet::Subscribe(subscribe)).await);
        // Retained if the will was published before the SUBSCRIBE, live if after (the restart
        // publishes it once its record's delete is durable).
        match until(&mut reader, |p| matches!(p, Packet::Publish(_))).await {
            Some(Packet::Publish(m)) => Some(m.payload),
            _ => None,
        }
    });
    kill(second, &net);
    retained
}
