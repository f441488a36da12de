//! What a run reports, as text for people and as JSON for scripts (`--json`).

use std::fmt::Write as _;

use serde::Serialize;

use crate::checker::{Counts, Verdict};
use crate::cli::{Qos, TopicMode};
use crate::procfs::CpuUsage;
use crate::stats::Percentiles;

/// The report of any subcommand; `kind` tags the JSON.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Report {
    Pubsub(TrafficReport),
    Fanout(TrafficReport),
    Latency(TrafficReport),
    Conns(ConnsReport),
}

impl Report {
    /// Whether the run passed its checks (the process exits 1 otherwise).
    pub fn ok(&self) -> bool {
        match self {
            Report::Pubsub(r) | Report::Fanout(r) | Report::Latency(r) => r.verdict.ok,
            Report::Conns(r) => r.failed == 0,
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|error| format!("{{\"error\":\"{error}\"}}"))
    }

    pub fn to_text(&self) -> String {
        match self {
            Report::Pubsub(r) => r.to_text("pubsub"),
            Report::Fanout(r) => r.to_text("fanout"),
            Report::Latency(r) => r.to_text("latency"),
            Report::Conns(r) => r.to_text(),
        }
    }
}

/// Pubsub, fan-out and latency runs.
#[derive(Debug, Clone, Serialize)]
pub struct TrafficReport {
    pub protocol: String,
    pub qos: u8,
    pub publishers: u32,
    pub subscribers: u32,
    pub messages_per_publisher: u64,
    pub payload_bytes: usize,
    /// Effective window (after the broker's receive maximum); null at QoS 0.
    pub window: Option<u32>,
    pub topics: TopicMode,
    /// Open loop only: offered messages per second over all publishers.
    pub offered_rate_per_s: Option<u64>,
    pub sent: u64,
    pub acked: u64,
    /// Every PUBLISH the subscribers received, duplicates included.
    pub deliveries: u64,
    /// First send to last delivery (or last acknowledgement when there are no subscribers).
    pub elapsed_ms: f64,
    /// Distinct messages delivered per second, all subscribers together.
    pub delivered_per_s: f64,
    /// Messages published per second (first send to last acknowledgement or last delivery).
    pub published_per_s: f64,
    /// Payload bytes delivered per second.
    pub delivered_bytes_per_s: f64,
    pub e2e_latency: Option<Percentiles>,
    pub ack_latency: Option<Percentiles>,
    /// Open loop: messages held back by the window or the socket (stamped with their due time).
    pub delayed_by_backpressure: u64,
    pub qos_mismatches: u64,
    pub counts: Counts,
    pub verdict: Verdict,
    pub cpu: CpuUsage,
    pub broker_rss_bytes: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ConnsReport {
    pub protocol: String,
    pub connections: u32,
    pub established: u32,
    pub failed: u32,
    /// First few connection errors, for diagnosis.
    pub errors: Vec<String>,
    pub source_addresses: u32,
    pub connect_elapsed_ms: f64,
    pub connects_per_s: f64,
    pub broker_rss_before_bytes: Option<u64>,
    pub broker_rss_after_bytes: Option<u64>,
    /// (after - before) / established.
    pub broker_bytes_per_connection: Option<f64>,
    pub cpu: CpuUsage,
}

fn latency_line(label: &str, p: &Option<Percentiles>) -> String {
    match p {
        Some(p) => format!(
            "  {label:<12} p50 {}  p99 {}  p99.9 {}  max {}  ({} samples)\n",
            us(p.p50_us),
            us(p.p99_us),
            us(p.p999_us),
            us(p.max_us),
            p.count
        ),
        None => String::new(),
    }
}

fn us(value: f64) -> String {
    if value >= 10_000.0 {
        format!("{:.1} ms", value / 1000.0)
    } else {
        format!("{value:.0} µs")
    }
}

fn mib(bytes: f64) -> String {
    format!("{:.1} MiB", bytes / (1024.0 * 1024.0))
}

fn cpu_line(cpu: &CpuUsage) -> String {
    let mut line = format!(
        "  cpu          bench {:.2} cores ({:.0} ms)",
        cpu.bench_cores, cpu.bench_cpu_ms
    );
    if let (Some(cores), Some(ms)) = (cpu.broker_cores, cpu.broker_cpu_ms) {
        let _ = write!(line, "   broker {cores:.2} cores ({ms:.0} ms)");
    }
    line.push('\n');
    line
}

impl TrafficReport {
    fn to_text(&self, kind: &str) -> String {
        let mut text = String::new();
        let window = self
            .window
            .map(|w| format!("window {w}  "))
            .unwrap_or_default();
        let _ = writeln!(
            text,
            "{kind}  mqtt {}  qos {}  {window}{} pub -> {} sub  {} msgs/pub x {} B  topics {}",
            self.protocol,
            self.qos,
            self.publishers,
            self.subscribers,
            self.messages_per_publisher,
            self.payload_bytes,
            self.topics
        );
        if let Some(rate) = self.offered_rate_per_s {
            let _ = writeln!(
                text,
                "  offered      {rate} msg/s (open loop), {} sends held back",
                self.delayed_by_backpressure
            );
        }
        let _ = writeln!(
            text,
            "  delivered    {} / {} in {:.3} s = {:.0} msg/s ({}/s)",
            self.counts.received,
            self.counts.expected,
            self.elapsed_ms / 1000.0,
            self.delivered_per_s,
            mib(self.delivered_bytes_per_s)
        );
        let _ = writeln!(
            text,
            "  published    {} (acked {}) = {:.0} msg/s",
            self.sent, self.acked, self.published_per_s
        );
        text.push_str(&latency_line("e2e latency", &self.e2e_latency));
        text.push_str(&latency_line("ack latency", &self.ack_latency));
        let _ = writeln!(
            text,
            "  check        {}  (lost {}, duplicates {}, out of order {}, unknown {})",
            if self.verdict.ok { "OK" } else { "FAILED" },
            self.counts.lost,
            self.counts.duplicates,
            self.counts.out_of_order,
            self.counts.out_of_range
        );
        for failure in &self.verdict.failures {
            let _ = writeln!(text, "    failure: {failure}");
        }
        for note in &self.verdict.notes {
            let _ = writeln!(text, "    note: {note}");
        }
        text.push_str(&cpu_line(&self.cpu));
        if let Some(rss) = self.broker_rss_bytes {
            let _ = writeln!(text, "  broker rss   {}", mib(rss as f64));
        }
        text
    }
}

impl ConnsReport {
    fn to_text(&self) -> String {
        let mut text = String::new();
        let _ = writeln!(
            text,
            "conns  mqtt {}  {} connections over {} source addresses",
            self.protocol, self.connections, self.source_addresses
        );
        let _ = writeln!(
            text,
            "  established  {} (failed {}) in {:.3} s = {:.0} conn/s",
            self.established,
            self.failed,
            self.connect_elapsed_ms / 1000.0,
            self.connects_per_s
        );
        for error in &self.errors {
            let _ = writeln!(text, "    error: {error}");
        }
        if let (Some(before), Some(after)) =
            (self.broker_rss_before_bytes, self.broker_rss_after_bytes)
        {
            let _ = writeln!(
                text,
                "  broker rss   {} -> {} ({:.0} B per connection)",
                mib(before as f64),
                mib(after as f64),
                self.broker_bytes_per_connection.unwrap_or(0.0)
            );
        }
        text.push_str(&cpu_line(&self.cpu));
        text
    }
}

/// The protocol name used in reports.
pub fn protocol_name(qos_free: crate::cli::ProtocolArg) -> String {
    match qos_free {
        crate::cli::ProtocolArg::V311 => "3.1.1".into(),
        crate::cli::ProtocolArg::V5 => "5.0".into(),
    }
}

/// QoS level as a number for reports.
pub fn qos_level(qos: Qos) -> u8 {
    qos.level()
}
