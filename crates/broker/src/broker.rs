//! Shared broker state and the accept loop.
//!
//! # Invariants
//! - Every connection task gets a clone of the shutdown receiver; `serve` returns only after
//!   every connection task ended (or the drain timeout passed and they were aborted).

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::config::{BrokerConfig, ConfigError};
use crate::metrics::Metrics;
use crate::persist::{MemoryStore, MessageStore, StoredWill};
use crate::read_order::ReadOrder;
use crate::retained::Retained;
use crate::router::Router;
use crate::session::Registry;
use crate::session::groups::Groups;

/// How long shutdown waits for connections to send their DISCONNECT and close.
pub const SHUTDOWN_DRAIN_TIMEOUT_MS: u64 = 3_000;
/// Pause after a failed accept (e.g. out of file descriptors) before trying again.
const ACCEPT_ERROR_BACKOFF_MS: u64 = 100;

/// State every connection task shares.
pub struct Shared {
    pub config: BrokerConfig,
    pub sessions: Registry,
    pub router: RwLock<Router>,
    pub retained: RwLock<Retained>,
    /// Share-group queues (messages waiting for a member to come online).
    pub groups: Groups,
    /// Wills recovered from the store, armed when the broker starts serving.
    pub recovered_wills: Mutex<Vec<StoredWill>>,
    pub metrics: Metrics,
    pub store: Arc<dyn MessageStore>,
    pub started_at: Instant,
    /// Read tickets: packets take effect in the order they were read (ARCHITECTURE §2.1).
    pub(crate) read_order: Arc<ReadOrder>,
    next_connection_id: AtomicU64,
    /// Set while [`Broker::serve`] accepts connections (recovery is done by then).
    ready: AtomicBool,
}

impl Shared {
    pub fn next_connection_id(&self) -> u64 {
        self.next_connection_id.fetch_add(1, Ordering::Relaxed)
    }

    /// True while the broker accepts connections (recovery done, listener open).
    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
}

/// The broker: build with [`Broker::new`], run with [`Broker::serve`].
#[derive(Clone)]
pub struct Broker {
    shared: Arc<Shared>,
}

impl Broker {
    /// A broker with the in-memory store.
    pub fn new(config: BrokerConfig) -> Result<Broker, ConfigError> {
        Broker::with_store(config, Arc::new(MemoryStore))
    }

    pub fn with_store(
        config: BrokerConfig,
        store: Arc<dyn MessageStore>,
    ) -> Result<Broker, ConfigError> {
        config.validate()?;
        let recovered = store.recover();
        let broker = Broker {
            shared: Arc::new(Shared {
                config,
                sessions: Registry::default(),
                router: RwLock::new(Router::default()),
                retained: RwLock::new(Retained::default()),
                groups: Groups::default(),
                recovered_wills: Mutex::new(Vec::new()),
                metrics: Metrics::default(),
                store,
                started_at: Instant::now(),
                read_order: Arc::default(),
                next_connection_id: AtomicU64::new(1),
                ready: AtomicBool::new(false),
            }),
        };
        crate::session::restore::restore(&broker.shared, recovered);
        Ok(broker)
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Accepts connections until `shutdown` resolves; then stops accepting, tells every
    /// client the server is shutting down (v5 DISCONNECT 0x8B) and waits for the connections
    /// to close.
    pub async fn serve(
        &self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> io::Result<()> {
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut connections = JoinSet::new();
        let sys = tokio::spawn(crate::sys::run(self.shared.clone(), stop_rx.clone()));
        crate::session::restore::arm_expiry(&self.shared);
        crate::will::arm_recovered(&self.shared);
        let checkpoints = tokio::spawn(crate::checkpoint::run_checkpoints(self.shared.clone()));
        tokio::pin!(shutdown);
        self.shared.ready.store(true, Ordering::Release);
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        let shared = self.shared.clone();
                        let stop = stop_rx.clone();
                        connections.spawn(crate::connection::run(shared, stream, peer, stop));
                    }
                    Err(error) => {
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(ACCEPT_ERROR_BACKOFF_MS)).await;
                    }
                },
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
        drop(listener);
        self.shared.ready.store(false, Ordering::Release);
        tracing::info!(connections = connections.len(), "shutting down");
        let _ = stop_tx.send(true);
        let drained =
            tokio::time::timeout(Duration::from_millis(SHUTDOWN_DRAIN_TIMEOUT_MS), async {
                while connections.join_next().await.is_some() {}
            })
            .await;
        if drained.is_err() {
            tracing::warn!(
                left = connections.len(),
                "connections did not close in time; aborted"
            );
            connections.abort_all();
        }
        sys.abort();
        checkpoints.abort();
        // A clean stop leaves exact cursors: nothing is replayed at the next start.
        crate::checkpoint::checkpoint_once(&self.shared);
        Ok(())
    }
}
