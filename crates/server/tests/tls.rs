//! TLS listeners (issue 13) with real clients: mosquitto_pub / mosquitto_sub with `--cafile`,
//! with a client certificate (mTLS), `require_client_cert`, `use_identity_as_username`,
//! garbage and failed handshakes on a TLS port, the certificate reload on SIGHUP, and bad TLS
//! config at start-up (exit code 2). Certificates are made at test time (`common::certs`).

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::certs::{self, Pki};
use common::tools::{run, spawn};
use common::{Broker, run_to_exit};

/// Bound on one mosquitto client run.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(15);

fn tls_listener(pki: &Pki, extra: &str) -> String {
    format!(
        "[[listener]]\nbind = \"127.0.0.1:0\"\ntls_cert = \"{}\"\ntls_key = \"{}\"\n{extra}\n",
        pki.server_cert.display(),
        pki.server_key.display()
    )
}

/// `[[listener]]` plain first, then the TLS one: the broker, and the TLS listener's address.
fn start(pki: &Pki, extra: &str) -> (Broker, SocketAddr) {
    let config = format!(
        "[[listener]]\nbind = \"127.0.0.1:0\"\n\n{}",
        tls_listener(pki, extra)
    );
    let mut broker = Broker::start_with_args(&config, &[]);
    let addrs = broker.listener_addrs(2);
    (broker, addrs[1])
}

/// mosquitto_pub (retained, QoS 1) with the given TLS arguments; the process output.
fn publish(addr: SocketAddr, topic: &str, message: &str, tls: &[&Path]) -> std::process::Output {
    let mut command = common::tools::tool("mosquitto_pub");
    command
        .args(["-h", "127.0.0.1", "-p", &addr.port().to_string()])
        .args(["-t", topic, "-m", message, "-q", "1", "-r"]);
    add_tls(&mut command, tls);
    run(&mut command, CLIENT_TIMEOUT)
}

/// `tls`: [cafile] or [cafile, cert, key].
fn add_tls(command: &mut Command, tls: &[&Path]) {
    let names = ["--cafile", "--cert", "--key"];
    for (name, path) in names.iter().zip(tls) {
        command.arg(name).arg(path);
    }
}

fn subscribe_one(addr: SocketAddr, topic: &str, tls: &[&Path]) -> std::process::Output {
    let mut command = common::tools::tool("mosquitto_sub");
    command
        .args(["-h", "127.0.0.1", "-p", &addr.port().to_string()])
        .args(["-t", topic, "-q", "1", "-C", "1", "-W", "10"]);
    add_tls(&mut command, tls);
    run(&mut command, CLIENT_TIMEOUT)
}

