//! `[store] max_disk_bytes` (issue 11 item 2): refusals at the budget (v5 0x97, 3.1.1 closed,
//! QoS 0 dropped), nothing acknowledged lost at a SIGKILL there, and publishing resumed once
//! retention frees space. Part of `limits.rs`'s test binary.

use std::time::Duration;

use super::common::raw::*;
use super::common::{Broker, WAIT};
use super::{persistent, puback_reason, sys_until};

/// Publishes 4000-byte QoS 1 messages to the filler stream (packet ids from `first_id`) until
/// one is refused with 0x97 twice, 200 ms apart; fails the test if the budget is not reached
/// within 200.
async fn fill_disk_budget(p: &mut RawClient, first_id: u16) {
    let filler = vec![0xB0u8; 4000];
    let mut refused_once = false;
    for n in 0..200u16 {
        let reason = puback_reason(p, publish("b/fill", &filler, 1, first_id + n)).await;
        if reason == ReasonCode::QUOTA_EXCEEDED {
            if refused_once {
                return;
            }
            // The first refusal may come from the running estimate of what was appended,
            // which counts each record whole where the blocks already had room for it. The
            // checkpoint (every 25 ms) replaces it with the blocks' size, and may accept again:
            // the budget is reached only once a refusal follows such a refresh.
            refused_once = true;
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        assert!(reason.is_success(), "{reason:?}");
        refused_once = false;
    }
    panic!("the disk budget was never reached");
}

/// The budget's configuration: every message stream has small blocks, the catch-all `rest`
/// too (the budget counts an active block's whole reservation once a record, a control record
/// too, is written to it, and the default stream's 4 MiB blocks would hold a 256 KiB budget
/// from the start); `filler` (`b/#`) keeps by retention only, with `filler_limit` its limit.
fn disk_budget_config(filler_limit: &str) -> String {
    format!(
        "[store]\nmax_disk_bytes = 262144\n[sys]\ninterval_s = 1\n\
         [[stream]]\nname = \"kept\"\nfilters = [\"a/#\"]\nblock_size_bytes = 8192\n\
         [[stream]]\nname = \"filler\"\nfilters = [\"b/#\"]\nblock_size_bytes = 8192\n{filler_limit}keep = \"retention\"\ndurability = \"always\"\n\
         [[stream]]\nname = \"rest\"\nblock_size_bytes = 8192\n"
    )
}

/// Issue 11 item 2, `[store] max_disk_bytes`: once the store's blocks reach the budget, a v5
/// QoS 1 PUBLISH that would be written gets PUBACK 0x97 (Quota exceeded), a 3.1.1 one closes
/// the connection without a PUBACK (the client resends later), and QoS 0 that would be written
/// is dropped (counted); QoS 0 to a stream that does not write it still flows. Nothing
/// acknowledged is lost: SIGKILL at the budget, restart, and the persistent subscriber gets
/// every acknowledged message, and none of the refused ones.
///
/// The filler stream has no limit here, so nothing frees the budget while the refusals are
/// checked: the test used to free it by a 3 s age limit in the same run, and on a loaded
/// machine the 3.1.1 PUBLISH came after that and was accepted (issue 24 item 8). Resuming
/// after retention is the next test's.
#[tokio::test]
async fn disk_budget_refuses_with_0x97_drops_qos0_and_loses_nothing_at_kill() {
    let mut b = Broker::start_with(&disk_budget_config(""));
    let (mut s, _) = RawClient::connect_ok(b.addr, persistent("db-s", true)).await;
    s.sub("a/x", 1).await;
    s.disconnect().await;
    let mut o = RawClient::v5(b.addr, "db-o").await;
    o.sub("a/q0", 0).await;
    o.sub("b/q0", 0).await;
    let mut sys = RawClient::v5(b.addr, "db-sys").await;
    sys.sub("$SYS/broker/messages/+/disk_budget", 0).await;

    let mut p = RawClient::v5(b.addr, "db-p").await;
    let mut acked: Vec<u8> = Vec::new();
    for i in 0..10u8 {
        p.publish_acked(publish("a/x", &[i; 100], 1, u16::from(i) + 1))
            .await;
        acked.push(i);
    }
    fill_disk_budget(&mut p, 100).await;
    // Every stream that writes is refused now, not only the one that filled the budget.
    assert_eq!(
        puback_reason(&mut p, publish("a/x", b"refused", 1, 400)).await,
        ReasonCode::QUOTA_EXCEEDED
    );
    // QoS 0: dropped where it would be written, delivered where it would not.
    p.publish_acked(publish("b/q0", b"dropped", 0, 0)).await;
    p.publish_acked(publish("a/q0", b"flows", 0, 0)).await;
    assert!(p.ping().await.is_empty());
    let seen = o.ping().await;
    let payloads: Vec<&[u8]> = seen
        .iter()
        .filter_map(|p| match p {
            Packet::Publish(m) => Some(&m.payload[..]),
            _ => None,
        })
        .collect();
    assert_eq!(payloads, vec![&b"flows"[..]], "{}", briefs(&seen));
    // 3.1.1 has no negative PUBACK: the connection is closed without one.
    let mut v3 = RawClient::v4(b.addr, "db-v3").await;
    // Past a checkpoint's refresh of the measure (every 25 ms): the budget stays reached.
    tokio::time::sleep(Duration::from_millis(200)).await;
    v3.send(&Packet::Publish(publish("a/x", b"refused", 1, 1)))
        .await;
    let before = v3.expect_closed().await;
    assert!(
        !before.iter().any(|p| matches!(p, Packet::PubAck(_))),
        "3.1.1 publish at the budget was acknowledged: {}",
        briefs(&before)
    );
    // Two refusals ended the fill, then a/x and the 3.1.1 PUBLISH.
    sys_until(&mut sys, "$SYS/broker/messages/refused/disk_budget", |n| {
        n >= 4
    })
    .await;
    sys_until(&mut sys, "$SYS/broker/messages/dropped/disk_budget", |n| {
        n >= 1
    })
    .await;

    // At the budget, SIGKILL: every acknowledged message survives, no refused one was stored.
    b.restart_after_kill();
    let (mut s, ca) = RawClient::connect_ok(b.addr, persistent("db-s", false)).await;
    assert!(ca.session_present);
    let mut got = Vec::new();
    while got.len() < acked.len() {
        let m = s.receive_acked().await;
        assert_ne!(&m.payload[..], b"refused", "a refused message was stored");
        got.push(m.payload[0]);
    }
    assert_eq!(got, acked, "every acknowledged message, in order");
    assert!(s.ping().await.is_empty());
}

/// `[store] max_disk_bytes`, continued: when retention (`max_age_s` of the filler stream, kept
/// by retention alone) frees space while the broker runs, publishing resumes by itself, and
/// what is acknowledged then survives a SIGKILL. The budget is proved reached by the fill
/// itself (it stops at the first 0x97), so nothing here depends on how fast the test runs:
/// the wait for the resume is bounded, the moment of it is not assumed.
#[tokio::test]
async fn disk_budget_resumes_after_retention_frees_space() {
    let mut b = Broker::start_with(&disk_budget_config("max_age_s = 3\n"));
    let (mut s, _) = RawClient::connect_ok(b.addr, persistent("dr-s", true)).await;
    s.sub("a/x", 1).await;
    s.disconnect().await;
    let mut p = RawClient::v5(b.addr, "dr-p").await;
    fill_disk_budget(&mut p, 100).await;
    let deadline = tokio::time::Instant::now() + WAIT * 4;
    loop {
        let reason = puback_reason(&mut p, publish("a/x", &[10; 100], 1, 500)).await;
        if reason.is_success() {
            break;
        }
        assert_eq!(reason, ReasonCode::QUOTA_EXCEEDED);
        assert!(
            tokio::time::Instant::now() < deadline,
            "publishing never resumed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    b.restart_after_kill();
    let (mut s, ca) = RawClient::connect_ok(b.addr, persistent("dr-s", false)).await;
    assert!(ca.session_present);
    let m = s.receive_acked().await;
    assert_eq!(&m.payload[..], &[10; 100][..]);
    assert!(s.ping().await.is_empty());
}
