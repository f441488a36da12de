//! One seed's cluster: three nodes, each a real tern-raft node on the simulated network
//! (`tern_raft::sim_net`) with its Raft log on a simulated disk, a real `Replica`, and the
//! real lifecycle (`ClusterNode::run_on`): while a node leads, the broker runs on a
//! `ReplicatedDisk` over its `live/` copy. Each node is a "process" of its own: a tokio
//! runtime, whose shutdown drops every task it had (connections, forwards, the engine).
//!
//! Clients reach a node on its client port (loopback TCP, a new port per boot); a node that
//! does not lead forwards the connection to the leader's forward port (loopback TCP, one
//! socket per node for the whole seed: the Raft membership names it).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tern_broker::{Broker, BrokerConfig, DurableConfig, DurableStore, Listener, ListenerContext};
use tern_cluster::node::MAX_FORWARD_QUEUE;
use tern_cluster::{ClusterConfig, ClusterNode, EngineFactory, NodeParts};
use tern_raft::sim_net::{Net, NetFactory};
use tern_raft::types::Raft;
use tern_raft::{Link, NodeConfig, NodeId, RaftNode, Role};
use tern_store::sim::{SimConfig, SimDisk};
use tern_store::vfs::Vfs;
use tern_store::{Store, SyncPolicy};
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};

use crate::conn::Addrs;
use crate::run::Log;

pub const NODES: usize = 3;

pub fn id(i: usize) -> NodeId {
    NodeId(i as u64 + 1)
}

/// The engine the lifecycle opens on the leader: the server's (`crates/server/src/cluster.rs`),
/// without the HTTP side and the auth files.
struct SimEngine;

impl EngineFactory for SimEngine {
    fn open(&self, dir: &Path, vfs: Arc<dyn Vfs>) -> Result<Broker, String> {
        let store = DurableStore::open_with_vfs(dir, DurableConfig::default(), vfs)
            .map_err(|e| format!("opening the store: {e}"))?;
        let config = BrokerConfig {
            deliver_after_durable: true,
            ..BrokerConfig::default()
        };
        let broker = Broker::with_store(config, Arc::new(store)).map_err(|e| e.to_string())?;
        broker.mark_ready();
        Ok(broker)
    }

    fn serving(&self, _broker: Option<Broker>) {}
}

struct Running {
    rt: tokio::runtime::Runtime,
    stop: oneshot::Sender<()>,
    done: std::sync::mpsc::Receiver<()>,
    raft: Raft,
    node: Arc<Mutex<Option<ClusterNode>>>,
}

pub struct World {
    pub net: Net,
    dirs: Vec<tempfile::TempDir>,
    disks: Vec<SimDisk>,
    forward_sockets: Vec<std::net::TcpListener>,
    pub addrs: Addrs,
    nodes: Vec<Option<Running>>,
    pub log: Log,
    pub violations: Vec<String>,
    /// Entries between snapshots and kept behind one, if not the defaults.
    pub snapshots: Option<(u64, u64)>,
}

