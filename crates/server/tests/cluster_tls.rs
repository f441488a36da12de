//! Mutual TLS on the cluster port (issue 23, docs/cluster.md "Security"), on real `tern
//! serve` processes: a three-node cluster over TLS forms, acknowledges a QoS 1 publish made
//! through a follower (a forwarded connection) and hands its leadership over; a peer with no
//! certificate, one from another CA, or no TLS at all is closed before its Raft messages
//! reach openraft (the node's term does not move, and the same message with the cluster's
//! certificate does move it); a node configured with another CA never joins; bad `[cluster]
//! tls_*` settings stop the start with exit code 2.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::certs::{NodePki, make_cluster};
use common::cluster::{
    MUST_WITHIN, TOKEN, start_tls as start, start_tls_with as start_with, try_view, view, wait_for,
    wait_leader,
};
use common::raw::RawClient;
use common::{Broker, free_port, run_to_exit};
use openraft::raft::AppendEntriesRequest;
use serde_json::Value;
use tern_raft::network::{FORWARD_MAGIC, Request, Response, call};
use tern_raft::types::Vote;
use tern_raft::{ClusterTls, NodeId};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::rustls;

fn tls_of(pki: &NodePki, ca: &Path) -> ClusterTls {
    let chain = rustls_pemfile::certs(&mut std::io::BufReader::new(
        std::fs::File::open(&pki.cert).unwrap(),
    ))
    .collect::<Result<Vec<_>, _>>()
    .unwrap();
    let key = rustls_pemfile::private_key(&mut std::io::BufReader::new(
        std::fs::File::open(&pki.key).unwrap(),
    ))
    .unwrap()
    .unwrap();
    ClusterTls::new(chain, key, read_ca(ca), Vec::new()).unwrap()
}

fn read_ca(ca: &Path) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    rustls_pemfile::certs(&mut std::io::BufReader::new(
        std::fs::File::open(ca).unwrap(),
    ))
    .collect::<Result<Vec<_>, _>>()
    .unwrap()
}

/// An AppendEntries from a made-up leader (node 99) in term `term`: a follower that takes it
/// moves to that term and follows node 99.
fn hostile_append(term: u64) -> Request {
    Request::Append(AppendEntriesRequest {
        vote: Vote::new_committed(term, NodeId(99)),
        prev_log_id: None,
        entries: Vec::new(),
        leader_commit: None,
    })
}

/// Sends `req` as a plaintext frame to `addr`, then reads: the connection must close without
/// an answer.
async fn plaintext_frame_is_closed(addr: SocketAddr, req: &Request) {
    let body = postcard::to_allocvec(req).unwrap();
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut frame = u32::try_from(body.len()).unwrap().to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    // The peer may close while we write (it saw garbage for a ClientHello): not an answer.
    let _ = s.write_all(&frame).await;
    let mut first = [0u8; 64];
    let read = tokio::time::timeout(MUST_WITHIN, s.read(&mut first)).await;
    let n = match read {
        Ok(Ok(n)) => n,
        Ok(Err(_)) => 0, // reset
        Err(_) => panic!("the TLS port left a plaintext peer's connection open"),
    };
    // At most a TLS alert record (content type 21), never a frame.
    assert!(
        n == 0 || first[0] == 21,
        "a plaintext peer got an answer: {:?}",
        &first[..n]
    );
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(MUST_WITHIN, s.read_to_end(&mut rest)).await;
    assert!(
        closed.is_ok(),
        "the TLS port left a plaintext peer's connection open"
    );
}

