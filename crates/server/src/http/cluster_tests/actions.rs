//! `/api/v1/cluster` and its actions: the JSON, the token rules, input checks, error statuses.

use axum::http::StatusCode;
use serde_json::{Value, json};
use tern_raft::NodeId;

use super::*;

#[tokio::test]
async fn cluster_json_is_the_issues_shape_on_a_follower() {
    let (_, app) = app(&Fake::new(follower()));
    let r = get(&app, "/api/v1/cluster").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let member = |id: u64| {
        json!({"id": id, "addr": format!("127.0.0.1:700{id}"), "voter": true,
               "match_index": null, "lag_entries": null})
    };
    assert_eq!(
        r.json(),
        json!({
            "node_id": 1, "leader_id": 2, "term": 5, "role": "follower",
            "commit_index": 40, "applied_index": 40,
            "members": [member(1), member(2), member(3)],
        })
    );
}

#[tokio::test]
async fn leader_id_is_null_without_a_leader() {
    let (_, app) = app(&Fake::new(candidate()));
    let body = get(&app, "/api/v1/cluster").await.json();
    assert_eq!(body["leader_id"], Value::Null, "{body}");
    assert_eq!(body["role"], "candidate");
    assert_eq!(body["term"], 6);
}

#[tokio::test]
async fn the_leader_reports_match_index_and_lag_per_member() {
    let mut status = leader(Some(10));
    status.learners = vec![NodeId(4)];
    let (_, app) = app(&Fake::new(status));
    let body = get(&app, "/api/v1/cluster").await.json();
    let members = body["members"].as_array().expect("members");
    let view: Vec<_> = members
        .iter()
        .map(|m| {
            (
                m["id"].clone(),
                m["voter"].clone(),
                m["match_index"].clone(),
                m["lag_entries"].clone(),
            )
        })
        .collect();
    assert_eq!(
        view,
        vec![
            (json!(1), json!(true), json!(42), json!(0)),
            (json!(2), json!(true), json!(42), json!(0)),
            (json!(3), json!(true), json!(30), json!(12)),
            // A learner the status names but whose address the fake does not know.
            (json!(4), json!(false), Value::Null, Value::Null),
        ]
    );
    assert_eq!(members[3]["addr"], Value::Null);
    assert_eq!(body["commit_index"], 42);
}

