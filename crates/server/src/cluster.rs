//! `tern serve` with `[cluster]`: this node runs a `tern_cluster::ClusterNode`, which owns
//! the listeners, forwards clients to the leader, and opens a broker here (through
//! [`ServerEngine`]) while this node leads. docs/cluster.md describes the whole.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use tern_broker::{Broker, DurableStore};
use tern_cluster::{ClusterConfig, ClusterNode, EngineFactory};
use tern_store::vfs::Vfs;
use tokio::net::TcpListener;

use crate::config_file::FileConfig;
use crate::http::HttpState;
use crate::listeners::{self, Prepared};
use crate::{auth_config, durable_config, print_line, print_listening, signals};

/// Opens brokers for the cluster node, with this process's configuration.
struct ServerEngine {
    file: FileConfig,
    allow_anonymous: bool,
    /// The broker serving now, for SIGHUP's reload.
    current: Arc<Mutex<Option<Broker>>>,
    http: Option<Arc<HttpState>>,
    listener_contexts: Vec<Arc<tern_broker::ListenerContext>>,
}

impl EngineFactory for ServerEngine {
    fn open(&self, dir: &Path, vfs: Arc<dyn Vfs>) -> Result<Broker, String> {
        let store = DurableStore::open_with_vfs(dir, durable_config(&self.file), vfs)
            .map_err(|e| format!("opening the store: {e}"))?;
        let config = tern_broker::BrokerConfig {
            deliver_after_durable: true,
            ..self.file.broker.clone()
        };
        let broker = Broker::with_store(config, Arc::new(store))
            .map_err(|e| format!("invalid limits: {e}"))?;
        // The files as they are now: a SIGHUP since the start has changed them perhaps.
        let rules = auth_config::load_rules(&self.file.auth, self.allow_anonymous)
            .map_err(|e| format!("[auth] {e}"))?;
        broker.replace_auth(rules);
        broker.mark_ready();
        Ok(broker)
    }

    fn serving(&self, broker: Option<Broker>) {
        match (&self.http, &broker) {
            (Some(http), Some(b)) => http.set_broker(b.clone(), self.listener_contexts.clone()),
            (Some(http), None) => http.clear_broker(),
            (None, _) => {}
        }
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = broker;
    }
}

/// SIGHUP: the cluster port's certificate, key, CA and CRLs, read again; links to and from
/// peers the new files refuse are cut (`tern_raft::tls`, "Reload").
fn cluster_tls_reload(
    tls: tern_raft::ClusterTls,
    files: crate::tls::ClusterTlsFiles,
) -> signals::Reload {
    signals::Reload {
        name: "cluster TLS",
        apply: Box::new(move || {
            let cut = crate::tls::reload_cluster_tls(&files, &tls).map_err(|e| e.to_string())?;
            if cut > 0 {
                tracing::warn!(
                    cut,
                    "cluster TLS: connections of peers the reloaded files refuse were cut"
                );
            }
            Ok(())
        }),
    }
}

/// Runs this node until `shutdown` resolves.
pub(crate) async fn run(
    node: tern_raft::NodeConfig,
    data_dir: &Path,
    file: FileConfig,
    prepared: Vec<Prepared>,
    allow_anonymous: bool,
    http: Option<Arc<HttpState>>,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    if let Some(http) = &http {
        http.expect_cluster();
    }
    let config = ClusterConfig::new(node, PathBuf::from(data_dir));
    warn_if_exposed(&config.raft);
    let cluster_listener = TcpListener::bind(config.raft.bind)
        .await
        .with_context(|| format!("[cluster] cannot bind {}", config.raft.bind))?;
    let cluster_addr = cluster_listener.local_addr().context("cluster address")?;
    let max_packet_size = file.broker.max_packet_size_bytes;
    let current = Arc::new(Mutex::new(None::<Broker>));
    let mut reloads = vec![
        auth_reload(current.clone(), file.clone(), allow_anonymous),
        crate::cert_reload(listeners::CertReloader::new(&prepared), {
            let current = current.clone();
            move || current.lock().unwrap_or_else(|e| e.into_inner()).clone()
        }),
    ];
    if let (Some(tls), Some(files)) = (&config.raft.tls, &file.cluster_tls) {
        reloads.push(cluster_tls_reload(tls.clone(), files.clone()));
    }
    signals::on_hangup(reloads).context("cannot install the SIGHUP handler")?;
    let bound = listeners::bind(prepared, max_packet_size).await?;
    let http_hook = http.clone();
    let engine = ServerEngine {
        allow_anonymous,
        current,
        http,
        listener_contexts: bound.iter().map(|l| l.context.clone()).collect(),
        file,
    };
    print_line(&format!("tern cluster on {cluster_addr}"))?;
    print_listening(&bound)?;
    ClusterNode::run(
        config,
        cluster_listener,
        bound,
        Arc::new(engine),
        shutdown,
        move |node| crate::http::cluster_node::attach(http_hook.as_deref(), node),
    )
    .await?;
    tracing::info!("stopped");
    Ok(())
}

/// A cluster port without TLS accepts Raft messages and forwarded clients from anyone who
/// reaches it: said once at the start when it listens beyond loopback (docs/cluster.md,
/// "Security").
fn warn_if_exposed(node: &tern_raft::NodeConfig) {
    if node.tls.is_some() {
        tracing::info!(bind = %node.bind, "cluster port: mutual TLS");
    } else if !node.bind.ip().is_loopback() {
        tracing::warn!(
            bind = %node.bind,
            "cluster port without TLS on a non-loopback address: anyone who reaches it can \
             vote, append to the Raft log and open client connections as the cluster; set \
             [cluster] tls_cert, tls_key and tls_ca, or let only the nodes reach this port"
        );
    }
}

/// SIGHUP: the password file and ACL, for the broker serving now (a broker opened later
/// reads them itself).
fn auth_reload(
    current: Arc<Mutex<Option<Broker>>>,
    file: FileConfig,
    allow_anonymous: bool,
) -> signals::Reload {
    let runtime = tokio::runtime::Handle::current();
    signals::Reload {
        name: "password_file and acl_file",
        apply: Box::new(move || {
            let rules = auth_config::load_rules(&file.auth, allow_anonymous)?;
            let broker = current.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if let Some(broker) = broker {
                broker.replace_auth(rules);
                runtime.spawn(broker.after_auth_reload());
            }
            Ok(())
        }),
    }
}
