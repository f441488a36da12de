//! Tests of the ack pipeline (`ack_pipeline.rs`).

use super::*;
use crate::model::TicketCompleter;

fn entry(
    packet_id: u16,
    kind: AckKind,
    deliver: &'static str,
    ticket: Option<Ticket>,
    after_durable: bool,
) -> Entry<&'static str> {
    Entry {
        counted: counts(&kind),
        packet_id,
        kind,
        reason: ReasonCode::SUCCESS,
        ticket,
        deliver: Some(deliver),
        deliver_after_durable: after_durable,
    }
}

/// What the connection counts in these tests: every QoS>0 PUBLISH.
fn counts(kind: &AckKind) -> bool {
    matches!(kind, AckKind::PubAck | AckKind::PubRec)
}

fn ack(kind: AckKind, packet_id: u16) -> Released<&'static str> {
    Released::Ack {
        counted: counts(&kind),
        kind,
        packet_id,
        reason: ReasonCode::SUCCESS,
    }
}

fn ticket() -> (TicketCompleter, Option<Ticket>) {
    let (c, t) = Ticket::pair();
    (c, Some(t))
}

#[test]
fn no_write_means_immediate_release() {
    let mut p = AckPipeline::new(8);
    let mut out = Vec::new();
    p.push(entry(1, AckKind::PubAck, "a", None, false), &mut out);
    p.push(entry(0, AckKind::None, "b", None, false), &mut out);
    assert_eq!(
        out,
        vec![
            Released::Deliver("a"),
            ack(AckKind::PubAck, 1),
            Released::Deliver("b")
        ]
    );
    assert!(p.is_empty());
}

#[tokio::test]
async fn qos2_holds_back_later_deliveries_even_qos0_until_durable() {
    let mut p = AckPipeline::new(8);
    let mut out = Vec::new();
    let (done, t) = ticket();
    p.push(entry(1, AckKind::PubRec, "q2", t, true), &mut out);
    p.push(entry(0, AckKind::None, "q0", None, false), &mut out);
    p.push(entry(2, AckKind::PubAck, "q1", None, false), &mut out);
    assert!(
        out.is_empty(),
        "nothing may pass the undurable QoS 2 message"
    );
    done.complete(Ok(()));
    p.wait_front(&mut out).await;
    assert_eq!(
        out,
        vec![
            Released::Deliver("q2"),
            Released::Deliver("q0"),
            Released::Deliver("q1"),
            ack(AckKind::PubRec, 1),
            ack(AckKind::PubAck, 2),
        ]
    );
}

/// Simulator finding 10 (docs/simulation.md): the front and the next write completed in
/// the turn whose later write failed. The durable entries ahead of the failure are still
/// delivered and acknowledged; nothing from the failed one on.
#[tokio::test]
async fn durable_entries_before_a_failed_write_are_released() {
    let mut p = AckPipeline::new(8);
    let mut out = Vec::new();
    let (first, t1) = ticket();
    let (second, t2) = ticket();
    let (third, t3) = ticket();
    p.push(entry(1, AckKind::PubRec, "a", t1, true), &mut out);
    p.push(entry(2, AckKind::PubRec, "b", t2, true), &mut out);
    p.push(entry(3, AckKind::PubRec, "c", t3, true), &mut out);
    first.complete(Ok(()));
    second.complete(Ok(()));
    third.complete(Err(PersistError("EIO".into())));
    p.wait_front(&mut out).await;
    assert_eq!(
        out,
        vec![
            Released::Deliver("a"),
            Released::Deliver("b"),
            ack(AckKind::PubRec, 1),
            ack(AckKind::PubRec, 2),
        ]
    );
    assert!(p.failed());
}

#[tokio::test]
async fn qos1_with_write_delivers_at_once_but_acks_wait_in_order() {
    let mut p = AckPipeline::new(8);
    let mut out = Vec::new();
    let (done, t) = ticket();
    p.push(entry(1, AckKind::PubAck, "a", t, false), &mut out);
    // The second needed no write (e.g. durability policy "never") yet must not overtake.
    p.push(entry(2, AckKind::PubAck, "b", None, false), &mut out);
    assert_eq!(out, vec![Released::Deliver("a"), Released::Deliver("b")]);
    out.clear();
    assert_eq!(p.len(), 2);
    done.complete(Ok(()));
    p.wait_front(&mut out).await;
    assert_eq!(out, vec![ack(AckKind::PubAck, 1), ack(AckKind::PubAck, 2)]);
}

