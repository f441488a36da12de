//! SIGHUP on the cluster port's TLS files (docs/cluster.md "Security"), on real `tern serve`
//! processes: a reload that revokes a node cuts its open connections, and the cluster CA is
//! rolled over with three reloads and no restart. (The TLS cluster itself: `cluster_tls.rs`.)

mod common;

use std::time::{Duration, Instant};

use common::certs::{NodePki, make_cluster};
use common::cluster::{
    MUST_WITHIN, TOKEN, start_tls as start, try_view, view, wait_for, wait_leader,
};
use common::raw::RawClient;
use common::{Broker, free_port};
use serde_json::Value;

/// SIGHUP on the cluster's TLS files (docs/cluster.md "Security"): a CRL that revokes node 3,
/// installed on nodes 1 and 2 and reloaded there, cuts node 3 off at once, although its
/// connections were made before (without the cut, the leader's open Raft connection would
/// keep replicating to it); the two go on committing. A reload whose files are bad first
/// changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_cuts_off_a_node_whose_certificate_is_revoked_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    // A fourth certificate, never used: its CRL is the one in force at the start.
    let mut pki = make_cluster(dir.path(), "good", &["n1", "n2", "n3", "unused"]);
    let crl = dir.path().join("cluster-crl.pem");
    std::fs::copy(&pki[3].revoked_in, &crl).unwrap();
    pki.truncate(3);
    for node in &mut pki {
        node.crl = Some(crl.clone());
    }
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let nodes = start(&pki, &ports);
    let leader = lead_away_from(&nodes, 3);
    let leader_node = &nodes[usize::try_from(leader).unwrap() - 1];
    let mut publisher = RawClient::v5(leader_node.addr, "crl-pub").await;
    let publish = |id: u16| tern_wire::Packet::Publish(common::raw::publish("crl/t", b"m", 1, id));
    let node3_match = |v: &Value| match_index_of(v, 3);
    let caught_up = || {
        let v = try_view(leader_node)?;
        (node3_match(&v)? >= v["commit_index"].as_u64()?).then_some(())
    };

    // Bad files: the CRL overwritten with garbage. The reload fails, nothing is cut.
    std::fs::write(&crl, "not a CRL").unwrap();
    nodes[0].signal(libc::SIGHUP);
    wait_for("node 1's failed reload", || {
        let log = nodes[0].log_tail(200);
        (log.contains("reload failed") && log.contains("cluster TLS")).then_some(())
    });
    publisher.send(&publish(1)).await;
    assert!(matches!(
        publisher.expect_packet().await,
        tern_wire::Packet::PubAck(_)
    ));
    wait_for("node 3 caught up after the failed reload", caught_up);

    // Node 3's certificate revoked on nodes 1 and 2; node 3 is not told.
    std::fs::copy(&pki[2].revoked_in, &crl).unwrap();
    nodes[0].signal(libc::SIGHUP);
    nodes[1].signal(libc::SIGHUP);
    wait_for("the leader cutting its links to node 3", || {
        leader_node
            .log_tail(400)
            .contains("cut after the reload")
            .then_some(())
    });
    let cut_at = node3_match(&view(leader_node)).unwrap_or(0);
    for id in 2..22 {
        publisher.send(&publish(id)).await;
        match publisher.expect_packet().await {
            tern_wire::Packet::PubAck(a) => assert_eq!(a.packet_id, id),
            p => panic!("expected PUBACK, got {}", common::raw::brief(&p)),
        }
    }
    // Long enough for heartbeats and retries over any link still open (50-500 ms each).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = view(leader_node);
    let commit = after["commit_index"].as_u64().unwrap();
    assert!(commit >= cut_at + 20, "{after}");
    assert!(
        node3_match(&after).is_none_or(|m| m <= cut_at),
        "node 3 still replicated to after the reload: {after}"
    );
    // The other of the two still follows the same leader.
    assert_eq!(
        view(&nodes[usize::try_from(leader % 2).unwrap()])["leader_id"],
        leader
    );
}

