//! Scripted probe for finding 13 of docs/simulation.md: a 3.1.1 publisher refused at a bound
//! is closed without an ack (it has no negative PUBACK), and the acknowledgements of what the
//! connection accepted just before must still go out before the close. Without them the
//! client resends those messages on every connection, each resend is followed by the next
//! refused message, and the exchange never ends: a livelock (seed 68 at the memory cap when
//! found; seed 520 of 1,000 on this code).

use std::time::Duration;

use tern_broker::{DurableConfig, StreamSpec};
use tern_store::sim::{SimConfig, SimDisk};
use tern_wire::{Packet, Properties, Protocol, Publish, QoS};

use super::client::{Conn, persistent_connect, s};
use super::tcp::{boot, kill, net};

/// The message stream's blocks: the smallest allowed. A written active block counts whole
/// against the budget (it is reserved, ARCHITECTURE §4), so the budget must pass one block
/// whether the measure has seen the control records' reservation or not.
const BLOCK_BYTES: u64 = 4096;
/// The disk budget: above one reserved block (plus the connection's control records), below
/// a fresh store's message stream plus [`FIRST_BYTES`].
const BUDGET_BYTES: u64 = BLOCK_BYTES + 512;
/// The first message: accepted (the budget is not reached yet), and its estimate reaches it.
const FIRST_BYTES: usize = 5000;

/// A 3.1.1 QoS 1 PUBLISH (id 1, large) whose write is held, then a second (id 2) that the
/// disk budget refuses, so the broker closes the connection; the held write is then let
/// go. Returns the packets the client got before the close (MQTT-3.3.4-1: the PUBLISH
/// accepted and made durable is acknowledged).
pub fn probe_acks_before_a_refusal_close() -> Vec<Packet> {
    let dir = tempfile::tempdir().expect("tempdir");
    let disk = SimDisk::new(dir.path(), 1, SimConfig::default());
    let net = net(&disk);
    let mut stream = StreamSpec::default_stream();
    stream.store.block_size_bytes = BLOCK_BYTES;
    let config = DurableConfig {
        streams: vec![stream],
        max_disk_bytes: Some(BUDGET_BYTES),
        ..DurableConfig::default()
    };
    let b = boot(&disk, dir.path(), &config, &net).expect("boot");
    let clients = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let publish = |packet_id: u16, payload: Vec<u8>| {
        Packet::Publish(Publish {
            dup: false,
            qos: QoS::AtLeastOnce,
            retain: false,
            topic: s("probe/t"),
            packet_id,
            properties: Properties::default(),
            payload: payload.into(),
        })
    };
    let got = clients.block_on(async {
        let connect = persistent_connect(Protocol::V3_1_1, "probe-close");
        let mut c = Conn::connect(&net, connect).await.expect("connect");
        let mut first = b"0:0:".to_vec();
        first.resize(FIRST_BYTES, b'x');
        disk.hold_next_write_containing(&dir.path().join("streams").join("messages"), b"0:0:");
        // Both at once: the first's write is held whenever it comes (the hold is armed), so
        // the second is always read while the first is not durable. Sent one after the other
        // the broker read them far apart under load, and a measure of the disk in between
        // (every 25 ms: it sees the reserved block, not the held write, and forgets the
        // estimate of the first) let the second through.
        assert!(c.send(&publish(1, first)).await);
        assert!(c.send(&publish(2, b"0:1:".to_vec())).await);
        assert!(
            // Blocking is fine here: the broker runs on its own runtime.
            disk.wait_held(Duration::from_secs(2)),
            "the write was not held"
        );
        // Not an assertion on time: the close path waits for the held write meanwhile.
        tokio::time::sleep(Duration::from_millis(200)).await;
        disk.release();
        let mut got = Vec::new();
        while let Ok(packet) = c.recv(Duration::from_secs(5)).await {
            match packet {
                Some(p) => got.push(p),
                None => panic!("the refused connection was not closed: {got:?}"),
            }
        }
        got
    });
    kill(b, &net);
    got
}
