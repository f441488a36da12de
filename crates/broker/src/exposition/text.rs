//! The Prometheus text exposition format (version 0.0.4), written by hand: one job, no
//! registry crate. A family is written as `# HELP`, `# TYPE`, then its samples.
//!
//! # Invariants
//! - Names are `tern_` plus `[a-z_]`; label values are escaped (`\\`, `"`, newline); HELP text
//!   is escaped (`\\`, newline).
//! - A histogram's buckets are cumulative, end with `le="+Inf"` equal to `_count`.

use std::fmt::Write;

use tern_store::HistogramSnapshot;

/// Prefix of every metric name.
pub(crate) const PREFIX: &str = "tern_";

/// A text page being written.
#[derive(Default)]
pub(crate) struct TextEncoder {
    out: String,
}

/// The type of a family.
#[derive(Clone, Copy)]
pub(crate) enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl TextEncoder {
    pub(crate) fn finish(self) -> String {
        self.out
    }

    /// Starts the family `tern_{name}`.
    pub(crate) fn family(&mut self, name: &str, kind: Kind, help: &str) {
        let kind = match kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.out, "# HELP {PREFIX}{name} {help}");
        let _ = writeln!(self.out, "# TYPE {PREFIX}{name} {kind}");
    }

    /// One sample `tern_{name}{labels} value`.
    pub(crate) fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: u64) {
        let _ = write!(self.out, "{PREFIX}{name}");
        self.labels(labels, None);
        let _ = writeln!(self.out, " {value}");
    }

    /// One sample with a fractional value.
    pub(crate) fn sample_f64(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        let _ = write!(self.out, "{PREFIX}{name}");
        self.labels(labels, None);
        let _ = writeln!(self.out, " {}", format_float(value));
    }

    /// A family with one unlabelled sample.
    pub(crate) fn single(&mut self, name: &str, kind: Kind, help: &str, value: u64) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }

    /// The samples of one histogram (`_bucket`, `_sum`, `_count`), bounds and sum divided by
    /// `scale` (e.g. 1e6 for microseconds shown in seconds).
    pub(crate) fn histogram(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        h: &HistogramSnapshot,
        scale: f64,
    ) {
        let mut cumulative = 0;
        for (i, count) in h.counts.iter().enumerate() {
            cumulative += count;
            let le = match h.bounds.get(i) {
                Some(&bound) => format_float(bound as f64 / scale),
                None => "+Inf".to_string(),
            };
            let _ = write!(self.out, "{PREFIX}{name}_bucket");
            self.labels(labels, Some(&le));
            let _ = writeln!(self.out, " {cumulative}");
        }
        let _ = write!(self.out, "{PREFIX}{name}_sum");
        self.labels(labels, None);
        let _ = writeln!(self.out, " {}", format_float(h.sum as f64 / scale));
        let _ = write!(self.out, "{PREFIX}{name}_count");
        self.labels(labels, None);
        let _ = writeln!(self.out, " {}", h.count);
    }

    fn labels(&mut self, labels: &[(&str, &str)], le: Option<&str>) {
        if labels.is_empty() && le.is_none() {
            return;
        }
        self.out.push('{');
        let mut first = true;
        for (name, value) in labels.iter().copied().chain(le.map(|le| ("le", le))) {
            if !first {
                self.out.push(',');
            }
            first = false;
            let _ = write!(self.out, "{name}=\"");
            for c in value.chars() {
                match c {
                    '\\' => self.out.push_str("\\\\"),
                    '"' => self.out.push_str("\\\""),
                    '\n' => self.out.push_str("\\n"),
                    c => self.out.push(c),
                }
            }
            self.out.push('"');
        }
        self.out.push('}');
    }
}

/// A float as Prometheus reads it (Rust's shortest round-trip form).
fn format_float(value: f64) -> String {
    format!("{value}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_escaped() {
        let mut e = TextEncoder::default();
        e.family("x", Kind::Gauge, "a \\ b\nc");
        e.sample("x", &[("l", "q\"\\\n")], 3);
        assert_eq!(
            e.finish(),
            "# HELP tern_x a \\\\ b\\nc\n# TYPE tern_x gauge\ntern_x{l=\"q\\\"\\\\\\n\"} 3\n"
        );
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_scaled() {
        let h = HistogramSnapshot {
            bounds: &[500, 1_000],
            counts: vec![1, 2, 3],
            sum: 2_500_000,
            count: 6,
        };
        let mut e = TextEncoder::default();
        e.histogram("h_seconds", &[("s", "m")], &h, 1e6);
        assert_eq!(
            e.finish(),
            "tern_h_seconds_bucket{s=\"m\",le=\"0.0005\"} 1\n\
             tern_h_seconds_bucket{s=\"m\",le=\"0.001\"} 3\n\
             tern_h_seconds_bucket{s=\"m\",le=\"+Inf\"} 6\n\
             tern_h_seconds_sum{s=\"m\"} 2.5\n\
             tern_h_seconds_count{s=\"m\"} 6\n"
        );
    }
}
