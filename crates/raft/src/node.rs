//! One node: its store, log, state machine, openraft core, peer listener, and the cluster's
//! formation from `[cluster] peers`.
//!
//! Bootstrap: every node is given the same initial voters. A node whose log is empty and whose
//! id is the lowest of them calls openraft's `initialize` with all of them; the others wait to
//! hear from it. A node restarted on its data directory is already initialized: it rejoins
//! with its vote and log.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use openraft::error::{InitializeError, RaftError};
use openraft::{BasicNode, RaftNetworkFactory, ServerState, SnapshotPolicy};
use tern_store::vfs::Vfs;
use tern_store::{Store, SyncPolicy};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::error::ConsensusError;
use crate::incarnation::{self, Incarnations};
use crate::inject::{self, Bug};
use crate::log_store::LogStore;
use crate::network::{self, TcpNetwork, serve};
use crate::state_machine::{Applier, ApplierWork, StateMachine};
use crate::tls::ClusterTls;
use crate::types::{NodeId, Raft, TypeConfig};

/// Default of `NodeConfig::snapshot_every_entries`.
pub const DEFAULT_SNAPSHOT_EVERY_ENTRIES: u64 = 50_000;
/// Default of `NodeConfig::log_kept_behind_snapshot`.
pub const DEFAULT_LOG_KEPT_BEHIND_SNAPSHOT: u64 = 10_000;

/// Longest [`RaftNode::shutdown`] waits for the core's tasks to let go of the store.
pub const STORE_RELEASE_WAIT: Duration = Duration::from_secs(30);
const STORE_RELEASE_POLL: Duration = Duration::from_millis(10);

/// How a node starts: `[cluster]` of the configuration, plus its data directory.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub node_id: NodeId,
    /// Where peers reach this node.
    pub bind: SocketAddr,
    /// The initial voters, the same list on every node. A node not in it joins only when the
    /// leader adds it as a learner.
    pub peers: Vec<(NodeId, SocketAddr)>,
    /// The store directory holding the Raft log, vote and applied point.
    pub data_dir: PathBuf,
    /// Durability of the log (`[state] sync`); the vote is always synced.
    pub sync: SyncPolicy,
    pub heartbeat_interval_ms: u64,
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    /// Entries between two snapshots built from the application's state (after which the
    /// log before the snapshot is purged).
    pub snapshot_every_entries: u64,
    /// Entries kept in the log behind a snapshot, so a briefly lagging follower catches up
    /// from the log instead of a snapshot.
    pub log_kept_behind_snapshot: u64,
    /// Mutual TLS on the cluster port, both ways (`[cluster] tls_*`); `None`: plain TCP.
    pub tls: Option<ClusterTls>,
    /// Where the applier's file work runs (a simulator's is in its own time).
    pub applier_work: ApplierWork,
}

impl NodeConfig {
    /// A configuration with openraft-like timings (heartbeat 50 ms, election 150..300 ms) and
    /// the log synced on every commit.
    pub fn new(
        node_id: NodeId,
        bind: SocketAddr,
        peers: Vec<(NodeId, SocketAddr)>,
        data_dir: PathBuf,
    ) -> Self {
        NodeConfig {
            node_id,
            bind,
            peers,
            data_dir,
            sync: SyncPolicy::Always,
            heartbeat_interval_ms: 50,
            election_timeout_min_ms: 150,
            election_timeout_max_ms: 300,
            snapshot_every_entries: DEFAULT_SNAPSHOT_EVERY_ENTRIES,
            log_kept_behind_snapshot: DEFAULT_LOG_KEPT_BEHIND_SNAPSHOT,
            tls: None,
            applier_work: ApplierWork::BlockingPool,
        }
    }