#[tokio::test]
async fn failed_write_is_neither_acked_nor_delivered() {
    let mut p = AckPipeline::new(8);
    let mut out = Vec::new();
    let (done, t) = ticket();
    p.push(entry(7, AckKind::PubRec, "lost", t, true), &mut out);
    p.push(entry(8, AckKind::PubAck, "after", None, false), &mut out);
    done.complete(Err(PersistError("disk".into())));
    p.wait_front(&mut out).await;
    assert!(p.failed());
    assert!(out.is_empty(), "{out:?}");
}

#[test]
fn abandon_returns_what_was_never_released() {
    let mut p = AckPipeline::new(8);
    let mut out = Vec::new();
    let (_pending, t) = ticket();
    p.push(entry(1, AckKind::PubAck, "sent", None, false), &mut out);
    p.push(entry(2, AckKind::PubRec, "held", t, true), &mut out);
    p.push(entry(0, AckKind::None, "behind", None, false), &mut out);
    assert_eq!(
        out,
        vec![Released::Deliver("sent"), ack(AckKind::PubAck, 1)]
    );
    assert_eq!(p.abandon(), vec!["held", "behind"]);
    assert!(p.is_empty() && !p.is_full());
}

#[tokio::test]
async fn late_then_early_tickets_release_in_packet_order() {
    let mut p = AckPipeline::new(8);
    let mut out = Vec::new();
    let (late, t1) = ticket();
    let (early, t2) = ticket();
    p.push(entry(1, AckKind::PubRec, "one", t1, true), &mut out);
    p.push(entry(2, AckKind::PubRec, "two", t2, true), &mut out);
    early.complete(Ok(()));
    assert!(out.is_empty());
    late.complete(Ok(()));
    p.wait_front(&mut out).await;
    assert_eq!(
        out,
        vec![
            Released::Deliver("one"),
            Released::Deliver("two"),
            ack(AckKind::PubRec, 1),
            ack(AckKind::PubRec, 2),
        ]
    );
}

#[tokio::test]
async fn encoded_ack_waits_for_its_ticket_in_packet_order() {
    let mut p = AckPipeline::new(8);
    let mut out = Vec::new();
    let (done, t) = ticket();
    let suback = AckKind::Encoded(Bytes::from_static(&[0x90, 3, 0, 5, 1]));
    p.push(
        Entry {
            packet_id: 5,
            kind: suback.clone(),
            reason: ReasonCode::SUCCESS,
            ticket: t,
            deliver: None,
            deliver_after_durable: false,
            counted: false,
        },
        &mut out,
    );
    p.push(entry(6, AckKind::PubAck, "m", None, false), &mut out);
    assert_eq!(out, vec![Released::Deliver("m")], "delivery is not held");
    out.clear();
    done.complete(Ok(()));
    p.wait_front(&mut out).await;
    assert_eq!(out, vec![ack(suback, 5), ack(AckKind::PubAck, 6)]);
}

#[tokio::test]
async fn release_hook_ticket_holds_the_ack_not_the_delivery() {
    let hooked: std::sync::Arc<parking_lot::Mutex<Vec<TicketCompleter>>> = Default::default();
    let held = hooked.clone();
    let mut p = AckPipeline::new(8).on_release(std::sync::Arc::new(move |d: &&'static str| {
        if !d.starts_with("retained") {
            return None;
        }
        let (done, t) = Ticket::pair();
        held.lock().push(done);
        Some(t)
    }));
    let mut out = Vec::new();
    let (own, t) = ticket();
    p.push(entry(1, AckKind::PubAck, "retained-1", t, false), &mut out);
    p.push(entry(0, AckKind::None, "retained-0", None, false), &mut out);
    p.push(entry(2, AckKind::PubAck, "plain", None, false), &mut out);
    assert_eq!(
        out,
        vec![
            Released::Deliver("retained-1"),
            Released::Deliver("retained-0"),
            Released::Deliver("plain")
        ]
    );
    out.clear();
    let mut hooks: Vec<TicketCompleter> = hooked.lock().drain(..).collect();
    assert_eq!(hooks.len(), 2, "the hook ran once per delivery");
    own.complete(Ok(()));
    // The QoS 0 entry's hook ticket is not waited for (no ack); the retained one is.
    drop(hooks.pop());
    assert!(p.has_pending_ticket());
    tokio::task::yield_now().await;
    assert!(out.is_empty());
    hooks.pop().unwrap().complete(Ok(()));
    p.wait_front(&mut out).await;
    assert_eq!(out, vec![ack(AckKind::PubAck, 1), ack(AckKind::PubAck, 2)]);
    assert!(p.is_empty());
}

