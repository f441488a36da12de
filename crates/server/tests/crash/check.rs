//! The checker: for every subscriber and every publisher,
//! - lost: acknowledged to the publisher (PUBACK, PUBREC or PUBCOMP) but never delivered
//!   (MQTT-4.3.2-*, MQTT-4.3.3-*, and MQTT-4.4.0-1 across the restarts);
//! - duplicated: a QoS 2 message delivered more than once, counted by payload (MQTT-4.3.3-*:
//!   exactly once; QoS 1 may repeat). A duplicate of a message its publisher published again
//!   after sending its PUBREL (paho's bug, see scripts/crash_paho.py) is the client's doing:
//!   the broker must take that PUBLISH as a new message (MQTT-4.3.3-2 (3.1.1),
//!   MQTT-4.3.3-10..12 (v5)). Those are reported apart and do not fail the test, as long as
//!   there are no more copies than the client published;
//! - reordered: a first delivery with a lower number than an earlier first delivery from the
//!   same publisher (one topic per publisher, an Ordered Topic: MQTT-4.6.0-5 / -6), which at a
//!   subscriber that delivers at PUBREL also catches PUBRELs out of order (MQTT-4.6.0-4).
//!   A message its publisher itself sent after a later one on the same connection (paho's
//!   resend order, MQTT-4.6.0-1) is the client's doing, reported apart;
//! - and, seen directly by the raw subscribers, PUBRELs out of the order of their PUBRECs
//!   (MQTT-4.6.0-4) and a QoS 2 PUBLISH sent again after its PUBREL (MQTT-4.3.3-1 (3.1.1) /
//!   MQTT-4.3.3-6 (v5), with the broker as the sender).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

use super::{Delivery, Record};

/// Examples shown per kind of failure.
const EXAMPLES: usize = 5;

/// The findings of one (subscriber, publisher) pair.
#[derive(Default)]
pub struct Pair {
    pub acked: usize,
    pub delivered: usize,
    pub distinct: usize,
    pub lost: Vec<u64>,
    /// Number → its deliveries (only QoS 2 numbers delivered more than once).
    pub duplicated: BTreeMap<u64, Vec<Delivery>>,
    /// As `duplicated`, for numbers the publisher re-sent after their PUBREL.
    pub duplicated_by_client: BTreeMap<u64, Vec<Delivery>>,
    /// (number delivered first time, highest number delivered first time before it).
    pub reordered: Vec<(Delivery, u64)>,
    /// As `reordered`, for numbers the publisher sent after a higher one.
    pub reordered_by_client: Vec<(Delivery, u64)>,
}

impl Pair {
    fn ok(&self) -> bool {
        self.lost.is_empty() && self.duplicated.is_empty() && self.reordered.is_empty()
    }
}

fn copies(duplicated: &BTreeMap<u64, Vec<Delivery>>) -> usize {
    duplicated.values().map(|d| d.len() - 1).sum()
}

/// Every pair, keyed (subscriber, publisher).
pub struct Report {
    pub pairs: BTreeMap<(String, String), Pair>,
    /// Subscriber → PUBRELs out of PUBREC order (MQTT-4.6.0-4).
    pub pubrel_order: BTreeMap<String, Vec<String>>,
    /// Subscriber → PUBLISHes the broker re-sent after their PUBREL.
    pub resent_by_broker: BTreeMap<String, Vec<String>>,
}

pub fn check(record: &Record) -> Report {
    let mut pairs = BTreeMap::new();
    for subscriber in record.subscribed.iter() {
        let deliveries = record
            .deliveries
            .get(subscriber)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        for (publisher, published) in &record.published {
            let mine: Vec<&Delivery> = deliveries
                .iter()
                .filter(|d| &d.publisher == publisher)
                .collect();
            let mut pair = check_pair(&mine, &published.acked, published.qos);
            if let Some(resent) = record.resent_after_pubrel.get(publisher) {
                // The client accounts for one copy per re-PUBLISH, no more: a copy beyond
                // those is the broker's.
                let (by_client, rest) = std::mem::take(&mut pair.duplicated)
                    .into_iter()
                    .partition(|(n, ds)| resent.get(n).is_some_and(|&t| ds.len() <= 1 + t));
                pair.duplicated = rest;
                pair.duplicated_by_client = by_client;
            }
            if let Some(late) = record.sent_out_of_order.get(publisher) {
                let (by_client, rest) = std::mem::take(&mut pair.reordered)
                    .into_iter()
                    .partition(|(d, _)| late.contains(&d.n));
                pair.reordered = rest;
                pair.reordered_by_client = by_client;
            }
            pairs.insert((subscriber.clone(), publisher.clone()), pair);
        }
    }
    Report {
        pairs,
        pubrel_order: record.pubrel_order.clone(),
        resent_by_broker: resent_by_broker(record),
    }
}

