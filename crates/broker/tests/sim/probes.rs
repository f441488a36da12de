//! Scripted probes: one scenario each, for a bug a seed found (its regression test), driven
//! step by step rather than drawn from a seed.

use std::time::Duration;

use tern_broker::DurableConfig;
use tern_store::sim::{SimConfig, SimDisk};
use tern_wire::Protocol;

use super::client::ack;
use super::probes_a::until;
use super::tcp::{boot, kill, net};

/// Probe for the QoS 2 received-set bug without any disk error (docs/simulation.md,
/// finding 1): a QoS 2 PUBLISH whose write is held pending in the disk, its connection lost,
/// and the same PUBLISH resent (DUP) on a new connection. Returns whether the broker sent
/// PUBREC for the resend while the first write was still pending (not durable).
pub fn probe_retry_while_write_pending() -> bool {
    use super::client::{Conn, persistent_connect, s};
    use tern_wire::{Packet, Properties, Publish, QoS};
    let dir = tempfile::tempdir().expect("tempdir");
    let disk = SimDisk::new(dir.path(), 1, SimConfig::default());
    let net = net(&disk);
    let b = boot(&disk, dir.path(), &DurableConfig::default(), &net).expect("boot");
    let clients = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let publish = |dup| {
        Packet::Publish(Publish {
            dup,
            qos: QoS::ExactlyOnce,
            retain: false,
            topic: s("probe/t"),
            packet_id: 7,
            properties: Properties::default(),
            payload: bytes::Bytes::from_static(b"0:0:"),
        })
    };
    let pubrec_while_pending = clients.block_on(async {
        let connect = || persistent_connect(Protocol::V5, "probe");
        let mut c = Conn::connect(&net, connect()).await.expect("connect");
        // The message's own record (not a control record the writer reaches first).
        disk.hold_next_write_containing(&dir.path().join("streams").join("messages"), b"0:0:");
        assert!(c.send(&publish(false)).await);
        assert!(
            // Blocking is fine here: the broker runs on its own runtime.
            disk.wait_held(Duration::from_secs(2)),
            "the write was not held"
        );
        drop(c);
        // The resend follows the CONNECT at once: the new connection does not read it before
        // the old connection is done (finding 3), and its PUBREC must not come before the
        // write is durable either way.
        let mut c = Conn::open(&net, connect()).await.expect("reconnect");
        assert!(c.send(&publish(true)).await);
        let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
        loop {
            match c.recv(Duration::from_millis(50)).await {
                Ok(Some(Packet::PubRec(a))) if a.packet_id == 7 => break true,
                Err(()) => break false,
                _ if tokio::time::Instant::now() > deadline => break false,
                _ => {}
            }
        }
    });
    disk.release();
    kill(b, &net);
    pubrec_while_pending
}

/// The share-group bug seed 60 found: a group's QoS 2 message that waited in the group's
/// queue while its member was offline lies below the member's own session cursor (the
/// group's cursor held it, the member's did not). The member comes back and gets it in
/// flight (its `p` record durable), and the broker crashes before the next checkpoint. At
/// start-up the exchange was taken for stale (below the member's cursor) and dropped, while
/// the group's replay skipped the message because of that exchange: the message was lost
/// and the member's packet id never released. Returns whether, after the restart, the member
/// got the message again (PUBLISH with DUP under the same packet id).
pub fn probe_group_message_in_flight_survives_restart() -> bool {
    use super::client::{Conn, persistent_connect, s};
    use tern_wire::{Packet, Properties, Publish, QoS, Subscribe};
    let dir = tempfile::tempdir().expect("tempdir");
    let disk = SimDisk::new(dir.path(), 2, SimConfig::default());
    let net = net(&disk);
    let config = DurableConfig::default();
    let first = boot(&disk, dir.path(), &config, &net).expect("boot");
    let clients = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let member = || persistent_connect(Protocol::V5, "member");
    let sent = clients.block_on(async {
        let mut m = Conn::connect(&net, member())
            .await
            .expect("member connects");
        let sub = Subscribe {
            packet_id: 1,
            properties: Properties::default(),
            filters: vec![(
                s("$share/g/probe/#"),
                tern_wire::SubscriptionOptions {
                    qos: QoS::ExactlyOnce,
                    ..Default::default()
                },
            )],
        };
        assert!(m.send(&Packet::Subscribe(sub)).await);
        until(&mut m, |p| matches!(p, Packet::SubAck(_)))
            .await
            .expect("SUBACK");
        drop(m); // offline: the next message waits in the group's queue
        let mut p = Conn::connect(&net, persistent_connect(Protocol::V5, "publisher"))
            .await
            .expect("publisher connects");
        let publish = Packet::Publish(Publish {
            dup: false,
            qos: QoS::ExactlyOnce,
            retain: false,
            topic: s("probe/t"),
            packet_id: 1,
            properties: Properties::default(),
            payload: bytes::Bytes::from_static(b"0:0:"),
        });
        assert!(p.send(&publish).await);
        until(&mut p, |p| matches!(p, Packet::PubRec(_)))
            .await
            .expect("PUBREC");
        assert!(p.send(&Packet::PubRel(ack(1))).await);
        until(&mut p, |p| matches!(p, Packet::PubComp(_)))
            .await
            .expect("PUBCOMP");
        // Checkpoints pass: the member's cursor moves past the message the group holds.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut m = Conn::connect(&net, member())
            .await
            .expect("member reconnects");
        let got = until(&mut m, |p| matches!(p, Packet::Publish(_))).await;
        // The crash comes before the next checkpoint (every 25 ms).
        disk.crash();
        match got {
            Some(Packet::Publish(p)) => Some(p.packet_id),
            _ => None,
        }
    });
    kill(first, &net);
    let Some(packet_id) = sent else {
        panic!("the group's message did not reach its member");
    };
    let second = boot(&disk, dir.path(), &config, &net).expect("restart");
    let resent = clients.block_on(async {
        let mut m = Conn::connect(&net, member()).await.expect("member reconnects");
        until(&mut m, |p| {
            matches!(p, Packet::Publish(p) if p.packet_id == packet_id && p.dup && &p.payload[..] == b"0:0:")
        })
        .await
        .is_some()
    });
    kill(second, &net);
    resent
}

