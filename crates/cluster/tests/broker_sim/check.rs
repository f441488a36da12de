//! The checker, over what the clients saw: every acknowledged message (PUBACK, or PUBREC for
//! QoS 2) delivered to every persistent subscriber; QoS 2 (both ends) never delivered twice;
//! each publisher's messages first delivered in the order it sent them. Lost persistent
//! sessions are reported by the clients themselves when they reconnect (`client.rs`).

use std::collections::{BTreeMap, BTreeSet};

use tern_wire::QoS;

use crate::client::{Delivery, PubState, SubState};

pub struct PubView<'a> {
    pub index: usize,
    pub qos: QoS,
    pub state: &'a PubState,
}

pub struct SubView<'a> {
    pub index: usize,
    pub qos: QoS,
    pub state: &'a SubState,
}

/// Most lines of one kind reported per subscriber and publisher.
const MAX_LINES: usize = 3;

pub fn check(pubs: &[PubView<'_>], subs: &[SubView<'_>]) -> Vec<String> {
    let mut out = Vec::new();
    for sub in subs {
        for p in pubs {
            let mine: Vec<&Delivery> = sub
                .state
                .delivered
                .iter()
                .filter(|d| d.publisher == p.index)
                .collect();
            let mut counts: BTreeMap<u64, usize> = BTreeMap::new();
            let mut highest: Option<u64> = None;
            let mut disorder = Vec::new();
            for d in &mine {
                let n = counts.entry(d.seq).or_default();
                *n += 1;
                if *n == 1 {
                    if let Some(h) = highest
                        && d.seq < h
                    {
                        disorder.push(format!(
                            "order: sub{} got pub{}'s {} for the first time after {h}",
                            sub.index, p.index, d.seq
                        ));
                    }
                    highest = highest.max(Some(d.seq));
                }
            }
            let delivered: BTreeSet<u64> = counts.keys().copied().collect();
            let missing: Vec<u64> = p.state.acked.difference(&delivered).copied().collect();
            if !missing.is_empty() {
                out.push(format!(
                    "at-least-once: {} message(s) of pub{} acknowledged and never delivered to \
                     sub{}: {:?}{}",
                    missing.len(),
                    p.index,
                    sub.index,
                    &missing[..missing.len().min(8)],
                    if missing.len() > 8 { " ..." } else { "" }
                ));
            }
            if p.qos == QoS::ExactlyOnce && sub.qos == QoS::ExactlyOnce {
                let twice: Vec<(u64, usize)> = counts
                    .iter()
                    .filter(|(_, n)| **n > 1)
                    .map(|(s, n)| (*s, *n))
                    .collect();
                if !twice.is_empty() {
                    out.push(format!(
                        "exactly-once: {} QoS 2 message(s) of pub{} delivered more than once to \
                         sub{} (seq, times): {:?}",
                        twice.len(),
                        p.index,
                        sub.index,
                        &twice[..twice.len().min(8)]
                    ));
                }
            }
            out.extend(disorder.into_iter().take(MAX_LINES));
        }
    }
    out
}
