//! The seed runner both cluster simulators share (feature `sim`): tern-raft's `tests/sim`
//! (`scripts/sim.sh --cluster`) and tern-cluster's `tests/broker_sim` (`--cluster-broker`).
//! It reads which seeds to run from the environment, runs them on worker threads, prints the
//! report of every failing seed (with the command that replays it), the first failing seed,
//! and the summary line `sim: seeds=N violations=V` that `scripts/sim.sh` reads.
//!
//! Environment, under the simulator's prefix `P` (`TERN_CSIM`, `TERN_CBSIM`): `P_SEEDS`,
//! `P_SEED_BASE`, `P_SEED` (one seed), `P_JOBS` (default: one per core), `P_VERBOSE` (every
//! seed's report, failing or not), `P_STOP_AT_FIRST`.

use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// What one seed's run gives the runner.
#[derive(Debug, Clone, Default)]
pub struct SeedReport {
    /// Messages acknowledged to the clients (or proposals committed) in the run.
    pub acked: u64,
    /// The seed's plan, as one line.
    pub plan: String,
    /// Every broken guarantee; empty when the seed passed.
    pub violations: Vec<String>,
    /// What the run logged, printed under a failing seed.
    pub log: Vec<String>,
}

/// One simulator's campaign of seeds.
#[derive(Debug, Clone, Copy)]
pub struct Campaign<'a> {
    /// The environment variables' prefix (`TERN_CSIM`).
    pub env_prefix: &'a str,
    /// Seeds run when the environment names none.
    pub default_seeds: u64,
    /// `scripts/sim.sh`'s flag for this simulator (`--cluster`), for the replay line.
    pub sim_flag: &'a str,
    /// The name on the summary line (`cluster`).
    pub name: &'a str,
    /// The injected bug's name (empty: none), for the replay line.
    pub inject_name: &'a str,
}

/// Most violations printed under one failing seed; the rest are counted.
const MAX_VIOLATIONS_PRINTED: usize = 10;

impl Campaign<'_> {
    fn var(&self, name: &str) -> Option<u64> {
        std::env::var(format!("{}_{name}", self.env_prefix))
            .ok()
            .and_then(|v| v.parse().ok())
    }

    fn flag(&self, name: &str) -> bool {
        std::env::var(format!("{}_{name}", self.env_prefix))
            .is_ok_and(|v| !v.is_empty() && v != "0")
    }

    /// Runs the seeds the environment asks for, each with `run` (an `Err` is a panic's
    /// message, counted as a violation), and prints as the module says. Returns how many
    /// seeds violated a guarantee.
    pub fn run(&self, run: impl Fn(u64) -> Result<SeedReport, String> + Sync) -> u64 {
        let (base, count) = match self.var("SEED") {
            Some(s) => (s, 1),
            None => (
                self.var("SEED_BASE").unwrap_or(0),
                self.var("SEEDS").unwrap_or(self.default_seeds),
            ),
        };
        let verbose = self.flag("VERBOSE");
        let stop_at_first = self.flag("STOP_AT_FIRST");
        let jobs = self
            .var("JOBS")
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u64))
            .max(1);
        let next = AtomicU64::new(base);
        let failing = AtomicU64::new(0);
        let stop = AtomicBool::new(false);
        let first: Mutex<Option<u64>> = Mutex::new(None);
        let out = Mutex::new(());
        let started = std::time::Instant::now();
        std::thread::scope(|scope| {
            for _ in 0..jobs {
                scope.spawn(|| {
                    while !stop.load(Ordering::Relaxed) {
                        let seed = next.fetch_add(1, Ordering::Relaxed);
                        if seed >= base + count {
                            return;
                        }
                        let (failed, report) = self.report(seed, verbose, &run);
                        {
                            // One seed's lines together.
                            let _g = out.lock().unwrap_or_else(|e| e.into_inner());
                            print!("{report}");
                        }
                        if failed {
                            failing.fetch_add(1, Ordering::Relaxed);
                            let mut f = first.lock().unwrap_or_else(|e| e.into_inner());
                            if f.is_none_or(|s| seed < s) {
                                *f = Some(seed);
                            }
                            if stop_at_first {
                                stop.store(true, Ordering::Relaxed);
                            }
                        }
                    }
                });
            }
        });
        let ran = next.load(Ordering::Relaxed).min(base + count) - base;
        let violating = failing.load(Ordering::Relaxed);
        if let Some(s) = *first.lock().unwrap_or_else(|e| e.into_inner()) {
            println!("sim: first failing seed {s}");
        }
        let secs = started.elapsed().as_secs_f64();
        println!(
            "{}: {ran} seeds in {secs:.1}s ({:.2}s per seed, {jobs} jobs)",
            self.name,
            secs * jobs as f64 / ran.max(1) as f64
        );
        println!("sim: seeds={ran} violations={violating}");
        violating
    }

    /// Runs `seed`; returns whether it violated a guarantee, and what to print for it: its
    /// plan, log and violations (with the replay command) if it failed or `verbose`, else
    /// nothing.
    fn report(
        &self,
        seed: u64,
        verbose: bool,
        run: &impl Fn(u64) -> Result<SeedReport, String>,
    ) -> (bool, String) {
        let t = std::time::Instant::now();
        let result = run(seed);
        let secs = t.elapsed().as_secs_f64();
        let (line, violations, log) = match result {
            Ok(r) => {
                let n = r.violations.len();
                let line = format!(
                    "seed {seed}: acked={} violations={n} ({secs:.2}s) {}",
                    r.acked, r.plan
                );
                (line, r.violations, r.log)
            }
            Err(p) => (
                format!("seed {seed}: panicked"),
                vec![format!("panic: {p}")],
                Vec::new(),
            ),
        };
        let mut out = String::new();
        if !verbose && violations.is_empty() {
            return (false, out);
        }
        let _ = writeln!(out, "{line}");
        for d in &log {
            let _ = writeln!(out, "    {d}");
        }
        for v in violations.iter().take(MAX_VIOLATIONS_PRINTED) {
            let _ = writeln!(out, "  VIOLATION {v}");
        }
        if violations.len() > MAX_VIOLATIONS_PRINTED {
            let more = violations.len() - MAX_VIOLATIONS_PRINTED;
            let _ = writeln!(out, "  ... and {more} more");
        }
        if !violations.is_empty() {
            let inject = if self.inject_name.is_empty() {
                String::new()
            } else {
                format!(" --inject {}", self.inject_name)
            };
            let _ = writeln!(
                out,
                "  replay: scripts/sim.sh {} --seed {seed}{inject}",
                self.sim_flag
            );
        }
        (!violations.is_empty(), out)
    }
}
