//! tern-bench: the load generator behind `tern bench`, usable against any MQTT broker.
//!
//! - [`cli`]: the clap types ([`Args`], [`Command`]) the `tern` binary embeds.
//! - [`run`]: runs a parsed command on its own runtime, prints the report, returns the exit code.
//! - `traffic`: pubsub, fan-out and latency runs (setup, start, drain, report); `conns`: idle
//!   connections and broker memory.
//! - `load`: the per-connection hot loops; `mqtt`: connect/subscribe and pre-encoded packets
//!   on top of tern-wire.
//! - `payload`: the 20-byte bench header in every message; `checker`: loss, duplicate and order
//!   checks and what each QoS allows; `stats`: HDR latency histograms; `procfs`: CPU and memory
//!   from /proc; `report`: text and JSON output; `progress`: the live progress line.
//!
//! Exit codes of [`run`]: 0 the run passed its checks, 1 it ran but a check failed (loss or
//! duplicates the QoS forbids, reordering, failed connections), 2 it could not run.

pub mod checker;
pub mod cli;
pub mod conns;
pub mod load;
pub mod mqtt;
pub mod payload;
pub mod procfs;
pub mod progress;
pub mod report;
pub mod stats;
pub mod tls;
pub mod traffic;

use std::process::ExitCode;
use std::time::Duration;

pub use cli::{Args, Cli, Command};
pub use report::Report;

use crate::progress::Progress;
use crate::traffic::TrafficPlan;

/// Runs `args` and prints its report (text, or JSON with `--json`) on stdout.
///
/// Builds its own tokio runtime on a fresh thread, so it can be called from plain `main` or from
/// inside another runtime alike.
pub fn run(args: Args) -> ExitCode {
    let json = common(&args.command).json;
    let outcome = std::thread::Builder::new()
        .name("tern-bench".into())
        .spawn(move || run_blocking(&args))
        .map_err(anyhow::Error::from)
        .and_then(|handle| {
            handle
                .join()
                .map_err(|_| anyhow::anyhow!("bench thread panicked"))?
        });
    match outcome {
        Ok(report) => {
            if json {
                println!("{}", report.to_json());
            } else {
                print!("{}", report.to_text());
            }
            if report.ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(2)
        }
    }
}

fn run_blocking(args: &Args) -> anyhow::Result<Report> {
    let common = common(&args.command);
    let runtime = match common.runtime {
        cli::RuntimeFlavor::Current => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?,
        cli::RuntimeFlavor::Multi => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(common.threads.max(1))
            .enable_all()
            .build()?,
    };
    runtime.block_on(run_async(args))
}

/// The options shared by every subcommand.
pub fn common(command: &Command) -> &cli::Common {
    match command {
        Command::Pubsub(a) => &a.common,
        Command::Fanout(a) => &a.common,
        Command::Conns(a) => &a.common,
        Command::Latency(a) => &a.common,
    }
}

/// Runs `args` on the current runtime and returns the report without printing it.
pub async fn run_async(args: &Args) -> anyhow::Result<Report> {
    let common = common(&args.command);
    let progress = if common.json {
        Progress::disabled()
    } else {
        Progress::new(common.quiet)
    };
    let timeout = Duration::from_secs(common.timeout_s);
    let work = async {
        match &args.command {
            Command::Pubsub(a) => {
                let plan = TrafficPlan {
                    publishers: a.publishers,
                    subscribers: a.subscribers,
                    messages_per_publisher: a.messages,
                    payload_bytes: a.payload_bytes,
                    qos: a.qos,
                    window: a.window,
                    topics: a.topics,
                    offered_rate_per_s: None,
                };
                traffic::run(common, &plan, &progress)
                    .await
                    .map(Report::Pubsub)
            }
            Command::Fanout(a) => {
                let plan = TrafficPlan {
                    publishers: 1,
                    subscribers: a.subscribers,
                    messages_per_publisher: a.messages,
                    payload_bytes: a.payload_bytes,
                    qos: a.qos,
                    window: a.window,
                    topics: cli::TopicMode::Shared,
                    offered_rate_per_s: None,
                };
                traffic::run(common, &plan, &progress)
                    .await
                    .map(Report::Fanout)
            }
            Command::Latency(a) => {
                let per_publisher =
                    (a.rate.saturating_mul(a.duration_s)) / u64::from(a.publishers.max(1));
                let plan = TrafficPlan {
                    publishers: a.publishers,
                    subscribers: a.subscribers,
                    messages_per_publisher: per_publisher.max(1),
                    payload_bytes: a.payload_bytes,
                    qos: a.qos,
                    window: a.window,
                    topics: a.topics,
                    offered_rate_per_s: Some(a.rate),
                };
                traffic::run(common, &plan, &progress)
                    .await
                    .map(Report::Latency)
            }
            Command::Conns(a) => conns::run(a, &progress).await.map(Report::Conns),
        }
    };
    let result = tokio::time::timeout(timeout, work).await;
    progress.finish();
    match result {
        Ok(report) => report,
        Err(_) => anyhow::bail!("run did not finish within --timeout-s {}", common.timeout_s),
    }
}
