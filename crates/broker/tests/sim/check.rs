//! The checker of one seed's guarantees, from what the clients saw.
//!
//! A **receiver** is who must get a publisher's acknowledged messages: one subscriber, or a
//! share group (any one of its members, MQTT 5 §4.8.2).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use parking_lot::Mutex;

use super::publisher::{PubSpec, PubState};
use super::subscriber::{Delivery, SubSpec, SubState};

pub type Pubs = [(PubSpec, Arc<Mutex<PubState>>)];
pub type Subs = [(SubSpec, Arc<Mutex<SubState>>)];

/// One subscriber, or the members of one share group (indices into the subscribers).
pub struct Receiver {
    pub members: Vec<usize>,
    pub filter: String,
    pub group: bool,
}

pub fn receivers(subs: &Subs) -> Vec<Receiver> {
    let mut out: Vec<Receiver> = Vec::new();
    for (i, (s, _)) in subs.iter().enumerate() {
        let key = s.subscription();
        match out.iter_mut().find(|r| {
            r.group && s.share.is_some() && {
                let first = &subs[r.members[0]].0;
                first.subscription() == key
            }
        }) {
            Some(r) => r.members.push(i),
            None => out.push(Receiver {
                members: vec![i],
                filter: s.filter.clone(),
                group: s.share.is_some(),
            }),
        }
    }
    out
}

pub(super) fn matches(filter: &str, topic: &str) -> bool {
    tern_store::topic_matches(filter.as_bytes(), topic.as_bytes())
}

/// Per receiver, per publisher whose topic its filter matches: the numbers acknowledged to
/// that publisher. Every subscription was acknowledged before the first PUBLISH, so every
/// receiver was subscribed when each of them was published.
pub fn expected(pubs: &Pubs, receivers: &[Receiver]) -> Vec<BTreeMap<usize, Vec<u64>>> {
    receivers
        .iter()
        .map(|r| {
            pubs.iter()
                .filter(|(p, _)| matches(&r.filter, &p.topic))
                .map(|(p, st)| (p.index, st.lock().acked.iter().copied().collect()))
                .collect()
        })
        .collect()
}

/// Whether every receiver holds what it is owed, with no QoS 2 exchange open.
pub fn complete(
    subs: &Subs,
    receivers: &[Receiver],
    expected: &[BTreeMap<usize, Vec<u64>>],
) -> bool {
    receivers.iter().zip(expected).all(|(r, owed)| {
        let states: Vec<_> = r.members.iter().map(|&m| subs[m].1.lock()).collect();
        states.iter().all(|st| st.received.is_empty())
            && owed.iter().all(|(p, acked)| {
                acked.iter().all(|n| {
                    states
                        .iter()
                        .any(|st| st.got.iter().any(|d| d.publisher == *p && d.number == *n))
                })
            })
    })
}

const EXAMPLES: usize = 5;

fn examples<T: std::fmt::Debug>(v: &[T]) -> String {
    let shown: Vec<_> = v.iter().take(EXAMPLES).collect();
    if v.len() > EXAMPLES {
        format!("{shown:?} and {} more", v.len() - EXAMPLES)
    } else {
        format!("{shown:?}")
    }
}

fn who(s: &SubSpec) -> String {
    format!(
        "{} ({:?}, QoS {}, {}, {:?})",
        s.client_id(),
        s.protocol,
        s.qos,
        s.subscription(),
        s.deliver
    )
}

/// What the checker needs to know about the run besides the clients.
pub struct Context {
    /// A retention limit may remove queued messages: losses are not counted.
    pub retention: bool,
    /// A session's own `max_queued_bytes` dropped QoS>0 messages (oldest first; the memory
    /// cap's seeds, `bounds.rs`): losses are not counted, and order is not checked (a
    /// dropped message's store cursor still holds it: a restart delivers it again, late).
    pub queue_drops: bool,
    /// The workload ran to its end (so open exchanges are a violation, not a timeout).
    pub finished: bool,
}

