//! Model-based property test: random appends, batches, reads, limits, purges, deletes,
//! expiries, compactions and reopens against a plain in-memory model, compared after
//! every step.

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;
use tern_store::{
    Discard, FilterSet, Limits, NewRecord, Store, StoreError, Stream, StreamConfig, topic_matches,
};

const TOPICS: [&str; 5] = ["a", "a/b", "a/c", "b", "$sys/x"];
const FILTERS: [&str; 5] = ["a/#", "+/b", "#", "b", "$sys/+"];
const MAX_AGE_NS: u64 = 1000;

#[derive(Debug, Clone)]
enum Step {
    Append {
        topic: usize,
        len: usize,
        dt: u64,
    },
    Batch {
        topics: Vec<usize>,
        len: usize,
        dt: u64,
    },
    Expire {
        dt: u64,
    },
    RemoveBelow {
        back: u64,
    },
    Purge {
        filter: usize,
    },
    Delete {
        back: u64,
    },
    Compact,
    Reopen,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        12 => (0..TOPICS.len(), 0..300usize, 0..100u64).prop_map(|(topic, len, dt)| Step::Append { topic, len, dt }),
        3 => (prop::collection::vec(0..TOPICS.len(), 1..5), 0..100usize, 0..100u64)
            .prop_map(|(topics, len, dt)| Step::Batch { topics, len, dt }),
        2 => (0..3000u64).prop_map(|dt| Step::Expire { dt }),
        1 => (0..40u64).prop_map(|back| Step::RemoveBelow { back }),
        1 => (0..FILTERS.len()).prop_map(|filter| Step::Purge { filter }),
        2 => (0..40u64).prop_map(|back| Step::Delete { back }),
        1 => Just(Step::Compact),
        2 => Just(Step::Reopen),
    ]
}

fn limits() -> impl Strategy<Value = Limits> {
    (
        prop::option::of(1..30u64),
        prop::option::of(500..6000u64),
        prop::option::of(1..4u64),
        prop::bool::ANY,
    )
        .prop_map(|(max_msgs, max_bytes, per_topic, new)| Limits {
            max_age: Some(Duration::from_nanos(MAX_AGE_NS)),
            max_msgs,
            max_bytes,
            max_msgs_per_topic: per_topic,
            discard: if new { Discard::New } else { Discard::Old },
            per_topic_exempt_prefix: None,
        })
}

