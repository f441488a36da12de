//! The cluster's operator surface on three real `tern serve` processes (issue 23 §5 and
//! "Interface"): `/api/v1/cluster` agrees on every node, `/readyz` is 200 on followers that
//! run no broker and 503 on a node left without a quorum, `/metrics` carries the
//! `tern_cluster_*` families (a follower's page has them alone), a fourth node is added as a
//! learner and promoted, then removed, leadership is transferred, and a node left without a
//! quorum closes the clients it cannot serve.

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use common::cluster::{TOKEN, view as cluster_view, wait_for};
use common::http::{Response, get, request, request_json};
use common::{Broker, free_port};
use serde_json::Value;
use tern_cluster::LEADER_WAIT_MS;

/// Node `id`'s config; `peers` are the initial voters (a node not among them is a newcomer).
fn node_config(id: u16, cluster_port: u16, peers: &[u16]) -> String {
    let peers: Vec<String> = peers
        .iter()
        .enumerate()
        .map(|(i, p)| format!("\"{}=127.0.0.1:{p}\"", i + 1))
        .collect();
    format!(
        "[listener]\nbind = \"127.0.0.1:{}\"\n\n[http]\ntoken = \"{TOKEN}\"\n\n\
         [cluster]\nnode_id = {id}\nbind = \"127.0.0.1:{cluster_port}\"\npeers = [{}]\n",
        free_port(),
        peers.join(", ")
    )
}

fn start(id: u16, cluster_port: u16, peers: &[u16]) -> Broker {
    let config = node_config(id, cluster_port, peers);
    Broker::start_with_args(&config, &["--http", "127.0.0.1:0"])
}

fn http(node: &Broker) -> SocketAddr {
    node.http.expect("the node printed `tern http on ADDR`")
}

fn voters(view: &Value) -> Vec<u64> {
    let members = view["members"].as_array().expect("members");
    members
        .iter()
        .filter(|m| m["voter"] == true)
        .filter_map(|m| m["id"].as_u64())
        .collect()
}

fn post(node: &Broker, path: &str, body: &str) -> Response {
    request_json(http(node), "POST", path, Some(TOKEN), body)
}

