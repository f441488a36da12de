//! Shared broker state and the accept loop.
//!
//! # Invariants
//! - Every connection task gets a clone of the shutdown receiver; `serve` returns only after
//!   every connection task ended, or the drain timeout passed (then those left end by their
//!   own close path's bounds, or with the runtime).
//! - Connection tasks are counted, not kept in a `JoinSet`: its entry was 56 B and an
//!   allocation in every idle connection.

use std::future::{Future, poll_fn};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::config::{BrokerConfig, ConfigError};
use crate::metrics::Metrics;
use crate::persist::{MemoryStore, MessageStore, StoredWill};
use crate::read_order::ReadOrder;
use crate::retained::Retained;
use crate::router::Router;
use crate::session::Registry;
use crate::session::groups::Groups;
use crate::transport::{ConnectionInfo, Listener, ListenerContext, Transport, poll_accept_any};

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
    /// Passwords and ACL in force; a reload replaces them ([`crate::auth`]).
    pub auth: crate::auth::Auth,
    /// CONNECTs per source address (`max_connect_rate_per_ip`).
    pub connect_rate: crate::connect_rate::ConnectRate,
    pub store: Arc<dyn MessageStore>,
    pub started_at: Instant,
    /// Read tickets: packets take effect in the order they were read (ARCHITECTURE §2.1).
    pub(crate) read_order: Arc<ReadOrder>,
    /// Connections with a keep alive, for the sweeper that closes the silent ones.
    pub(crate) keep_alive: Arc<crate::keep_alive::KeepAlive>,
    /// Every connection's ack pipeline hook (`retained::release_hook`).
    pub(crate) release_hook: crate::ack_pipeline::ReleaseHook<Arc<crate::message::Message>>,
    /// Sockets lingering after a close the broker started (`connection::linger`), counted so
    /// that their number is bounded and a shutdown waits for them.
    pub(crate) lingering: Arc<LiveTasks>,
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

/// The tasks [`Broker::start_background`] started; dropping it aborts them.
pub struct Background {
    sys: tokio::task::JoinHandle<()>,
    checkpoints: tokio::task::JoinHandle<()>,
}

impl Drop for Background {
    fn drop(&mut self) {
        self.sys.abort();
        self.checkpoints.abort();
    }
}

/// The connection tasks of [`Broker::serve_listeners`] still alive (and, counted apart, the
/// lingering sockets of `connection::linger`).
#[derive(Default)]
pub(crate) struct LiveTasks {
    count: AtomicUsize,
    /// Notified when `count` drops to 0.
    ended: Notify,
}

impl LiveTasks {
    /// How many counted tasks are alive.
    pub(crate) fn alive(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// Resolves once no counted task is alive.
    async fn all_ended(&self) {
        loop {
            let ended = self.ended.notified();
            tokio::pin!(ended);
            // Registered before the check: a task ending in between still wakes this wait.
            ended.as_mut().enable();
            if self.count.load(Ordering::Acquire) == 0 {
                return;
            }
            ended.await;
        }
    }
}

/// Counts one task in [`LiveTasks`] while it lives (dropped with its future: also when the
/// task panics or is aborted).
pub(crate) struct LiveTask(Arc<LiveTasks>);

impl LiveTask {
    fn new(tasks: &Arc<LiveTasks>) -> LiveTask {
        tasks.count.fetch_add(1, Ordering::AcqRel);
        LiveTask(tasks.clone())
    }

    /// Counts one more task unless `limit` are alive.
    pub(crate) fn within(tasks: &Arc<LiveTasks>, limit: usize) -> Option<LiveTask> {
        tasks
            .count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|_| LiveTask(tasks.clone()))
    }
}

