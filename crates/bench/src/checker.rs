//! Loss, duplicate and order checking at the subscribers.
//!
//! One [`StreamCheck`] per (subscriber, publisher) pair. Each publisher publishes to exactly one
//! topic, so a publisher id names a (publisher, topic) stream. Sequence numbers are consecutive
//! from 0, so a bitmap of seen sequence numbers tells duplicates from late arrivals exactly.
//!
//! What counts as a failure depends on the QoS of the delivery ([`Verdict`]):
//! - **QoS 0**: loss is reported, never a failure (at most once allows it: a broker may drop
//!   QoS 0 under overflow). A duplicate or an out-of-order delivery fails.
//! - **QoS 1**: loss fails. Duplicates are reported but allowed (at least once). An
//!   out-of-order delivery of a message not seen before fails.
//! - **QoS 2**: loss, duplicates and out-of-order deliveries all fail.
//!
//! Order is required at every QoS because MQTT makes every topic an "ordered topic" by default
//! (section 4.6) and a bench run never reconnects.
//!
//! # Invariants
//! - `seen` never grows past `expected` sequence numbers; anything above is counted as
//!   `out_of_range` and not stored, so a broken broker cannot make the checker allocate.

use crate::cli::Qos as QoS;
use serde::Serialize;

/// Counts for one stream or a whole run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Messages the subscribers should have received.
    pub expected: u64,
    /// Distinct messages received.
    pub received: u64,
    /// `expected - received`.
    pub lost: u64,
    /// Deliveries of a message already received.
    pub duplicates: u64,
    /// First deliveries that arrived after a later sequence number of the same stream.
    pub out_of_order: u64,
    /// Sequence numbers or publisher ids that the run never sent.
    pub out_of_range: u64,
}

impl Counts {
    pub fn add(&mut self, other: &Counts) {
        self.expected += other.expected;
        self.received += other.received;
        self.lost += other.lost;
        self.duplicates += other.duplicates;
        self.out_of_order += other.out_of_order;
        self.out_of_range += other.out_of_range;
    }
}

/// Tracks one (subscriber, publisher) stream.
#[derive(Debug, Clone)]
pub struct StreamCheck {
    expected: u64,
    seen: Vec<u64>,
    highest_seen: Option<u64>,
    received: u64,
    duplicates: u64,
    out_of_order: u64,
    out_of_range: u64,
}

impl StreamCheck {
    /// A stream whose publisher sends sequence numbers `0..expected`.
    pub fn new(expected: u64) -> StreamCheck {
        StreamCheck {
            expected,
            seen: Vec::new(),
            highest_seen: None,
            received: 0,
            duplicates: 0,
            out_of_order: 0,
            out_of_range: 0,
        }
    }

    /// Records one delivery of `seq`; true when it is the first delivery of that message.
    pub fn record(&mut self, seq: u64) -> bool {
        if seq >= self.expected {
            self.out_of_range += 1;
            return false;
        }
        let word = (seq / 64) as usize;
        let bit = 1u64 << (seq % 64);
        if self.seen.len() <= word {
            // Grows only up to expected/64 words (seq < expected checked above).
            self.seen.resize(word + 1, 0);
        }
        if self.seen[word] & bit != 0 {
            self.duplicates += 1;
            return false;
        }
        self.seen[word] |= bit;
        self.received += 1;
        match self.highest_seen {
            Some(high) if seq < high => self.out_of_order += 1,
            _ => self.highest_seen = Some(seq),
        }
        true
    }

    /// Whether every expected message has arrived.
    pub fn complete(&self) -> bool {
        self.received == self.expected
    }

    pub fn counts(&self) -> Counts {
        Counts {
            expected: self.expected,
            received: self.received,
            lost: self.expected - self.received,
            duplicates: self.duplicates,
            out_of_order: self.out_of_order,
            out_of_range: self.out_of_range,
        }
    }
}

/// Whether a run's counts are acceptable at a QoS, and why not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    pub ok: bool,
    /// Human-readable reasons for failure (empty when ok).
    pub failures: Vec<String>,
    /// Things worth reporting that the QoS allows (QoS 0 loss, QoS 1 duplicates).
    pub notes: Vec<String>,
}

