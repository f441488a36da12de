//! Helpers of the cluster suites (`cluster_http.rs`, `cluster_tls*.rs`): nodes of real `tern
//! serve` processes, their `/api/v1/cluster` view, and bounded waits on it.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::Broker;
use super::certs::NodePki;
use super::http::get;

pub const TOKEN: &str = "test-token-0123456789";
/// Bound on each wait for something that must happen (elections on a loaded machine).
pub const MUST_WITHIN: Duration = Duration::from_secs(30);

/// One node's config: `tls` its certificate, key and CA; `ports` every node's cluster port;
/// `listeners` its `[[listener]]` tables (none: one plain listener).
pub fn tls_node_config(id: usize, ports: &[u16], tls: &NodePki, listeners: &str) -> String {
    let peers: Vec<String> = ports
        .iter()
        .enumerate()
        .map(|(i, p)| format!("\"{}=127.0.0.1:{p}\"", i + 1))
        .collect();
    let listeners = if listeners.is_empty() {
        "[listener]\nbind = \"127.0.0.1:0\"\n"
    } else {
        listeners
    };
    let crl = tls
        .crl
        .as_ref()
        .map_or(String::new(), |c| format!("tls_crl = {c:?}\n"));
    format!(
        "{listeners}\n[http]\ntoken = \"{TOKEN}\"\n\n\
         [cluster]\nnode_id = {id}\n\
         bind = \"127.0.0.1:{}\"\npeers = [{}]\ntls_cert = {:?}\ntls_key = {:?}\ntls_ca = {:?}\n{crl}",
        ports[id - 1],
        peers.join(", "),
        tls.cert,
        tls.key,
        tls.ca,
    )
}

pub fn start_tls(pki: &[NodePki], ports: &[u16]) -> Vec<Broker> {
    start_tls_with(pki, ports, "")
}

pub fn start_tls_with(pki: &[NodePki], ports: &[u16], listeners: &str) -> Vec<Broker> {
    (0..pki.len())
        .map(|i| {
            Broker::start_with_args(
                &tls_node_config(i + 1, ports, &pki[i], listeners),
                &["--http", "127.0.0.1:0"],
            )
        })
        .collect()
}

pub fn view(node: &Broker) -> Value {
    let r = get(node.http.expect("http address"), "/api/v1/cluster");
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

/// [`view`], or `None` while the node is starting (503).
pub fn try_view(node: &Broker) -> Option<Value> {
    let r = get(node.http?, "/api/v1/cluster");
    (r.status == 200).then(|| r.json())
}

/// Polls `f` until it gives a value, for at most [`MUST_WITHIN`].
pub fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + MUST_WITHIN;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {MUST_WITHIN:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The leader's id once the nodes of `among` all name it and it serves.
pub fn wait_leader(nodes: &[Broker], among: &[usize]) -> u64 {
    wait_for("one leader named by every node, serving", || {
        let views = among
            .iter()
            .map(|&i| try_view(&nodes[i]))
            .collect::<Option<Vec<Value>>>()?;
        let leader = views[0]["leader_id"].as_u64()?;
        let agree = views.iter().all(|v| v["leader_id"] == leader);
        let node = &nodes[usize::try_from(leader).ok()? - 1];
        let serving = get(node.http?, "/api/v1/clients").status == 200;
        (agree && serving).then_some(leader)
    })
}