    /// From the `[cluster]` section: `node_id = 1`, `bind = "127.0.0.1:7001"`,
    /// `peers = ["1=127.0.0.1:7001", "2=127.0.0.1:7002", "3=127.0.0.1:7003"]`.
    pub fn from_cluster(
        node_id: u64,
        bind: &str,
        peers: &[impl AsRef<str>],
        data_dir: PathBuf,
    ) -> Result<NodeConfig, ConsensusError> {
        let bind = bind
            .trim()
            .parse::<SocketAddr>()
            .map_err(|_| ConsensusError::Invalid(format!("bind {bind:?}: want HOST:PORT")))?;
        let peers = peers
            .iter()
            .map(|p| NodeConfig::parse_peer(p.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        if peers.is_empty() {
            return Err(ConsensusError::Invalid(
                "peers is empty: list the initial voters".into(),
            ));
        }
        let config = NodeConfig::new(NodeId(node_id), bind, peers, data_dir);
        config.validate()?;
        Ok(config)
    }

    /// Parses one `peers` item, `"2=127.0.0.1:7002"`.
    pub fn parse_peer(s: &str) -> Result<(NodeId, SocketAddr), ConsensusError> {
        let bad = || ConsensusError::Invalid(format!("peer {s:?}: want ID=HOST:PORT"));
        let (id, addr) = s.split_once('=').ok_or_else(bad)?;
        let id = id.trim().parse::<u64>().map_err(|_| bad())?;
        let addr = addr.trim().parse::<SocketAddr>().map_err(|_| bad())?;
        Ok((NodeId(id), addr))
    }

    fn validate(&self) -> Result<(), ConsensusError> {
        let mut ids: Vec<NodeId> = self.peers.iter().map(|p| p.0).collect();
        ids.sort();
        ids.dedup();
        if ids.len() != self.peers.len() {
            return Err(ConsensusError::Invalid("a node id repeats in peers".into()));
        }
        // A node outside `peers` is a newcomer: it waits to be added as a learner.
        Ok(())
    }

    fn raft_config(&self) -> Result<openraft::Config, ConsensusError> {
        openraft::Config {
            cluster_name: "tern".into(),
            heartbeat_interval: self.heartbeat_interval_ms,
            election_timeout_min: self.election_timeout_min_ms,
            election_timeout_max: self.election_timeout_max_ms,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(self.snapshot_every_entries),
            max_in_snapshot_log_to_keep: self.log_kept_behind_snapshot,
            install_snapshot_timeout: network::SNAPSHOT_CHUNK_TIMEOUT.as_millis() as u64,
            ..Default::default()
        }
        .validate()
        .map_err(|e| ConsensusError::Invalid(e.to_string()))
    }
}

/// One member of the cluster, as the membership records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub id: NodeId,
    /// `None` if the recorded address does not parse (it was added by this code, so never).
    pub addr: Option<SocketAddr>,
    pub voter: bool,
}

/// See [`RaftNode::status_changes`].
pub struct StatusChanges(tokio::sync::watch::Receiver<openraft::RaftMetrics<NodeId, BasicNode>>);

impl StatusChanges {
    /// Waits for the next change; `false` once the node has stopped.
    pub async fn changed(&mut self) -> bool {
        self.0.changed().await.is_ok()
    }
}

/// A running node. Dropping it stops its listener; [`RaftNode::shutdown`] also waits for the
/// Raft core to stop (and so for the store to be released).
pub struct RaftNode {
    pub(crate) id: NodeId,
    pub(crate) raft: Raft,
    pub(crate) config: NodeConfig,
    local_addr: SocketAddr,
    pub(crate) elections: Arc<AtomicU64>,
    tasks: Vec<JoinHandle<()>>,
    /// The node's store (held so that it closes when the node is dropped).
    _store: Store,
    /// Serializes proposals under the injected bug `AckBeforeCommit` only.
    #[cfg(feature = "inject")]
    pub(crate) inject_serial: tokio::sync::Mutex<()>,
    /// The log store's, state machine's and incarnations' canaries, gone once the core's
    /// tasks and the cluster port's connections have all let go of them and their streams
    /// are closed.
    storage: Vec<Weak<()>>,
}

impl std::fmt::Debug for RaftNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftNode")
            .field("id", &self.id)
            .field("local_addr", &self.local_addr)
            .finish()
    }
}

impl RaftNode {
    /// Binds `config.bind` and starts.
    pub async fn start(
        config: NodeConfig,
        applier: Box<dyn Applier>,
    ) -> Result<RaftNode, ConsensusError> {
        let listener =
            TcpListener::bind(config.bind)
                .await
                .map_err(|source| ConsensusError::Io {
                    context: format!("bind {}", config.bind),
                    source,
                })?;
        RaftNode::start_on(config, listener, applier, None).await
    }

    /// Starts on a bound listener, with the store's I/O through `vfs` if given.
    pub async fn start_on(
        config: NodeConfig,
        listener: TcpListener,
        applier: Box<dyn Applier>,
        vfs: Option<Arc<dyn Vfs>>,
    ) -> Result<RaftNode, ConsensusError> {
        RaftNode::start_forwarding(config, listener, applier, vfs, None).await
    }

