//! The ACL file (mosquitto's syntax), with a password file made by mosquitto_passwd: every
//! path, with mosquitto_sub/mosquitto_pub and raw clients for the exact codes. Denials:
//! SUBACK 0x87 (v5) / 0x80 (3.1.1 §3.9.3: the failure return code); PUBLISH: v5
//! PUBACK/PUBREC 0x87, 3.1.1 acknowledged and dropped; delivery checked per topic. Plus SIGHUP:
//! new rules apply to connected clients, a bad file keeps the old ones.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::raw::*;
use common::{Broker, QUIET, WAIT};

const ACL: &str = "\
# Lines before the first `user`: anonymous clients.
topic read public/#

user alice
topic readwrite alice/#
topic deny alice/secret

user bob
topic read alice/#
topic deny alice/private
topic read $SYS/#

user carol
topic read #

pattern readwrite devices/%c/#
pattern read inbox/%u/#
";

/// Starts a broker with the ACL above and a mosquitto_passwd file (alice, bob, carol; the
/// password is the name). `$SYS` every second.
fn start(dir: &Path, acl: &str) -> Broker {
    let passwd = dir.join("passwd");
    let p = passwd.to_str().expect("utf-8");
    for (i, user) in ["alice", "bob", "carol"].iter().enumerate() {
        let mut cmd = common::tools::tool("mosquitto_passwd");
        if i == 0 {
            cmd.arg("-c");
        }
        let out = cmd
            .args(["-b", p, user, user])
            .output()
            .expect("mosquitto_passwd");
        assert!(out.status.success(), "{out:?}");
    }
    std::fs::write(dir.join("acl"), acl).expect("write acl");
    Broker::start_with(&format!(
        "[sys]\ninterval_s = 1\n[auth]\npassword_file = \"{}\"\nacl_file = \"{}\"\n",
        passwd.display(),
        dir.join("acl").display()
    ))
}

async fn client(b: &Broker, protocol: Protocol, id: &str, user: Option<&str>) -> RawClient {
    let mut c = connect_packet(protocol, id, true, 0);
    c.username = user.map(s);
    c.password = user.map(|u| bytes::Bytes::copy_from_slice(u.as_bytes()));
    RawClient::connect_ok(b.addr, c).await.0
}

async fn suback(c: &mut RawClient, filter: &str) -> ReasonCode {
    c.subscribe(subscribe(7, &[(filter, opts(1))])).await[0]
}

/// Publishes at `qos_level` (1 or 2) and returns the PUBACK / PUBREC reason.
async fn pub_reason(c: &mut RawClient, topic: &str, qos_level: u8) -> ReasonCode {
    c.send(&Packet::Publish(publish(topic, b"x", qos_level, 9)))
        .await;
    match c.expect_non_publish().await {
        Packet::PubAck(a) | Packet::PubRec(a) => {
            if qos_level == 2 && a.reason.is_success() {
                c.send(&Packet::PubRel(ack(9))).await;
                assert!(matches!(c.expect_non_publish().await, Packet::PubComp(_)));
            }
            a.reason
        }
        other => panic!("expected an ack, got {}", brief(&other)),
    }
}

#[tokio::test]
async fn subscribe_denials_v5_0x87_and_v3_0x80_with_user_anonymous_and_pattern_rules() {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = start(dir.path(), ACL);
    for (protocol, denied) in [
        (Protocol::V5, ReasonCode::NOT_AUTHORIZED),
        (Protocol::V3_1_1, ReasonCode::UNSPECIFIED_ERROR),
    ] {
        let mut anon = client(&b, protocol, "anon", None).await;
        assert_eq!(
            suback(&mut anon, "public/#").await,
            ReasonCode(1),
            "{protocol:?}"
        );
        assert_eq!(suback(&mut anon, "alice/#").await, denied, "{protocol:?}");
        assert_eq!(suback(&mut anon, "#").await, denied, "{protocol:?}");
        let mut alice = client(&b, protocol, "a1", Some("alice")).await;
        assert_eq!(suback(&mut alice, "alice/#").await, ReasonCode(1));
        assert_eq!(
            suback(&mut alice, "alice/secret").await,
            denied,
            "deny wins"
        );
        assert_eq!(
            suback(&mut alice, "public/#").await,
            denied,
            "no anonymous rules"
        );
        // %u and %c patterns.
        assert_eq!(suback(&mut alice, "inbox/alice/#").await, ReasonCode(1));
        assert_eq!(suback(&mut alice, "inbox/bob/#").await, denied);
        assert_eq!(suback(&mut alice, "devices/a1/#").await, ReasonCode(1));
        assert_eq!(suback(&mut alice, "devices/a2/#").await, denied);
        assert_eq!(
            suback(&mut anon, "inbox/anon/#").await,
            denied,
            "%u needs a username"
        );
        assert_eq!(
            suback(&mut anon, "devices/anon/x").await,
            ReasonCode(1),
            "%c does not"
        );
        // $SYS only where a rule starting with $ allows it.
        let mut carol = client(&b, protocol, "c1", Some("carol")).await;
        assert_eq!(suback(&mut carol, "#").await, ReasonCode(1));
        assert_eq!(
            suback(&mut carol, "$SYS/#").await,
            denied,
            "`#` does not cover $SYS"
        );
        let mut bob = client(&b, protocol, "b1", Some("bob")).await;
        assert_eq!(suback(&mut bob, "$SYS/#").await, ReasonCode(1));
        let sys = bob.expect_publish().await;
        assert!(sys.topic.starts_with("$SYS/"), "{}", &*sys.topic);
    }
}

