//! Idle connections: how many a broker takes, how fast, and what each costs it in memory.
//!
//! Connections are spread over source addresses (`--first-source`, then the next address every
//! `--per-source` connections) so that a run can go past the ~28,000 ephemeral ports one source
//! address has towards one destination. The connections stay open for `--hold-s`, then the
//! broker's resident memory is read and every connection sends DISCONNECT.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::bail;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::cli::ConnsArgs;
use crate::mqtt::{Conn, ConnectOptions, connect};
use crate::procfs::{CpuMark, Target, rss_bytes};
use crate::progress::Progress;
use crate::report::{ConnsReport, protocol_name};
use crate::traffic::{resolve, run_tag};

/// Connection errors kept verbatim in the report.
pub const MAX_REPORTED_ERRORS: usize = 5;
/// Give up on the remaining connections when none completes for this long.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(20);

/// The source address of connection `index`.
pub fn source_for(first: Ipv4Addr, per_source: u32, index: u32) -> Ipv4Addr {
    let step = index / per_source.max(1);
    Ipv4Addr::from(u32::from(first).wrapping_add(step))
}

pub async fn run(args: &ConnsArgs, progress: &Progress) -> anyhow::Result<ConnsReport> {
    let common = &args.common;
    if args.connections == 0 {
        bail!("--connections must be positive");
    }
    let addr = resolve(common).await?;
    let tag = args.tag.clone().unwrap_or_else(run_tag);
    let rss_before = common
        .broker_pid
        .and_then(|pid| rss_bytes(Target::Pid(pid)));
    let cpu = CpuMark::now(common.broker_pid);
    let done = Arc::new(AtomicU64::new(0));
    progress.counter("connected", u64::from(args.connections), done.clone());

    let started = Instant::now();
    let tasks = spawn_connects(args, addr, &tag, done.clone())?;
    let Connected {
        conns,
        errors,
        failed,
    } = collect(tasks).await;
    let connect_elapsed = started.elapsed();
    // CPU of the connect phase only: the hold is idle by design.
    let cpu = cpu.usage();
    progress.phase(&format!(
        "holding {} connections for {} s",
        conns.len(),
        args.hold_s
    ));
    tokio::time::sleep(Duration::from_secs(args.hold_s)).await;
    let rss_after = common
        .broker_pid
        .and_then(|pid| rss_bytes(Target::Pid(pid)));
    progress.phase("disconnecting");
    let established = conns.len() as u32;
    let mut closing = JoinSet::new();
    for mut conn in conns {
        closing.spawn(async move { conn.disconnect().await });
    }
    while closing.join_next().await.is_some() {}
    progress.finish();

    let connect_elapsed_ns = connect_elapsed.as_nanos() as u64;
    Ok(ConnsReport {
        protocol: protocol_name(common.protocol),
        connections: args.connections,
        established,
        failed,
        errors,
        source_addresses: (args.connections - 1) / args.per_source.max(1) + 1,
        connect_elapsed_ms: connect_elapsed_ns as f64 / 1e6,
        connects_per_s: crate::stats::rate_per_s(u64::from(established), connect_elapsed_ns),
        broker_rss_before_bytes: rss_before,
        broker_rss_after_bytes: rss_after,
        broker_bytes_per_connection: match (rss_before, rss_after) {
            (Some(before), Some(after)) if established > 0 => {
                Some((after as f64 - before as f64) / f64::from(established))
            }
            _ => None,
        },
        cpu,
    })
}

type ConnectTasks = JoinSet<Result<Conn, String>>;

/// Starts every connection, at most `--connect-concurrency` at a time, each counted in
/// `done` when it completes either way.
fn spawn_connects(
    args: &ConnsArgs,
    addr: std::net::SocketAddr,
    tag: &str,
    done: Arc<AtomicU64>,
) -> anyhow::Result<ConnectTasks> {
    let common = &args.common;
    let protocol = common.protocol.wire();
    let tls = crate::tls::TlsClient::from_args(common)?;
    let limit = Arc::new(Semaphore::new(common.connect_concurrency.max(1)));
    let mut tasks = JoinSet::new();
    for index in 0..args.connections {
        let limit = limit.clone();
        let tls = tls.clone();
        let done = done.clone();
        let client_id = format!("{}-{tag}-c{index}", common.prefix);
        let source = IpAddr::V4(source_for(args.first_source, args.per_source, index));
        let keep_alive_s = args.keep_alive_s;
        let persistent = common.persistent;
        tasks.spawn(async move {
            let _permit = limit.acquire_owned().await;
            let options = ConnectOptions {
                addr,
                source: Some(source),
                protocol,
                client_id: &client_id,
                keep_alive_s,
                persistent,
                tls,
            };
            let result = connect(&options).await;
            done.fetch_add(1, Ordering::Relaxed);
            result.map_err(|error| format!("{client_id} from {source}: {error}"))
        });
    }
    Ok(tasks)
}

/// What the connect phase ended with.
struct Connected {
    conns: Vec<Conn>,
    /// At most [`MAX_REPORTED_ERRORS`], verbatim.
    errors: Vec<String>,
    failed: u32,
}

/// Waits for every connection, giving up on the rest once none completes for
/// [`STALL_TIMEOUT`].
async fn collect(mut tasks: ConnectTasks) -> Connected {
    let mut out = Connected {
        conns: Vec::with_capacity(tasks.len()),
        errors: Vec::new(),
        failed: 0,
    };
    loop {
        let joined = match tokio::time::timeout(STALL_TIMEOUT, tasks.join_next()).await {
            Ok(Some(joined)) => joined,
            Ok(None) => break,
            Err(_) => {
                // A broker that stops accepting would otherwise hold the run until --timeout-s
                // and lose the report; count what is still pending as failed instead.
                let pending = tasks.len() as u32;
                tasks.abort_all();
                out.failed += pending;
                out.errors.push(format!(
                    "{pending} connections pending with none completing for {} s (broker stopped accepting?)",
                    STALL_TIMEOUT.as_secs()
                ));
                break;
            }
        };
        let error = match joined {
            Ok(Ok(conn)) => {
                out.conns.push(conn);
                continue;
            }
            Ok(Err(error)) => error,
            Err(error) => format!("connect task failed: {error}"),
        };
        out.failed += 1;
        if out.errors.len() < MAX_REPORTED_ERRORS {
            out.errors.push(error);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_step_every_per_source_connections() {
        let first = Ipv4Addr::new(127, 0, 0, 1);
        assert_eq!(source_for(first, 5000, 0), first);
        assert_eq!(source_for(first, 5000, 4999), first);
        assert_eq!(source_for(first, 5000, 5000), Ipv4Addr::new(127, 0, 0, 2));
        assert_eq!(source_for(first, 5000, 12_000), Ipv4Addr::new(127, 0, 0, 3));
        assert_eq!(source_for(first, 0, 3), Ipv4Addr::new(127, 0, 0, 4));
    }
}
