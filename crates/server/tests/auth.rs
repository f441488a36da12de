//! Authentication: password files (mosquitto_passwd's `$6$` and `$7$`, `tern passwd`'s
//! argon2id), CONNACK refusals (MQTT-3.1.4-2 for a refused CONNECT; v5 §3.2.2.2 reason 0x86 / 0x87,
//! 3.1.1 return codes 4 / 5), the loopback default of `allow_anonymous`, and `tern passwd`.
//! Driven by mosquitto_pub and raw bytes.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::raw::*;
use common::{Broker, run_to_exit};

/// A password file with alice ($7$, mosquitto_passwd's default), bob ($6$, `-H sha512`) and
/// carol (argon2id, `tern passwd -b`), all made by the real tools.
fn password_file(dir: &Path) -> PathBuf {
    let path = dir.join("passwd");
    let p = path.to_str().expect("utf-8 path");
    let ok = |args: &[&str]| {
        let out = common::tools::tool("mosquitto_passwd")
            .args(args)
            .output()
            .expect("mosquitto_passwd (Debian package mosquitto) is installed");
        assert!(out.status.success(), "mosquitto_passwd {args:?}: {out:?}");
    };
    ok(&["-c", "-b", p, "alice", "secret"]);
    ok(&["-H", "sha512", "-b", p, "bob", "hunter2"]);
    let done = run_to_exit(&["passwd", "-b", p, "carol", "pw3"], dir, common::WAIT);
    assert!(done.status.success(), "tern passwd: {}", done.stderr);
    let text = std::fs::read_to_string(&path).expect("read passwd");
    assert!(text.contains("alice:$7$"), "{text}");
    assert!(text.contains("bob:$6$"), "{text}");
    assert!(text.contains("carol:$argon2id$"), "{text}");
    path
}

fn with_login(protocol: Protocol, id: &str, user: Option<&str>, pass: Option<&str>) -> Connect {
    let mut c = connect_packet(protocol, id, true, 0);
    c.username = user.map(s);
    c.password = pass.map(|p| bytes::Bytes::copy_from_slice(p.as_bytes()));
    c
}

async fn connack(b: &Broker, connect: Connect) -> ReasonCode {
    match RawClient::connect_with(b.addr, connect).await.1 {
        Packet::ConnAck(ca) => ca.reason,
        other => panic!("expected CONNACK, got {}", brief(&other)),
    }
}

fn mosquitto_pub(b: &Broker, version: &str, user: &str, pass: &str) -> std::process::Output {
    common::tools::tool("mosquitto_pub")
        .args(["-h", "127.0.0.1", "-p", &b.addr.port().to_string()])
        .args([
            "-V", version, "-u", user, "-P", pass, "-t", "t", "-m", "x", "-q", "1",
        ])
        .output()
        .expect("mosquitto_pub")
}

#[tokio::test]
async fn mosquitto_and_argon2_passwords_work_and_wrong_ones_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let passwd = password_file(dir.path());
    let b = Broker::start_with(&format!(
        "[auth]\nallow_anonymous = false\npassword_file = \"{}\"\n",
        passwd.display()
    ));
    for (user, pass) in [("alice", "secret"), ("bob", "hunter2"), ("carol", "pw3")] {
        for version in ["mqttv311", "mqttv5"] {
            let out = mosquitto_pub(&b, version, user, pass);
            assert!(out.status.success(), "{user} {version}: {out:?}");
            let bad = mosquitto_pub(&b, version, user, "wrong");
            assert!(
                !bad.status.success(),
                "{user} {version} wrong password accepted"
            );
        }
    }
    // The exact codes: v5 0x86, 3.1.1 return code 4 (decoded as 0x86).
    for protocol in [Protocol::V5, Protocol::V3_1_1] {
        let id = unique_id("bad");
        let reason = connack(&b, with_login(protocol, &id, Some("alice"), Some("nope"))).await;
        assert_eq!(
            reason,
            ReasonCode::BAD_USER_NAME_OR_PASSWORD,
            "{protocol:?}"
        );
        let reason = connack(&b, with_login(protocol, &id, Some("mallory"), Some("x"))).await;
        assert_eq!(
            reason,
            ReasonCode::BAD_USER_NAME_OR_PASSWORD,
            "{protocol:?} unknown user"
        );
        // No username where one is required: v5 0x87, 3.1.1 return code 5.
        let reason = connack(&b, with_login(protocol, &id, None, None)).await;
        assert_eq!(reason, ReasonCode::NOT_AUTHORIZED, "{protocol:?} anonymous");
        let reason = connack(&b, with_login(protocol, &id, Some("bob"), Some("hunter2"))).await;
        assert_eq!(reason, ReasonCode::SUCCESS, "{protocol:?}");
    }
}

/// The venv python with paho-mqtt 2.x (`scripts/pydeps.sh` makes it when missing; a failure
/// fails the test, naming why).
fn paho_python() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new("timeout")
        .args(["420", "bash"])
        .arg(root.join("scripts/pydeps.sh"))
        .output()
        .expect("run scripts/pydeps.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "pydeps: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(stdout.lines().last().unwrap_or("").trim())
}

#[test]
fn paho_is_refused_with_a_wrong_password_v3_and_v5() {
    let dir = tempfile::tempdir().expect("tempdir");
    let passwd = password_file(dir.path());
    let b = Broker::start_with(&format!(
        "[auth]\nallow_anonymous = false\npassword_file = \"{}\"\n",
        passwd.display()
    ));
    let python = paho_python();
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/interop/paho_connect.py");
    let port = b.addr.port().to_string();
    for version in ["3", "5"] {
        for (password, expected) in [
            ("secret", "0 Success"),
            ("wrong", "134 Bad user name or password"),
        ] {
            let out = Command::new("timeout")
                .arg("20")
                .arg(&python)
                .arg(&script)
                .args([port.as_str(), "alice", password, version])
                .output()
                .expect("paho_connect.py");
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert_eq!(stdout.trim(), expected, "v{version} {password}: {out:?}");
        }
    }
}

