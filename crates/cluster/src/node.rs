//! One cluster node: its Raft node, its replica, the client listeners, and the broker engine
//! it runs while (and only while) it leads.
//!
//! # Invariants
//! - At most one engine runs per node, and only for the term it was started in: a change of
//!   term or role stops it (its disk fails first, so nothing it writes later is proposed)
//!   before another starts.
//! - An engine starts from a copy of the replica taken after this node, as leader, has
//!   applied everything committed before its term (a read index), so it sees every write
//!   any earlier leader had acknowledged.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tern_broker::{Accepted, Broker, Listener, ListenerContext, Upgrade};
use tern_raft::{ClusterStatus, ClusterTls, Consensus, Link, NodeConfig, NodeId, RaftNode, Role};
use tern_store::vfs::Vfs;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::disk::ReplicatedDisk;
use crate::error::ClusterError;
use crate::limits::Limits;
pub use crate::limits::{
    MAX_ACCEPT_QUEUE, MAX_FORWARD_QUEUE, MAX_FORWARDED_CONNECTIONS, RefusedConnections,
};
use crate::replica::Replica;

/// How long a client connection waits for a leader (or this node's engine) to appear before
/// it is closed.
pub const LEADER_WAIT_MS: u64 = 10_000;
/// How many election timeouts (`election_timeout_max_ms`) a client connection waits while
/// its node serves nobody (no leader known, or leading cut off from the majority) before it
/// is closed, so that its client tries another node: a majority that can elect has done so
/// by then; a node on the minority side of a partition would hold it until `LEADER_WAIT_MS`
/// (clients gave up first: paho-based ones after their CONNACK timeout, 3 s in
/// cluster-check, which made the majority look unavailable for 5.5 s after a cut).
pub const LEADERLESS_WAIT_ELECTION_TIMEOUTS: u64 = 2;
/// How often the lifecycle looks at the role even without a change (a failed engine start is
/// tried again at this pace).
pub const ROLE_CHECK_INTERVAL_MS: u64 = 200;
/// Longest an engine's stop waits for its connections to drain and its store to close.
pub const ENGINE_STOP_WAIT_MS: u64 = 10_000;

/// What the node needs from the application to run an engine: a broker over a store opened
/// on the given disk in the given directory, and to hear which broker serves now (the HTTP
/// endpoints' broker).
pub trait EngineFactory: Send + Sync + 'static {
    /// Opens the store in `dir` doing every I/O through `vfs`, and a broker over it
    /// (recovery runs here; its repairs are writes like any other).
    fn open(&self, dir: &Path, vfs: Arc<dyn Vfs>) -> Result<Broker, String>;
    /// The broker now serving on this node, or `None` when it stopped.
    fn serving(&self, broker: Option<Broker>);
}

/// `[cluster]`, resolved: the Raft node's configuration and this node's directories.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    pub raft: NodeConfig,
    /// Holds `raft/` (log, vote, applied point), `replica/` and, while leading, `live/`.
    pub data_dir: PathBuf,
    pub(crate) limits: Limits,
}

impl ClusterConfig {
    pub fn new(mut raft: NodeConfig, data_dir: PathBuf) -> ClusterConfig {
        raft.data_dir = data_dir.join("raft");
        ClusterConfig {
            raft,
            data_dir,
            limits: Limits::default(),
        }
    }
}

/// What [`ClusterNode::run_on`] runs on: the Raft node, started with `replica`'s applier,
/// and the connections forwarded to it by other nodes (with the address they came from).
pub struct NodeParts {
    pub raft: RaftNode,
    pub replica: Replica,
    /// Connections on the cluster port that are forwarded clients, their first four bytes
    /// (`tern_raft::network::FORWARD_MAGIC`) already read (tern-raft's `network::serve`).
    pub forwarded: mpsc::Receiver<(Link, SocketAddr)>,
}

/// A listener's identity for connections accepted on it.
#[derive(Clone)]
struct Door {
    context: Arc<ListenerContext>,
    upgrade: Option<Arc<dyn Upgrade>>,
}

struct Engine {
    term: u64,
    accept: mpsc::Sender<Accepted>,
    stop: oneshot::Sender<()>,
    disk: ReplicatedDisk,
    serving: JoinHandle<()>,
}