/// The checker. Per subscriber: its session survives every fault (Session Present = 1 on
/// every reconnect after its SUBACK), SUBACKs grant what was asked, no payload is foreign,
/// and no QoS 2 exchange it took part in is left open (a packet id it holds, never released
/// by PUBREL: the broker forgot an exchange it must finish, MQTT-4.4.0-1). Per receiver and
/// publisher:
/// - lost: acknowledged to the publisher (PUBACK; PUBREC for QoS 2) and never handed to the
///   application of the subscriber, or of any member of the group (QoS 1: at least once,
///   QoS 2: exactly once); not counted under a retention limit;
/// - duplicated: handed over more than once (across a group's members too) though publisher
///   and subscription are QoS 2;
/// - reordered (one subscriber only; not for QoS 1 under a retention limit): a first delivery below an earlier first delivery of
///   the same publisher, unless the broker refused the lower one at least once, so that it
///   was published again after the later one (one topic per publisher: an Ordered Topic, MQTT-4.6.0-5 / -6; at a
///   subscriber that delivers at PUBREL this also catches PUBRELs out of order, MQTT-4.6.0-4);
/// - invented: a number its publisher never sent, a message from a publisher the filter does
///   not match, or at a QoS other than the lower of the publication's and the subscription's.
pub fn check(pubs: &Pubs, subs: &Subs, ctx: &Context, violations: &mut Vec<String>) {
    for (s, st) in subs {
        check_session(s, &st.lock(), ctx, violations);
    }
    let receivers = receivers(subs);
    let expected = expected(pubs, &receivers);
    for (r, owed) in receivers.iter().zip(&expected) {
        let states: Vec<_> = r.members.iter().map(|&m| subs[m].1.lock()).collect();
        let name = r
            .members
            .iter()
            .map(|&m| who(&subs[m].0))
            .collect::<Vec<_>>()
            .join(" + ");
        for (p, pst) in pubs {
            let mine: Vec<(usize, Delivery)> = r
                .members
                .iter()
                .zip(&states)
                .flat_map(|(&m, st)| {
                    st.got
                        .iter()
                        .filter(|d| d.publisher == p.index)
                        .map(move |d| (m, *d))
                })
                .collect();
            let Some(acked) = owed.get(&p.index) else {
                if !mine.is_empty() {
                    violations.push(format!(
                        "{name}: {} messages of {} whose topic it does not match",
                        mine.len(),
                        p.client_id()
                    ));
                }
                continue;
            };
            let pair = format!(
                "{name} <- {} ({:?}, QoS {})",
                p.client_id(),
                p.protocol,
                p.qos
            );
            let held: Vec<&SubState> = states.iter().map(|st| &**st).collect();
            let member = Member {
                receiver: r,
                subs,
                states: &held,
            };
            check_pair(
                &pair,
                &member,
                p,
                &pst.lock(),
                acked,
                &mine,
                ctx,
                violations,
            );
        }
    }
}

/// Every PUBLISH of message `number` of `publisher` the receiver's clients saw: (subscriber,
/// connection, boot, packet id, DUP, virtual time); which stage sent it twice.
fn publishes_of(member: &Member<'_>, publisher: usize, number: u64) -> String {
    let all: Vec<String> = member
        .receiver
        .members
        .iter()
        .zip(member.states)
        .flat_map(|(&m, st)| {
            st.seen
                .iter()
                .filter(|s| s.publisher == publisher && s.number == number)
                .map(move |s| {
                    let dup = if s.dup { " DUP" } else { "" };
                    format!(
                        "sub {m} c{} boot {} id {}{dup} t={:?}",
                        s.connection, s.boot, s.packet_id, s.at
                    )
                })
        })
        .collect();
    format!("{publisher}/{number}: [{}]", all.join("; "))
}

fn check_session(s: &SubSpec, st: &SubState, ctx: &Context, violations: &mut Vec<String>) {
    let who = who(s);
    if !st.open_ids.violations.is_empty() {
        violations.push(format!(
            "{who}: {} PUBLISHes against an open exchange: {}",
            st.open_ids.violations.len(),
            examples(&st.open_ids.violations)
        ));
    }
    if st.sessions_lost > 0 {
        violations.push(format!(
            "{who}: session lost {} times after its SUBACK",
            st.sessions_lost
        ));
    }
    if !st.bad_subacks.is_empty() {
        violations.push(format!("{who}: SUBACKs {:?}", st.bad_subacks));
    }
    if !st.foreign.is_empty() {
        violations.push(format!(
            "{who}: invented payloads {}",
            examples(&st.foreign)
        ));
    }
    if ctx.finished && !st.received.is_empty() {
        let mut open: Vec<_> = st.received.iter().collect();
        open.sort();
        violations.push(format!(
            "{who}: QoS 2 exchanges never released (packet id, held message): {}",
            examples(&open)
        ));
    }
}