    /// [`RaftNode::start_on`], handing the connections on the cluster port that are
    /// forwarded client connections ([`network::FORWARD_MAGIC`]) to `forward`.
    pub async fn start_forwarding(
        config: NodeConfig,
        listener: TcpListener,
        applier: Box<dyn Applier>,
        vfs: Option<Arc<dyn Vfs>>,
        forward: Option<network::Forwarded>,
    ) -> Result<RaftNode, ConsensusError> {
        let local_addr = listener.local_addr().map_err(|source| ConsensusError::Io {
            context: "listener address".into(),
            source,
        })?;
        let store = open_store(&config, vfs)?;
        let incarnations = Arc::new(Incarnations::open(&store)?);
        incarnation::check_start(
            (config.node_id, &config.peers, config.tls.as_ref()),
            &listener,
            &store,
            &incarnations,
        )
        .await?;
        let network = TcpNetwork {
            tls: config.tls.clone(),
        };
        let (raft, store, mut storage) = open(&config, applier, network, store).await?;
        storage.push(incarnations.liveness());
        let serving = tokio::spawn(serve(
            listener,
            raft.clone(),
            forward,
            config.tls.clone(),
            incarnations,
        ));
        RaftNode::run(config, raft, (store, storage), local_addr, Some(serving)).await
    }

    /// Starts with another transport (a simulated network): `network` carries this node's
    /// requests, and whatever delivers peers' requests to it calls [`network::handle`] on
    /// [`RaftNode::peer_handler`].
    pub async fn start_with<N: RaftNetworkFactory<TypeConfig>>(
        config: NodeConfig,
        applier: Box<dyn Applier>,
        network: N,
        vfs: Option<Arc<dyn Vfs>>,
    ) -> Result<RaftNode, ConsensusError> {
        let store = open_store(&config, vfs)?;
        RaftNode::start_with_store(config, applier, network, store).await
    }

    /// [`RaftNode::start_with`] on a store the caller opened on `config.data_dir`. A
    /// simulator whose disk has stepped writers (tern-store's `SimConfig::stepped_writers`)
    /// keeps a clone to run their turns (`Store::step`), from before the node starts (forming
    /// the cluster writes) until it has shut down; the clone holds the store's lock until it
    /// is dropped.
    pub async fn start_with_store<N: RaftNetworkFactory<TypeConfig>>(
        config: NodeConfig,
        applier: Box<dyn Applier>,
        network: N,
        store: Store,
    ) -> Result<RaftNode, ConsensusError> {
        let (raft, store, storage) = open(&config, applier, network, store).await?;
        let addr = config.bind;
        RaftNode::run(config, raft, (store, storage), addr, None).await
    }

    async fn run(
        config: NodeConfig,
        raft: Raft,
        (store, storage): (Store, Vec<Weak<()>>),
        local_addr: SocketAddr,
        serving: Option<JoinHandle<()>>,
    ) -> Result<RaftNode, ConsensusError> {
        let elections = Arc::new(AtomicU64::new(0));
        let mut tasks = vec![tokio::spawn(count_elections(
            raft.clone(),
            elections.clone(),
        ))];
        tasks.extend(serving);
        let node = RaftNode {
            id: config.node_id,
            raft,
            config,
            local_addr,
            elections,
            tasks,
            _store: store,
            #[cfg(feature = "inject")]
            inject_serial: tokio::sync::Mutex::new(()),
            storage,
        };
        node.bootstrap().await?;
        Ok(node)
    }

    /// What a transport hands peers' requests to (with [`network::handle`]): a handle on
    /// the Raft core that does not keep the node alive. Once the node is shut down, requests
    /// fail.
    pub fn peer_handler(&self) -> Raft {
        self.raft.clone()
    }

    /// The lowest initial voter forms the cluster when its log is empty.
    async fn bootstrap(&self) -> Result<(), ConsensusError> {
        let lowest = self.config.peers.iter().map(|p| p.0).min();
        let initialized = self
            .raft
            .is_initialized()
            .await
            .map_err(|e| ConsensusError::Shutdown(e.to_string()))?;
        if initialized || lowest != Some(self.id) {
            return Ok(());
        }
        let members: BTreeMap<NodeId, BasicNode> = self
            .config
            .peers
            .iter()
            .map(|(id, addr)| (*id, BasicNode::new(addr.to_string())))
            .collect();
        tracing::info!(node = %self.id, voters = members.len(), "raft: forming the cluster");
        match self.raft.initialize(members).await {
            Ok(()) | Err(RaftError::APIError(InitializeError::NotAllowed(_))) => Ok(()),
            Err(e) => Err(ConsensusError::Membership(e.to_string())),
        }
    }

    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The members (voters and learners) with the cluster addresses they were added with,
    /// and whether each votes.
    pub fn members(&self) -> Vec<Member> {
        let m = self.raft.metrics().borrow().membership_config.clone();
        let membership = m.membership();
        let voters: Vec<NodeId> = membership.voter_ids().collect();
        membership
            .nodes()
            .map(|(id, node)| Member {
                id: *id,
                addr: node.addr.parse().ok(),
                voter: voters.contains(id),
            })
            .collect()
    }