struct Shared {
    raft: Arc<RaftNode>,
    replica: Replica,
    factory: Arc<dyn EngineFactory>,
    doors: Vec<Door>,
    engine: Mutex<Option<Engine>>,
    live_dir: PathBuf,
    limits: Limits,
    /// Client connections this node forwards or waits to forward ([`Limits::forwarded_connections`]).
    forwards: Arc<Semaphore>,
    /// Forwarded connections from other nodes not yet handed to the engine
    /// ([`Limits::forward_queue`]).
    forwards_waiting: Arc<Semaphore>,
    forwarded_total: AtomicU64,
    /// [`RefusedConnections`], in [`Refusal`]'s order.
    refused: [AtomicU64; 3],
    /// The cluster port's TLS, for connections forwarded to the leader (`[cluster] tls_*`).
    tls: Option<ClusterTls>,
    /// Set while this node hands its leadership over: no engine runs (its writes would renew
    /// the followers' leases and the chosen node could not win).
    transferring: AtomicBool,
}

fn lock(m: &Mutex<Option<Engine>>) -> MutexGuard<'_, Option<Engine>> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A running cluster node; see the module documentation.
#[derive(Clone)]
pub struct ClusterNode {
    shared: Arc<Shared>,
}

impl ClusterNode {
    /// Starts the Raft node on `cluster_listener` and serves clients on `listeners` until
    /// `shutdown` resolves.
    pub async fn run(
        config: ClusterConfig,
        cluster_listener: TcpListener,
        listeners: Vec<Listener>,
        factory: Arc<dyn EngineFactory>,
        shutdown: impl std::future::Future<Output = ()>,
        started: impl FnOnce(ClusterNode),
    ) -> Result<(), ClusterError> {
        tracing::info!(node = %config.raft.node_id, "cluster: node starting");
        let replica = ClusterNode::open_replica(&config)?;
        let (forward_tx, forward_rx) = mpsc::channel(config.limits.forward_queue);
        let raft = RaftNode::start_forwarding(
            config.raft.clone(),
            cluster_listener,
            replica.applier(),
            None,
            Some(forward_tx),
        )
        .await?;
        let parts = NodeParts {
            raft,
            replica,
            forwarded: forward_rx,
        };
        ClusterNode::run_on(config, parts, listeners, factory, shutdown, started).await
    }

    /// Opens the node's replica (`replica/` in the data directory), whose applier the Raft
    /// node is started with.
    pub fn open_replica(config: &ClusterConfig) -> Result<Replica, ClusterError> {
        let sync = config.raft.sync != tern_store::SyncPolicy::Never;
        Replica::open(config.data_dir.join("replica"), sync)
            .map_err(|e| ClusterError::io("opening the replica", e))
    }

    /// [`ClusterNode::run`] on a Raft node the caller started (on another transport: the
    /// cluster simulator's network, `tests/broker_sim`) with `parts.replica`'s applier; the
    /// lifecycle, the listeners and the forwarding are the same.
    pub async fn run_on(
        config: ClusterConfig,
        parts: NodeParts,
        listeners: Vec<Listener>,
        factory: Arc<dyn EngineFactory>,
        shutdown: impl std::future::Future<Output = ()>,
        started: impl FnOnce(ClusterNode),
    ) -> Result<(), ClusterError> {
        let NodeParts {
            raft,
            replica,
            forwarded: forward_rx,
        } = parts;
        let doors = listeners
            .iter()
            .map(|l| Door {
                context: l.context.clone(),
                upgrade: l.upgrade.clone(),
            })
            .collect();
        let node = ClusterNode {
            shared: Arc::new(Shared {
                raft: Arc::new(raft),
                replica,
                factory,
                doors,
                engine: Mutex::new(None),
                live_dir: config.data_dir.join("live"),
                limits: config.limits,
                forwards: Arc::new(Semaphore::new(config.limits.forwarded_connections)),
                forwards_waiting: Arc::new(Semaphore::new(config.limits.forward_queue)),
                forwarded_total: AtomicU64::new(0),
                refused: Default::default(),
                tls: config.raft.tls.clone(),
                transferring: AtomicBool::new(false),
            }),
        };
        // Before anything runs: whoever watches the node (the HTTP side) must have it by the
        // time this node leads or serves (tests/cluster.rs saw a 404 from a new leader's
        // `/api/v1/cluster` when this came after the lifecycle's start).
        started(node.clone());
        let mut tasks = Vec::new();
        for (index, listener) in listeners.into_iter().enumerate() {
            tasks.push(tokio::spawn(
                node.clone().accept_loop(index, listener.socket),
            ));
        }
        tasks.push(tokio::spawn(node.clone().forwarded_loop(forward_rx)));
        let lifecycle = tokio::spawn(node.clone().lifecycle());
        // A node whose Raft core stopped on its own would linger: serving no engine, voting
        // in no election, its clients forwarded nowhere. It stops, with the reason, and the
        // process's supervisor starts it again (a fresh core).
        let raft = node.shared.raft.clone();
        let core_stopped = tokio::select! {
            () = shutdown => None,
            why = raft.core_stopped() => Some(why),
        };
        for t in &tasks {
            t.abort();
        }
        lifecycle.abort();
        let _ = lifecycle.await;
        let Some(why) = core_stopped else {
            node.stop_engine("shutting down").await;
            return Ok(());
        };
        tracing::error!(reason = %why, "cluster: the Raft core stopped; this node stops");
        node.stop_engine("the Raft core stopped").await;
        Err(ClusterError::ConsensusStopped(why))
    }

