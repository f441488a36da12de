//! A cluster of nodes on loopback TCP, each with its own data directory and an applier that
//! records what it is handed (standing in for the broker's durable state: it outlives a
//! node's restart, as the broker's stores do).

use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tern_raft::{
    Applier, ApplyError, ClusterStatus, Consensus, ConsensusError, LogIndex, NodeConfig, NodeId,
    RaftNode, Role,
};
use tern_store::sim::{SimConfig, SimDisk};
use tokio::net::TcpListener;

/// How long a test waits for a condition before failing (generous: a loaded machine).
pub const WAIT_LIMIT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(20);

/// What one node's applier saw: (index, ops), in order.
pub type Applied = Arc<Mutex<Vec<(LogIndex, Vec<Bytes>)>>>;

pub struct Recorder(pub Applied, pub InstallGate);

/// Holds a node's snapshot installs while closed, so a test can act in the middle of one.
#[derive(Clone, Default)]
pub struct InstallGate(Arc<(Mutex<GateState>, Condvar)>);

#[derive(Default)]
struct GateState {
    gate: Gate,
    /// Installs that have come to the gate, passed or not.
    arrived: usize,
}

#[derive(Default, Clone, Copy, PartialEq, Eq)]
enum Gate {
    #[default]
    Open,
    Closed,
    /// Installs fail (at once, or the one waiting at the gate).
    Failing,
}

impl InstallGate {
    fn set(&self, to: Gate) {
        self.0.0.lock().unwrap().gate = to;
        self.0.1.notify_all();
    }

    /// Installs that have come to the gate so far.
    pub fn arrived(&self) -> usize {
        self.0.0.lock().unwrap().arrived
    }

    pub fn close(&self) {
        self.set(Gate::Closed);
    }

    pub fn open(&self) {
        self.set(Gate::Open);
    }

    pub fn fail(&self) {
        self.set(Gate::Failing);
    }

    /// Waits while closed (at most [`WAIT_LIMIT`]).
    fn pass(&self) -> Result<(), ApplyError> {
        let (state, cv) = &*self.0;
        let mut state = state.lock().unwrap();
        state.arrived += 1;
        let (state, _) = cv
            .wait_timeout_while(state, WAIT_LIMIT, |s| s.gate == Gate::Closed)
            .unwrap();
        match state.gate {
            Gate::Open => Ok(()),
            Gate::Closed | Gate::Failing => Err(ApplyError("install failed at the gate".into())),
        }
    }
}

impl Applier for Recorder {
    fn apply(&mut self, index: LogIndex, ops: &[Bytes]) -> Result<(), ApplyError> {
        let mut v = self.0.lock().unwrap();
        if v.last().is_some_and(|(i, _)| *i >= index) {
            return Ok(()); // replayed after a restart: already applied
        }
        v.push((index, ops.to_vec()));
        Ok(())
    }

    fn snapshot(&mut self) -> Result<Vec<u8>, ApplyError> {
        let v = self.0.lock().unwrap();
        let mut out = Vec::new();
        for (i, ops) in v.iter() {
            out.extend_from_slice(&i.to_be_bytes());
            out.extend_from_slice(&(ops.len() as u32).to_be_bytes());
            for op in ops {
                out.extend_from_slice(&(op.len() as u32).to_be_bytes());
                out.extend_from_slice(op);
            }
        }
        Ok(out)
    }

    fn install_snapshot(&mut self, _index: LogIndex, mut data: &[u8]) -> Result<(), ApplyError> {
        self.1.pass()?;
        let bad = || ApplyError("truncated snapshot".into());
        let mut take = |n: usize| -> Result<Vec<u8>, ApplyError> {
            if data.len() < n {
                return Err(bad());
            }
            let (a, b) = data.split_at(n);
            data = b;
            Ok(a.to_vec())
        };
        let mut v = Vec::new();
        while let Ok(i) = take(8) {
            let i = u64::from_be_bytes(i.try_into().map_err(|_| bad())?);
            let n = u32::from_be_bytes(take(4)?.try_into().map_err(|_| bad())?);
            let mut ops = Vec::new();
            for _ in 0..n {
                let len = u32::from_be_bytes(take(4)?.try_into().map_err(|_| bad())?);
                ops.push(Bytes::from(take(len as usize)?));
            }
            v.push((i, ops));
        }
        *self.0.lock().unwrap() = v;
        Ok(())
    }

