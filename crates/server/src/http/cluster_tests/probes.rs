//! `/readyz` and the `tern_cluster_*` families of `/metrics` in cluster mode.

use axum::http::StatusCode;
use serde_json::json;
use tern_broker::{Broker, BrokerConfig};
use tern_raft::Role;

use super::*;

/// `/readyz` in a cluster: 503 without a leader or without a quorum, 200 on a follower that
/// knows a leader even with no broker, whatever a broker says.
#[tokio::test]
async fn readyz_follows_the_leader_and_the_quorum() {
    let fake = Fake::new(candidate());
    let (state, app) = app(&fake);
    let ready = |r: Answered| (r.status, r.json()["ready"].clone());
    let not_ready = (StatusCode::SERVICE_UNAVAILABLE, json!(false));
    assert_eq!(ready(get(&app, "/readyz").await), not_ready, "no leader");
    *fake.status.lock() = follower();
    let r = get(&app, "/readyz").await;
    assert_eq!(
        (r.status, r.json()),
        (
            StatusCode::OK,
            json!({"ready": true, "role": "follower", "leader_id": 2, "quorum_reachable": true})
        ),
        "a follower with a leader and no broker"
    );
    *fake.status.lock() = leader(None);
    assert_eq!(
        ready(get(&app, "/readyz").await),
        not_ready,
        "a leader never acknowledged"
    );
    *fake.status.lock() = leader(Some(QUORUM_ACK_MAX_AGE_MS + 1));
    assert_eq!(
        ready(get(&app, "/readyz").await),
        not_ready,
        "a leader that lost its quorum"
    );
    *fake.status.lock() = leader(Some(QUORUM_ACK_MAX_AGE_MS));
    assert_eq!(
        ready(get(&app, "/readyz").await),
        (StatusCode::OK, json!(true))
    );
    // A ready broker does not make a leaderless node ready.
    let broker = Broker::new(BrokerConfig::default()).expect("broker");
    broker.mark_ready();
    state.set_broker(broker, Vec::new());
    *fake.status.lock() = candidate();
    assert_eq!(
        ready(get(&app, "/readyz").await),
        not_ready,
        "a ready broker, no leader"
    );
    *fake.status.lock() = ClusterStatus {
        role: Role::Stopped,
        ..follower()
    };
    assert_eq!(ready(get(&app, "/readyz").await), not_ready, "stopped");
}

fn scrape(r: &Answered) -> prom::Exposition {
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    prom::parse(&r.body).unwrap_or_else(|e| panic!("invalid exposition: {e}\n{}", r.body))
}

const CLUSTER_FAMILIES: [(&str, &str); 16] = [
    ("tern_cluster_role", "gauge"),
    ("tern_cluster_term", "gauge"),
    ("tern_cluster_leader_id", "gauge"),
    ("tern_cluster_quorum_reachable", "gauge"),
    ("tern_cluster_voters", "gauge"),
    ("tern_cluster_learners", "gauge"),
    ("tern_cluster_commit_index", "gauge"),
    ("tern_cluster_applied_index", "gauge"),
    ("tern_cluster_last_log_index", "gauge"),
    ("tern_cluster_snapshot_index", "gauge"),
    ("tern_cluster_purged_index", "gauge"),
    ("tern_cluster_replication_lag_entries", "gauge"),
    ("tern_cluster_quorum_ack_age_seconds", "gauge"),
    ("tern_cluster_elections_started_total", "counter"),
    ("tern_cluster_forwarded_connections_total", "counter"),
    ("tern_cluster_refused_connections_total", "counter"),
];