fn unique_id(prefix: &str) -> String {
    common::unique(prefix)
}

#[tokio::test]
async fn anonymous_clients_get_in_on_loopback_by_default_even_with_a_password_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let passwd = password_file(dir.path());
    let b = Broker::start_with(&format!(
        "[auth]\npassword_file = \"{}\"\n",
        passwd.display()
    ));
    let reason = connack(&b, with_login(Protocol::V5, "anon", None, None)).await;
    assert_eq!(reason, ReasonCode::SUCCESS);
    // A username given is still checked.
    let reason = connack(&b, with_login(Protocol::V5, "a2", Some("alice"), Some("x"))).await;
    assert_eq!(reason, ReasonCode::BAD_USER_NAME_OR_PASSWORD);
}

#[test]
fn a_reachable_address_without_auth_does_not_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let data = data.to_str().expect("utf-8");
    let done = run_to_exit(
        &["serve", "--bind", "0.0.0.0:0", "--data-dir", data],
        dir.path(),
        Duration::from_secs(20),
    );
    assert_eq!(done.status.code(), Some(2), "{}", done.stderr);
    assert!(done.stderr.contains("password_file"), "{}", done.stderr);
    assert!(done.stderr.contains("allow_anonymous"), "{}", done.stderr);
    assert!(!done.stdout.contains("listening"), "{}", done.stdout);
}

#[test]
fn a_malformed_password_file_does_not_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let passwd = dir.path().join("passwd");
    std::fs::write(&passwd, "alice:$6$notbase64!$x\n").expect("write");
    let config = dir.path().join("tern.toml");
    std::fs::write(
        &config,
        format!("[auth]\npassword_file = \"{}\"\n", passwd.display()),
    )
    .expect("write");
    let done = run_to_exit(
        &[
            "serve",
            "--bind",
            "127.0.0.1:0",
            "--config",
            config.to_str().expect("utf-8"),
        ],
        dir.path(),
        Duration::from_secs(20),
    );
    assert_eq!(done.status.code(), Some(2), "{}", done.stderr);
    assert!(done.stderr.contains("line 1"), "{}", done.stderr);
}

#[test]
fn tern_passwd_creates_changes_and_deletes_users() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("pw");
    let f = file.to_str().expect("utf-8");
    let run = |args: &[&str]| run_to_exit(args, dir.path(), common::WAIT);
    // Without -c the file must exist.
    assert!(!run(&["passwd", "-b", f, "u1", "a"]).status.success());
    assert!(run(&["passwd", "-c", "-b", f, "u1", "a"]).status.success());
    assert!(run(&["passwd", "-b", f, "u2", "b"]).status.success());
    let before = std::fs::read_to_string(&file).expect("read");
    assert!(run(&["passwd", "-b", f, "u1", "c"]).status.success());
    let after = std::fs::read_to_string(&file).expect("read");
    assert_eq!(after.lines().count(), 2, "{after}");
    assert_ne!(
        before.lines().next(),
        after.lines().next(),
        "u1's hash changed"
    );
    assert_eq!(before.lines().nth(1), after.lines().nth(1), "u2 untouched");
    assert!(run(&["passwd", "-D", f, "u2"]).status.success());
    assert!(
        !run(&["passwd", "-D", f, "u2"]).status.success(),
        "already gone"
    );
    let last = std::fs::read_to_string(&file).expect("read");
    assert!(
        last.starts_with("u1:$argon2id$") && last.lines().count() == 1,
        "{last}"
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&file).expect("stat").permissions().mode();
        assert_eq!(mode & 0o077, 0, "not readable by others: {mode:o}");
    }
}

/// Runs `tern passwd ARGS` on a pseudo-terminal (util-linux `script`), typing `input`.
fn passwd_on_a_terminal(args: &str, input: &str) -> std::process::Output {
    use std::io::Write;
    let mut child = Command::new("timeout")
        .args(["20", "script", "-qec"])
        .arg(format!("{} passwd {args}", common::bin()))
        .arg("/dev/null")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("script (util-linux)");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(input.as_bytes()).expect("type");
    drop(stdin);
    child.wait_with_output().expect("wait")
}

#[tokio::test]
async fn tern_passwd_asks_twice_on_the_terminal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("pw");
    let f = file.to_str().expect("utf-8");
    let out = passwd_on_a_terminal(&format!("-c {f} dave"), "typed1\ntyped1\n");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Password:") && text.contains("Reenter password:"),
        "{text}"
    );
    let out = passwd_on_a_terminal(&format!("{f} erin"), "one\ntwo\n");
    assert!(!out.status.success(), "different passwords accepted");
    let b = Broker::start_with(&format!("[auth]\npassword_file = \"{f}\"\n"));
    let reason = connack(
        &b,
        with_login(Protocol::V5, "d", Some("dave"), Some("typed1")),
    )
    .await;
    assert_eq!(reason, ReasonCode::SUCCESS);
    let reason = connack(&b, with_login(Protocol::V5, "e", Some("erin"), Some("one"))).await;
    assert_eq!(
        reason,
        ReasonCode::BAD_USER_NAME_OR_PASSWORD,
        "erin was not added"
    );
}