/// SIGHUP, then waits until the broker logs that its TLS files were read again.
fn reload(broker: &Broker) {
    broker.signal(libc::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !broker.log_tail(200).contains("TLS certificates reloaded") {
        assert!(Instant::now() < deadline, "no reload logged");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn mosquitto_clients_over_tls_with_cafile() {
    let dir = tempfile::tempdir().unwrap();
    let pki = certs::make(dir.path(), "a", "client-a");
    let (broker, tls_addr) = start(&pki, "");
    let out = publish(tls_addr, "tls/t", "over tls", &[&pki.ca]);
    assert!(out.status.success(), "pub: {}", text(&out.stderr));
    let out = subscribe_one(tls_addr, "tls/t", &[&pki.ca]);
    assert!(out.status.success(), "sub: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "over tls");
    // The plain listener (the first line) serves the same broker.
    let out = subscribe_one(broker.addr, "tls/t", &[]);
    assert_eq!(
        text(&out.stdout).trim(),
        "over tls",
        "{}",
        text(&out.stderr)
    );
    // A client that does not trust the server's CA is refused by its own TLS check.
    let other = certs::make(dir.path(), "b", "client-b");
    let out = publish(tls_addr, "tls/t", "x", &[&other.ca]);
    assert!(!out.status.success(), "{}", text(&out.stdout));
}

#[test]
fn mutual_tls_and_require_client_cert() {
    let dir = tempfile::tempdir().unwrap();
    let pki = certs::make(dir.path(), "a", "client-a");
    let extra = format!(
        "tls_client_ca = \"{}\"\nrequire_client_cert = true\n",
        pki.ca.display()
    );
    let (_broker, addr) = start(&pki, &extra);
    let with_cert = [pki.ca.as_path(), &pki.client_cert, &pki.client_key];
    let out = publish(addr, "mtls/t", "with cert", &with_cert);
    assert!(out.status.success(), "pub: {}", text(&out.stderr));
    let out = subscribe_one(addr, "mtls/t", &with_cert);
    assert_eq!(
        text(&out.stdout).trim(),
        "with cert",
        "{}",
        text(&out.stderr)
    );
    // Without a certificate the handshake fails.
    let out = publish(addr, "mtls/t", "no cert", &[&pki.ca]);
    assert!(!out.status.success(), "{}", text(&out.stdout));
    // A certificate from another CA is refused too.
    let other = certs::make(dir.path(), "b", "client-b");
    let out = publish(
        addr,
        "mtls/t",
        "foreign",
        &[&pki.ca, &other.client_cert, &other.client_key],
    );
    assert!(!out.status.success(), "{}", text(&out.stdout));
    let out = subscribe_one(addr, "mtls/t", &with_cert);
    assert_eq!(text(&out.stdout).trim(), "with cert");
}

/// `tern bench` against a listener that requires client certificates: with `--tls-cert` and
/// `--tls-key` its connections are taken and every QoS 1 message acknowledged and delivered;
/// without them its handshakes are refused and the run fails.
#[test]
fn tern_bench_presents_a_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let pki = certs::make(dir.path(), "bench", "client-bench");
    let extra = format!(
        "tls_client_ca = \"{}\"\nrequire_client_cert = true\n",
        pki.ca.display()
    );
    let (_broker, addr) = start(&pki, &extra);
    let bench = |identity: &[&Path]| {
        let mut command = Command::new(common::bin());
        command
            .args(["bench", "pubsub", "--port", &addr.port().to_string()])
            .args(["--qos", "1", "-n", "200", "--timeout-s", "20", "--json"])
            .arg("--tls-ca")
            .arg(&pki.ca);
        for (name, path) in ["--tls-cert", "--tls-key"].iter().zip(identity) {
            command.arg(name).arg(path);
        }
        run(&mut command, Duration::from_secs(60))
    };
    let out = bench(&[&pki.client_cert, &pki.client_key]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["acked"], 200, "{report}");
    assert_eq!(report["deliveries"], 200, "{report}");
    let out = bench(&[]);
    assert!(!out.status.success(), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains("CertificateRequired"),
        "{}",
        text(&out.stderr)
    );
}

/// `tls_crl`: a client certificate the CA's revocation list names is refused in the
/// handshake, with mosquitto_pub; a CRL replaced and reloaded on SIGHUP refuses the next
/// handshake of a certificate it has just revoked (and cuts the connections already up with
/// it: tests/tls_revocation.rs).
#[test]
fn a_revoked_client_certificate_is_refused_and_a_reloaded_crl_revokes() {
    let dir = tempfile::tempdir().unwrap();
    let pki = certs::make(dir.path(), "a", "client-a");
    let crl = dir.path().join("live-crl.pem");
    std::fs::copy(&pki.crl_empty, &crl).unwrap();
    let extra = format!(
        "tls_client_ca = \"{}\"\ntls_crl = \"{}\"\nrequire_client_cert = true\n",
        pki.ca.display(),
        crl.display()
    );
    let (broker, addr) = start(&pki, &extra);
    let with_cert = [pki.ca.as_path(), &pki.client_cert, &pki.client_key];
    let out = publish(addr, "crl/t", "not revoked yet", &with_cert);
    assert!(out.status.success(), "pub: {}", text(&out.stderr));

    std::fs::copy(&pki.crl_client, &crl).unwrap();
    reload(&broker);
    let out = publish(addr, "crl/t", "revoked", &with_cert);
    assert!(!out.status.success(), "a revoked certificate connected");
    let out = subscribe_one(broker.addr, "crl/t", &[]);
    assert_eq!(
        text(&out.stdout).trim(),
        "not revoked yet",
        "the revoked client's message got in: {}",
        text(&out.stderr)
    );
}

#[test]
fn use_identity_as_username_refuses_a_client_without_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let pki = certs::make(dir.path(), "a", "sensor-7");
    let extra = format!(
        "tls_client_ca = \"{}\"\nuse_identity_as_username = true\n",
        pki.ca.display()
    );
    let (_broker, addr) = start(&pki, &extra);
    let with_cert = [pki.ca.as_path(), &pki.client_cert, &pki.client_key];
    let out = publish(addr, "id/t", "identified", &with_cert);
    assert!(out.status.success(), "pub: {}", text(&out.stderr));
    // TLS without a client certificate: CONNACK rc 4 (v3) / 0x86 (v5), as mosquitto.
    for version in ["mqttv311", "mqttv5"] {
        let mut command = common::tools::tool("mosquitto_pub");
        command
            .args(["-h", "127.0.0.1", "-p", &addr.port().to_string()])
            .args(["-t", "id/t", "-m", "anon", "-V", version, "-u", "someone"]);
        add_tls(&mut command, &[&pki.ca]);
        let out = run(&mut command, CLIENT_TIMEOUT);
        assert!(!out.status.success(), "{version}: accepted");
        let stderr = text(&out.stderr).to_lowercase();
        assert!(
            stderr.contains("bad user name or password") || stderr.contains("bad username"),
            "{version}: {stderr}"
        );
    }
}

/// Reads until the peer closes (or `deadline`); true if it closed.
fn closed_by_peer(stream: &mut TcpStream, deadline: Instant) -> bool {
    let mut buf = [0u8; 1024];
    while Instant::now() < deadline {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => return true, // reset
        }
    }
    false
}

#[test]
fn garbage_and_failed_handshakes_free_their_slot() {
    let dir = tempfile::tempdir().unwrap();
    let pki = certs::make(dir.path(), "a", "client-a");
    // Two places only: a leaked slot would refuse the real client at the end.
    let (broker, addr) = start(&pki, "max_connections = 2");
    let inputs: [&[u8]; 4] = [
        b"GET / HTTP/1.1\r\n\r\n",
        &[0x10, 0x0c, 0, 4, b'M', b'Q', b'T', b'T', 4, 2, 0, 60, 0, 0],
        &[0x16, 0x03, 0x01, 0xff, 0xff, 1, 2, 3, 4],
        &[0xff; 300],
    ];
    for round in 0..3 {
        for input in inputs {
            let mut stream = TcpStream::connect(addr).unwrap();
            stream
                .set_read_timeout(Some(Duration::from_millis(200)))
                .unwrap();
            let _ = stream.write_all(input);
            assert!(
                closed_by_peer(&mut stream, Instant::now() + Duration::from_secs(10)),
                "round {round}: garbage {input:?} left open"
            );
        }
    }
    let out = publish(addr, "g/t", "still serving", &[&pki.ca]);
    assert!(out.status.success(), "pub: {}", text(&out.stderr));
    let out = subscribe_one(broker.addr, "g/t", &[]);
    assert_eq!(text(&out.stdout).trim(), "still serving");
}

#[test]
fn listener_max_connections_refuses_the_one_too_many() {
    let dir = tempfile::tempdir().unwrap();
    let pki = certs::make(dir.path(), "a", "client-a");
    let (broker, addr) = start(&pki, "max_connections = 1");
    // The one place is taken by a subscriber that stays (until its message comes).
    let mut command = line_buffered_sub(addr);
    command.args(["-t", "m/t", "-C", "1", "-W", "20", "-d"]);
    add_tls(&mut command, &[&pki.ca]);
    let mut sub = spawn(&mut command, CLIENT_TIMEOUT * 2);
    let out = wait_for_line(&mut sub, "SUBACK");
    assert!(out.contains("SUBACK"), "{out}");
    let refused = publish(addr, "m/t", "too many", &[&pki.ca]);
    assert!(!refused.status.success(), "{}", text(&refused.stdout));
    // The plain listener has no such limit.
    let out = publish(broker.addr, "m/t", "via plain", &[]);
    assert!(out.status.success());
    let out = sub.wait_with_output().unwrap();
    assert!(
        text(&out.stdout).contains("via plain"),
        "{}",
        text(&out.stdout)
    );
}

/// mosquitto_sub with its stdout line buffered (a pipe would hold `-d`'s SUBACK line back).
fn line_buffered_sub(addr: SocketAddr) -> Command {
    let mut command = common::tools::tool("stdbuf");
    command
        .args(["-oL", "mosquitto_sub", "-h", "127.0.0.1", "-p"])
        .arg(addr.port().to_string());
    command
}

/// Reads the child's stdout until a line containing `needle` (bounded by the child's timeout).
fn wait_for_line(child: &mut std::process::Child, needle: &str) -> String {
    let stdout = child.stdout.as_mut().expect("piped");
    let mut seen = String::new();
    let mut byte = [0u8; 1];
    while !seen.contains(needle) {
        match stdout.read(&mut byte) {
            Ok(1) => seen.push(byte[0] as char),
            _ => break,
        }
    }
    seen
}

#[test]
fn sighup_reloads_certificates_and_keeps_connections() {
    let dir = tempfile::tempdir().unwrap();
    let old = certs::make(dir.path(), "old", "c");
    let new = certs::make(dir.path(), "new", "c");
    // The listener's files: the old PKI's, replaced by the new one's before SIGHUP.
    let cert = dir.path().join("live-cert.pem");
    let key = dir.path().join("live-key.pem");
    std::fs::copy(&old.server_cert, &cert).unwrap();
    std::fs::copy(&old.server_key, &key).unwrap();
    let live = Pki {
        server_cert: cert.clone(),
        server_key: key.clone(),
        ..certs::make(dir.path(), "unused", "c")
    };
    let (broker, addr) = start(&live, "");
    // A subscriber connected under the old certificate.
    let mut command = line_buffered_sub(addr);
    command.args(["-t", "r/t", "-C", "1", "-W", "30", "-d"]);
    add_tls(&mut command, &[&old.ca]);
    let mut sub = spawn(&mut command, CLIENT_TIMEOUT * 3);
    assert!(wait_for_line(&mut sub, "SUBACK").contains("SUBACK"));

    std::fs::copy(&new.server_cert, &cert).unwrap();
    std::fs::copy(&new.server_key, &key).unwrap();
    reload(&broker);
    // New handshakes get the new certificate: the old CA no longer verifies it.
    let out = publish(addr, "r/x", "old ca", &[&old.ca]);
    assert!(!out.status.success(), "the old certificate is still served");
    let out = publish(addr, "r/t", "after reload", &[&new.ca]);
    assert!(out.status.success(), "pub: {}", text(&out.stderr));
    // The connection made before the reload still works.
    let out = sub.wait_with_output().unwrap();
    assert!(
        text(&out.stdout).contains("after reload"),
        "{}",
        text(&out.stdout)
    );
}

fn serve_with(config: &str) -> common::Finished {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tern.toml");
    std::fs::write(&path, config).unwrap();
    let data = dir.path().join("data");
    run_to_exit(
        &[
            "serve",
            "--config",
            path.to_str().unwrap(),
            "--data-dir",
            data.to_str().unwrap(),
        ],
        dir.path(),
        Duration::from_secs(20),
    )
}

#[test]
fn bad_tls_config_exits_2_naming_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let pki = certs::make(dir.path(), "a", "c");
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "-----BEGIN CERTIFICATE-----\nnot base64!\n").unwrap();
    let missing = dir.path().join("missing.key");
    let cases = [
        (
            format!(
                "[[listener]]\nbind = \"127.0.0.1:0\"\ntls_cert = \"{}\"\n",
                pki.server_cert.display()
            ),
            "tls_key",
        ),
        (
            format!(
                "[[listener]]\nbind = \"127.0.0.1:0\"\ntls_cert = \"{}\"\ntls_key = \"{}\"\n",
                pki.server_cert.display(),
                missing.display()
            ),
            "missing.key",
        ),
        (
            format!(
                "[[listener]]\nbind = \"127.0.0.1:0\"\ntls_cert = \"{}\"\ntls_key = \"{}\"\n",
                garbage.display(),
                pki.server_key.display()
            ),
            "garbage.pem",
        ),
        (
            format!(
                "{}tls_crl = \"{}\"\n",
                tls_listener(&pki, ""),
                pki.crl_client.display()
            ),
            "tls_crl",
        ),
        (
            format!(
                "{}tls_client_ca = \"{}\"\ntls_crl = \"{}\"\n",
                tls_listener(&pki, ""),
                pki.ca.display(),
                pki.ca.display()
            ),
            "no PEM certificate revocation list",
        ),
        (
            "[[listener]]\nbind = \"127.0.0.1:0\"\ntransport = \"quic\"\n".to_string(),
            "quic",
        ),
        (
            "[[listener]]\nbind = \"127.0.0.1:0\"\nwhat = 1\n".to_string(),
            "what",
        ),
    ];
    for (config, named) in cases {
        let out = serve_with(&config);
        assert_eq!(out.status.code(), Some(2), "{config}\n{}", out.stderr);
        assert!(out.stderr.contains(named), "{config}\n{}", out.stderr);
    }
}