impl Drop for LiveTask {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.ended.notify_waiters();
        }
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
        let started_at = Instant::now();
        let broker = Broker {
            shared: Arc::new_cyclic(|weak| Shared {
                config,
                sessions: Registry::default(),
                router: RwLock::new(Router::default()),
                retained: RwLock::new(Retained::default()),
                groups: Groups::default(),
                recovered_wills: Mutex::new(Vec::new()),
                metrics: Metrics::default(),
                auth: crate::auth::Auth::default(),
                connect_rate: Default::default(),
                store,
                started_at,
                read_order: Arc::default(),
                keep_alive: Arc::new(crate::keep_alive::KeepAlive::new(started_at)),
                release_hook: crate::retained::release_hook(weak.clone()),
                lingering: Arc::default(),
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

    /// Accepts connections on one plain TCP listener until `shutdown` resolves; see
    /// [`Broker::serve_listeners`].
    pub async fn serve(
        &self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> io::Result<()> {
        let name = listener
            .local_addr()
            .map(|addr| addr.to_string())
            .unwrap_or_default();
        let listener = Listener::tcp(listener, ListenerContext::plain_tcp(name));
        self.serve_listeners(vec![listener], shutdown).await
    }

    /// Accepts connections on every listener until `shutdown` resolves; then stops accepting,
    /// tells every client the server is shutting down (v5 DISCONNECT 0x8B) and waits for the
    /// connections to close.
    pub async fn serve_listeners(
        &self,
        listeners: Vec<Listener>,
        shutdown: impl Future<Output = ()>,
    ) -> io::Result<()> {
        let (stop_tx, stop_rx) = watch::channel(false);
        let connections = Arc::new(LiveTasks::default());
        let background = self.start_background(stop_rx.clone());
        tokio::pin!(shutdown);
        let mut next_listener = 0;
        self.shared.ready.store(true, Ordering::Release);
        loop {
            let accept = poll_fn(|cx| poll_accept_any(&listeners, &mut next_listener, cx));
            // `biased` (as every select in this crate): branches are polled in order, not from
            // a random start, so a simulated run is one execution.
            tokio::select! {
                biased;
                _ = &mut shutdown => break,
                (index, accepted) = accept => match accepted {
                    Ok((stream, peer)) => {
                        let live = LiveTask::new(&connections);
                        self.spawn_connection(live, &listeners[index], stream, peer, &stop_rx);
                    }
                    Err(error) => {
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(ACCEPT_ERROR_BACKOFF_MS)).await;
                    }
                },
            }
        }
        drop(listeners);
        self.shared.ready.store(false, Ordering::Release);
        tracing::info!(
            connections = connections.count.load(Ordering::Acquire),
            "shutting down"
        );
        let _ = stop_tx.send(true);
        // After the send: a connection that attaches later sees `stop` (`connection::run`).
        self.shared.sessions.shut_down_connections();
        // The sockets the connections' closes leave lingering are waited for too (each for at
        // most `CLOSE_LINGER_MS`), within the same bound: their clients read the 0x8B.
        let drained =
            tokio::time::timeout(Duration::from_millis(SHUTDOWN_DRAIN_TIMEOUT_MS), async {
                connections.all_ended().await;
                self.shared.lingering.all_ended().await;
            })
            .await;
        if drained.is_err() {
            tracing::warn!(
                left = connections.count.load(Ordering::Acquire),
                lingering = self.shared.lingering.alive(),
                "connections did not close in time; not waiting for them"
            );
        }
        drop(background);
        // A clean stop leaves exact cursors: nothing is replayed at the next start.
        crate::checkpoint::checkpoint_once(&self.shared);
        Ok(())
    }

    /// Starts what runs beside the connections: the `$SYS` publisher (until `stop` turns
    /// true), session expiry and the wills recovered from the store, and the checkpointer.
    /// [`Broker::serve_listeners`] calls it; a caller that accepts connections itself (the
    /// simulator, through [`Broker::run_connection`]) calls it once before the first one.
    /// Dropping the result stops the `$SYS` publisher and the checkpointer.
    pub fn start_background(&self, stop: watch::Receiver<bool>) -> Background {
        let sys = tokio::spawn(crate::sys::run(self.shared.clone(), stop));
        crate::session::restore::arm_expiry(&self.shared);
        crate::will::arm_recovered(&self.shared);
        let checkpoints = tokio::spawn(crate::checkpoint::run_checkpoints(self.shared.clone()));
        Background { sys, checkpoints }
    }

    /// Serves one connection on any transport to its end, outside of a listener: the
    /// in-memory [`crate::transport::duplex`] of tests and the simulator. `stop` turning true
    /// closes it as a shutdown does.
    pub async fn run_connection<T: Transport>(
        &self,
        transport: T,
        info: ConnectionInfo,
        stop: watch::Receiver<bool>,
    ) {
        crate::connection::run_until_stopped(self.shared.clone(), transport, info, stop).await;
    }

    /// Starts the task of one accepted socket, counted by `live`, unless its listener is full.
    fn spawn_connection(
        &self,
        live: LiveTask,
        listener: &Listener,
        socket: TcpStream,
        peer: SocketAddr,
        stop: &watch::Receiver<bool>,
    ) {
        let Ok(slot) = listener.context.admit() else {
            let refused = Metrics::add_get(&self.shared.metrics.connections_refused_listener, 1);
            if refused.is_power_of_two() {
                tracing::warn!(
                    listener = %listener.context.name,
                    limit = listener.context.max_connections,
                    %peer,
                    refused,
                    "listener max_connections reached; connection closed"
                );
            }
            return; // dropping the socket closes it
        };
        let shared = self.shared.clone();
        let mut info = ConnectionInfo::new(listener.context.clone(), peer);
        let mut stop = stop.clone();
        let Some(upgrade) = listener.upgrade.clone() else {
            match slot {
                // The plain path: the task is the connection's future, nothing around it (a
                // wrapper would keep its captures beside it: measured +80 B per connection).
                None => tokio::spawn(crate::connection::run(shared, socket, info, stop, live)),
                Some(slot) => tokio::spawn(crate::connection::run(
                    shared,
                    socket,
                    info,
                    stop,
                    (live, slot),
                )),
            };
            return;
        };
        tokio::spawn(async move {
            let deadline = Instant::now() + shared.config.connect_timeout();
            let upgraded = tokio::select! {
                biased;
                upgraded = tokio::time::timeout_at(deadline, upgrade.upgrade(socket)) => upgraded,
                _ = stop.changed() => return,
            };
            let upgraded = match upgraded {
                Ok(Ok(upgraded)) => upgraded,
                outcome => {
                    let failed = Metrics::add_get(&shared.metrics.transport_handshakes_failed, 1);
                    let error = match outcome {
                        Ok(Err(error)) => error.to_string(),
                        _ => "timed out".to_string(),
                    };
                    tracing::debug!(listener = %info.listener.name, %peer, %error, failed, "handshake failed");
                    return;
                }
            };
            info.peer_cn = upgraded.peer_cn;
            crate::connection::run(shared, upgraded.stream, info, stop, (live, slot)).await;
        });
    }
}
