//! `$SYS/broker/...` statistics (server policy; MQTT-4.7.2-1 for `$` topics is covered in
//! subscriptions.rs).

mod common;

use std::collections::HashMap;

use common::raw::*;
use common::{Broker, QUIET, WAIT};

/// Reads `$SYS` messages until `done` holds for the values seen so far (bounded by `WAIT`×2).
async fn collect_until(
    c: &mut RawClient,
    done: impl Fn(&HashMap<String, String>) -> bool,
) -> HashMap<String, String> {
    let mut seen = HashMap::new();
    let deadline = tokio::time::Instant::now() + WAIT * 2;
    while !done(&seen) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "$SYS values never satisfied the check: {seen:?}"
        );
        let m = c.expect_publish().await;
        assert!(m.topic.starts_with("$SYS/broker/"), "{:?}", m.topic);
        seen.insert(
            m.topic.to_string(),
            String::from_utf8_lossy(&m.payload).into_owned(),
        );
    }
    seen
}

fn num(seen: &HashMap<String, String>, topic: &str) -> Option<u64> {
    seen.get(topic).and_then(|v| v.trim().parse().ok())
}

/// `$SYS/broker/version`, `uptime`, `clients/connected` are published (interval 1 s); the
/// counters are numbers; `clients/connected` counts this client; `messages/received` grows
/// when messages are published.
#[tokio::test]
async fn sys_counters_are_published_and_move() {
    let b = Broker::start_with("[sys]\ninterval_s = 1\n");
    let mut c = RawClient::v5(b.addr, "sys-s").await;
    c.sub("$SYS/broker/#", 0).await;
    let seen = collect_until(&mut c, |s| {
        s.contains_key("$SYS/broker/version")
            && s.contains_key("$SYS/broker/uptime")
            && num(s, "$SYS/broker/clients/connected").is_some()
            && num(s, "$SYS/broker/messages/received").is_some()
    })
    .await;
    assert!(seen["$SYS/broker/version"].contains(env!("CARGO_PKG_VERSION")));
    assert!(num(&seen, "$SYS/broker/clients/connected").unwrap() >= 1);
    let before = num(&seen, "$SYS/broker/messages/received").unwrap();
    let mut p = RawClient::v5(b.addr, "sys-p").await;
    for i in 0..5u16 {
        p.publish_acked(publish("sys/t", b"x", 1, i + 1)).await;
    }
    collect_until(&mut c, |s| {
        num(s, "$SYS/broker/messages/received").is_some_and(|n| n >= before + 5)
    })
    .await;
}

/// `$SYS` messages are retained: a client subscribing after a tick gets the values at once.
#[tokio::test]
async fn sys_values_are_retained() {
    let b = Broker::start_with("[sys]\ninterval_s = 1\n");
    let mut first = RawClient::v5(b.addr, "sysr-1").await;
    first.sub("$SYS/broker/uptime", 0).await;
    first.expect_publish().await; // a tick happened
    let mut late = RawClient::v5(b.addr, "sysr-2").await;
    late.sub("$SYS/broker/uptime", 0).await;
    // The retained copy comes at subscribe time; a tick racing the SUBSCRIBE may deliver a
    // live (RETAIN 0) copy as well, so look at the first two.
    let m1 = late.expect_publish().await;
    if !m1.retain {
        let second = late.expect_publish().await;
        assert!(second.retain, "no retained value sent at subscribe");
    }
}

/// `interval_s = 0` disables `$SYS`.
#[tokio::test]
async fn sys_disabled_by_config() {
    let b = Broker::start_with("[sys]\ninterval_s = 0\n");
    let mut c = RawClient::v5(b.addr, "sys-off").await;
    c.sub("$SYS/#", 0).await;
    c.expect_nothing(QUIET * 3).await;
}

/// `$SYS/broker/clients/connected` follows connections coming and going.
#[tokio::test]
async fn sys_clients_connected_follows_connections() {
    let b = Broker::start_with("[sys]\ninterval_s = 1\n");
    let mut c = RawClient::v5(b.addr, "sysc-s").await;
    c.sub("$SYS/broker/clients/connected", 0).await;
    let topic = "$SYS/broker/clients/connected";
    let base = num(
        &collect_until(&mut c, |s| num(s, topic).is_some()).await,
        topic,
    )
    .unwrap();
    let mut extra = Vec::new();
    for i in 0..3 {
        extra.push(RawClient::v4(b.addr, &format!("sysc-{i}")).await);
    }
    collect_until(&mut c, |s| num(s, topic) == Some(base + 3)).await;
    for e in extra {
        e.disconnect().await;
    }
    collect_until(&mut c, |s| num(s, topic) == Some(base)).await;
}
