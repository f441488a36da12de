//! The `tern` binary: `tern serve` runs the broker (crate tern-broker) on its listeners.
//! `tern bench` runs the load generator (crate tern-bench).
//! `tern passwd` manages a password file (`passwd`).
//! - `cli`: the command line; `config_file`: the TOML file (`auth_config`: its `[auth]`);
//!   `signals`: SIGINT/SIGTERM, SIGHUP reloads.
//! - `listeners`: `[[listener]]` tables (TCP or WebSocket, TLS or not); `tls`: rustls configs
//!   and their reload; `ws`: the WebSocket upgrade and byte-stream adapter.
//! - `http`: the admin HTTP listener (`/metrics`, `/api/v1`, the dashboard).

mod auth_config;
mod cli;
mod cluster;
mod config_file;
mod http;
mod listeners;
mod passwd;
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
use http::HttpSettings;

/// jemalloc, not the C library's malloc, for the whole binary (`tern serve` and `tern bench`):
/// its size classes (…512, 640, 768…) fit the broker's per-connection blocks closer than glibc's
/// 16 B-granular chunks with an 8–16 B header, and its per-thread caches serve the workers
/// without glibc's arena locks. Measured on 2 cores (BENCHMARKS.md "Session 6: idle memory",
/// ARCHITECTURE §1): RSS per idle connection and the QoS 0 cell. The libraries stay
/// allocator-neutral: only this binary picks.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Exit code for a bad config file (the contract).
const EXIT_CONFIG: u8 = 2;
const DEFAULT_BIND: &str = "127.0.0.1:1883";

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve(args),
        Command::Bench(args) => tern_bench::run(args),
        Command::Passwd(args) => passwd::run(args),
    }
}