impl World {
    pub fn new(seed: u64, log: Log) -> Result<World, String> {
        let dirs: Vec<_> = (0..NODES)
            .map(|_| tempfile::tempdir().map_err(|e| e.to_string()))
            .collect::<Result<_, _>>()?;
        for d in &dirs {
            // The store's lock file is a real one, beside the simulated files.
            std::fs::create_dir_all(d.path().join("raft")).map_err(|e| e.to_string())?;
        }
        let disks = dirs
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let cfg = SimConfig::default();
                SimDisk::new(d.path().join("raft"), seed.wrapping_mul(64) + i as u64, cfg)
            })
            .collect();
        let forward_sockets = (0..NODES)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string()))
            .collect::<Result<_, _>>()?;
        Ok(World {
            net: Net::new(seed),
            dirs,
            disks,
            forward_sockets,
            addrs: Arc::new(Mutex::new(vec![None; NODES])),
            nodes: (0..NODES).map(|_| None).collect(),
            log,
            violations: Vec::new(),
            snapshots: None,
        })
    }

    fn config(&self, i: usize) -> Result<ClusterConfig, String> {
        let addr = |j: usize| {
            self.forward_sockets[j]
                .local_addr()
                .map_err(|e| e.to_string())
        };
        let peers = (0..NODES)
            .map(|j| Ok((id(j), addr(j)?)))
            .collect::<Result<Vec<_>, String>>()?;
        let mut raft = NodeConfig::new(id(i), addr(i)?, peers, self.dirs[i].path().into());
        raft.sync = SyncPolicy::Always;
        // Real time on a shared machine: elections slower than openraft's defaults, so that a
        // scheduling hiccup is not an election each time.
        raft.heartbeat_interval_ms = 50;
        raft.election_timeout_min_ms = 400;
        raft.election_timeout_max_ms = 800;
        if let Some((every, kept)) = self.snapshots {
            raft.snapshot_every_entries = every;
            raft.log_kept_behind_snapshot = kept;
        }
        Ok(ClusterConfig::new(raft, self.dirs[i].path().into()))
    }

    pub fn is_up(&self, i: usize) -> bool {
        self.nodes[i].is_some()
    }

    /// The node that leads with the highest term, as the nodes see it.
    pub fn leader(&self) -> Option<usize> {
        let mut best: Option<(u64, usize)> = None;
        for (i, n) in self.nodes.iter().enumerate() {
            let Some(n) = n else { continue };
            let Some(node) = n.node.lock().unwrap().clone() else {
                continue;
            };
            let st = node.status();
            if st.role == Role::Leader && best.is_none_or(|(t, _)| st.term > t) {
                best = Some((st.term, i));
            }
        }
        best.map(|(_, i)| i)
    }

    /// Boots node `i` (its next process) and waits until its Raft node runs.
    pub fn start(&mut self, i: usize) {
        if let Err(e) = self.try_start(i) {
            self.violations
                .push(format!("node {} does not start: {e}", id(i)));
            self.log.line(format!("node {} does not start: {e}", id(i)));
        }
    }

    fn try_start(&mut self, i: usize) -> Result<(), String> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .thread_name(format!("node-{}", i + 1))
            .build()
            .map_err(|e| e.to_string())?;
        let config = self.config(i)?;
        let forward = self.forward_sockets[i]
            .try_clone()
            .map_err(|e| e.to_string())?;
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop, stop_rx) = oneshot::channel::<()>();
        let (done_tx, done) = std::sync::mpsc::channel();
        let slot: Arc<Mutex<Option<ClusterNode>>> = Arc::default();
        let boot = Boot {
            config,
            disk: self.disks[i].clone(),
            net: self.net.clone(),
            me: id(i),
            forward,
            slot: slot.clone(),
        };
        rt.spawn(async move {
            boot.run(ready_tx, stop_rx).await;
            let _ = done_tx.send(());
        });
        let (addr, raft) = ready_rx
            .recv_timeout(Duration::from_secs(20))
            .map_err(|_| "the node did not come up".to_string())??;
        self.addrs.lock().unwrap()[i] = Some(addr);
        self.nodes[i] = Some(Running {
            rt,
            stop,
            done,
            raft,
            node: slot,
        });
        self.log.line(format!("node {} up", id(i)));
        Ok(())
    }

    /// The node's process dies: a power loss of its disk (unsynced Raft log writes lost) or a
    /// crash (the page cache survives). It stops answering peers and clients at once; its
    /// engine's disk fails (nothing it writes later is proposed) before the engine stops.
    pub fn kill(&mut self, i: usize, power_loss: bool) {
        let Some(r) = self.nodes[i].take() else {
            return;
        };
        if power_loss {
            self.disks[i].power_loss();
        } else {
            self.disks[i].crash();
        }
        self.addrs.lock().unwrap()[i] = None;
        self.net.handlers.lock().unwrap().remove(&id(i));
        let raft = r.raft.clone();
        r.rt.block_on(async move {
            let _ = tokio::time::timeout(Duration::from_secs(5), raft.shutdown()).await;
        });
        let _ = r.stop.send(());
        if r.done.recv_timeout(Duration::from_secs(20)).is_err() {
            self.log
                .line(format!("node {}: lifecycle did not stop", id(i)));
        }
        *r.node.lock().unwrap() = None;
        r.rt.shutdown_timeout(Duration::from_secs(5));
        let how = if power_loss { "power loss" } else { "crash" };
        self.log.line(format!("node {} down ({how})", id(i)));
    }

    pub fn stop(mut self) {
        for i in 0..NODES {
            self.kill(i, false);
        }
    }
}

