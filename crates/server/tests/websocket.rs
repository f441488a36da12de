//! MQTT over WebSocket (issue 13) with paho-mqtt (`transport="websockets"`), plain (ws://)
//! and under TLS (wss://), MQTT 3.1.1 and 5, beside a plain TCP listener of the same broker.

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use common::tools::{python, repo_root, run};
use common::{Broker, certs};

fn paho_ws(addr: SocketAddr, version: &str, cafile: Option<&std::path::Path>) -> String {
    let script = repo_root().join("scripts/interop/paho_ws.py");
    let mut command = Command::new(python());
    command
        .arg(&script)
        .arg(addr.port().to_string())
        .arg(version);
    if let Some(cafile) = cafile {
        command.arg(cafile);
    }
    let out = run(&mut command, Duration::from_secs(40));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "paho over ws (v{version}) failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn check(stdout: &str, version: &str) {
    let topic = format!("ws/{version}");
    assert!(stdout.contains(&format!("got {topic} 20 104")), "{stdout}");
    assert!(
        stdout.contains(&format!("got {topic} 204800 7")),
        "{stdout}"
    );
}

#[test]
fn paho_over_websocket_plain_and_tls() {
    let dir = tempfile::tempdir().unwrap();
    let pki = certs::make(dir.path(), "a", "c");
    let config = format!(
        "[[listener]]\nbind = \"127.0.0.1:0\"\n\n\
         [[listener]]\nbind = \"127.0.0.1:0\"\ntransport = \"ws\"\n\n\
         [[listener]]\nbind = \"127.0.0.1:0\"\ntransport = \"ws\"\ntls_cert = \"{}\"\ntls_key = \"{}\"\n",
        pki.server_cert.display(),
        pki.server_key.display()
    );
    let mut broker = Broker::start_with_args(&config, &[]);
    let addrs = broker.listener_addrs(3);
    for version in ["3", "5"] {
        check(&paho_ws(addrs[1], version, None), version);
        check(&paho_ws(addrs[2], version, Some(&pki.ca)), version);
    }
}

#[test]
fn websocket_listener_closes_plain_mqtt() {
    use std::io::{Read, Write};
    let mut broker = Broker::start_with_args(
        "[[listener]]\nbind = \"127.0.0.1:0\"\ntransport = \"ws\"\n",
        &[],
    );
    let addr = broker.listener_addrs(1)[0];
    // Raw MQTT on a WebSocket port: not an HTTP upgrade, closed.
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
        .write_all(&[0x10, 0x0c, 0, 4, b'M', b'Q', b'T', b'T', 4, 2, 0, 60, 0, 0])
        .unwrap();
    let mut reply = Vec::new();
    let _ = stream.read_to_end(&mut reply);
    assert!(
        !reply.starts_with(&[0x20]),
        "a CONNACK on a WebSocket port: {reply:?}"
    );
}