#[tokio::test]
async fn a_follower_without_a_broker_exposes_the_cluster_families() {
    let (_, app) = app(&Fake::new(follower()));
    let page = scrape(&get(&app, "/metrics").await);
    for (family, kind) in CLUSTER_FAMILIES {
        assert_eq!(
            page.types.get(family).map(String::as_str),
            Some(kind),
            "{family}"
        );
    }
    for (role, value) in [("leader", 0.0), ("follower", 1.0), ("candidate", 0.0)] {
        assert_eq!(
            page.value("tern_cluster_role", &[("role", role)]),
            Some(value),
            "{role}"
        );
    }
    let v = |name: &str| page.value(name, &[]);
    assert_eq!(v("tern_cluster_term"), Some(5.0));
    assert_eq!(v("tern_cluster_leader_id"), Some(2.0));
    assert_eq!(v("tern_cluster_quorum_reachable"), Some(1.0));
    assert_eq!(v("tern_cluster_voters"), Some(3.0));
    assert_eq!(v("tern_cluster_learners"), Some(0.0));
    assert_eq!(v("tern_cluster_applied_index"), Some(40.0));
    assert_eq!(v("tern_cluster_last_log_index"), Some(42.0));
    assert_eq!(v("tern_cluster_snapshot_index"), Some(30.0));
    assert_eq!(
        v("tern_cluster_purged_index"),
        None,
        "nothing purged: no sample"
    );
    assert_eq!(v("tern_cluster_elections_started_total"), Some(2.0));
    assert_eq!(v("tern_cluster_forwarded_connections_total"), Some(7.0));
    for (limit, value) in [
        ("forwarded_connections", 1.0),
        ("forward_queue", 2.0),
        ("accept_queue", 3.0),
    ] {
        let refused = page.value(
            "tern_cluster_refused_connections_total",
            &[("limit", limit)],
        );
        assert_eq!(refused, Some(value), "{limit}");
    }
    assert_eq!(
        page.sum("tern_cluster_replication_lag_entries"),
        0.0,
        "leader only"
    );
    assert_eq!(
        v("tern_cluster_quorum_ack_age_seconds"),
        None,
        "leader only"
    );
    assert!(
        !page.types.contains_key("tern_uptime_seconds"),
        "no broker here"
    );
}

#[tokio::test]
async fn a_leader_exposes_lag_per_peer_beside_the_brokers_families() {
    let fake = Fake::new(leader(Some(1_234)));
    let (state, app) = app(&fake);
    state.set_broker(
        Broker::new(BrokerConfig::default()).expect("broker"),
        Vec::new(),
    );
    let page = scrape(&get(&app, "/metrics").await);
    assert!(
        page.types.contains_key("tern_uptime_seconds"),
        "the broker's families too"
    );
    let lag = |peer| page.value("tern_cluster_replication_lag_entries", &[("peer", peer)]);
    assert_eq!(
        (lag("2"), lag("3"), lag("1")),
        (Some(0.0), Some(12.0), None)
    );
    assert_eq!(
        page.value("tern_cluster_quorum_ack_age_seconds", &[]),
        Some(1.234)
    );
    assert_eq!(
        page.value("tern_cluster_role", &[("role", "leader")]),
        Some(1.0)
    );
    assert_eq!(page.value("tern_cluster_commit_index", &[]), Some(42.0));
    // No leader: 0 (ids start at 1), and the quorum gauge says why /readyz is 503.
    *fake.status.lock() = candidate();
    let page = scrape(&get(&app, "/metrics").await);
    assert_eq!(page.value("tern_cluster_leader_id", &[]), Some(0.0));
    assert_eq!(page.value("tern_cluster_quorum_reachable", &[]), Some(0.0));
}

/// In a cluster the broker comes and goes with leadership: the HTTP side serves the one set
/// last, and none after `clear_broker`.
#[tokio::test]
async fn the_broker_is_replaced_and_cleared_with_leadership() {
    let fake = Fake::new(leader(Some(10)));
    let (state, app) = app(&fake);
    let first = Broker::new(BrokerConfig::default()).expect("broker");
    // Tells the two brokers apart: only the first is marked ready.
    first.mark_ready();
    state.set_broker(first, Vec::new());
    assert_eq!(get(&app, "/api/v1/clients").await.status, StatusCode::OK);
    // Leadership lost: the broker stopped.
    *fake.status.lock() = follower();
    state.clear_broker();
    let r = get(&app, "/api/v1/clients").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.body.contains("the leader (node 2)"), "{}", r.body);
    let page = scrape(&get(&app, "/metrics").await);
    assert!(
        !page.types.contains_key("tern_uptime_seconds"),
        "no stale broker families"
    );
    // Leading again, with a new broker: it is the one served, not the first.
    *fake.status.lock() = leader(Some(10));
    let second = Broker::new(BrokerConfig::default()).expect("broker");
    state.set_broker(second, Vec::new());
    assert!(
        state.served().is_some_and(|s| !s.broker.is_ready()),
        "the second broker is served"
    );
    // Replaced without a clear in between (a missed step-down): the newest wins.
    let third = Broker::new(BrokerConfig::default()).expect("broker");
    third.mark_ready();
    state.set_broker(third, Vec::new());
    assert!(
        state.served().is_some_and(|s| s.broker.is_ready()),
        "the third broker is served"
    );
    assert_eq!(get(&app, "/api/v1/clients").await.status, StatusCode::OK);
    let page = scrape(&get(&app, "/metrics").await);
    assert!(page.types.contains_key("tern_uptime_seconds"));
}