/// The broker's re-sends after PUBREL, without messages their publisher published twice
/// (the second copy is a new message, and may get the same packet id).
fn resent_by_broker(record: &Record) -> BTreeMap<String, Vec<String>> {
    let by_client = |payload: &str| {
        super::parse_payload(payload.as_bytes()).is_some_and(|(publ, n)| {
            (record.resent_after_pubrel.get(&publ)).is_some_and(|r| r.contains_key(&n))
        })
    };
    (record.resent_by_broker.iter())
        .map(|(sub, all)| {
            let bad = all.iter().filter(|(p, _)| !by_client(p));
            (
                sub.clone(),
                bad.map(|(_, what)| what.clone()).collect::<Vec<_>>(),
            )
        })
        .filter(|(_, bad)| !bad.is_empty())
        .collect()
}

fn check_pair(deliveries: &[&Delivery], acked: &BTreeSet<u64>, qos: u8) -> Pair {
    let mut pair = Pair {
        acked: acked.len(),
        delivered: deliveries.len(),
        ..Pair::default()
    };
    let mut seen = BTreeSet::new();
    let mut highest: Option<u64> = None;
    let mut copies: BTreeMap<u64, Vec<Delivery>> = BTreeMap::new();
    for &d in deliveries {
        copies.entry(d.n).or_default().push(d.clone());
        if !seen.insert(d.n) {
            continue;
        }
        match highest {
            Some(h) if d.n < h => pair.reordered.push((d.clone(), h)),
            _ => highest = Some(d.n),
        }
    }
    pair.distinct = seen.len();
    pair.lost = acked.difference(&seen).copied().collect();
    if qos == 2 {
        pair.duplicated = copies.into_iter().filter(|(_, c)| c.len() > 1).collect();
    }
    pair
}

fn brief(d: &Delivery) -> String {
    format!(
        "[id {}{}, qos {}, cycle {}, {} ms after the restart]",
        d.packet_id,
        if d.dup { " DUP" } else { "" },
        d.qos,
        d.cycle,
        d.since_restart_ms
    )
}

/// The shape of a duplicate from its first two copies: DUP flags, same or other packet id,
/// same broker life or not. Packet ids and times vary; this is what tells causes apart.
fn shape(first: &Delivery, second: &Delivery) -> String {
    let flag = |d: &Delivery| if d.dup { "DUP=1" } else { "DUP=0" };
    let id = if first.packet_id == second.packet_id {
        "the same id"
    } else {
        "a new id"
    };
    let life = match second.cycle.saturating_sub(first.cycle) {
        0 => "in the same broker life".to_string(),
        n => format!("{n} restart(s) later"),
    };
    format!("{} then {} under {id}, {life}", flag(first), flag(second))
}

/// Per shape: how many, and the range of the gap between the copies and of the second
/// copy's time after its restart (ms).
#[derive(Default)]
struct ShapeStats {
    count: usize,
    gap_ms: (u64, u64),
    second_after_restart_ms: (u64, u64),
}

fn widen(range: &mut (u64, u64), v: u64, first: bool) {
    *range = if first {
        (v, v)
    } else {
        (range.0.min(v), range.1.max(v))
    };
}

fn shapes(out: &mut String, duplicated: &BTreeMap<u64, Vec<Delivery>>) {
    let mut stats: BTreeMap<String, ShapeStats> = BTreeMap::new();
    for ds in duplicated.values() {
        let (Some(first), Some(second)) = (ds.first(), ds.get(1)) else {
            continue;
        };
        let s = stats.entry(shape(first, second)).or_default();
        let gap = second.at_ms.saturating_sub(first.at_ms);
        widen(&mut s.gap_ms, gap, s.count == 0);
        widen(
            &mut s.second_after_restart_ms,
            second.since_restart_ms,
            s.count == 0,
        );
        s.count += 1;
    }
    for (shape, s) in stats {
        let _ = writeln!(
            out,
            "    shape: {} x {shape}; second copy {}..{} ms after the first, {}..{} ms after \
             its restart",
            s.count,
            s.gap_ms.0,
            s.gap_ms.1,
            s.second_after_restart_ms.0,
            s.second_after_restart_ms.1
        );
    }
}

/// First and last few of a sorted list of numbers.
fn numbers(ns: &[u64]) -> String {
    if ns.len() <= 2 * EXAMPLES {
        return format!("{ns:?}");
    }
    format!("{:?} ... {:?}", &ns[..EXAMPLES], &ns[ns.len() - EXAMPLES..])
}

fn duplicates(out: &mut String, publ: &str, duplicated: &BTreeMap<u64, Vec<Delivery>>) {
    shapes(out, duplicated);
    for (n, ds) in duplicated.iter().take(EXAMPLES) {
        let first_ms = ds.first().map_or(0, |d| d.at_ms);
        let copies: Vec<String> = (ds.iter().enumerate())
            .map(|(i, d)| match i {
                0 => brief(d),
                _ => format!("+{} ms {}", d.at_ms.saturating_sub(first_ms), brief(d)),
            })
            .collect();
        let _ = writeln!(out, "    {publ}:{n} x{}: {}", ds.len(), copies.join(" "));
    }
}

