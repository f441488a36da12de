//! Subscribers that go away for long (issue 25): they leave cleanly (DISCONNECT) with QoS 1/2
//! deliveries open at a chosen stage, stay offline across the broker's crashes and power
//! losses while the publishers go on, and come back to a backlog of hundreds of messages;
//! with in-flight windows from 1 to 1,024 (Receive Maximum, the publishers' windows).
//!
//! Drawn from a generator of its own, after the plan's other draws (so those stay as they
//! were); a seed that draws an offline subscriber also draws longer publishers, which moves
//! its faults (they strike at fractions of the messages published).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tern_store::sim::SimRng;

use super::client::Net;
use super::plan::Plan;

/// Where in its exchanges a leaving subscriber stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// A PUBLISH taken (held under its packet id; QoS 1 and QoS 2 at PUBLISH delivered) and
    /// not acknowledged: no PUBACK / PUBREC goes.
    Unacked,
    /// Right after sending a PUBREC (QoS 2): the PUBREL is still to come.
    AfterPubrec,
    /// A PUBREL taken (QoS 2 at PUBREL delivered) and not answered: no PUBCOMP goes.
    AtPubrel,
}

/// How a subscriber goes offline.
#[derive(Debug, Clone, Copy)]
pub struct Offline {
    /// It leaves once it took this many PUBLISHes on a connection and reaches `stage`.
    pub after_publishes: u64,
    pub stage: Stage,
    /// DISCONNECT before closing (or the socket just closes).
    pub clean: bool,
    /// It stays away until the publishers had this many more messages acknowledged...
    pub backlog_msgs: u64,
    /// ... and the broker restarted this many times (unless acknowledgements stop).
    pub restarts: u64,
    /// How many times it goes away (later connections stay).
    pub absences: u64,
}

/// A window from 1 to 1,024, spread over the powers of two (small ones as likely as large).
fn window(rng: &mut SimRng) -> usize {
    1 << rng.range(0, 10)
}

/// The draws of issue 25: windows of 1-1,024 and, in 1 seed of 4, one offline subscriber
/// with longer publishers (so that it comes back to hundreds of messages). Under a memory cap
/// (`bounds.rs`, drawn before) the windows stay at most 2 and the publishers as drawn: the
/// cap's slow readers would take seconds of CPU to drain hundreds of messages, and the cap
/// refuses a backlog that large anyway.
pub fn draw(seed: u64, plan: &mut Plan) {
    let mut rng = SimRng::keyed(&[seed, 0x0ff1]);
    let capped = plan.memory_cap.is_some();
    for p in &mut plan.publishers {
        if rng.chance(0.3) && !capped {
            p.window = window(&mut rng);
        }
    }
    for s in plan.subscribers.iter_mut().filter(|s| s.share.is_none()) {
        if s.protocol.is_v5() && s.receive_maximum.is_none() && rng.chance(0.3) {
            s.receive_maximum = Some(window(&mut rng) as u16);
        }
    }
    if !rng.chance(0.25) {
        return;
    }
    let plain = plan
        .subscribers
        .iter()
        .filter(|s| s.share.is_none())
        .count();
    let Some(s) = plan.subscribers.get_mut(rng.below(plain as u64) as usize) else {
        return;
    };
    let stage = if s.qos == 2 {
        *rng.pick(&[Stage::Unacked, Stage::AfterPubrec, Stage::AtPubrel])
    } else {
        Stage::Unacked
    };
    s.offline = Some(Offline {
        after_publishes: rng.range(1, 60),
        stage,
        clean: rng.chance(0.8),
        backlog_msgs: rng.range(100, 250),
        restarts: rng.range(1, 2),
        absences: rng.range(1, 3),
    });
    if s.protocol.is_v5() {
        s.receive_maximum = Some(window(&mut rng) as u16);
    }
    // The short leaves of `network_faults` give way to the long one.
    s.leave_after = None;
    for p in &mut plan.publishers {
        let limit = rng.range(120, 300);
        if !capped {
            p.limit = limit;
        }
    }
    let faults = rng.range(3, 6);
    if !capped {
        spread_faults(&mut rng, plan, faults);
    }
    // No share group beside it: members with a Receive Maximum of 1-4 that leave every 3-20
    // PUBLISHes take seconds (of CPU, in release) to drain this many messages.
    plan.subscribers.retain(|s| s.share.is_none());
}

/// `n` faults spread over the (longer) run, of the kinds the plan drew, in turn: issue 25's
/// runs killed the broker 6-8 times, and faults drawn for 40-150 messages per publisher would
/// all strike in the first third of 120-299.
fn spread_faults(rng: &mut SimRng, plan: &mut Plan, n: u64) {
    let kinds: Vec<_> = plan.faults.iter().map(|&(_, f)| f).collect();
    if kinds.is_empty() {
        return;
    }
    let total: u64 = plan.publishers.iter().map(|p| p.limit).sum();
    plan.faults = (1..=n)
        .map(|k| {
            let at = total * k / (n + 1) + rng.below(total / (2 * (n + 1)) + 1);
            (at, kinds[(k as usize - 1) % kinds.len()])
        })
        .collect();
}

/// How long acknowledgements may stop before an offline subscriber gives up waiting for its
/// backlog (the publishers are done, or stalled at a bound): virtual time.
const NO_PROGRESS: Duration = Duration::from_millis(200);
/// The longest absence, virtual time.
const LONGEST_ABSENCE: Duration = Duration::from_secs(5);

/// Waits, offline, until the backlog and the restarts `o` asks for have happened (or the
/// publishers made no progress for [`NO_PROGRESS`]); false once the run stops.
pub async fn stay_away(net: &Arc<Net>, o: &Offline) -> bool {
    let acks_at_leave = net.acks.load(Ordering::Relaxed);
    let boot_at_leave = net.boot.load(Ordering::Relaxed);
    let started = tokio::time::Instant::now();
    let mut progress = (acks_at_leave, started);
    loop {
        if net.stop.load(Ordering::Relaxed) {
            return false;
        }
        let now = tokio::time::Instant::now();
        let acks = net.acks.load(Ordering::Relaxed);
        if acks != progress.0 {
            progress = (acks, now);
        }
        let backlog = acks >= acks_at_leave + o.backlog_msgs;
        let restarted = net.boot.load(Ordering::Relaxed) >= boot_at_leave + o.restarts;
        let stuck = now - progress.1 > NO_PROGRESS;
        if (backlog && restarted) || stuck || now - started > LONGEST_ABSENCE {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