#[derive(Default)]
struct Model {
    recs: BTreeMap<u64, (u64, &'static str, Vec<u8>)>,
    next_seq: u64,
    time: u64,
}

fn rec_len(topic: &str, payload: usize) -> u64 {
    (36 + topic.len() + payload) as u64
}

impl Model {
    fn bytes(&self) -> u64 {
        self.recs
            .values()
            .map(|(_, t, p)| rec_len(t, p.len()))
            .sum()
    }
    fn count(&self, topic: &str) -> u64 {
        self.recs.values().filter(|r| r.1 == topic).count() as u64
    }
    fn rejects(&self, l: &Limits, batch: &[(&str, usize)]) -> bool {
        if l.discard != Discard::New {
            return false;
        }
        let n = batch.len() as u64;
        let b: u64 = batch.iter().map(|(t, p)| rec_len(t, *p)).sum();
        if l.max_msgs.is_some_and(|m| self.recs.len() as u64 + n > m) {
            return true;
        }
        if l.max_bytes.is_some_and(|m| self.bytes() + b > m) {
            return true;
        }
        if let Some(m) = l.max_msgs_per_topic {
            for (i, (t, _)) in batch.iter().enumerate() {
                let before = batch[..i].iter().filter(|x| x.0 == *t).count() as u64;
                if self.count(t) + before + 1 > m {
                    return true;
                }
            }
        }
        false
    }
    fn insert(&mut self, l: &Limits, batch: &[(&'static str, Vec<u8>)]) {
        for (t, p) in batch {
            self.recs.insert(self.next_seq, (self.time, t, p.clone()));
            self.next_seq += 1;
            if let (Some(m), Discard::Old) = (l.max_msgs_per_topic, l.discard) {
                while self.count(t) > m {
                    let s = *self.recs.iter().find(|r| r.1.1 == *t).unwrap().0;
                    self.recs.remove(&s);
                }
            }
        }
        if l.discard == Discard::Old {
            while l.max_msgs.is_some_and(|m| self.recs.len() as u64 > m)
                || l.max_bytes.is_some_and(|m| self.bytes() > m)
            {
                let s = *self.recs.keys().next().unwrap();
                self.recs.remove(&s);
            }
        }
    }
    fn remove_where(&mut self, f: impl Fn(u64, &(u64, &'static str, Vec<u8>)) -> bool) -> u64 {
        let before = self.recs.len();
        self.recs.retain(|s, r| !f(*s, r));
        (before - self.recs.len()) as u64
    }
}

fn compare(s: &Stream, m: &Model) -> Result<(), TestCaseError> {
    let info = s.info();
    prop_assert_eq!(info.msgs, m.recs.len() as u64);
    prop_assert_eq!(info.bytes, m.bytes());
    prop_assert_eq!(info.first_seq, m.recs.keys().next().copied());
    prop_assert_eq!(info.last_seq, m.recs.keys().next_back().copied());
    let all = s
        .read_from(0, &FilterSet::all(), 100_000, usize::MAX)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let got: Vec<(u64, u64, Vec<u8>, Vec<u8>)> = all
        .records
        .iter()
        .map(|r| (r.seq, r.time_ns, r.topic.to_vec(), r.payload.to_vec()))
        .collect();
    let want: Vec<(u64, u64, Vec<u8>, Vec<u8>)> = m
        .recs
        .iter()
        .map(|(s, (t, top, p))| (*s, *t, top.as_bytes().to_vec(), p.clone()))
        .collect();
    prop_assert_eq!(got, want);
    for f in FILTERS {
        let got: Vec<u64> = s
            .read_from(0, &FilterSet::new([f]), 100_000, usize::MAX)
            .map_err(|e| TestCaseError::fail(e.to_string()))?
            .records
            .iter()
            .map(|r| r.seq)
            .collect();
        let want: Vec<u64> = m
            .recs
            .iter()
            .filter(|r| topic_matches(f.as_bytes(), r.1.1.as_bytes()))
            .map(|r| *r.0)
            .collect();
        prop_assert_eq!(got, want, "filter {}", f);
    }
    for t in TOPICS {
        let seqs: Vec<u64> = m.recs.iter().filter(|r| r.1.1 == t).map(|r| *r.0).collect();
        let st = s.topic_stats(t.as_bytes()).unwrap();
        match (seqs.first(), seqs.last()) {
            (Some(&a), Some(&b)) => {
                let st = st.ok_or_else(|| TestCaseError::fail(format!("no stats for {t}")))?;
                prop_assert_eq!(
                    (st.count, st.first_seq, st.last_seq),
                    (seqs.len() as u64, a, b)
                );
                let last = s.last_for_topic(t.as_bytes()).unwrap().unwrap();
                prop_assert_eq!(last.seq, b);
            }
            _ => {
                prop_assert!(st.is_none());
                prop_assert!(s.last_for_topic(t.as_bytes()).unwrap().is_none());
            }
        }
    }
    // Point reads around the live range, including removed and never-written sequences.
    for seq in m.next_seq.saturating_sub(60)..m.next_seq + 2 {
        let got = s.get(seq).unwrap().map(|r| r.payload.to_vec());
        prop_assert_eq!(got, m.recs.get(&seq).map(|r| r.2.clone()), "get {}", seq);
    }
    Ok(())
}

fn run(steps: Vec<Step>, limits: Limits) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let config = StreamConfig {
        block_size_bytes: 4096,
        // Drop clean blocks' entries from memory at once, so reloading is exercised.
        index_cache_blocks: 1,
        limits: limits.clone(),
        expire_interval: Duration::from_secs(3600),
        ..Default::default()
    };
    let mut store = Store::open(dir.path()).unwrap();
    let mut s = store.stream("m", config.clone()).unwrap();
    let mut m = Model {
        next_seq: 1,
        ..Default::default()
    };
    for st in steps {
        match st {
            Step::Append { topic, len, dt } => {
                m.time += dt;
                let t = TOPICS[topic];
                let payload = vec![(m.next_seq % 251) as u8; len];
                let ticket = s.append_at(m.time, t.as_bytes(), b"", &payload).unwrap();
                prop_assert_eq!(ticket.seq(), m.next_seq);
                let rejected = m.rejects(&limits, &[(t, len)]);
                match ticket.wait() {
                    Ok(_) => {
                        prop_assert!(!rejected);
                        m.insert(&limits, &[(t, payload)]);
                    }
                    Err(StoreError::LimitReached { .. }) => {
                        prop_assert!(rejected);
                        m.next_seq += 1;
                    }
                    Err(e) => return Err(TestCaseError::fail(e.to_string())),
                }
            }
            Step::Batch { topics, len, dt } => {
                m.time += dt;
                let payload = vec![7u8; len];
                let recs: Vec<NewRecord> = topics
                    .iter()
                    .map(|&i| NewRecord {
                        topic: TOPICS[i].as_bytes(),
                        payload: &payload,
                        time_ns: Some(m.time),
                        ..Default::default()
                    })
                    .collect();
                let batch: Vec<(&str, usize)> = topics.iter().map(|&i| (TOPICS[i], len)).collect();
                let rejected = m.rejects(&limits, &batch);
                let ticket = s.append_batch(&recs).unwrap();
                match ticket.wait() {
                    Ok(_) => {
                        prop_assert!(!rejected);
                        let b: Vec<(&'static str, Vec<u8>)> = topics
                            .iter()
                            .map(|&i| (TOPICS[i], payload.clone()))
                            .collect();
                        m.insert(&limits, &b);
                    }
                    Err(StoreError::LimitReached { .. }) => {
                        prop_assert!(rejected);
                        m.next_seq += topics.len() as u64;
                    }
                    Err(e) => return Err(TestCaseError::fail(e.to_string())),
                }
            }
            Step::Expire { dt } => {
                let now = m.time + dt;
                let cutoff = now.saturating_sub(MAX_AGE_NS);
                let n = m.remove_where(|_, r| r.0 < cutoff);
                let r = s.expire(now).unwrap();
                prop_assert_eq!(r.records, n);
            }
            Step::RemoveBelow { back } => {
                let floor = m.next_seq.saturating_sub(back);
                let n = m.remove_where(|s, _| s < floor);
                prop_assert_eq!(s.remove_below(floor).unwrap().records, n);
            }
            Step::Purge { filter } => {
                let f = FILTERS[filter];
                let n = m.remove_where(|_, r| topic_matches(f.as_bytes(), r.1.as_bytes()));
                prop_assert_eq!(s.purge(&FilterSet::new([f])).unwrap().records, n);
            }
            Step::Delete { back } => {
                let seq = m.next_seq.saturating_sub(back);
                let n = m.remove_where(|s, _| s == seq);
                prop_assert_eq!(s.delete(&[seq]).unwrap().records, n);
            }
            Step::Compact => s.compact(1000).unwrap(),
            Step::Reopen => {
                drop(s);
                drop(store);
                store = Store::open(dir.path()).unwrap();
                s = store.stream("m", config.clone()).unwrap();
                prop_assert!(s.recovery_report().lost.is_none());
            }
        }
        compare(&s, &m)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]
    #[test]
    fn store_matches_model(steps in prop::collection::vec(step(), 1..60), limits in limits()) {
        run(steps, limits)?;
    }
}
