//! CPU time and resident memory from `/proc` (Linux), for the generator itself and the broker.
//!
//! CPU times in `/proc/PID/stat` are in clock ticks of `USER_HZ`, which Linux fixes at 100 for
//! user space on every architecture we run on ([`TICKS_PER_S`]); reading it via `sysconf` would
//! need `unsafe` FFI for no gain.

use std::path::PathBuf;

use serde::Serialize;

/// `USER_HZ`: the unit of utime/stime in `/proc/PID/stat`.
pub const TICKS_PER_S: u64 = 100;

/// Which process to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The bench process itself.
    SelfProcess,
    Pid(u32),
}

impl Target {
    fn dir(self) -> PathBuf {
        match self {
            Target::SelfProcess => PathBuf::from("/proc/self"),
            Target::Pid(pid) => PathBuf::from(format!("/proc/{pid}")),
        }
    }
}

/// CPU time consumed so far, in milliseconds (fractional). `None` if unreadable.
///
/// Sums the nanosecond run times of every live thread (`/proc/PID/task/*/schedstat`), because
/// the 10 ms ticks of `/proc/PID/stat` round a short run's CPU to zero; falls back to the ticks
/// when schedstat is not available.
pub fn cpu_time_ms(target: Target) -> Option<f64> {
    if let Some(ns) = schedstat_ns(target) {
        return Some(ns as f64 / 1e6);
    }
    let text = std::fs::read_to_string(target.dir().join("stat")).ok()?;
    parse_stat_cpu_ticks(&text).map(|ticks| (ticks * 1000 / TICKS_PER_S) as f64)
}

fn schedstat_ns(target: Target) -> Option<u64> {
    let mut total_ns = 0u64;
    let mut threads = 0;
    for entry in std::fs::read_dir(target.dir().join("task")).ok()? {
        let Ok(entry) = entry else { continue };
        let Ok(text) = std::fs::read_to_string(entry.path().join("schedstat")) else {
            continue;
        };
        if let Some(ns) = text
            .split_whitespace()
            .next()
            .and_then(|field| field.parse::<u64>().ok())
        {
            total_ns += ns;
            threads += 1;
        }
    }
    (threads > 0).then_some(total_ns)
}

/// Resident set size in bytes (`VmRSS` of `/proc/PID/status`). `None` if unreadable.
pub fn rss_bytes(target: Target) -> Option<u64> {
    let text = std::fs::read_to_string(target.dir().join("status")).ok()?;
    parse_status_rss_kb(&text).map(|kb| kb * 1024)
}

/// utime + stime (fields 14 and 15) from the text of `/proc/PID/stat`. The command name (field 2)
/// may hold spaces and parentheses, so fields are counted from the last `)`.
fn parse_stat_cpu_ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace();
    // after_name starts at field 3 (state); utime is field 14, i.e. the 12th from here.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

fn parse_status_rss_kb(status: &str) -> Option<u64> {
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// CPU used by the generator and (when its pid is known) the broker over one measured interval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct CpuUsage {
    pub elapsed_ms: u64,
    pub bench_cpu_ms: f64,
    /// CPU-seconds per second: 1.0 = one core busy.
    pub bench_cores: f64,
    pub broker_cpu_ms: Option<f64>,
    pub broker_cores: Option<f64>,
}

impl CpuUsage {
    /// The same CPU times spread over `active_ms` instead of the whole measured interval: a run
    /// whose end includes idle waiting (the drain) is judged by the time it did work.
    pub fn over_active_ms(self, active_ms: f64) -> CpuUsage {
        if active_ms <= 0.0 {
            return self;
        }
        CpuUsage {
            elapsed_ms: active_ms.round() as u64,
            bench_cores: self.bench_cpu_ms / active_ms,
            broker_cores: self.broker_cpu_ms.map(|ms| ms / active_ms),
            ..self
        }
    }
}

/// A start point for a [`CpuUsage`] measurement.
#[derive(Debug, Clone, Copy)]
pub struct CpuMark {
    at: std::time::Instant,
    bench_ms: Option<f64>,
    broker_ms: Option<f64>,
    broker: Option<u32>,
}

impl CpuMark {
    pub fn now(broker_pid: Option<u32>) -> CpuMark {
        CpuMark {
            at: std::time::Instant::now(),
            bench_ms: cpu_time_ms(Target::SelfProcess),
            broker_ms: broker_pid.and_then(|pid| cpu_time_ms(Target::Pid(pid))),
            broker: broker_pid,
        }
    }

    pub fn usage(&self) -> CpuUsage {
        let elapsed_ms = self.at.elapsed().as_millis() as u64;
        let cores = |ms: f64| {
            if elapsed_ms == 0 {
                0.0
            } else {
                ms / elapsed_ms as f64
            }
        };
        let bench_cpu_ms = match (self.bench_ms, cpu_time_ms(Target::SelfProcess)) {
            (Some(start), Some(end)) => (end - start).max(0.0),
            _ => 0.0,
        };
        let broker_now = self.broker.and_then(|pid| cpu_time_ms(Target::Pid(pid)));
        let broker_cpu_ms = match (self.broker_ms, broker_now) {
            (Some(start), Some(end)) => Some((end - start).max(0.0)),
            _ => None,
        };
        CpuUsage {
            elapsed_ms,
            bench_cpu_ms,
            bench_cores: cores(bench_cpu_ms),
            broker_cpu_ms,
            broker_cores: broker_cpu_ms.map(cores),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_awkward_command_name() {
        let stat = "1234 (my (odd) name) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 1 0";
        assert_eq!(parse_stat_cpu_ticks(stat), Some(325));
    }

    #[test]
    fn parses_rss() {
        let status = "Name:\tmosquitto\nVmPeak:\t  9000 kB\nVmRSS:\t    5120 kB\nThreads:\t1\n";
        assert_eq!(parse_status_rss_kb(status), Some(5120));
        assert_eq!(parse_status_rss_kb("Name: x\n"), None);
    }

    #[test]
    fn reads_own_process() {
        assert!(cpu_time_ms(Target::SelfProcess).is_some());
        assert!(rss_bytes(Target::SelfProcess).unwrap_or(0) > 0);
        let usage = CpuMark::now(Some(std::process::id())).usage();
        assert!(usage.broker_cpu_ms.is_some());
    }
}