#[tokio::test]
async fn without_a_cluster_the_routes_are_404_and_single_node_is_unchanged() {
    let state = state("127.0.0.1:0", Some(TOKEN));
    let app = router(state.clone());
    for (method, path, body) in [
        ("GET", "/api/v1/cluster", ""),
        (
            "POST",
            "/api/v1/cluster/members",
            r#"{"id": 4, "addr": "127.0.0.1:7004"}"#,
        ),
        ("DELETE", "/api/v1/cluster/members/2", ""),
        ("POST", "/api/v1/cluster/leader", r#"{"id": 2}"#),
    ] {
        let r = call(&app, method, path, Some(TOKEN), body).await;
        assert_eq!(
            r.status,
            StatusCode::NOT_FOUND,
            "{method} {path}: {}",
            r.body
        );
        assert!(
            r.json()["error"]
                .as_str()
                .is_some_and(|e| e.contains("[cluster]"))
        );
    }
    // Single node: `/readyz` and `/metrics` follow the broker, as before the cluster existed.
    let r = get(&app, "/readyz").await;
    assert_eq!(
        (r.status, r.json()),
        (StatusCode::SERVICE_UNAVAILABLE, json!({"ready": false}))
    );
    assert_eq!(
        get(&app, "/metrics").await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let broker = Broker::new(BrokerConfig::default()).expect("broker");
    state.set_broker(broker.clone(), Vec::new());
    let r = get(&app, "/readyz").await;
    assert_eq!(
        r.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "set but not serving yet"
    );
    broker.mark_ready();
    let r = get(&app, "/readyz").await;
    assert_eq!(
        (r.status, r.json()),
        (StatusCode::OK, json!({"ready": true}))
    );
    let r = get(&app, "/metrics").await;
    assert_eq!(r.status, StatusCode::OK);
    let page = prom::parse(&r.body).unwrap_or_else(|e| panic!("{e}\n{}", r.body));
    assert!(page.types.contains_key("tern_uptime_seconds"));
    assert!(!page.types.keys().any(|k| k.starts_with("tern_cluster_")));
}

#[tokio::test]
async fn actions_need_the_token_and_reads_follow_the_bind() {
    let fake = Fake::new(follower());
    let (_, app) = app(&fake);
    let add = r#"{"id": 4, "addr": "127.0.0.1:7004"}"#;
    for token in [None, Some("wrong-token-0123456789")] {
        for (method, path, body) in [
            ("POST", "/api/v1/cluster/members", add),
            ("DELETE", "/api/v1/cluster/members/2", ""),
            ("POST", "/api/v1/cluster/leader", r#"{"id": 2}"#),
        ] {
            let r = call(&app, method, path, token, body).await;
            assert_eq!(
                r.status,
                StatusCode::UNAUTHORIZED,
                "{method} {path} {token:?}"
            );
        }
    }
    assert_eq!(
        get(&app, "/api/v1/cluster").await.status,
        StatusCode::OK,
        "loopback reads are open"
    );
    // No token configured: actions are disabled.
    let open = state("127.0.0.1:0", None);
    open.set_cluster(fake.clone());
    let r = call(&router(open), "POST", "/api/v1/cluster/members", None, add).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    // A non-loopback bind: the read needs the token too; /readyz never does.
    let exposed = state("0.0.0.0:0", Some(TOKEN));
    exposed.set_cluster(fake.clone());
    let exposed = router(exposed);
    assert_eq!(
        get(&exposed, "/api/v1/cluster").await.status,
        StatusCode::UNAUTHORIZED
    );
    let r = call(&exposed, "GET", "/api/v1/cluster", Some(TOKEN), "").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        get(&exposed, "/metrics").await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(get(&exposed, "/readyz").await.status, StatusCode::OK);
    assert!(fake.calls.lock().is_empty(), "{:?}", fake.calls.lock());
}

#[tokio::test]
async fn bad_input_is_400_with_a_json_error_and_never_reaches_the_cluster() {
    let fake = Fake::new(follower());
    let (_, app) = app(&fake);
    for (body, says) in [
        (r#"{"id": 0, "addr": "127.0.0.1:7004"}"#, "start at 1"),
        (r#"{"id": -1, "addr": "127.0.0.1:7004"}"#, "body"),
        (r#"{"id": 4, "addr": "localhost"}"#, "not an address"),
        (r#"{"id": 4, "addr": "0.0.0.0:7004"}"#, "cannot be dialed"),
        (r#"{"id": 4, "addr": "127.0.0.1:0"}"#, "cannot be dialed"),
        (r#"{"id": 4}"#, "body"),
        (
            r#"{"id": 4, "addr": "127.0.0.1:7004", "voter": true}"#,
            "body",
        ),
        ("id=4", "body"),
    ] {
        let r = post(&app, "/api/v1/cluster/members", body).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}: {}", r.body);
        let error = r.json()["error"].as_str().unwrap_or_default().to_string();
        assert!(error.contains(says), "{body}: {error}");
    }
    for path in ["/api/v1/cluster/members/0", "/api/v1/cluster/members/two"] {
        let r = call(&app, "DELETE", path, Some(TOKEN), "").await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{path}: {}", r.body);
        assert!(r.json()["error"].is_string());
    }
    for body in [r#"{"id": 0}"#, r#"{"to": 2}"#, "2"] {
        let r = post(&app, "/api/v1/cluster/leader", body).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}: {}", r.body);
    }
    assert!(fake.calls.lock().is_empty(), "{:?}", fake.calls.lock());
}

#[tokio::test]
async fn actions_reach_the_cluster_and_its_errors_keep_their_status() {
    let fake = Fake::new(leader(Some(10)));
    let (_, app) = app(&fake);
    let r = post(
        &app,
        "/api/v1/cluster/members",
        r#"{"id": 4, "addr": "127.0.0.1:7004"}"#,
    )
    .await;
    assert_eq!(
        (r.status, r.json()),
        (
            StatusCode::OK,
            json!({"added": 4, "addr": "127.0.0.1:7004"})
        )
    );
    // Conflicts this node can see: a member twice, another member's address.
    let r = post(
        &app,
        "/api/v1/cluster/members",
        r#"{"id": 3, "addr": "127.0.0.1:7009"}"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    let r = post(
        &app,
        "/api/v1/cluster/members",
        r#"{"id": 5, "addr": "127.0.0.1:7002"}"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    // A learner left by a dropped request: the same request resumes it, another address not.
    fake.status.lock().learners.push(NodeId(4));
    fake.addrs.lock().push((NodeId(4), addr("127.0.0.1:7004")));
    let r = post(
        &app,
        "/api/v1/cluster/members",
        r#"{"id": 4, "addr": "127.0.0.1:7004"}"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let r = post(
        &app,
        "/api/v1/cluster/members",
        r#"{"id": 4, "addr": "127.0.0.1:7005"}"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    let r = call(&app, "DELETE", "/api/v1/cluster/members/9", Some(TOKEN), "").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.body);
    let r = call(&app, "DELETE", "/api/v1/cluster/members/3", Some(TOKEN), "").await;
    assert_eq!(
        (r.status, r.json()),
        (StatusCode::OK, json!({"removed": 3}))
    );
    let r = post(&app, "/api/v1/cluster/leader", r#"{"id": 9}"#).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "not a voter: {}", r.body);
    let r = post(&app, "/api/v1/cluster/leader", r#"{"id": 2}"#).await;
    assert_eq!(r.status, StatusCode::NOT_IMPLEMENTED, "{}", r.body);
    assert!(
        r.json()["error"]
            .as_str()
            .is_some_and(|e| e.contains("openraft 0.9"))
    );
    *fake.answer.lock() = Answer::NotLeader(Some(2));
    let r = call(&app, "DELETE", "/api/v1/cluster/members/3", Some(TOKEN), "").await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(r.json()["leader_id"], 2, "{}", r.body);
    *fake.answer.lock() = Answer::NotLeader(None);
    let r = call(&app, "DELETE", "/api/v1/cluster/members/3", Some(TOKEN), "").await;
    assert_eq!(
        (r.status, r.json()["leader_id"].clone()),
        (StatusCode::CONFLICT, Value::Null)
    );
    *fake.answer.lock() = Answer::Unavailable;
    let r = post(
        &app,
        "/api/v1/cluster/members",
        r#"{"id": 4, "addr": "127.0.0.1:7004"}"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        *fake.calls.lock(),
        [
            "add 4 127.0.0.1:7004",
            "add 4 127.0.0.1:7004",
            "remove 3",
            "transfer 2",
            "remove 3",
            "remove 3",
            "add 4 127.0.0.1:7004"
        ]
    );
}

#[test]
fn consensus_errors_map_to_their_status() {
    use tern_raft::ConsensusError as C;
    let io = std::io::Error::other("disk");
    for (error, status) in [
        (C::NotLeader { leader: None }, StatusCode::CONFLICT),
        (C::Membership("lagging".into()), StatusCode::CONFLICT),
        (C::Unsupported("transfer"), StatusCode::NOT_IMPLEMENTED),
        (C::Invalid("id".into()), StatusCode::BAD_REQUEST),
        (
            C::Shutdown("stopped".into()),
            StatusCode::SERVICE_UNAVAILABLE,
        ),
        (
            C::TransferTimedOut("2 did not take over".into()),
            StatusCode::SERVICE_UNAVAILABLE,
        ),
        (C::Storage("disk".into()), StatusCode::INTERNAL_SERVER_ERROR),
        (
            C::Io {
                context: "bind".into(),
                source: io,
            },
            StatusCode::INTERNAL_SERVER_ERROR,
        ),
    ] {
        let shown = error.to_string();
        let response = axum::response::IntoResponse::into_response(ClusterActionError::from(error));
        assert_eq!(response.status(), status, "{shown}");
    }
}