/// A receiver with its members' specs and (locked) states.
struct Member<'a> {
    receiver: &'a Receiver,
    subs: &'a Subs,
    /// Per member, in `receiver.members` order: locked by the caller (not locked again).
    states: &'a [&'a SubState],
}

#[allow(clippy::too_many_arguments)]
fn check_pair(
    pair: &str,
    member: &Member<'_>,
    p: &PubSpec,
    pst: &PubState,
    acked: &[u64],
    mine: &[(usize, Delivery)],
    ctx: &Context,
    violations: &mut Vec<String>,
) {
    let (r, subs) = (member.receiver, member.subs);
    let mut count: BTreeMap<u64, usize> = BTreeMap::new();
    for (_, d) in mine {
        *count.entry(d.number).or_default() += 1;
    }
    let lost: Vec<u64> = acked
        .iter()
        .copied()
        .filter(|n| !count.contains_key(n))
        .collect();
    if !lost.is_empty() && !ctx.retention && !ctx.queue_drops {
        let on: Vec<(u64, (u64, u64))> = lost.iter().map(|n| (*n, pst.acked_on[n])).collect();
        // What the receiver's clients saw of them (a PUBLISH dropped as a client left).
        let seen: Vec<(usize, u64, bool, u8)> = r
            .members
            .iter()
            .zip(member.states)
            .flat_map(|(&m, st)| {
                st.seen
                    .iter()
                    .filter(|s| s.publisher == p.index && lost.contains(&s.number))
                    .map(move |s| (m, s.connection, s.dup, s.qos))
            })
            .collect();
        violations.push(format!(
            "{pair}: {} acknowledged messages lost (number, (publisher's connection, broker boot) it was acknowledged on): {}; PUBLISHes of them seen (subscriber, connection, DUP, QoS): {}",
            lost.len(),
            examples(&on),
            examples(&seen)
        ));
    }
    let invented: Vec<u64> = count.keys().copied().filter(|&n| n >= pst.next).collect();
    if !invented.is_empty() {
        violations.push(format!("{pair}: never published: {}", examples(&invented)));
    }
    let wrong_qos: Vec<(u64, u8)> = mine
        .iter()
        .filter(|(m, d)| d.qos != p.qos.min(subs[*m].0.qos))
        .map(|(_, d)| (d.number, d.qos))
        .collect();
    if !wrong_qos.is_empty() {
        violations.push(format!(
            "{pair}: delivered at another QoS than the lower of publication and subscription (number, QoS): {}",
            examples(&wrong_qos)
        ));
    }
    let all_qos2 = p.qos == 2 && r.members.iter().all(|&m| subs[m].0.qos == 2);
    if all_qos2 {
        let dup: Vec<(u64, usize)> = count
            .iter()
            .filter(|(_, c)| **c > 1)
            .map(|(n, c)| (*n, *c))
            .collect();
        if !dup.is_empty() {
            violations.push(format!(
                "{pair}: QoS 2 delivered more than once (number, times): {}; the PUBLISHes of {}",
                examples(&dup),
                publishes_of(member, p.index, dup[0].0)
            ));
        }
    }
    if r.group || ctx.queue_drops {
        // A group's members share its messages in no particular order; see `queue_drops`.
        return;
    }
    if ctx.retention && mine.iter().any(|(_, d)| d.qos == 1) {
        // A retention limit may remove the first copy of a QoS 1 message before it is
        // delivered (it is not open QoS 2 state), and the publisher's resend after a fault
        // then arrives after later messages.
        return;
    }
    let mut seen = BTreeSet::new();
    let mut last: Option<u64> = None;
    let mut reordered = Vec::new();
    for (_, d) in mine {
        if !seen.insert(d.number) {
            continue;
        }
        if let Some(l) = last {
            // A number the broker refused was published again after later ones.
            if d.number < l && !pst.refused.contains(&d.number) {
                reordered.push((l, d.number, d.connection));
            }
        }
        last = Some(d.number);
    }
    if !reordered.is_empty() {
        violations.push(format!(
            "{pair}: first deliveries out of order (after, got, connection): {}",
            examples(&reordered)
        ));
    }
}