    /// This node's view of the cluster.
    pub fn status(&self) -> ClusterStatus {
        self.shared.raft.status()
    }

    /// The Raft node (membership changes, members).
    pub fn raft(&self) -> &Arc<RaftNode> {
        &self.shared.raft
    }

    /// Hands the leadership to voter `to` (this node must lead): stops this node's engine
    /// (its clients reconnect, and reach the new leader), then asks consensus to move the
    /// leadership (`Consensus::transfer_leader`). On failure this node leads on and its
    /// engine starts again.
    pub async fn transfer_leader(&self, to: NodeId) -> Result<(), ClusterError> {
        if to == self.status().node_id {
            return Ok(());
        }
        // Under load the chosen voter follows a moving end of the log: the engine is stopped
        // only once it has what this node has now, so that its exact catch-up, with the
        // engine stopped, is short (a node just restarted may need seconds).
        let st = self.status();
        if st.role == tern_raft::Role::Leader
            && st.voters.contains(&to)
            && !self
                .shared
                .raft
                .wait_replicated(to, st.last_log_index, tern_raft::TRANSFER_CATCH_UP_MS)
                .await
        {
            return Err(ClusterError::from(
                tern_raft::ConsensusError::TransferTimedOut(format!(
                    "{to} did not catch up within {} ms",
                    tern_raft::TRANSFER_CATCH_UP_MS
                )),
            ));
        }
        self.shared.transferring.store(true, Ordering::SeqCst);
        self.stop_engine("leadership handed over").await;
        let moved = self.shared.raft.transfer_leader(to).await;
        self.shared.transferring.store(false, Ordering::SeqCst);
        moved.map_err(ClusterError::from)
    }

    /// Client connections this node forwarded to another node's engine.
    pub fn forwarded_connections(&self) -> u64 {
        self.shared.forwarded_total.load(Ordering::Relaxed)
    }

    /// Client connections this node closed at a limit (counters).
    pub fn refused_connections(&self) -> RefusedConnections {
        let [forwarded_connections, forward_queue, accept_queue] = self
            .shared
            .refused
            .each_ref()
            .map(|c| c.load(Ordering::Relaxed));
        RefusedConnections {
            forwarded_connections,
            forward_queue,
            accept_queue,
        }
    }

    /// Starts and stops the engine as the role changes.
    async fn lifecycle(self) {
        let mut changes = self.shared.raft.status_changes();
        loop {
            self.reconcile().await;
            let tick = tokio::time::sleep(Duration::from_millis(ROLE_CHECK_INTERVAL_MS));
            tokio::select! {
                alive = changes.changed() => if !alive { return },
                _ = tick => {}
            }
        }
    }

