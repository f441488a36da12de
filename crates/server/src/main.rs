//! The `tern` binary: `tern serve` runs the broker (crate tern-broker) on a TCP listener.
//! `tern bench` runs the load generator (crate tern-bench).
//! - `cli`: the command line; `config_file`: the TOML file; `signals`: SIGINT/SIGTERM;
//!   `http`: the admin HTTP listener (`/metrics`, `/api/v1`, the dashboard).

mod cli;
mod config_file;
mod http;
mod signals;

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use std::path::Path;
use std::sync::Arc;

use tern_broker::{Broker, DurableConfig, DurableStore, SessionLimits};
use tokio::net::TcpListener;
use tracing_subscriber::EnvFilter;

use cli::{Cli, Command, ServeArgs};
use http::HttpSettings;

/// Exit code for a bad config file (the contract).
const EXIT_CONFIG: u8 = 2;
const DEFAULT_BIND: &str = "127.0.0.1:1883";

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve(args),
        Command::Bench(args) => tern_bench::run(args),
    }
}

/// `tern serve --check-config FILE`: parse and validate, say what is wrong.
fn check_config(path: &Path, http_flag: Option<&str>) -> ExitCode {
    let file = match config_file::load(path) {
        Ok(file) => file,
        Err(error) => {
            eprintln!("error: config {}: {error}", path.display());
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    if let Err(error) = HttpSettings::resolve(file.http.as_ref(), http_flag) {
        eprintln!("error: config {}: [http] {error}", path.display());
        return ExitCode::from(EXIT_CONFIG);
    }
    println!("config {}: ok", path.display());
    ExitCode::SUCCESS
}

fn init_logging(args: &ServeArgs) -> Result<(), String> {
    let filter = match &args.log {
        Some(level) => EnvFilter::try_new(level),
        None => EnvFilter::try_from_default_env().or_else(|_| EnvFilter::try_new("info")),
    };
    let filter = filter.map_err(|error| format!("--log: {error}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if args.log_format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
    Ok(())
}

fn serve(args: ServeArgs) -> ExitCode {
    if let Some(path) = &args.check_config {
        return check_config(path, args.http.as_deref());
    }
    let file = match &args.config {
        Some(path) => match config_file::load(path) {
            Ok(file) => file,
            Err(error) => {
                eprintln!("error: config {}: {error}", path.display());
                return ExitCode::from(EXIT_CONFIG);
            }
        },
        None => config_file::FileConfig::default(),
    };
    let http = match HttpSettings::resolve(file.http.as_ref(), args.http.as_deref()) {
        Ok(http) => http,
        Err(error) => {
            eprintln!("error: [http] {error}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    if let Err(error) = init_logging(&args) {
        eprintln!("error: {error}");
        return ExitCode::from(EXIT_CONFIG);
    }
    let bind = args
        .bind
        .clone()
        .or(file.bind.clone())
        .unwrap_or_else(|| DEFAULT_BIND.to_string());
    let mut file = file;
    if file.streams.is_empty() {
        file.streams.push(tern_broker::StreamSpec::default_stream());
    }
    if let Some(sync) = &args.sync {
        match config_file::sync_policy(sync, args.sync_interval_ms) {
            Ok(policy) => file.streams[0].store.sync = policy,
            Err(error) => {
                eprintln!("error: --sync: {error}");
                return ExitCode::from(EXIT_CONFIG);
            }
        }
    }
    match run(&bind, &args.data_dir, file, http) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn print_line(line: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}").context("stdout")?;
    stdout.flush().context("stdout")
}

fn open_store(data_dir: &Path, file: &config_file::FileConfig) -> anyhow::Result<DurableStore> {
    DurableStore::open(
        data_dir,
        DurableConfig {
            streams: file.streams.clone(),
            sessions: SessionLimits {
                max_pending_per_session: file.broker.max_queued_messages,
                max_pending_bytes_per_session: file.broker.max_queued_bytes,
                max_inflight_per_session: usize::from(file.broker.max_inflight_messages),
            },
            state_sync: file.state_sync,
            max_disk_bytes: file.max_disk_bytes,
        },
    )
    .with_context(|| format!("cannot open the data directory {}", data_dir.display()))
}

fn run(
    bind: &str,
    data_dir: &Path,
    file: config_file::FileConfig,
    http: Option<HttpSettings>,
) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        // Before recovery: /healthz answers and /readyz says "not yet" while it runs.
        let http = match http {
            Some(settings) => {
                let (state, local) = http::start(settings).await?;
                print_line(&format!("tern http on {local}"))?;
                tracing::info!(%local, "http listening");
                Some(state)
            }
            None => None,
        };
        let store = Arc::new(open_store(data_dir, &file)?);
        let broker = Broker::with_store(file.broker, store).context("invalid limits")?;
        let shutdown = signals::install().context("cannot install signal handlers")?;
        let listener = TcpListener::bind(bind)
            .await
            .with_context(|| format!("cannot listen on {bind}"))?;
        let local = listener.local_addr().context("listener has no address")?;
        if let Some(http) = &http {
            // The connections gauge's `listener` label. With several listeners, each gets
            // its own label value (its bind address) from the listener list.
            http.set_broker(broker.clone(), local.to_string());
        }
        print_line(&format!("tern listening on {local}"))?;
        tracing::info!(%local, "listening");
        broker.serve(listener, shutdown).await?;
        tracing::info!("stopped");
        Ok(())
    })
}