#[tokio::test]
async fn publish_denials_v5_0x87_and_v3_dropped_after_the_ack() {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = start(dir.path(), ACL);
    let mut watcher = client(&b, Protocol::V5, "w", Some("carol")).await;
    assert_eq!(suback(&mut watcher, "#").await, ReasonCode(1));

    let mut alice = client(&b, Protocol::V5, "a5", Some("alice")).await;
    assert_eq!(
        pub_reason(&mut alice, "alice/secret", 1).await,
        ReasonCode::NOT_AUTHORIZED
    );
    assert_eq!(
        pub_reason(&mut alice, "alice/secret", 2).await,
        ReasonCode::NOT_AUTHORIZED
    );
    assert_eq!(
        pub_reason(&mut alice, "public/x", 1).await,
        ReasonCode::NOT_AUTHORIZED
    );
    assert_eq!(
        pub_reason(&mut alice, "devices/a5/t", 1).await,
        ReasonCode::SUCCESS
    );
    assert_eq!(
        pub_reason(&mut alice, "devices/other/t", 1).await,
        ReasonCode::NOT_AUTHORIZED
    );
    assert_eq!(
        pub_reason(&mut alice, "alice/ok", 2).await,
        ReasonCode::SUCCESS
    );
    // 3.1.1: acknowledged (no reason codes), never delivered.
    let mut alice4 = client(&b, Protocol::V3_1_1, "a4", Some("alice")).await;
    assert_eq!(
        pub_reason(&mut alice4, "alice/secret", 1).await,
        ReasonCode::SUCCESS
    );
    alice4
        .send(&Packet::Publish(publish("alice/secret", b"x", 0, 0)))
        .await;
    alice4.publish_acked(publish("alice/end", b"x", 1, 3)).await;
    // The watcher (carol may read everything) saw only what was allowed, in order.
    let mut seen = Vec::new();
    while seen.last().map(String::as_str) != Some("alice/end") {
        seen.push(watcher.receive_acked().await.topic.to_string());
    }
    assert_eq!(seen, ["devices/a5/t", "alice/ok", "alice/end"]);
}

/// Reads a child's stdout lines into a channel.
fn lines_of(child: &mut std::process::Child) -> mpsc::Receiver<String> {
    let out = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

#[tokio::test]
async fn mosquitto_clients_see_only_what_the_acl_lets_them_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = start(dir.path(), ACL);
    let port = b.addr.port().to_string();
    // bob reads alice/# except alice/private: a delivery-time check on the concrete topic.
    let mut sub = common::tools::tool("mosquitto_sub")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-V",
            "mqttv311",
            "-u",
            "bob",
            "-P",
            "bob",
        ])
        .args(["-t", "alice/#", "-v", "-q", "1", "-W", "30"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("mosquitto_sub");
    let lines = lines_of(&mut sub);
    let mosquitto_pub = |topic: &str, msg: &str| {
        let out = common::tools::tool("mosquitto_pub")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-V",
                "mqttv5",
                "-u",
                "alice",
                "-P",
                "alice",
            ])
            .args(["-t", topic, "-m", msg, "-q", "1"])
            .output()
            .expect("mosquitto_pub");
        assert!(out.status.success(), "{out:?}");
    };
    // Until mosquitto_sub is subscribed, publish a marker.
    let deadline = Instant::now() + WAIT;
    loop {
        mosquitto_pub("alice/ready", "r");
        if let Ok(line) = lines.recv_timeout(Duration::from_millis(200)) {
            assert_eq!(line, "alice/ready r");
            break;
        }
        assert!(Instant::now() < deadline, "mosquitto_sub never subscribed");
    }
    while lines.try_recv().is_ok() {}
    mosquitto_pub("alice/private", "p");
    mosquitto_pub("alice/secret", "s"); // alice may not write it
    mosquitto_pub("alice/done", "d");
    let line = lines.recv_timeout(WAIT).expect("alice/done");
    let mut got = vec![line];
    while let Ok(line) = lines.recv_timeout(QUIET) {
        got.push(line);
    }
    let _ = sub.kill();
    let _ = sub.wait();
    let got: Vec<&str> = got
        .iter()
        .map(String::as_str)
        .filter(|l| *l != "alice/ready r")
        .collect();
    assert_eq!(got, ["alice/done d"]);
}

#[tokio::test]
async fn sighup_reloads_the_acl_without_dropping_connections_and_keeps_it_on_a_bad_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = start(dir.path(), ACL);
    let mut anon = client(&b, Protocol::V5, "anon-r", None).await;
    assert_eq!(
        pub_reason(&mut anon, "public/x", 1).await,
        ReasonCode::NOT_AUTHORIZED
    );
    std::fs::write(dir.path().join("acl"), "topic readwrite public/#\n").expect("write");
    b.signal(libc::SIGHUP);
    // Applied once the broker has re-read the file: retry on the same connection.
    let deadline = Instant::now() + WAIT;
    while pub_reason(&mut anon, "public/x", 1).await != ReasonCode::SUCCESS {
        assert!(Instant::now() < deadline, "the new ACL never applied");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A bad file: logged, the rules in force stay.
    std::fs::write(dir.path().join("acl"), "topic sometimes public/#\n").expect("write");
    b.signal(libc::SIGHUP);
    let deadline = Instant::now() + WAIT;
    while !b.log_tail(20).contains("reload failed") {
        assert!(
            Instant::now() < deadline,
            "no reload error logged:\n{}",
            b.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        pub_reason(&mut anon, "public/x", 1).await,
        ReasonCode::SUCCESS
    );
    let mut again = client(&b, Protocol::V5, "anon-2", None).await;
    assert_eq!(
        pub_reason(&mut again, "public/y", 1).await,
        ReasonCode::SUCCESS
    );
}