    async fn reconcile(&self) {
        let status = self.status();
        let (running_term, failed) = {
            let engine = lock(&self.shared.engine);
            match engine.as_ref() {
                Some(e) => (
                    Some(e.term),
                    e.disk.failure().is_some() || e.serving.is_finished(),
                ),
                None => (None, false),
            }
        };
        // A leader cut off from its majority stops its engine: its clients go elsewhere.
        let leading = status.role == Role::Leader
            && !status.leader_cut_off()
            && !self.shared.transferring.load(Ordering::SeqCst);
        // The injected bug keeps a deposed leader's engine serving until this node leads
        // again: two engines own the sessions of the clients it holds.
        let deposed_keeps_serving =
            !leading && crate::inject::on(crate::inject::Bug::LoseOwnershipOnTakeover);
        if running_term.is_some()
            && !deposed_keeps_serving
            && (!leading || running_term != Some(status.term) || failed)
        {
            self.stop_engine("leadership lost or engine failed").await;
        }
        if leading && (running_term.is_none() || running_term != Some(status.term) || failed) {
            if let Err(error) = self.start_engine(status.term).await {
                tracing::warn!(%error, term = status.term, "cluster: engine did not start");
                self.stop_engine("start failed").await;
            }
        }
    }

    async fn start_engine(&self, term: u64) -> Result<(), ClusterError> {
        let sh = &self.shared;
        // Everything in the log before the barrier (a previous engine's tail too, which a
        // leader restarted in the same term still commits) is applied here before the copy.
        let barrier = crate::ops::Op::Barrier
            .encode()
            .map_err(|e| ClusterError::Engine(e.to_string()))?;
        sh.raft.propose(vec![barrier]).await?;
        let replica = sh.replica.clone();
        let live = sh.live_dir.clone();
        let applied = tokio::task::spawn_blocking(move || replica.copy_to(&live))
            .await
            .map_err(|e| ClusterError::Engine(e.to_string()))?
            .map_err(|e| ClusterError::io("copying the replica", e))?;
        let disk = ReplicatedDisk::start_limited(
            sh.live_dir.clone(),
            sh.raft.clone(),
            term,
            tokio::runtime::Handle::current(),
            sh.limits.disk,
        )
        .map_err(|e| ClusterError::io("starting the proposer", e))?;
        let factory = sh.factory.clone();
        let (dir, vfs): (PathBuf, Arc<dyn Vfs>) = (sh.live_dir.clone(), Arc::new(disk.clone()));
        let opened = tokio::task::spawn_blocking(move || factory.open(&dir, vfs)).await;
        let broker = match opened {
            Ok(Ok(b)) => b,
            Ok(Err(e)) => {
                disk.fail("the engine did not open");
                return Err(ClusterError::Engine(e));
            }
            Err(e) => {
                disk.fail("the engine did not open");
                return Err(ClusterError::Engine(e.to_string()));
            }
        };
        let (accept, accept_rx) = mpsc::channel(sh.limits.accept_queue);
        let (stop, stop_rx) = oneshot::channel::<()>();
        let serving_broker = broker.clone();
        let serving = tokio::spawn(async move {
            let stopped = async move {
                let _ = stop_rx.await;
            };
            if let Err(error) = serving_broker.serve_accepted(accept_rx, stopped).await {
                tracing::warn!(%error, "cluster: engine stopped with an error");
            }
        });
        *lock(&sh.engine) = Some(Engine {
            term,
            accept,
            stop,
            disk,
            serving,
        });
        sh.factory.serving(Some(broker));
        tracing::info!(term, ?applied, "cluster: leading; engine serving");
        Ok(())
    }

    async fn stop_engine(&self, why: &str) {
        let Some(engine) = lock(&self.shared.engine).take() else {
            return;
        };
        // The disk first: whatever the engine writes from now on is never proposed.
        engine.disk.fail(why);
        self.shared.factory.serving(None);
        let _ = engine.stop.send(());
        drop(engine.accept);
        let stopped =
            tokio::time::timeout(Duration::from_millis(ENGINE_STOP_WAIT_MS), engine.serving).await;
        if stopped.is_err() {
            tracing::warn!("cluster: engine did not stop in time");
        }
        // No proposal of the old engine may enter the log after the next engine's barrier.
        let disk = engine.disk.clone();
        let _ = tokio::task::spawn_blocking(move || disk.join_proposer()).await;
        let live = self.shared.live_dir.clone();
        let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(live)).await;
        let waits = engine.disk.stats();
        tracing::info!(why, term = engine.term, ?waits, "cluster: engine stopped");
    }
}

mod clients;

#[cfg(test)]
#[path = "node_tests.rs"]
mod tests;