/// A cluster CA rolled over with SIGHUPs and no restart, as docs/cluster.md says: every node
/// trusts both CAs, then presents a certificate of the new one, then trusts the new one alone.
/// After each step the cluster acknowledges a publish and all three nodes replicate; at the
/// last, links made with certificates of the old CA are cut and made again with the new ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_ca_is_rolled_over_with_reloads_and_no_restart() {
    let dir = tempfile::tempdir().unwrap();
    let old = make_cluster(dir.path(), "old", &["n1", "n2", "n3"]);
    let new = make_cluster(dir.path(), "new", &["n1", "n2", "n3"]);
    // The files the nodes read, rewritten in place between reloads.
    let live: Vec<NodePki> = (1..=3)
        .map(|i| {
            let node = NodePki {
                ca: dir.path().join("live-ca.pem"),
                cert: dir.path().join(format!("live-n{i}.pem")),
                key: dir.path().join(format!("live-n{i}-key.pem")),
                revoked_in: old[i - 1].revoked_in.clone(),
                crl: None,
            };
            std::fs::copy(&old[i - 1].cert, &node.cert).unwrap();
            std::fs::copy(&old[i - 1].key, &node.key).unwrap();
            node
        })
        .collect();
    std::fs::copy(&old[0].ca, &live[0].ca).unwrap();
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let nodes = start(&live, &ports);
    let mut id = 0;
    let mut reloads = 0;
    let mut step = |what: &str| {
        reloads += 1;
        for node in &nodes {
            node.signal(libc::SIGHUP);
        }
        for node in &nodes {
            wait_for(&format!("{what}: the cluster TLS reload"), || {
                let log = node.log_tail(2000);
                let done = log
                    .lines()
                    .filter(|l| l.contains("cluster TLS") && l.contains("reloaded"))
                    .count();
                (done >= reloads).then_some(())
            });
        }
    };
    let both = format!(
        "{}{}",
        std::fs::read_to_string(&old[0].ca).unwrap(),
        std::fs::read_to_string(&new[0].ca).unwrap()
    );
    std::fs::write(&live[0].ca, both).unwrap();
    step("both CAs");
    acknowledged_by_all_three(&nodes, &mut id).await;
    for (node, fresh) in live.iter().zip(&new) {
        std::fs::copy(&fresh.cert, &node.cert).unwrap();
        std::fs::copy(&fresh.key, &node.key).unwrap();
    }
    step("the new certificates");
    acknowledged_by_all_three(&nodes, &mut id).await;
    std::fs::copy(&new[0].ca, &live[0].ca).unwrap();
    step("the new CA alone");
    acknowledged_by_all_three(&nodes, &mut id).await;
    // The old CA's certificates had links at the last step: they were cut, not kept.
    let cut: usize = nodes
        .iter()
        .map(|n| n.log_tail(2000).matches("cut after the reload").count())
        .sum();
    assert!(cut > 0, "no link of the old CA was cut at the last step");
}

/// A QoS 1 publish through the leader is acknowledged (sent again on a new connection, as a
/// client would, if leadership moved under it), then every member's `match_index` reaches the
/// commit index it made.
async fn acknowledged_by_all_three(nodes: &[Broker], id: &mut u16) {
    use common::raw::{Recv, connect_packet};
    use tern_wire::{Packet, Protocol, ReasonCode};
    let deadline = Instant::now() + MUST_WITHIN;
    let leader_node = loop {
        let leader = wait_leader(nodes, &[0, 1, 2]);
        let leader_node = &nodes[usize::try_from(leader).unwrap() - 1];
        *id += 1;
        let connect = connect_packet(Protocol::V5, &format!("roll-{id}"), true, 0);
        let (mut client, connack) = RawClient::connect_with(leader_node.addr, connect).await;
        if matches!(&connack, Packet::ConnAck(c) if c.reason == ReasonCode::SUCCESS) {
            let publish = common::raw::publish("roll/t", b"m", 1, *id);
            client.send(&Packet::Publish(publish)).await;
            if let Recv::Packet(Packet::PubAck(a)) = client.recv(MUST_WITHIN).await {
                assert_eq!(a.packet_id, *id);
                break leader_node;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no PUBACK within {MUST_WITHIN:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let commit = view(leader_node)["commit_index"].as_u64().unwrap();
    wait_for("all three replicating", || {
        let v = try_view(leader_node)?;
        (1..=3)
            .all(|m| match_index_of(&v, m).is_some_and(|i| i >= commit))
            .then_some(())
    });
}

/// The leader's id once every node names it, handed to the next node first if `not` led.
fn lead_away_from(nodes: &[Broker], not: u64) -> u64 {
    let leader = wait_leader(nodes, &[0, 1, 2]);
    if leader != not {
        return leader;
    }
    let to = not % 3 + 1;
    let r = common::http::request_json(
        nodes[usize::try_from(not).unwrap() - 1].http.unwrap(),
        "POST",
        "/api/v1/cluster/leader",
        Some(TOKEN),
        &format!("{{\"id\": {to}}}"),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let leader = wait_leader(nodes, &[0, 1, 2]);
    assert_ne!(leader, not, "the transfer away from node {not}");
    leader
}

/// A member's `match_index` in a `/api/v1/cluster` view (`None`: not known).
fn match_index_of(view: &Value, id: u64) -> Option<u64> {
    let members = view["members"].as_array()?;
    let member = members.iter().find(|m| m["id"] == id)?;
    member["match_index"].as_u64()
}