#[test]
fn the_operator_surface_on_three_processes() {
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let mut nodes: Vec<Broker> = (0..3u16)
        .map(|i| start(i + 1, ports[usize::from(i)], &ports))
        .collect();
    wait_for("every node ready (a leader with its quorum)", || {
        nodes
            .iter()
            .all(|n| get(http(n), "/readyz").status == 200)
            .then_some(())
    });
    let leader_id = wait_for("one leader that every node names", || {
        let views: Vec<Value> = nodes.iter().map(cluster_view).collect();
        let leader = views[0]["leader_id"].as_u64()?;
        let leaders = views.iter().filter(|v| v["role"] == "leader").count();
        let agree = views.iter().all(|v| v["leader_id"] == leader);
        (agree && leaders == 1).then_some(leader)
    });
    let leader = &nodes[usize::try_from(leader_id).expect("id") - 1];
    // A follower may be ready (it knows the leader) before the leader heard its match.
    let view = wait_for("the leader knows every member's match index", || {
        let view = cluster_view(leader);
        let members = view["members"].as_array()?;
        members
            .iter()
            .all(|m| m["match_index"].is_u64())
            .then_some(view)
    });
    assert_eq!(voters(&view), vec![1, 2, 3], "{view}");
    for m in view["members"].as_array().expect("members") {
        let id = usize::try_from(m["id"].as_u64().expect("id")).expect("id");
        assert_eq!(m["addr"], format!("127.0.0.1:{}", ports[id - 1]), "{view}");
    }
    assert!(
        view["commit_index"].is_u64() && view["term"].as_u64() >= Some(1),
        "{view}"
    );

    // A follower: no broker, ready, and a metrics page of the cluster's families alone.
    let follower = nodes
        .iter()
        .find(|n| cluster_view(n)["role"] == "follower")
        .expect("a follower");
    let page =
        common::prom::parse(&get(http(follower), "/metrics").body).expect("valid exposition");
    assert_eq!(
        page.value("tern_cluster_role", &[("role", "follower")]),
        Some(1.0)
    );
    assert_eq!(
        page.value("tern_cluster_leader_id", &[]),
        Some(leader_id as f64)
    );
    assert!(
        !page.types.contains_key("tern_uptime_seconds"),
        "a follower runs no broker"
    );
    assert_eq!(
        cluster_view(follower)["members"][0]["match_index"],
        Value::Null
    );
    let lists = get(http(follower), "/api/v1/clients");
    assert_eq!(lists.status, 503, "{}", lists.body);
    // The leader: once its engine started, the broker's families and the cluster's.
    wait_for("the leader's broker serves the lists", || {
        (get(http(leader), "/api/v1/clients").status == 200).then_some(())
    });
    let page = common::prom::parse(&get(http(leader), "/metrics").body).expect("valid exposition");
    assert!(page.types.contains_key("tern_uptime_seconds"));
    let peers = page
        .samples
        .keys()
        .filter(|(n, _)| n == "tern_cluster_replication_lag_entries")
        .count();
    assert_eq!(peers, 2, "one lag per peer");

    // A fourth node: a newcomer, added as a learner and promoted, then removed.
    let port4 = free_port();
    let newcomer = start(4, port4, &ports);
    let add = format!("{{\"id\": 4, \"addr\": \"127.0.0.1:{port4}\"}}");
    assert_eq!(
        request_json(http(leader), "POST", "/api/v1/cluster/members", None, &add).status,
        401
    );
    let r = post(leader, "/api/v1/cluster/members", &add);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(voters(&cluster_view(leader)), vec![1, 2, 3, 4]);
    wait_for("the newcomer knows the leader", || {
        (cluster_view(&newcomer)["leader_id"] == leader_id).then_some(())
    });
    let r = request(
        http(leader),
        "DELETE",
        "/api/v1/cluster/members/4",
        Some(TOKEN),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(voters(&cluster_view(leader)), vec![1, 2, 3]);
    drop(newcomer);

    // Leader transfer: the chosen voter leads afterwards (asked on the leader, answered once
    // it has taken over), and every node says so.
    let other = (leader_id % 3) + 1;
    let r = post(
        leader,
        "/api/v1/cluster/leader",
        &format!("{{\"id\": {other}}}"),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["leader_id"], other);
    for n in &nodes {
        wait_for("every node sees the new leader", || {
            let c = get(http(n), "/api/v1/cluster");
            (c.status == 200 && c.json()["leader_id"] == other).then_some(())
        });
    }

    // Two of three nodes gone: the survivor has no quorum and says so, whatever it was.
    let survivor = nodes.pop().expect("node 3");
    for mut n in nodes {
        n.kill();
    }
    let body = wait_for("the survivor not ready", || {
        let r = get(http(&survivor), "/readyz");
        (r.status == 503).then(|| r.json())
    });
    assert_eq!(body["ready"], false, "{body}");
    let page =
        common::prom::parse(&get(http(&survivor), "/metrics").body).expect("valid exposition");
    assert_eq!(page.value("tern_cluster_quorum_reachable", &[]), Some(0.0));

    // A client that connects to it anyway is closed (no CONNACK) after a couple of election
    // timeouts, so that it tries another node; it was held until `LEADER_WAIT_MS` (10 s)
    // before, past a client's patience (a minority side of a partition looked like an outage).
    let mut stream = std::net::TcpStream::connect(survivor.addr).expect("the listener accepts");
    stream
        .write_all(&common::raw::connect_bytes(4, 0x02, 30, "lost-soul", &[]))
        .expect("CONNECT sent");
    stream
        .set_read_timeout(Some(Duration::from_millis(LEADER_WAIT_MS / 2)))
        .expect("timeout");
    let mut answer = Vec::new();
    match stream.read_to_end(&mut answer) {
        Ok(_) => assert!(answer.is_empty(), "answered {answer:?}"),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("still held after {} ms: {e}", LEADER_WAIT_MS / 2),
    }
}