/// Per-listener `allow_anonymous` overrides `[auth]`'s, and a username taken from the client
/// certificate (`use_identity_as_username`) is the authentication: the password file, which
/// does not know that name, is not consulted (mosquitto does the same).
#[test]
fn listener_allow_anonymous_and_certificate_identity_with_a_password_file() {
    let dir = tempfile::tempdir().unwrap();
    let pki = certs::make(dir.path(), "a", "sensor-9");
    let passwd = dir.path().join("passwd");
    let out = run(
        common::tools::tool("mosquitto_passwd")
            .args(["-c", "-b"])
            .arg(&passwd)
            .args(["alice", "secret"]),
        CLIENT_TIMEOUT,
    );
    assert!(
        out.status.success(),
        "mosquitto_passwd: {}",
        text(&out.stderr)
    );
    let config = format!(
        "[auth]\nallow_anonymous = false\npassword_file = \"{}\"\n\n\
         [[listener]]\nbind = \"127.0.0.1:0\"\n\n\
         [[listener]]\nbind = \"127.0.0.1:0\"\nallow_anonymous = true\n\n{}",
        passwd.display(),
        tls_listener(
            &pki,
            &format!(
                "tls_client_ca = \"{}\"\nuse_identity_as_username = true\n",
                pki.ca.display()
            )
        )
    );
    let mut broker = Broker::start_with_args(&config, &[]);
    let addrs = broker.listener_addrs(3);
    // Listener 0 follows [auth]: anonymous refused (v5 0x87 / 3.1.1 rc 5).
    let out = publish(addrs[0], "l/t", "anon", &[]);
    assert!(!out.status.success(), "anonymous accepted on listener 0");
    assert!(
        text(&out.stderr).to_lowercase().contains("not authori"),
        "{}",
        text(&out.stderr)
    );
    // Listener 1 lets anonymous clients in.
    let out = publish(addrs[1], "l/t", "anon", &[]);
    assert!(out.status.success(), "listener 1: {}", text(&out.stderr));
    // A password-file user works on listener 0.
    let mut command = common::tools::tool("mosquitto_pub");
    command
        .args(["-h", "127.0.0.1", "-p", &addrs[0].port().to_string()])
        .args(["-t", "l/t", "-m", "alice", "-u", "alice", "-P", "secret"]);
    let out = run(&mut command, CLIENT_TIMEOUT);
    assert!(out.status.success(), "alice: {}", text(&out.stderr));
    // Listener 2: the certificate's CN (unknown to the password file) gets in, with any
    // password or none.
    let with_cert = [pki.ca.as_path(), &pki.client_cert, &pki.client_key];
    let out = publish(addrs[2], "l/t", "by certificate", &with_cert);
    assert!(out.status.success(), "cert: {}", text(&out.stderr));
    let out = subscribe_one(addrs[1], "l/t", &[]);
    assert_eq!(
        text(&out.stdout).trim(),
        "by certificate",
        "{}",
        text(&out.stderr)
    );
}