#[tokio::test]
async fn release_hook_ticket_of_a_qos2_entry_is_waited_for_after_its_own() {
    let hooked: std::sync::Arc<parking_lot::Mutex<Vec<TicketCompleter>>> = Default::default();
    let held = hooked.clone();
    let mut p = AckPipeline::new(8).on_release(std::sync::Arc::new(move |_: &&'static str| {
        let (done, t) = Ticket::pair();
        held.lock().push(done);
        Some(t)
    }));
    let mut out = Vec::new();
    let (own, t) = ticket();
    p.push(entry(1, AckKind::PubRec, "q2", t, true), &mut out);
    assert!(
        out.is_empty() && hooked.lock().is_empty(),
        "not released yet"
    );
    own.complete(Ok(()));
    p.wait_front(&mut out).await;
    assert_eq!(out, vec![Released::Deliver("q2")], "delivered, ack held");
    out.clear();
    let hook = hooked.lock().pop().expect("hook ran at release");
    hook.complete(Err(PersistError("disk".into())));
    p.wait_front(&mut out).await;
    assert!(p.failed() && out.is_empty(), "{out:?}");
}

#[test]
fn full_at_capacity_of_uncounted_entries() {
    let mut p = AckPipeline::new(2);
    let mut out = Vec::new();
    let (_d1, t1) = ticket();
    p.push(entry(1, AckKind::PubRec, "held", t1, true), &mut out);
    p.push(entry(0, AckKind::None, "a", None, false), &mut out);
    assert!(!p.is_full());
    p.push(entry(0, AckKind::None, "b", None, false), &mut out);
    assert!(p.is_full());
    assert!(p.has_pending_ticket());
}

/// Counted entries are bounded by the Receive Maximum check, not by the pipeline: however
/// many wait for their writes, the connection keeps reading (it must see the PUBLISH that
/// exceeds the maximum, and the PUBRELs that end exchanges).
#[test]
fn counted_entries_never_fill_the_pipeline() {
    let mut p = AckPipeline::new(2);
    let mut out = Vec::new();
    let mut completers = Vec::new();
    for id in 1..=10 {
        let (done, t) = ticket();
        completers.push(done);
        p.push(entry(id, AckKind::PubAck, "m", t, false), &mut out);
    }
    let (done, t) = ticket();
    completers.push(done);
    p.push(
        Entry {
            packet_id: 1,
            kind: AckKind::PubComp,
            reason: ReasonCode::SUCCESS,
            ticket: t,
            deliver: None,
            deliver_after_durable: false,
            counted: true,
        },
        &mut out,
    );
    assert_eq!(p.len(), 11);
    assert!(!p.is_full());
}

#[tokio::test]
async fn released_acks_carry_the_counted_flag() {
    let mut p = AckPipeline::new(4);
    let mut out = Vec::new();
    let (done, t) = ticket();
    p.push(entry(1, AckKind::PubAck, "a", t, false), &mut out);
    p.push(
        Entry {
            packet_id: 1,
            kind: AckKind::PubRec,
            reason: ReasonCode::SUCCESS,
            ticket: None,
            deliver: None,
            deliver_after_durable: false,
            counted: false,
        },
        &mut out,
    );
    assert!(!p.is_full());
    done.complete(Ok(()));
    p.wait_front(&mut out).await;
    assert_eq!(
        out,
        vec![
            Released::Deliver("a"),
            ack(AckKind::PubAck, 1),
            Released::Ack {
                kind: AckKind::PubRec,
                packet_id: 1,
                reason: ReasonCode::SUCCESS,
                counted: false
            },
        ]
    );
    assert!(p.is_empty());
}
