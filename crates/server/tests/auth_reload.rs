//! Issue 24 item 2: a reload (SIGHUP) of the password file and the ACL reaches what the old
//! rules let in. A connected client whose password the new file no longer accepts, or whose
//! user is gone, is disconnected (v5 DISCONNECT 0x87 Not authorized; 3.1.1: closed), as
//! mosquitto does; one whose entry is unchanged stays. Messages queued for an offline session
//! before the reload are checked against the new ACL when it applies: one the session may no
//! longer read is not delivered (before, the ACL was checked only when a message was queued).

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::raw::*;
use common::{Broker, WAIT};

/// Sets `user`'s password (the file is made by the first call).
fn passwd(file: &Path, user: &str, password: &str, create: bool) {
    let mut cmd = common::tools::tool("mosquitto_passwd");
    if create {
        cmd.arg("-c");
    }
    let out = cmd
        .arg("-b")
        .arg(file)
        .args([user, password])
        .output()
        .expect("mosquitto_passwd");
    assert!(out.status.success(), "{out:?}");
}

fn start(dir: &Path, acl: &str) -> Broker {
    let file = dir.join("passwd");
    for (i, user) in ["alice", "bob", "carol"].iter().enumerate() {
        passwd(&file, user, user, i == 0);
    }
    std::fs::write(dir.join("acl"), acl).expect("write acl");
    Broker::start_with(&format!(
        "[auth]\npassword_file = \"{}\"\nacl_file = \"{}\"\n",
        file.display(),
        dir.join("acl").display()
    ))
}

fn credentials(mut c: Connect, user: &str) -> Connect {
    c.username = Some(s(user));
    c.password = Some(bytes::Bytes::copy_from_slice(user.as_bytes()));
    c
}

async fn client(b: &Broker, protocol: Protocol, user: &str) -> RawClient {
    let c = credentials(connect_packet(protocol, user, true, 0), user);
    RawClient::connect_ok(b.addr, c).await.0
}

/// Waits until the broker logged `needle` (the reload runs on its own after SIGHUP).
async fn logged(b: &Broker, needle: &str) {
    let deadline = Instant::now() + WAIT;
    while !b.log_tail(50).contains(needle) {
        assert!(
            Instant::now() < deadline,
            "never logged {needle:?}:\n{}",
            b.log_tail(50)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn sighup_disconnects_clients_whose_password_no_longer_matches_or_whose_user_is_gone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = start(dir.path(), "user alice\ntopic readwrite #\n");
    let mut alice = client(&b, Protocol::V5, "alice").await;
    let mut bob = client(&b, Protocol::V5, "bob").await;
    let mut carol = client(&b, Protocol::V3_1_1, "carol").await;
    let file = dir.path().join("passwd");
    passwd(&file, "alice", "changed", false);
    let out = common::tools::tool("mosquitto_passwd")
        .arg("-D")
        .arg(&file)
        .arg("carol")
        .output()
        .expect("mosquitto_passwd -D");
    assert!(out.status.success(), "{out:?}");
    b.signal(libc::SIGHUP);
    // MQTT-3.14.2-1 / §4.13: the reason is a DISCONNECT reason code; 0x86 exists for CONNACK
    // only, so a refused password is 0x87 Not authorized.
    assert_eq!(alice.expect_disconnect().await, ReasonCode::NOT_AUTHORIZED);
    // 3.1.1 has no DISCONNECT from the server: the connection is closed.
    carol.expect_closed().await;
    // Bob's entry did not change: still connected, and his old password still works.
    assert!(bob.ping().await.is_empty());
    let (_again, ack) = RawClient::connect_ok(
        b.addr,
        credentials(connect_packet(Protocol::V5, "bob-2", true, 0), "bob"),
    )
    .await;
    assert_eq!(ack.reason, ReasonCode::SUCCESS);
    logged(&b, "client disconnected").await;
}

#[tokio::test]
async fn sighup_drops_queued_messages_the_new_acl_forbids() {
    let dir = tempfile::tempdir().expect("tempdir");
    let acl = "user alice\ntopic read t/#\nuser bob\ntopic readwrite t/#\n";
    let b = start(dir.path(), acl);
    let mut persistent = connect_packet(Protocol::V5, "alice", false, 0);
    persistent.properties.session_expiry_interval_s = Some(600);
    let persistent = credentials(persistent, "alice");
    let (mut alice, _) = RawClient::connect_ok(b.addr, persistent.clone()).await;
    alice.sub("t/#", 1).await;
    alice.disconnect().await;
    let mut bob = client(&b, Protocol::V5, "bob").await;
    bob.publish_acked(publish("t/kept", b"1", 1, 1)).await;
    bob.publish_acked(publish("t/secret", b"2", 1, 2)).await;
    bob.publish_acked(publish("t/kept", b"3", 1, 3)).await;
    // Alice may read t/kept only from now on; t/secret is queued for her already.
    std::fs::write(
        dir.path().join("acl"),
        "user alice\ntopic read t/kept\nuser bob\ntopic readwrite t/#\n",
    )
    .expect("write acl");
    b.signal(libc::SIGHUP);
    logged(&b, "reloaded rules applied").await;
    let (mut alice, ack) = RawClient::connect_ok(b.addr, persistent).await;
    assert!(ack.session_present);
    let mut got = Vec::new();
    for _ in 0..2 {
        let m = alice.receive_acked().await;
        got.push((m.topic.to_string(), m.payload.to_vec()));
    }
    assert_eq!(
        got,
        [
            ("t/kept".to_string(), b"1".to_vec()),
            ("t/kept".to_string(), b"3".to_vec())
        ]
    );
    assert!(alice.ping().await.is_empty(), "t/secret was delivered");
}