/// What a node's process starts from.
struct Boot {
    config: ClusterConfig,
    disk: SimDisk,
    net: Net,
    me: NodeId,
    forward: std::net::TcpListener,
    slot: Arc<Mutex<Option<ClusterNode>>>,
}

type Ready = std::sync::mpsc::Sender<Result<(SocketAddr, Raft), String>>;

impl Boot {
    async fn run(self, ready: Ready, stop: oneshot::Receiver<()>) {
        let started = match self.start().await {
            Ok(s) => s,
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        let (parts, listener, addr) = started;
        let _ = ready.send(Ok((addr, parts.raft.peer_handler())));
        let slot = self.slot.clone();
        let result = ClusterNode::run_on(
            self.config,
            parts,
            vec![listener],
            Arc::new(SimEngine),
            async move {
                let _ = stop.await;
            },
            move |node| *slot.lock().unwrap() = Some(node),
        )
        .await;
        if let Err(e) = result {
            tracing::warn!(error = %e, "cluster node stopped with an error");
        }
    }

    async fn start(&self) -> Result<(NodeParts, Listener, SocketAddr), String> {
        let store = open_store(&self.config.raft.data_dir, &self.disk).await?;
        let replica = ClusterNode::open_replica(&self.config).map_err(|e| e.to_string())?;
        let factory = NetFactory {
            net: self.net.clone(),
            me: self.me,
        };
        let raft =
            RaftNode::start_with_store(self.config.raft.clone(), replica.applier(), factory, store)
                .await
                .map_err(|e| e.to_string())?;
        self.net
            .handlers
            .lock()
            .unwrap()
            .insert(self.me, raft.peer_handler());
        let client = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| e.to_string())?;
        let addr = client.local_addr().map_err(|e| e.to_string())?;
        let forward = self.forward.try_clone().map_err(|e| e.to_string())?;
        forward.set_nonblocking(true).map_err(|e| e.to_string())?;
        let forward = TcpListener::from_std(forward).map_err(|e| e.to_string())?;
        let (tx, forwarded) = mpsc::channel(MAX_FORWARD_QUEUE);
        // The cluster port's demultiplexer in production (tern-raft's `network::serve`)
        // hands forwarded connections over the same way: the magic read, as a `Link`.
        tokio::spawn(async move {
            loop {
                match forward.accept().await {
                    Ok((mut stream, peer)) => {
                        let mut magic = [0u8; 4];
                        if stream.read_exact(&mut magic).await.is_err()
                            || magic != tern_raft::network::FORWARD_MAGIC
                        {
                            continue;
                        }
                        if tx.send((Link::Tcp(stream), peer)).await.is_err() {
                            return;
                        }
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            }
        });
        let listener = Listener {
            socket: client,
            context: Arc::new(ListenerContext::new(
                0,
                "sim",
                tern_broker::TransportKind::Tcp,
            )),
            upgrade: None,
        };
        let parts = NodeParts {
            raft,
            replica,
            forwarded,
        };
        Ok((parts, listener, addr))
    }
}

/// The previous process's store may take a moment to let go of its lock.
async fn open_store(dir: &Path, disk: &SimDisk) -> Result<Store, String> {
    let started = Instant::now();
    loop {
        match Store::open_with_vfs(dir, disk.vfs()) {
            Ok(s) => return Ok(s),
            Err(e) if started.elapsed() > Duration::from_secs(5) => {
                return Err(format!(
                    "the Raft store does not open: {e} (threads alive: {})",
                    live_threads()
                ));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// This process's threads by name, with counts ("node-1 x2, tern-store-raft-log"): when a
/// crashed node's store stays locked (seed 7844, session 14), whose threads outlived it —
/// its runtime's (`node-N`: workers and blocking pool) or a store writer (`tern-store-*`).
fn live_threads() -> String {
    let mut names = std::collections::BTreeMap::<String, usize>::new();
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for task in tasks.flatten() {
            let name = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            *names.entry(name.trim().to_string()).or_default() += 1;
        }
    }
    names
        .iter()
        .map(|(n, c)| {
            if *c > 1 {
                format!("{n} x{c}")
            } else {
                n.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}