impl Report {
    pub fn ok(&self) -> bool {
        self.pairs.values().all(Pair::ok)
            && self.pubrel_order.is_empty()
            && self.resent_by_broker.is_empty()
    }

    /// The headline: lost, duplicated (the broker's and the client's), reordered, PUBRELs
    /// out of order.
    pub fn totals(&self) -> String {
        let sum = |f: fn(&Pair) -> usize| self.pairs.values().map(f).sum::<usize>();
        format!(
            "lost {}, duplicated QoS 2 copies {} (and {} after a client re-sent PUBLISH after \
             PUBREL), reordered first deliveries {} (and {} a client sent out of order), \
             PUBRELs out of PUBREC order {}, PUBLISH re-sent by the broker after PUBREL {}",
            sum(|p| p.lost.len()),
            sum(|p| copies(&p.duplicated)),
            sum(|p| copies(&p.duplicated_by_client)),
            sum(|p| p.reordered.len()),
            sum(|p| p.reordered_by_client.len()),
            self.pubrel_order.values().map(Vec::len).sum::<usize>(),
            self.resent_by_broker.values().map(Vec::len).sum::<usize>()
        )
    }

    /// One line per pair, then the findings with examples.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        for ((sub, publ), p) in &self.pairs {
            let _ = writeln!(
                out,
                "  {sub:<11} <- {publ:<10} acked {:>6}, delivered {:>6} ({:>6} distinct): lost {}, \
                 duplicated {} (+{} copies; client-caused +{}), reordered {} (client-caused {})",
                p.acked,
                p.delivered,
                p.distinct,
                p.lost.len(),
                p.duplicated.len(),
                copies(&p.duplicated),
                copies(&p.duplicated_by_client),
                p.reordered.len(),
                p.reordered_by_client.len()
            );
        }
        for ((sub, publ), p) in &self.pairs {
            self.describe_pair(&mut out, sub, publ, p);
        }
        for (sub, bad) in &self.resent_by_broker {
            let _ = writeln!(
                out,
                "BROKER RE-SENT PUBLISH AFTER PUBREL (MQTT-4.3.3-1 (3.1.1) / MQTT-4.3.3-6 (v5)): \
                 {sub} got {} QoS 2 messages again under a packet id it had released, e.g.:",
                bad.len()
            );
            for what in bad.iter().take(EXAMPLES) {
                let _ = writeln!(out, "    {what}");
            }
        }
        for (sub, bad) in &self.pubrel_order {
            let _ = writeln!(
                out,
                "PUBREL ORDER (MQTT-4.6.0-4): {sub} got {} PUBRELs out of the order of its \
                 PUBRECs, e.g.:",
                bad.len()
            );
            for what in bad.iter().take(EXAMPLES) {
                let _ = writeln!(out, "    {what}");
            }
        }
        out
    }

    fn describe_pair(&self, out: &mut String, sub: &str, publ: &str, p: &Pair) {
        if !p.lost.is_empty() {
            let _ = writeln!(
                out,
                "LOST: {sub} never got {} acknowledged messages of {publ}: {}",
                p.lost.len(),
                numbers(&p.lost)
            );
        }
        if !p.duplicated.is_empty() {
            let _ = writeln!(
                out,
                "DUPLICATED (QoS 2): {sub} got {} messages of {publ} more than once (+{} \
                 copies), e.g.:",
                p.duplicated.len(),
                copies(&p.duplicated)
            );
            duplicates(out, publ, &p.duplicated);
        }
        if !p.duplicated_by_client.is_empty() {
            let _ = writeln!(
                out,
                "CLIENT-CAUSED DUPLICATES (not a broker failure): {sub} got {} messages of \
                 {publ} more than once that {publ} published again after sending their PUBREL \
                 (MQTT-4.3.3-1 (3.1.1) / MQTT-4.3.3-6 (v5)), e.g.:",
                p.duplicated_by_client.len()
            );
            duplicates(out, publ, &p.duplicated_by_client);
        }
        if !p.reordered_by_client.is_empty() {
            let _ = writeln!(
                out,
                "CLIENT-CAUSED ORDER (not a broker failure): {sub} got {} messages of {publ} \
                 late that {publ} itself sent after a later one (MQTT-4.6.0-1), e.g.:",
                p.reordered_by_client.len()
            );
            for (d, after) in p.reordered_by_client.iter().take(EXAMPLES) {
                let _ = writeln!(out, "    {publ}:{} {} after {publ}:{after}", d.n, brief(d));
            }
        }
        if !p.reordered.is_empty() {
            let _ = writeln!(
                out,
                "REORDERED: {sub} got {} messages of {publ} for the first time after a later \
                 one, e.g.:",
                p.reordered.len()
            );
            for (d, after) in p.reordered.iter().take(EXAMPLES) {
                let _ = writeln!(out, "    {publ}:{} {} after {publ}:{after}", d.n, brief(d));
            }
        }
    }
}
