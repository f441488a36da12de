//! Scripted probe for finding 6 (docs/simulation.md): acknowledgements after a disk error
//! under a running broker.

use std::time::Duration;

use tern_broker::DurableConfig;
use tern_store::sim::{FaultAction, OpKind, ScriptedFault, SimConfig, SimDisk};
use tern_wire::{Packet, Properties, Protocol, Publish, QoS};

use super::client::{Conn, persistent_connect, s};
use super::tcp::{boot, kill, net};

/// What seeds 21, 54 and 97 found with `--eio`: the message stream fails (EIO on an
/// fdatasync); a QoS 2 PUBLISH that arrives afterwards is refused by the store at once, but
/// its packet id had already gone into the session's received set, with no record for a
/// retry to wait on. The publisher reconnects and resends it (DUP): the broker took the
/// resend for a retry of a recorded exchange and PUBREC'd it with nothing durable, and a
/// power loss then lost an acknowledged message. Returns whether that PUBREC was sent.
pub fn probe_pubrec_for_a_refused_write() -> bool {
    let dir = tempfile::tempdir().expect("tempdir");
    let disk = SimDisk::new(dir.path(), 6, SimConfig::default());
    let net = net(&disk);
    let b = boot(&disk, dir.path(), &DurableConfig::default(), &net).expect("boot");
    let clients = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let publish = |packet_id, dup| {
        Packet::Publish(Publish {
            dup,
            qos: QoS::ExactlyOnce,
            retain: false,
            topic: s("probe/eio"),
            packet_id,
            properties: Properties::default(),
            payload: bytes::Bytes::from(format!("0:{packet_id}:")),
        })
    };
    let pubrec = clients.block_on(async {
        let connect = || persistent_connect(Protocol::V5, "eio-probe");
        let mut c = Conn::connect(&net, connect()).await.expect("connect");
        disk.update_config(|cfg| {
            cfg.faults.push(ScriptedFault {
                op: OpKind::Sync,
                path_contains: "streams/messages/".into(),
                nth: 1,
                action: FaultAction::Eio,
            })
        });
        // The first message's fdatasync fails: the stream refuses every write from now on.
        assert!(c.send(&publish(1, false)).await);
        assert!(
            pubrec_or_close(&mut c, 1).await.is_none(),
            "PUBREC for a message whose fdatasync failed"
        );
        assert!(disk.stats().sync_errors > 0, "the fdatasync did not fail");
        // A new message on a new connection: refused at once, not acknowledged.
        let mut c = Conn::connect(&net, connect()).await.expect("reconnect");
        assert!(c.send(&publish(2, false)).await);
        assert!(
            pubrec_or_close(&mut c, 2).await.is_none(),
            "PUBREC for a message the store refused"
        );
        // Its resend must not be acknowledged either.
        let Some(mut c) = Conn::connect(&net, connect()).await else {
            return false;
        };
        assert!(c.send(&publish(2, true)).await);
        pubrec_or_close(&mut c, 2).await.is_some()
    });
    kill(b, &net);
    pubrec
}

/// Reads until a PUBREC for `packet_id` (returned), the connection's end or 2 s (`None`).
async fn pubrec_or_close(c: &mut Conn, packet_id: u16) -> Option<Packet> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while tokio::time::Instant::now() < deadline {
        match c.recv(Duration::from_millis(50)).await {
            Ok(Some(Packet::PubRec(a))) if a.packet_id == packet_id => {
                return Some(Packet::PubRec(a));
            }
            Err(()) => return None,
            _ => {}
        }
    }
    None
}
