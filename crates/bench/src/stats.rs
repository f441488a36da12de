//! Latency histograms and their summary.
//!
//! Each client task records into its own [`Latency`] (no sharing on the hot path); the run merges
//! them at the end and reports p50, p99, p99.9 and max.
//!
//! # Invariants
//! - Values are nanoseconds, clamped to [`MAX_TRACKABLE_NS`] (one hour) so recording never fails;
//!   the histogram's memory is fixed by that range and [`SIGNIFICANT_DIGITS`].

use hdrhistogram::Histogram;
use serde::Serialize;

/// Largest latency the histograms can hold; larger values are clamped to it.
pub const MAX_TRACKABLE_NS: u64 = 3_600_000_000_000;
/// Precision of the histograms (3 digits: 0.1% error).
pub const SIGNIFICANT_DIGITS: u8 = 3;

/// A latency histogram in nanoseconds.
#[derive(Debug, Clone)]
pub struct Latency {
    histogram: Histogram<u64>,
}

impl Default for Latency {
    fn default() -> Self {
        Latency::new()
    }
}

impl Latency {
    pub fn new() -> Latency {
        // Constant bounds that hdrhistogram accepts (1 <= low, high >= 2*low, sigfig <= 5): no
        // input can make this fail.
        let histogram = Histogram::new_with_bounds(1, MAX_TRACKABLE_NS, SIGNIFICANT_DIGITS)
            .expect("constant histogram bounds are valid");
        Latency { histogram }
    }

    #[inline]
    pub fn record_ns(&mut self, value_ns: u64) {
        let clamped = value_ns.clamp(1, MAX_TRACKABLE_NS);
        // Cannot fail: the value is within the histogram's bounds.
        let _ = self.histogram.record(clamped);
    }

    pub fn merge(&mut self, other: &Latency) {
        // Same bounds on both sides, so adding never fails.
        let _ = self.histogram.add(&other.histogram);
    }

    pub fn count(&self) -> u64 {
        self.histogram.len()
    }

    pub fn summary(&self) -> Option<Percentiles> {
        if self.histogram.is_empty() {
            return None;
        }
        let at = |q: f64| self.histogram.value_at_quantile(q) as f64 / 1_000.0;
        Some(Percentiles {
            count: self.histogram.len(),
            p50_us: at(0.50),
            p99_us: at(0.99),
            p999_us: at(0.999),
            max_us: self.histogram.max() as f64 / 1_000.0,
            mean_us: self.histogram.mean() / 1_000.0,
        })
    }
}

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Percentiles {
    pub count: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub mean_us: f64,
}

/// Messages per second over `elapsed_ns`, 0 when nothing was timed.
pub fn rate_per_s(messages: u64, elapsed_ns: u64) -> f64 {
    if elapsed_ns == 0 {
        return 0.0;
    }
    messages as f64 * 1e9 / elapsed_ns as f64
}

/// The median of `values` (mean of the two middle ones for an even count); `None` when empty.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    Some(if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn within(actual: f64, expected: f64) -> bool {
        (actual - expected).abs() <= expected * 0.002
    }

    #[test]
    fn percentiles_of_uniform_values() {
        let mut latency = Latency::new();
        for us in 1..=1000u64 {
            latency.record_ns(us * 1_000);
        }
        let summary = latency.summary().unwrap();
        assert_eq!(summary.count, 1000);
        assert!(within(summary.p50_us, 500.0), "{summary:?}");
        assert!(within(summary.p99_us, 990.0), "{summary:?}");
        assert!(within(summary.p999_us, 999.0), "{summary:?}");
        assert!(within(summary.max_us, 1000.0), "{summary:?}");
        assert!(within(summary.mean_us, 500.5), "{summary:?}");
    }

    #[test]
    fn merge_adds_counts_and_keeps_max() {
        let mut a = Latency::new();
        let mut b = Latency::new();
        a.record_ns(1_000);
        b.record_ns(9_000_000);
        a.merge(&b);
        let summary = a.summary().unwrap();
        assert_eq!(summary.count, 2);
        assert!(within(summary.max_us, 9_000.0));
    }

    #[test]
    fn out_of_range_values_are_clamped_not_lost() {
        let mut latency = Latency::new();
        latency.record_ns(0);
        latency.record_ns(u64::MAX);
        assert_eq!(latency.count(), 2);
        assert!(latency.summary().unwrap().max_us <= MAX_TRACKABLE_NS as f64 / 1_000.0 * 1.001);
    }

    #[test]
    fn empty_histogram_has_no_summary() {
        assert!(Latency::new().summary().is_none());
    }

    #[test]
    fn rates_and_medians() {
        assert_eq!(rate_per_s(500, 500_000_000), 1000.0);
        assert_eq!(rate_per_s(5, 0), 0.0);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }
}