/// The retained bug seeds 217, 823, ... found (docs/simulation.md, finding 7): the PUBREC of a
/// retained QoS 2 message waits for its message record and its `tern.retained` record. A
/// power loss keeps the first (with the rx record that makes a resend a retry) and loses the
/// second; after the restart the publisher's resend is PUBREC'd as a retry, and the retained
/// value must then be this message. Returns the retained payload a new client gets at the
/// end (`None`: no retained message).
pub fn probe_retained_qos2_retry_after_power_loss() -> Option<bytes::Bytes> {
    use super::client::{Conn, clean_connect, persistent_connect, s};
    use tern_wire::{Packet, Properties, Publish, QoS, Subscribe, SubscriptionOptions};
    let dir = tempfile::tempdir().expect("tempdir");
    let disk = SimDisk::new(dir.path(), 3, SimConfig::default());
    let net = net(&disk);
    let config = DurableConfig::default();
    let first = boot(&disk, dir.path(), &config, &net).expect("boot");
    let clients = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let publish = |dup| {
        Packet::Publish(Publish {
            dup,
            qos: QoS::ExactlyOnce,
            retain: true,
            topic: s("probe/r"),
            packet_id: 9,
            properties: Properties::default(),
            payload: bytes::Bytes::from_static(b"0:1:"),
        })
    };
    let publisher = || persistent_connect(Protocol::V5, "retainer");
    clients.block_on(async {
        let mut p = Conn::connect(&net, publisher()).await.expect("connect");
        // The retained record's write is held; the message record is durable before it is
        // issued (QoS 2 is released only once durable), then the power fails.
        disk.hold_next_write_containing(&dir.path().join("streams").join("tern.retained"), b"0:1:");
        assert!(p.send(&publish(false)).await);
        assert!(
            disk.wait_held(Duration::from_secs(2)),
            "the retained write was not held"
        );
        disk.power_loss();
    });
    disk.release();
    kill(first, &net);
    let second = boot(&disk, dir.path(), &config, &net).expect("restart");
    let retained = clients.block_on(async {
        let mut p = Conn::connect(&net, publisher()).await.expect("reconnect");
        assert!(p.send(&publish(true)).await);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        let mut acknowledged = false;
        while tokio::time::Instant::now() < deadline && !acknowledged {
            if let Ok(Some(Packet::PubRec(a))) = p.recv(Duration::from_millis(50)).await {
                acknowledged = a.packet_id == 9 && a.reason.is_success();
            }
        }
        assert!(acknowledged, "the resend was not acknowledged");
        let mut c = Conn::connect(&net, clean_connect(Protocol::V5, "reader"))
            .await
            .expect("reader connects");
        let sub = Subscribe {
            packet_id: 1,
            properties: Properties::default(),
            filters: vec![(s("probe/r"), SubscriptionOptions::default())],
        };
        assert!(c.send(&Packet::Subscribe(sub)).await);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
        while tokio::time::Instant::now() < deadline {
            if let Ok(Some(Packet::Publish(m))) = c.recv(Duration::from_millis(50)).await {
                if m.retain {
                    return Some(m.payload);
                }
            }
        }
        None
    });
    kill(second, &net);
    retained
}