/// A TLS client that trusts the cluster CA but presents no certificate: the handshake or the
/// first read fails, and nothing is answered.
async fn no_certificate_is_refused(addr: SocketAddr, ca: &Path, server_name: &str, req: &Request) {
    let mut roots = rustls::RootCertStore::empty();
    for c in read_ca(ca) {
        roots.add(c).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from(server_name.to_string()).unwrap();
    // TLS 1.3: the client's side of the handshake ends before the server checked it.
    let Ok(mut tls) = connector.connect(name, tcp).await else {
        return;
    };
    let body = postcard::to_allocvec(req).unwrap();
    let mut frame = u32::try_from(body.len()).unwrap().to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    let _ = tls.write_all(&frame).await;
    let _ = tls.flush().await;
    let mut answer = [0u8; 64];
    match tokio::time::timeout(MUST_WITHIN, tls.read(&mut answer)).await {
        Ok(Ok(0)) | Ok(Err(_)) => {} // closed, or the server's alert: certificate required
        Ok(Ok(n)) => panic!("answered without a certificate: {:?}", &answer[..n]),
        Err(_) => panic!("a peer without a certificate was left connected"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_serves_and_refuses_peers_without_the_cluster_ca() {
    let dir = tempfile::tempdir().unwrap();
    let pki = make_cluster(dir.path(), "good", &["n1", "n2", "n3"]);
    let stranger = make_cluster(dir.path(), "other", &["x"]);
    // Each node: a plain MQTT listener, then a TLS one (the client's TLS inside the cluster's).
    let mqtts = common::certs::make(dir.path(), "mqtts", "client");
    let listeners = format!(
        "[[listener]]\nbind = \"127.0.0.1:0\"\n\n[[listener]]\nbind = \"127.0.0.1:0\"\n\
         tls_cert = {:?}\ntls_key = {:?}\n",
        mqtts.server_cert, mqtts.server_key
    );
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let mut nodes = start_with(&pki, &ports, &listeners);
    let tls_ports: Vec<u16> = nodes
        .iter_mut()
        .map(|n| n.listener_addrs(2)[1].port())
        .collect();
    let leader = wait_leader(&nodes, &[0, 1, 2]);
    let leader_index = usize::try_from(leader).unwrap() - 1;
    let f = (leader_index + 1) % 3;
    let follower = &nodes[f];

    // A client of a follower is forwarded to the leader over the TLS link: its QoS 1 publish
    // is acknowledged once committed, and a subscriber on the other follower gets it.
    let other = &nodes[(leader_index + 2) % 3];
    let mut sub = RawClient::v5(other.addr, "tls-sub").await;
    sub.sub("tls/t", 1).await;
    let mut client = RawClient::v5(follower.addr, "tls-pub").await;
    client
        .send(&tern_wire::Packet::Publish(common::raw::publish(
            "tls/t",
            b"over tls",
            1,
            1,
        )))
        .await;
    match client.expect_packet().await {
        tern_wire::Packet::PubAck(a) => assert_eq!(a.packet_id, 1),
        p => panic!("expected PUBACK, got {}", common::raw::brief(&p)),
    }
    assert_eq!(&sub.expect_publish().await.payload[..], b"over tls");
    // A client of the follower's TLS listener: its TLS travels inside the link's, and the
    // leader's listener undoes it (mosquitto_pub exits 0 once its QoS 1 PUBACK came).
    let out = common::tools::run(
        common::tools::tool("mosquitto_pub")
            .args(["-h", "127.0.0.1", "-p", &tls_ports[f].to_string()])
            .args([
                "-t",
                "tls/t",
                "-m",
                "mqtts inside",
                "-q",
                "1",
                "-i",
                "tls-mqtts",
            ])
            .arg("--cafile")
            .arg(&mqtts.ca),
        MUST_WITHIN,
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(&sub.expect_publish().await.payload[..], b"mqtts inside");
    drop((client, sub));

    // Peers outside the cluster CA: their AppendEntries never reaches openraft. Its term is
    // far above any an election on a loaded machine could reach meanwhile.
    let term = view(follower)["term"].as_u64().expect("term");
    let hostile_term = term + 1000;
    let attack = hostile_append(hostile_term);
    let addr: SocketAddr = format!("127.0.0.1:{}", ports[f]).parse().unwrap();
    plaintext_frame_is_closed(addr, &attack).await;
    plaintext_frame_is_closed(addr, &Request::HoldElections { for_ms: 10_000 }).await;
    no_certificate_is_refused(addr, &pki[f].ca, &format!("n{}.cluster", f + 1), &attack).await;
    // Another CA's certificate, from a client that trusts the cluster's server certificate.
    let foreign = tls_of(&stranger[0], &pki[f].ca);
    assert!(call(addr, &attack, Some(&foreign)).await.is_err());
    // A forwarded-connection preamble in plaintext is closed too.
    let mut s = TcpStream::connect(addr).await.unwrap();
    let _ = s.write_all(&FORWARD_MAGIC).await;
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(MUST_WITHIN, s.read_to_end(&mut rest)).await;
    assert!(closed.is_ok(), "a plaintext forwarded connection was kept");
    let after = view(follower);
    assert!(after["term"].as_u64() < Some(hostile_term), "{after}");
    assert_ne!(after["leader_id"].as_u64(), Some(99), "{after}");

    // The control: the same message with a certificate of the cluster CA is taken (so the
    // refusals above are the TLS's doing, not a malformed message's).
    let member = tls_of(&pki[f], &pki[f].ca);
    match call(addr, &attack, Some(&member)).await {
        Ok(Response::Append(Ok(_))) => {}
        other => panic!("the cluster's own certificate was refused: {other:?}"),
    }
    wait_for(
        "the follower in the member's term, following node 99",
        || {
            let v = view(follower);
            (v["term"].as_u64() >= Some(hostile_term) && v["leader_id"] == 99).then_some(())
        },
    );
}

#[test]
fn a_tls_cluster_hands_its_leadership_over() {
    let dir = tempfile::tempdir().unwrap();
    let pki = make_cluster(dir.path(), "good", &["n1", "n2", "n3"]);
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let nodes = start(&pki, &ports);
    let leader = wait_leader(&nodes, &[0, 1, 2]);
    // The transfer's HoldElections requests travel over TLS too.
    let to = leader % 3 + 1;
    let node = &nodes[usize::try_from(leader).unwrap() - 1];
    let r = common::http::request_json(
        node.http.unwrap(),
        "POST",
        "/api/v1/cluster/leader",
        Some(TOKEN),
        &format!("{{\"id\": {to}}}"),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(wait_leader(&nodes, &[0, 1, 2]), to);
}

#[test]
fn a_node_with_another_ca_never_joins() {
    let dir = tempfile::tempdir().unwrap();
    let mut pki = make_cluster(dir.path(), "good", &["n1", "n2"]);
    pki.extend(make_cluster(dir.path(), "other", &["n3"]));
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let nodes = start(&pki, &ports);
    node_3_never_joins(&nodes);
}

/// `[cluster] tls_crl`: node 3's certificate is from the cluster CA, but the CA's revocation
/// list, which every node checks, names it. (Without the CRL the same certificates form a
/// cluster of three: `a_tls_cluster_hands_its_leadership_over`.)
#[test]
fn a_node_whose_certificate_is_revoked_never_joins() {
    let dir = tempfile::tempdir().unwrap();
    let mut pki = make_cluster(dir.path(), "good", &["n1", "n2", "n3"]);
    let crl = pki[2].revoked_in.clone();
    for node in &mut pki {
        node.crl = Some(crl.clone());
    }
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let nodes = start(&pki, &ports);
    node_3_never_joins(&nodes);
}

/// Nodes 1 and 2 elect a leader and commit; node 3, whose certificate they refuse (and it
/// theirs), is never reached and learns nothing.
fn node_3_never_joins(nodes: &[Broker]) {
    let leader = wait_leader(nodes, &[0, 1]);
    let leader_node = &nodes[usize::try_from(leader).unwrap() - 1];
    // Node 3 refuses the leader's connections (and they its): its log says so.
    wait_for("node 3 refusing a handshake", || {
        nodes[2]
            .log_tail(200)
            .contains("cluster TLS handshake refused")
            .then_some(())
    });
    // The two form and commit (the leader's engine started behind a committed barrier);
    // node 3 is a voter in the membership that nothing reaches.
    let view3 = wait_for("the leader's view of node 3", || {
        let v = try_view(leader_node)?;
        let m3 = v["members"]
            .as_array()?
            .iter()
            .find(|m| m["id"] == 3)?
            .clone();
        Some((v, m3))
    });
    assert_eq!(view3.1["match_index"], Value::Null, "{}", view3.0);
    // Node 3, on a new data directory, waits for a majority of its peers to confirm it new
    // (tern_raft::incarnation) and none can answer it: it has no Raft core (503 "starting").
    // Were it running, it must know no leader and have no entries.
    if let Some(seen) = try_view(&nodes[2]) {
        assert_eq!(seen["leader_id"], Value::Null, "node 3 joined: {seen}");
        assert!(
            seen["commit_index"].as_u64().unwrap_or(0) == 0,
            "node 3 got entries: {seen}"
        );
    }
}

fn serve_with(config: &str, dir: &Path) -> common::Finished {
    let path = dir.join("tern.toml");
    std::fs::write(&path, config).unwrap();
    let data = dir.join("data");
    run_to_exit(
        &[
            "serve",
            "--config",
            path.to_str().unwrap(),
            "--data-dir",
            data.to_str().unwrap(),
        ],
        dir,
        Duration::from_secs(20),
    )
}

#[test]
fn bad_cluster_tls_settings_stop_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let pki = make_cluster(dir.path(), "good", &["n1", "n2"]);
    let base = "[listener]\nbind = \"127.0.0.1:0\"\n\n[cluster]\nnode_id = 1\n\
                bind = \"127.0.0.1:0\"\npeers = [\"1=127.0.0.1:1\"]\n";
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "-----BEGIN CERTIFICATE-----\nnope\n").unwrap();
    let cases = [
        (
            format!("tls_cert = {:?}\ntls_key = {:?}\n", pki[0].cert, pki[0].key),
            "set all three",
        ),
        (
            format!(
                "tls_cert = {:?}\ntls_key = {:?}\ntls_ca = {:?}\n",
                pki[0].cert,
                pki[0].key,
                dir.path().join("missing.pem")
            ),
            "missing.pem",
        ),
        (
            format!(
                "tls_cert = {:?}\ntls_key = {:?}\ntls_ca = {garbage:?}\n",
                pki[0].cert, pki[0].key
            ),
            "garbage.pem",
        ),
        (
            format!(
                "tls_cert = {:?}\ntls_key = {:?}\ntls_ca = {:?}\n",
                pki[0].cert, pki[0].cert, pki[0].ca
            ),
            "no PEM private key",
        ),
        (
            format!("tls_crl = {:?}\n", pki[0].revoked_in),
            "needs tls_cert",
        ),
        (
            // A file without a CRL in it.
            format!(
                "tls_cert = {:?}\ntls_key = {:?}\ntls_ca = {:?}\ntls_crl = {:?}\n",
                pki[0].cert, pki[0].key, pki[0].ca, pki[0].ca
            ),
            "no PEM certificate revocation list",
        ),
        (
            // Another node's key: rustls checks that it matches the certificate.
            format!(
                "tls_cert = {:?}\ntls_key = {:?}\ntls_ca = {:?}\n",
                pki[0].cert, pki[1].key, pki[0].ca
            ),
            "do not make a TLS config",
        ),
    ];
    for (tls, expected) in cases {
        let out = serve_with(&format!("{base}{tls}"), dir.path());
        assert_eq!(out.status.code(), Some(2), "{tls}: {}", out.stderr);
        assert!(out.stderr.contains(expected), "{tls}: {}", out.stderr);
        assert!(out.stderr.contains("[cluster]"), "{tls}: {}", out.stderr);
    }
}
