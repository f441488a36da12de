//! Fixed-bucket histograms of the writer's work (fsync latency, group-commit batch size), for
//! monitoring. The writer is the only one that records, so an observation is a few
//! relaxed atomic adds on lines no other thread writes: no lock, no allocation.
//!
//! # Invariants
//! - `bounds` are strictly increasing; bucket `i` counts observations `<= bounds[i]` and
//!   `> bounds[i - 1]`; the last bucket counts everything above the last bound.
//! - A snapshot may be torn between buckets (taken while the writer records), never within
//!   one counter: each count only grows.

use std::sync::atomic::{AtomicU64, Ordering};

/// Upper bounds of the fsync latency buckets, in microseconds (50 µs to 5 s).
pub const FSYNC_BOUNDS_US: &[u64] = &[
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000,
    5_000_000,
];

/// Upper bounds of the records-per-group-commit buckets.
pub const BATCH_BOUNDS_RECORDS: &[u64] = &[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1_024, 4_096];

/// Most buckets a histogram has (bounds plus the overflow bucket).
const MAX_BUCKETS: usize = 16;

/// A histogram with fixed bucket bounds, recorded with relaxed atomics.
#[derive(Debug)]
pub(crate) struct Histogram {
    bounds: &'static [u64],
    buckets: [AtomicU64; MAX_BUCKETS],
    sum: AtomicU64,
}

impl Histogram {
    pub(crate) fn new(bounds: &'static [u64]) -> Histogram {
        debug_assert!(bounds.len() < MAX_BUCKETS);
        debug_assert!(bounds.windows(2).all(|w| w[0] < w[1]));
        Histogram {
            bounds,
            buckets: Default::default(),
            sum: AtomicU64::new(0),
        }
    }

    pub(crate) fn observe(&self, value: u64) {
        let index = self.bounds.partition_point(|&bound| bound < value);
        self.buckets[index].fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(value, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> HistogramSnapshot {
        let counts: Vec<u64> = self.buckets[..=self.bounds.len()]
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        HistogramSnapshot {
            bounds: self.bounds,
            count: counts.iter().sum(),
            counts,
            sum: self.sum.load(Ordering::Relaxed),
        }
    }
}

/// A histogram as read at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// Upper bounds of the buckets (the overflow bucket has none).
    pub bounds: &'static [u64],
    /// Observations per bucket, not cumulative: `bounds.len() + 1` entries.
    pub counts: Vec<u64>,
    /// Sum of every observed value.
    pub sum: u64,
    /// Number of observations.
    pub count: u64,
}

impl HistogramSnapshot {
    /// An empty histogram with these bounds.
    pub fn empty(bounds: &'static [u64]) -> HistogramSnapshot {
        HistogramSnapshot {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0,
            count: 0,
        }
    }

    /// Adds `other` (same bounds) into `self`: the histogram of several streams.
    pub fn merge(&mut self, other: &HistogramSnapshot) {
        if self.bounds != other.bounds {
            return;
        }
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.sum += other.sum;
        self.count += other.count;
    }
}

/// A stream's writer histograms (since the stream was opened).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamHistograms {
    /// Duration of each `fdatasync` of a block file, in microseconds.
    pub fsync_us: HistogramSnapshot,
    /// Records made durable by each group commit (turns that wrote records).
    pub batch_records: HistogramSnapshot,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_land_in_the_first_bucket_whose_bound_is_not_below_them() {
        let h = Histogram::new(&[1, 10, 100]);
        for v in [0, 1, 2, 10, 11, 100, 101, 5_000] {
            h.observe(v);
        }
        let s = h.snapshot();
        assert_eq!(s.counts, vec![2, 2, 2, 2]);
        assert_eq!(s.count, 8);
        assert_eq!(s.sum, 5_225);
    }

    #[test]
    fn merge_adds_bucket_by_bucket() {
        let h = Histogram::new(BATCH_BOUNDS_RECORDS);
        h.observe(3);
        let mut total = HistogramSnapshot::empty(BATCH_BOUNDS_RECORDS);
        total.merge(&h.snapshot());
        total.merge(&h.snapshot());
        assert_eq!(total.count, 2);
        assert_eq!(total.counts[2], 2);
        assert_eq!(total.sum, 6);
    }
}