/// Applies the rules of the module doc to `counts` at `qos`.
pub fn judge(qos: QoS, counts: &Counts) -> Verdict {
    let mut failures = Vec::new();
    let mut notes = Vec::new();
    if counts.lost > 0 {
        let text = format!("{} of {} messages lost", counts.lost, counts.expected);
        match qos {
            QoS::AtMostOnce => notes.push(format!("{text} (allowed at QoS 0)")),
            _ => failures.push(text),
        }
    }
    if counts.duplicates > 0 {
        let text = format!("{} duplicate deliveries", counts.duplicates);
        match qos {
            QoS::AtLeastOnce => notes.push(format!("{text} (allowed at QoS 1)")),
            _ => failures.push(text),
        }
    }
    if counts.out_of_order > 0 {
        failures.push(format!("{} deliveries out of order", counts.out_of_order));
    }
    if counts.out_of_range > 0 {
        failures.push(format!(
            "{} deliveries never sent by this run",
            counts.out_of_range
        ));
    }
    Verdict {
        ok: failures.is_empty(),
        failures,
        notes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn run(expected: u64, seqs: &[u64]) -> Counts {
        let mut check = StreamCheck::new(expected);
        for &seq in seqs {
            check.record(seq);
        }
        check.counts()
    }

    #[test]
    fn in_order_complete_stream_is_clean() {
        let counts = run(5, &[0, 1, 2, 3, 4]);
        assert_eq!(
            counts,
            Counts {
                expected: 5,
                received: 5,
                ..Counts::default()
            }
        );
        for qos in [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce] {
            assert!(judge(qos, &counts).ok);
        }
    }

    #[test]
    fn gap_is_loss() {
        let counts = run(5, &[0, 1, 3, 4]);
        assert_eq!(counts.lost, 1);
        assert_eq!(counts.out_of_order, 0);
        assert!(judge(QoS::AtMostOnce, &counts).ok);
        assert_eq!(judge(QoS::AtMostOnce, &counts).notes.len(), 1);
        assert!(!judge(QoS::AtLeastOnce, &counts).ok);
        assert!(!judge(QoS::ExactlyOnce, &counts).ok);
    }

    #[test]
    fn repeat_is_duplicate_not_reorder() {
        let counts = run(3, &[0, 1, 1, 2]);
        assert_eq!(counts.duplicates, 1);
        assert_eq!(counts.out_of_order, 0);
        assert_eq!(counts.lost, 0);
        assert!(!judge(QoS::AtMostOnce, &counts).ok);
        assert!(judge(QoS::AtLeastOnce, &counts).ok);
        assert!(!judge(QoS::ExactlyOnce, &counts).ok);
    }

    #[test]
    fn late_first_delivery_is_out_of_order() {
        let counts = run(3, &[0, 2, 1]);
        assert_eq!(counts.out_of_order, 1);
        assert_eq!(counts.lost, 0);
        for qos in [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce] {
            assert!(!judge(qos, &counts).ok);
        }
    }

    #[test]
    fn unknown_sequence_is_out_of_range_and_not_stored() {
        let mut check = StreamCheck::new(2);
        check.record(u64::MAX);
        assert!(check.seen.is_empty());
        assert_eq!(check.counts().out_of_range, 1);
        assert!(!judge(QoS::AtMostOnce, &check.counts()).ok);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Any delivery sequence: received + lost = expected, duplicates = deliveries - distinct.
        #[test]
        fn counts_add_up(expected in 1u64..300, seqs in proptest::collection::vec(0u64..300, 0..600)) {
            let counts = run(expected, &seqs);
            let in_range: Vec<u64> = seqs.iter().copied().filter(|&s| s < expected).collect();
            let mut distinct = in_range.clone();
            distinct.sort_unstable();
            distinct.dedup();
            prop_assert_eq!(counts.received, distinct.len() as u64);
            prop_assert_eq!(counts.received + counts.lost, expected);
            prop_assert_eq!(counts.duplicates, (in_range.len() - distinct.len()) as u64);
            prop_assert_eq!(counts.out_of_range, (seqs.len() - in_range.len()) as u64);
        }
    }
}
