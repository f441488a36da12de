//! The `tern` binary: `tern serve` runs the broker (crate tern-broker) on its listeners.
//! `tern bench` runs the load generator (crate tern-bench).
//! - `cli`: the command line; `config_file`: the TOML file; `signals`: SIGINT/SIGTERM.
//! - `listeners`: `[[listener]]` tables (TCP or WebSocket, TLS or not); `tls`: rustls configs
//!   and their reload; `ws`: the WebSocket upgrade and byte-stream adapter.

mod cli;
mod config_file;
mod listeners;
mod signals;
mod tls;
mod ws;

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use std::path::Path;
use std::sync::Arc;

use tern_broker::{Broker, DurableConfig, DurableStore, SessionLimits};
use tracing_subscriber::EnvFilter;

use cli::{Cli, Command, ServeArgs};

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

fn serve(args: ServeArgs) -> ExitCode {
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
    let filter = match &args.log {
        Some(level) => EnvFilter::try_new(level),
        None => EnvFilter::try_from_default_env().or_else(|_| EnvFilter::try_new("info")),
    };
    let filter = match filter {
        Ok(filter) => filter,
        Err(error) => {
            eprintln!("error: --log: {error}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let mut listener_configs = file.listeners.clone();
    if listener_configs.is_empty() {
        let bind = file
            .bind
            .clone()
            .unwrap_or_else(|| DEFAULT_BIND.to_string());
        listener_configs.push(listeners::ListenerConfig::plain(bind));
    }
    if let Some(bind) = &args.bind {
        // `--bind` replaces the first listener's address.
        listener_configs[0].bind = bind.clone();
    }
    let prepared = match listeners::prepare(&listener_configs) {
        Ok(prepared) => prepared,
        Err((listener, error)) => {
            eprintln!("error: listener {listener}: {error}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
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
    match run(prepared, &args.data_dir, file) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(
    prepared: Vec<listeners::Prepared>,
    data_dir: &Path,
    file: config_file::FileConfig,
) -> anyhow::Result<()> {
    let store = DurableStore::open(
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
    .with_context(|| format!("cannot open the data directory {}", data_dir.display()))?;
    let store = Arc::new(store);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let broker = Broker::with_store(file.broker, store).context("invalid limits")?;
        let shutdown = signals::install().context("cannot install signal handlers")?;
        listeners::reload_on_sighup(listeners::CertReloader::new(&prepared))
            .context("cannot install the SIGHUP handler")?;
        let max_packet_size = broker.shared().config.max_packet_size_bytes;
        let listeners = listeners::bind(prepared, max_packet_size).await?;
        {
            // One line per listener, in config order: the first line is the first listener.
            let mut stdout = std::io::stdout().lock();
            for listener in &listeners {
                let local = listener.socket.local_addr().context("listener has no address")?;
                writeln!(stdout, "tern listening on {local}").context("stdout")?;
                let context = &listener.context;
                tracing::info!(%local, transport = ?context.transport, tls = context.tls, "listening");
            }
            stdout.flush().context("stdout")?;
        }
        broker.serve_listeners(listeners, shutdown).await?;
        tracing::info!("stopped");
        Ok(())
    })
}
