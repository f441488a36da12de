//! The checker, once the healed cluster has settled: acknowledged means committed on a
//! majority and never lost; every node applied one log. (The
//! apply contract and the vote's durability are checked as they happen: `app.rs`,
//! `World::start`.)

use std::collections::BTreeMap;

use bytes::Bytes;
use tern_raft::LogIndex;

use crate::app::show;
use crate::run::Acked;
use crate::world::{World, id};

/// `members`: the nodes in the final membership (each has applied up to `barrier`); the
/// others (a removed voter, a spare that never joined) must agree with them where they
/// applied anything.
pub fn check(w: &World, acked: &[Acked], barrier: LogIndex, members: &[usize]) {
    let states: Vec<BTreeMap<LogIndex, Vec<Bytes>>> = w
        .apps
        .iter()
        .map(|a| {
            a.lock()
                .unwrap()
                .applied
                .range(..=barrier)
                .map(|(i, o)| (*i, o.clone()))
                .collect()
        })
        .collect();
    let Some(&m0) = members.first() else {
        w.violation("no members after settling".into());
        return;
    };
    // One log: every member applied the same batches at the same indexes.
    for &i in &members[1..] {
        if states[i] != states[m0] {
            let diff = (states[m0].keys().chain(states[i].keys()))
                .find(|k| states[m0].get(k) != states[i].get(k));
            w.violation(format!(
                "nodes {} and {} applied different logs: first difference at index {diff:?}: {} vs {}",
                id(m0),
                id(i),
                diff.and_then(|k| states[m0].get(k)).map_or("nothing".into(), |o| show(o)),
                diff.and_then(|k| states[i].get(k)).map_or("nothing".into(), |o| show(o)),
            ));
        }
    }
    for i in (0..w.total()).filter(|i| !members.contains(i)) {
        if let Some((k, o)) = states[i].iter().find(|(k, o)| states[m0].get(k) != Some(o)) {
            w.violation(format!(
                "node {} (not a member at the end) applied {} at index {k}, the members {}",
                id(i),
                show(o),
                states[m0].get(k).map_or("nothing".into(), |m| show(m)),
            ));
        }
    }
    let states: Vec<_> = members.iter().map(|&i| (i, &states[i])).collect();
    // Acknowledged: applied on every node, at the index `propose` answered.
    for a in acked {
        for &(i, s) in &states {
            if s.get(&a.index) != Some(&a.ops) {
                w.violation(format!(
                    "acknowledged batch {} at index {} lost: node {} applied {} there",
                    show(&a.ops),
                    a.index,
                    id(i),
                    s.get(&a.index).map_or("nothing".into(), |o| show(o)),
                ));
                break;
            }
        }
    }
    // Exactly once: every operation is unique to one proposal.
    for &(i, s) in &states {
        let mut seen: BTreeMap<&Bytes, LogIndex> = BTreeMap::new();
        for (index, ops) in s {
            for op in ops {
                if let Some(first) = seen.insert(op, *index) {
                    w.violation(format!(
                        "node {} applied {} twice (indexes {first} and {index})",
                        id(i),
                        String::from_utf8_lossy(op)
                    ));
                }
            }
        }
    }
}

/// Terms that had more than one leader (seen sending AppendEntries). Not a violation:
/// openraft 0.9 identifies a leader by (term, node id), its default "advanced" leader ids,
/// and a term may have one leader per node id (standard Raft's one leader per term is its
/// `single-term-leader` feature, which tern-raft does not enable). Reported as a statistic.
pub fn terms_with_several_leaders(w: &World) -> usize {
    let seen = w.net.seen.lock().unwrap();
    seen.leaders.values().filter(|l| l.len() > 1).count()
}
