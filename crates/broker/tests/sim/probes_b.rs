//! Scripted probes for findings 5 and 8 of docs/simulation.md: a QoS 2 exchange must never
//! start on a message retention already removed (`--retention`; seeds 28, 87, 473, 513, ...),
//! and reclamation must keep what a share group still holds (`--groups`; seeds 343, 50).

use std::sync::Arc;
use std::time::Duration;

use tern_broker::{DurableConfig, StreamSpec};
use tern_store::sim::{SimConfig, SimDisk};
use tern_wire::{Ack, Packet, Properties, Protocol, Publish, QoS, ReasonCode};

use super::client::{Conn, Net, persistent_connect, s};
use super::tcp::{boot, kill, net};

/// Messages the stream keeps (`max_msgs`).
const MAX_MSGS: u64 = 8;
/// Messages published while the subscriber is away: most of them are removed.
const BURST: u16 = 40;

fn ack(packet_id: u16) -> Packet {
    Packet::PubRel(Ack {
        packet_id,
        reason: ReasonCode::SUCCESS,
        properties: Properties::default(),
    })
}

/// The packet ids of the QoS 2 PUBLISHes (with DUP if `dup`) `c` gets until 300 ms pass
/// without one (or the connection ends).
async fn publishes(c: &mut Conn, dup: bool) -> Vec<u16> {
    publishes_with_payloads(c, dup)
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect()
}

/// [`publishes`] with each one's payload.
async fn publishes_with_payloads(c: &mut Conn, dup: bool) -> Vec<(u16, bytes::Bytes)> {
    let mut got = Vec::new();
    while let Ok(Some(p)) = c.recv(Duration::from_millis(300)).await {
        if let Packet::Publish(p) = p {
            if p.qos == QoS::ExactlyOnce && p.dup == dup {
                got.push((p.packet_id, p.payload));
            }
        }
    }
    got
}

/// Subscribes `c` to `filter` at QoS 2 and waits for the SUBACK.
async fn subscribe(c: &mut Conn, filter: &str) {
    let subscribe = tern_wire::Subscribe {
        packet_id: 1,
        properties: Properties::default(),
        filters: vec![(
            s(filter),
            tern_wire::SubscriptionOptions {
                qos: QoS::ExactlyOnce,
                ..Default::default()
            },
        )],
    };
    assert!(c.send(&Packet::Subscribe(subscribe)).await);
    loop {
        match c.recv(Duration::from_secs(2)).await {
            Ok(Some(Packet::SubAck(_))) => break,
            Ok(Some(_)) => {}
            _ => panic!("no SUBACK"),
        }
    }
}

/// Publishes `n` QoS 2 messages `0:{i}:` (padded with `pad` bytes) to `probe/t` and
/// completes their exchanges.
async fn publish_burst(net: &Arc<Net>, n: u16, pad: usize) {
    let mut p = Conn::connect(net, persistent_connect(Protocol::V5, "probe-pub"))
        .await
        .expect("publisher connects");
    for packet_id in 1..=n {
        let mut payload = format!("0:{packet_id}:").into_bytes();
        payload.resize(payload.len() + pad, b'.');
        let publish = Publish {
            dup: false,
            qos: QoS::ExactlyOnce,
            retain: false,
            topic: s("probe/t"),
            packet_id,
            properties: Properties::default(),
            payload: payload.into(),
        };
        assert!(p.send(&Packet::Publish(publish)).await);
    }
    let mut completed = 0;
    while completed < n {
        match p.recv(Duration::from_secs(3)).await {
            Ok(Some(Packet::PubRec(a))) => assert!(p.send(&ack(a.packet_id)).await),
            Ok(Some(Packet::PubComp(_))) => completed += 1,
            Ok(Some(_)) => {}
            _ => panic!("the publisher's exchanges did not complete ({completed})"),
        }
    }
}