    /// The cluster address of member `id`, if it is one and its address parses.
    pub fn member_addr(&self, id: NodeId) -> Option<SocketAddr> {
        self.members()
            .into_iter()
            .find(|m| m.id == id)
            .and_then(|m| m.addr)
    }

    /// Resolves at this node's next change of role, term, leader, log or membership (any
    /// change of openraft's metrics); `false` once the node has stopped.
    pub fn status_changes(&self) -> StatusChanges {
        StatusChanges(self.raft.metrics())
    }

    /// Resolves once the Raft core has stopped, with the reason. Other than by
    /// [`RaftNode::shutdown`] (which cannot run while the node is shared; its reason is
    /// openraft's "raft stopped"), the core stops on a storage error or a fault inside
    /// openraft: 0.9.25 quits the core when a snapshot is due to a follower whose replication
    /// stream ended a moment before, on that follower's higher vote (seed 45,780 of the
    /// cluster simulator). Such a node takes no part in consensus until it is started again,
    /// so whoever runs it should stop the process rather than let it linger
    /// (`ClusterNode::run` returns an error).
    pub async fn core_stopped(&self) -> String {
        let mut metrics = self.raft.metrics();
        loop {
            if let Err(fatal) = &metrics.borrow_and_update().running_state {
                return fatal.to_string();
            }
            if metrics.changed().await.is_err() {
                return "the Raft core ended".to_string();
            }
        }
    }

    /// The address peers reach this node on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops the Raft core and the listener, and waits (up to [`STORE_RELEASE_WAIT`]) until
    /// the core's tasks have dropped the log and state machine: then the store's lock is
    /// free, and the node can be started again in this process.
    pub async fn shutdown(mut self) {
        for t in self.tasks.drain(..) {
            t.abort();
            let _ = t.await;
        }
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!(node = %self.id, error = %e, "raft: core did not stop cleanly");
        }
        let deadline = tokio::time::Instant::now() + STORE_RELEASE_WAIT;
        while self.storage.iter().any(|w| w.strong_count() > 0) {
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(node = %self.id, "raft: storage still held after shutdown");
                return;
            }
            tokio::time::sleep(STORE_RELEASE_POLL).await;
        }
    }
}

impl Drop for RaftNode {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Opens the node's store directory, through `vfs` if given.
fn open_store(config: &NodeConfig, vfs: Option<Arc<dyn Vfs>>) -> Result<Store, ConsensusError> {
    Ok(match vfs {
        Some(v) => Store::open_with_vfs(&config.data_dir, v)?,
        None => Store::open(&config.data_dir)?,
    })
}

/// Opens the node's log and state machine in `store`, and starts the Raft core.
async fn open<N: RaftNetworkFactory<TypeConfig>>(
    config: &NodeConfig,
    applier: Box<dyn Applier>,
    network: N,
    store: Store,
) -> Result<(Raft, Store, Vec<Weak<()>>), ConsensusError> {
    config.validate()?;
    let log = LogStore::open(&store, config.sync)?;
    let sm = StateMachine::open(&store, config.sync, applier, config.applier_work)?;
    if inject::on(Bug::DeliverUncommitted) {
        log.deliver_early(Arc::new(sm.early_delivery()));
    }
    log.purge_after(sm.purge_gate());
    let storage = vec![log.liveness(), sm.liveness()];
    let raft = Raft::new(
        config.node_id,
        Arc::new(config.raft_config()?),
        network,
        log,
        sm,
    )
    .await
    .map_err(|e| ConsensusError::Shutdown(e.to_string()))?;
    Ok((raft, store, storage))
}

/// Counts the elections this node started (turns into a candidate), for the metrics.
async fn count_elections(raft: Raft, elections: Arc<AtomicU64>) {
    let mut rx = raft.metrics();
    let mut last = rx.borrow().state;
    while rx.changed().await.is_ok() {
        let state = rx.borrow().state;
        if state == ServerState::Candidate && last != ServerState::Candidate {
            elections.fetch_add(1, Ordering::Relaxed);
        }
        last = state;
    }
}