    /// This state outlives restarts by itself (it stands for state kept with its own
    /// applied point): nothing to make durable.
    fn persist(&mut self) -> Result<(), ApplyError> {
        Ok(())
    }
}

pub struct Cluster {
    /// Simulated disks, one per node (power loss), if the cluster runs on them.
    pub disks: Option<Vec<SimDisk>>,
    /// Applied to every node's configuration.
    pub tune: fn(&mut NodeConfig),
    pub dirs: Vec<tempfile::TempDir>,
    pub addrs: Vec<SocketAddr>,
    pub nodes: Vec<Option<RaftNode>>,
    pub applied: Vec<Applied>,
    /// Each node's snapshot installs pass here (open unless a test closes it).
    pub install_gates: Vec<InstallGate>,
    pub voters: usize,
}

pub fn id(i: usize) -> NodeId {
    NodeId(i as u64 + 1)
}

impl Cluster {
    /// `voters` nodes forming a cluster from empty directories, plus `spares` not started.
    pub async fn start(voters: usize, spares: usize) -> Cluster {
        Cluster::start_tuned(voters, spares, |_| {}).await
    }

    /// `start`, with `tune` applied to every node's configuration.
    pub async fn start_tuned(voters: usize, spares: usize, tune: fn(&mut NodeConfig)) -> Cluster {
        Cluster::start_full(voters, spares, tune, None).await
    }

    /// `start_tuned` with each node's store on a simulated disk of its own (seeded by
    /// `seed` and the node's position).
    pub async fn start_sim(voters: usize, seed: u64, tune: fn(&mut NodeConfig)) -> Cluster {
        Cluster::start_full(voters, 0, tune, Some(seed)).await
    }

    async fn start_full(
        voters: usize,
        spares: usize,
        tune: fn(&mut NodeConfig),
        sim_seed: Option<u64>,
    ) -> Cluster {
        let mut listeners = Vec::new();
        let mut addrs = Vec::new();
        for _ in 0..voters + spares {
            let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            addrs.push(l.local_addr().expect("addr"));
            listeners.push(l);
        }
        let mut c = Cluster {
            dirs: (0..voters + spares)
                .map(|_| tempfile::tempdir().expect("tempdir"))
                .collect(),
            addrs,
            nodes: (0..voters + spares).map(|_| None).collect(),
            applied: (0..voters + spares).map(|_| Applied::default()).collect(),
            install_gates: (0..voters + spares)
                .map(|_| InstallGate::default())
                .collect(),
            voters,
            tune,
            disks: None,
        };
        c.disks = sim_seed.map(|seed| {
            c.dirs
                .iter()
                .enumerate()
                .map(|(i, d)| SimDisk::new(d.path(), seed * 16 + i as u64, SimConfig::default()))
                .collect()
        });
        // A spare's listener is dropped here and bound again when it starts. The voters start
        // at once, as processes do: a node on a new data directory waits for a majority of
        // them to confirm it new (tern_raft::incarnation).
        let mut starting = tokio::task::JoinSet::new();
        for (i, l) in listeners.into_iter().enumerate().take(voters) {
            let start = c.start_future(i, l);
            starting.spawn(async move { (i, start.await) });
        }
        while let Some(done) = starting.join_next().await {
            let (i, node) = done.expect("start task");
            c.nodes[i] = Some(node.expect("start node"));
        }
        c
    }