/// A persistent QoS 2 subscriber is away while a publisher sends [`BURST`] QoS 2 messages
/// under `max_msgs` = [`MAX_MSGS`]: retention removes most of them from the store while
/// their copies wait in the session's queue (the checkpoint drops such copies every 25 ms).
/// The subscriber comes back at once, so it may take copies the checkpoint has not dropped
/// yet, and holds every PUBLISH it gets (no PUBREC); then the broker crashes. Returns the
/// packet ids the subscriber holds that the restarted broker does not resend: exchanges
/// the broker forgot (MQTT-4.4.0-1); empty when correct.
pub fn probe_exchange_on_removed_message_is_resent() -> Vec<u16> {
    let dir = tempfile::tempdir().expect("tempdir");
    let disk = SimDisk::new(dir.path(), 5, SimConfig::default());
    let net = net(&disk);
    let mut spec = StreamSpec::default_stream();
    spec.store.block_size_bytes = 8 * 1024;
    spec.store.limits.max_msgs = Some(MAX_MSGS);
    let config = DurableConfig {
        streams: vec![spec],
        ..DurableConfig::default()
    };
    let first = boot(&disk, dir.path(), &config, &net).expect("boot");
    let clients = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let sub = || persistent_connect(Protocol::V5, "probe-sub");
    let held = clients.block_on(async {
        let mut c = Conn::connect(&net, sub())
            .await
            .expect("subscriber connects");
        subscribe(&mut c, "probe/#").await;
        drop(c);
        // The first floors are set (the store opens pinned) before anything is published.
        tokio::time::sleep(Duration::from_millis(400)).await;
        publish_burst(&net, BURST, 0).await;
        let mut c = Conn::connect(&net, sub())
            .await
            .expect("subscriber returns");
        let held = publishes(&mut c, false).await;
        disk.crash();
        held
    });
    kill(first, &net);
    assert!(!held.is_empty(), "the subscriber got nothing");
    let second = boot(&disk, dir.path(), &config, &net).expect("restart");
    let resent = clients.block_on(async {
        let mut c = Conn::connect(&net, sub())
            .await
            .expect("subscriber reconnects");
        publishes(&mut c, true).await
    });
    kill(second, &net);
    held.into_iter().filter(|id| !resent.contains(id)).collect()
}

/// Messages queued for the share group in [`probe_group_queue_survives_reclamation`].
pub const GROUP_BURST: u16 = 20;

/// A share group's only member is away while [`GROUP_BURST`] QoS 2 messages of 1 KB fill
/// several 4 KiB blocks: they wait in the group's queue, held by the group's cursor alone
/// (the member's own cursor passes them). Reclamation runs (two passes), the member comes
/// back and holds every PUBLISH it gets, the broker crashes, and the member reconnects.
/// Returns (packet ids held but not resent after the restart, distinct messages the member
/// got in all): correct is (none, all of them).
pub fn probe_group_queue_survives_reclamation() -> (Vec<u16>, usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let disk = SimDisk::new(dir.path(), 8, SimConfig::default());
    let net = net(&disk);
    let mut spec = StreamSpec::default_stream();
    spec.store.block_size_bytes = 4 * 1024;
    let config = DurableConfig {
        streams: vec![spec],
        ..DurableConfig::default()
    };
    let first = boot(&disk, dir.path(), &config, &net).expect("boot");
    let clients = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let member = || persistent_connect(Protocol::V5, "probe-member");
    let held = clients.block_on(async {
        let mut c = Conn::connect(&net, member())
            .await
            .expect("member connects");
        subscribe(&mut c, "$share/g/probe/#").await;
        drop(c);
        publish_burst(&net, GROUP_BURST, 1000).await;
        // Floors computed at one pass (every 250 ms) are applied at the next.
        tokio::time::sleep(Duration::from_millis(800)).await;
        let mut c = Conn::connect(&net, member()).await.expect("member returns");
        let held = publishes_with_payloads(&mut c, false).await;
        disk.crash();
        held
    });
    kill(first, &net);
    let second = boot(&disk, dir.path(), &config, &net).expect("restart");
    let resent = clients.block_on(async {
        let mut c = Conn::connect(&net, member())
            .await
            .expect("member reconnects");
        publishes_with_payloads(&mut c, true).await
    });
    kill(second, &net);
    let forgotten = held
        .iter()
        .map(|(id, _)| *id)
        .filter(|id| !resent.iter().any(|(r, _)| r == id))
        .collect();
    let mut got: Vec<&bytes::Bytes> = held.iter().chain(&resent).map(|(_, p)| p).collect();
    got.sort();
    got.dedup();
    (forgotten, got.len())
}