/// `tern serve --check-config FILE`: everything `serve` checks before it opens the data
/// directory (the file, the listeners and their TLS files, `[auth]` and its files, `[http]`).
fn check_config(args: &ServeArgs, path: &Path) -> ExitCode {
    let file = match config_file::load(path) {
        Ok(file) => file,
        Err(error) => {
            eprintln!("error: config {}: {error}", path.display());
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    if let Err(error) = plan(args, file) {
        eprintln!("error: config {}: {error}", path.display());
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

/// What `serve` runs, checked whole before anything is opened.
struct Plan {
    listeners: Vec<listeners::Prepared>,
    file: config_file::FileConfig,
    rules: tern_broker::AuthRules,
    allow_anonymous: bool,
    http: Option<HttpSettings>,
}

/// The command line over the file: listeners (TLS files read), `[auth]` (files read),
/// `[http]`, `--sync`. An error names the table or flag.
fn plan(args: &ServeArgs, mut file: config_file::FileConfig) -> Result<Plan, String> {
    let http = HttpSettings::resolve(file.http.as_ref(), args.http.as_deref())
        .map_err(|error| format!("[http] {error}"))?;
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
    let prepared = listeners::prepare(&listener_configs)
        .map_err(|(listener, error)| format!("listener {listener}: {error}"))?;
    if let (Some(node), Some(files)) = (file.cluster.as_mut(), &file.cluster_tls) {
        let tls = tls::cluster_tls(files).map_err(|error| format!("[cluster] {error}"))?;
        node.tls = Some(tls);
    }
    // The default stream is added here rather than by the store, so that `--sync` reaches it.
    if !file.streams.iter().any(|s| s.filters.is_empty()) {
        file.streams.push(tern_broker::StreamSpec::default_stream());
    }
    if let Some(sync) = &args.sync {
        let policy = config_file::sync_policy(sync, args.sync_interval_ms)
            .map_err(|error| format!("--sync: {error}"))?;
        for stream in &mut file.streams {
            stream.store.sync = policy;
        }
    }
    // The rule is over every listener's address, but a listener that sets `allow_anonymous`
    // itself has decided for its own address.
    let binds: Vec<String> = listener_configs
        .iter()
        .filter(|l| l.allow_anonymous.is_none())
        .map(|l| l.bind.clone())
        .collect();
    let allow_anonymous = auth_config::allow_anonymous_default(&file.auth, &binds)?;
    let rules = auth_config::load_rules(&file.auth, allow_anonymous)
        .map_err(|error| format!("[auth] {error}"))?;
    Ok(Plan {
        listeners: prepared,
        file,
        rules,
        allow_anonymous,
        http,
    })
}

fn serve(args: ServeArgs) -> ExitCode {
    if let Some(path) = &args.check_config {
        return check_config(&args, path);
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
    let plan = match plan(&args, file) {
        Ok(plan) => plan,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    if let Err(error) = init_logging(&args) {
        eprintln!("error: {error}");
        return ExitCode::from(EXIT_CONFIG);
    }
    match run(plan, &args.data_dir) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// One line per listener, in config order: the first line is the first listener.
fn print_listening(listeners: &[tern_broker::Listener]) -> anyhow::Result<()> {
    for listener in listeners {
        let local = listener
            .socket
            .local_addr()
            .context("listener has no address")?;
        print_line(&format!("tern listening on {local}"))?;
        let context = &listener.context;
        tracing::info!(%local, transport = ?context.transport, tls = context.tls, "listening");
    }
    Ok(())
}

fn print_line(line: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}").context("stdout")?;
    stdout.flush().context("stdout")
}

fn open_store(data_dir: &Path, file: &config_file::FileConfig) -> anyhow::Result<DurableStore> {
    DurableStore::open(data_dir, durable_config(file))
        .with_context(|| format!("cannot open the data directory {}", data_dir.display()))
}

fn durable_config(file: &config_file::FileConfig) -> DurableConfig {
    DurableConfig {
        streams: file.streams.clone(),
        sessions: SessionLimits {
            max_pending_per_session: file.broker.max_queued_messages,
            max_pending_bytes_per_session: file.broker.max_queued_bytes,
        },
        state_sync: file.state_sync,
        max_disk_bytes: file.max_disk_bytes,
    }
}

fn run(plan: Plan, data_dir: &Path) -> anyhow::Result<()> {
    let Plan {
        listeners: prepared,
        file,
        rules,
        allow_anonymous,
        http,
    } = plan;
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = file.worker_threads {
        builder.worker_threads(threads);
    }
    let runtime = builder
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
        if let Some(node) = file.cluster.clone() {
            let shutdown = signals::install().context("cannot install signal handlers")?;
            return cluster::run(
                node,
                data_dir,
                file,
                prepared,
                allow_anonymous,
                http,
                shutdown,
            )
            .await;
        }
        let store = Arc::new(open_store(data_dir, &file)?);
        let broker = Broker::with_store(file.broker, store).context("invalid limits")?;
        broker.replace_auth(rules);
        let shutdown = signals::install().context("cannot install signal handlers")?;
        signals::on_hangup(vec![
            auth_reload(&broker, file.auth.clone(), allow_anonymous),
            cert_reload(listeners::CertReloader::new(&prepared), {
                let broker = broker.clone();
                move || Some(broker.clone())
            }),
        ])
        .context("cannot install the SIGHUP handler")?;
        let max_packet_size = broker.config().max_packet_size_bytes;
        let listeners = listeners::bind(prepared, max_packet_size).await?;
        if let Some(http) = &http {
            // The connections gauge has one sample per listener.
            let contexts = listeners.iter().map(|l| l.context.clone()).collect();
            http.set_broker(broker.clone(), contexts);
        }
        // Ready before the lines: whoever reads them may probe `/readyz` at once.
        broker.mark_ready();
        print_listening(&listeners)?;
        broker.serve_listeners(listeners, shutdown).await?;
        tracing::info!("stopped");
        Ok(())
    })
}

/// SIGHUP: every TLS listener's certificate, key, client CA and CRLs (a listener whose files
/// are bad keeps its old ones); then the broker serving now (`serving`) disconnects the
/// clients whose certificates the new files refuse.
fn cert_reload(
    reloader: listeners::CertReloader,
    serving: impl Fn() -> Option<Broker> + Send + Sync + 'static,
) -> signals::Reload {
    signals::Reload {
        name: "TLS certificates",
        apply: Box::new(move || {
            let failed = reloader.reload();
            if let Some(broker) = serving() {
                broker.after_tls_reload();
            }
            if failed.is_empty() {
                Ok(())
            } else {
                let names: Vec<String> = failed
                    .iter()
                    .map(|(listener, error)| format!("{listener}: {error}"))
                    .collect();
                Err(names.join("; "))
            }
        }),
    }
}

/// SIGHUP: re-read the password file and the ACL; both apply together, or neither.
fn auth_reload(
    broker: &Broker,
    auth: auth_config::AuthConfig,
    allow_anonymous: bool,
) -> signals::Reload {
    let broker = broker.clone();
    // The reload runs on the blocking pool; what follows it (checking queued messages and the
    // connected clients' passwords again) is async work for the runtime.
    let runtime = tokio::runtime::Handle::current();
    signals::Reload {
        name: "password_file and acl_file",
        apply: Box::new(move || {
            let rules = auth_config::load_rules(&auth, allow_anonymous)?;
            broker.replace_auth(rules);
            runtime.spawn(broker.after_auth_reload());
            Ok(())
        }),
    }
}