    pub fn config(&self, i: usize) -> NodeConfig {
        let peers = (0..self.voters).map(|j| (id(j), self.addrs[j])).collect();
        let mut cfg = NodeConfig::new(id(i), self.addrs[i], peers, self.dirs[i].path().into());
        // Slower than the defaults: a loaded test machine must not elect on every hiccup.
        cfg.heartbeat_interval_ms = 100;
        cfg.election_timeout_min_ms = 800;
        cfg.election_timeout_max_ms = 1600;
        (self.tune)(&mut cfg);
        cfg
    }

    /// Starts (or restarts, on its data directory) node `i`.
    pub async fn start_node(&mut self, i: usize, listener: Option<TcpListener>) {
        let node = self.try_start_node(i, listener).await.expect("start node");
        self.nodes[i] = Some(node);
    }

    /// [`Cluster::start_node`], returning the start's error.
    pub async fn try_start_node(
        &self,
        i: usize,
        listener: Option<TcpListener>,
    ) -> Result<RaftNode, ConsensusError> {
        let listener = match listener {
            Some(l) => l,
            None => rebind(self.addrs[i]).await,
        };
        self.start_future(i, listener).await
    }

    fn start_future(
        &self,
        i: usize,
        listener: TcpListener,
    ) -> impl Future<Output = Result<RaftNode, ConsensusError>> + Send + 'static {
        let vfs = self.disks.as_ref().map(|d| d[i].vfs());
        let config = self.config(i);
        let applier = Box::new(Recorder(
            self.applied[i].clone(),
            self.install_gates[i].clone(),
        ));
        async move { RaftNode::start_on(config, listener, applier, vfs).await }
    }

    pub async fn kill(&mut self, i: usize) {
        if let Some(n) = self.nodes[i].take() {
            n.shutdown().await;
        }
    }

    pub fn node(&self, i: usize) -> &RaftNode {
        self.nodes[i].as_ref().expect("node running")
    }

    pub fn status(&self, i: usize) -> ClusterStatus {
        self.node(i).status()
    }

    /// Waits until the running nodes agree on one leader; returns its position.
    pub async fn leader(&self) -> usize {
        wait_until("a leader all running nodes agree on", || {
            let running: Vec<usize> = (0..self.nodes.len())
                .filter(|&i| self.nodes[i].is_some())
                .collect();
            let leader = running
                .iter()
                .copied()
                .find(|&i| self.status(i).role == Role::Leader)?;
            let agreed = running
                .iter()
                .all(|&i| self.status(i).leader == Some(id(leader)));
            agreed.then_some(leader)
        })
        .await
    }

    /// Proposes 12 batches (`{prefix}0`..) through `leader` and waits until it has purged its
    /// log past index 5: with `snapshot_every_entries = 5` and nothing kept behind a snapshot,
    /// a node that missed them can catch up only by a snapshot.
    pub async fn write_until_purged(&self, leader: usize, prefix: &str) {
        for k in 0..12 {
            self.node(leader)
                .propose(vec![op(&format!("{prefix}{k}"))])
                .await
                .expect("propose");
        }
        wait_until("the leader snapshots and purges its log", || {
            let st = self.status(leader);
            st.purged_index.is_some_and(|p| p >= 5).then_some(())
        })
        .await;
    }

    /// The ops node `i` has applied, in order, flattened.
    pub fn ops(&self, i: usize) -> Vec<Bytes> {
        self.applied[i]
            .lock()
            .unwrap()
            .iter()
            .flat_map(|(_, ops)| ops.iter().cloned())
            .collect()
    }
}

/// Binds a port a stopped node used (the kernel may hold it briefly).
async fn rebind(addr: SocketAddr) -> TcpListener {
    for _ in 0..500 {
        if let Ok(l) = TcpListener::bind(addr).await {
            return l;
        }
        tokio::time::sleep(POLL).await;
    }
    panic!("cannot bind {addr} again");
}

/// Polls `f` until it returns Some, or fails the test after [`WAIT_LIMIT`].
pub async fn wait_until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + WAIT_LIMIT;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "waited {WAIT_LIMIT:?} for {what}"
        );
        tokio::time::sleep(POLL).await;
    }
}

pub fn op(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}
