//! The dashboard's cluster panel in a real browser (Debian's `chromium`, headless, as
//! `tests/dashboard.rs` does): the page served by the router with a fake cluster, the DOM
//! read after a few polls. `TERN_SKIP_BROWSER=1` skips it on a machine without chromium.

use std::process::{Command, Stdio};

use tern_broker::{Broker, BrokerConfig};

use super::*;

/// Virtual time one page load runs for (chromium pauses it while fetches are pending).
const VIRTUAL_TIME_BUDGET_MS: u32 = 3_000;

/// Serves `state`'s router on a loopback port and returns the DOM chromium built from `/`.
async fn dump_dom(state: Arc<HttpState>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let local = listener.local_addr().expect("local address");
    let server = tokio::spawn(async move { axum::serve(listener, router(state)).await });
    let url = format!("http://{local}/");
    let out = tokio::task::spawn_blocking(move || {
        Command::new("chromium")
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
            ])
            .arg(format!("--virtual-time-budget={VIRTUAL_TIME_BUDGET_MS}"))
            .args(["--dump-dom", &url])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
    })
    .await
    .expect("join")
    .expect("run chromium (apt-get install chromium, or TERN_SKIP_BROWSER=1)");
    server.abort();
    assert!(out.status.success(), "chromium failed: {:?}", out.status);
    String::from_utf8(out.stdout).expect("UTF-8 DOM")
}

/// The opening tag of the element with `id`.
fn tag<'a>(dom: &'a str, id: &str) -> &'a str {
    let at = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no #{id}: {dom}"));
    let start = dom[..at].rfind('<').expect("tag start");
    let end = at + dom[at..].find('>').expect("tag end");
    &dom[start..end]
}

/// How many polls completed (`<body data-polls>`, set by the page after each full poll).
fn polls(dom: &str) -> u32 {
    let body = &dom[dom.find("<body").expect("body")..];
    let body = &body[..body.find('>').expect("body tag end")];
    body.split("data-polls=\"")
        .nth(1)
        .and_then(|v| v.split('"').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn skip() -> bool {
    let skip = std::env::var_os("TERN_SKIP_BROWSER").is_some();
    if skip {
        eprintln!("TERN_SKIP_BROWSER set: skipped");
    }
    skip
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_shows_the_members_and_the_leader_and_no_broker_lists() {
    if skip() {
        return;
    }
    let fake = Fake::new(follower());
    let (state, _) = app(&fake);
    let dom = dump_dom(state).await;
    let panel = tag(&dom, "cluster");
    assert!(!panel.contains("hidden"), "{panel}");
    assert!(
        panel.contains("data-role=\"follower\"") && panel.contains("data-leader=\"2\""),
        "{panel}"
    );
    for id in 1..=3 {
        assert!(
            dom.contains(&format!("data-id=\"{id}\"")),
            "member {id}: {dom}"
        );
    }
    assert!(
        dom.contains("127.0.0.1:7002") && dom.contains(">leader<"),
        "{dom}"
    );
    assert!(
        dom.contains("on the leader (node 2)"),
        "the lists are the leader's: {dom}"
    );
    assert!(
        tag(&dom, "ready").contains("status") && dom.contains(">ready<"),
        "{dom}"
    );
    // Every poll completed: no error on a node without a broker.
    assert!(
        tag(&dom, "status").ends_with("class=\"status\""),
        "{}",
        tag(&dom, "status")
    );
    assert!(polls(&dom) >= 1, "no poll completed: {dom}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_shows_the_lag_and_a_single_node_no_panel() {
    if skip() {
        return;
    }
    let fake = Fake::new(leader(Some(10)));
    let (state, _) = app(&fake);
    let broker = Broker::new(BrokerConfig::default()).expect("broker");
    broker.mark_ready();
    state.set_broker(broker.clone(), Vec::new());
    let dom = dump_dom(state).await;
    assert!(
        tag(&dom, "cluster").contains("data-role=\"leader\""),
        "{dom}"
    );
    assert!(
        dom.contains("class=\"lag-bad\" data-value=\"12\"")
            || dom.contains("data-value=\"12\" class=\"lag-bad\""),
        "node 3 lags 12: {dom}"
    );
    // A single node: the panel stays hidden.
    let single = super::state("127.0.0.1:0", Some(TOKEN));
    single.set_broker(broker, Vec::new());
    let dom = dump_dom(single).await;
    assert!(
        tag(&dom, "cluster").contains("hidden"),
        "{}",
        tag(&dom, "cluster")
    );
    assert!(polls(&dom) >= 1, "no poll completed: {dom}");
}
