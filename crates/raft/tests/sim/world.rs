//! One seed's cluster: N nodes, each on a simulated disk of its own (stepped writers, so the
//! store runs no thread), on the simulated network, driven on one thread by tokio's paused
//! clock. Nodes crash and restart from their disks; a stepper task runs the stores' writer
//! turns every 1-10 ms of virtual time (the seed's disk latency).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::storage::RaftLogStorage;
use tern_raft::log_store::LogStore;
use tern_raft::{ApplierWork, NodeConfig, NodeId, RaftNode};
use tern_store::sim::{SimConfig, SimDisk};
use tern_store::{Store, SyncPolicy};

use crate::app::{self, App};
use tern_raft::sim_net::{Net, NetFactory};

/// A node's id from its position.
pub fn id(i: usize) -> NodeId {
    NodeId(i as u64 + 1)
}

/// An applier's file work (an install writes and syncs several files) takes this many of the
/// disk's turns.
const APPLIER_WORK_DISK_TURNS: u64 = 4;

pub struct World {
    /// The initial voters; one more node (position `n`) is a spare, started only to join.
    pub n: usize,
    /// Entries between snapshots and kept behind one, if not the defaults.
    pub snapshots: Option<(u64, u64)>,
    /// How long the applier's file work (an install, a persist) takes, in virtual time.
    pub applier_work_ms: u64,
    pub net: Net,
    pub dirs: Vec<tempfile::TempDir>,
    pub disks: Vec<SimDisk>,
    /// The running nodes (clients take clones for a call; a crash waits for them back).
    pub nodes: Arc<Mutex<Vec<Option<Arc<RaftNode>>>>>,
    /// Stores whose writers the stepper runs: the running nodes', and a dying node's until
    /// it has shut down. (node, boot, store).
    stepping: Arc<Mutex<Vec<(usize, u64, Store)>>>,
    boots: Vec<u64>,
    pub apps: Vec<app::Shared>,
    pub violations: Arc<Mutex<Vec<String>>>,
    /// Raft cores that stopped on their own (`run::restart_stopped` restarted their nodes).
    pub core_stops: u64,
    stepper: tokio::task::JoinHandle<()>,
}

impl World {
    pub async fn new(seed: u64, n: usize, disk_step_ms: u64) -> World {
        let net = Net::new(seed);
        let total = n + 1;
        let dirs: Vec<_> = (0..total)
            .map(|_| tempfile::tempdir().expect("tempdir"))
            .collect();
        let clock = Arc::new(AtomicU64::new(0));
        let disks: Vec<SimDisk> = dirs
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let cfg = SimConfig {
                    stepped_writers: true,
                    ..SimConfig::default()
                };
                let disk = SimDisk::new(d.path(), seed.wrapping_mul(64) + i as u64, cfg);
                let c = clock.clone();
                disk.set_clock(Arc::new(move || c.load(Ordering::Relaxed)));
                disk
            })
            .collect();
        let stepping: Arc<Mutex<Vec<(usize, u64, Store)>>> = Arc::default();
        let stepper = tokio::spawn(step_stores(stepping.clone(), clock, disk_step_ms));
        World {
            n,
            snapshots: None,
            applier_work_ms: disk_step_ms * APPLIER_WORK_DISK_TURNS,
            net,
            dirs,
            disks,
            nodes: Arc::new(Mutex::new((0..total).map(|_| None).collect())),
            stepping,
            boots: vec![0; total],
            apps: (0..total).map(|_| app::Shared::default()).collect(),
            violations: Arc::default(),
            core_stops: 0,
            stepper,
        }
    }

    /// Every node, the spare included.
    pub fn total(&self) -> usize {
        self.n + 1
    }

    pub fn addr(i: usize) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 7001 + i as u16))
    }

    fn config(&self, i: usize) -> NodeConfig {
        let peers = (0..self.n).map(|j| (id(j), World::addr(j))).collect();
        let mut cfg = NodeConfig::new(id(i), World::addr(i), peers, self.dirs[i].path().into());
        cfg.sync = SyncPolicy::Always;
        cfg.applier_work = ApplierWork::Simulated {
            latency_ms: self.applier_work_ms,
        };
        if let Some((every, kept)) = self.snapshots {
            cfg.snapshot_every_entries = every;
            cfg.log_kept_behind_snapshot = kept;
        }
        cfg
    }

    pub fn node(&self, i: usize) -> Option<Arc<RaftNode>> {
        self.nodes.lock().unwrap()[i].clone()
    }

    pub fn violation(&self, v: String) {
        self.violations.lock().unwrap().push(v);
    }

    /// Starts node `i` on its disk (the next boot), after checking that the vote on the disk
    /// is not behind the vote the node has shown its peers.
    pub async fn start(&mut self, i: usize) {
        let vfs = self.disks[i].vfs();
        self.check_disk(i, &vfs).await;
        let app = App {
            node: id(i),
            state: self.apps[i].clone(),
            violations: self.violations.clone(),
        };
        let factory = NetFactory {
            net: self.net.clone(),
            me: id(i),
        };
        let store = match Store::open_with_vfs(self.dirs[i].path(), vfs) {
            Ok(s) => s,
            Err(e) => {
                self.violation(format!("node {}: its store does not open: {e}", id(i)));
                return;
            }
        };
        self.boots[i] += 1;
        self.stepping
            .lock()
            .unwrap()
            .push((i, self.boots[i], store.clone()));
        let node =
            match RaftNode::start_with_store(self.config(i), Box::new(app), factory, store).await {
                Ok(n) => Arc::new(n),
                Err(e) => {
                    self.violation(format!("node {} does not start: {e}", id(i)));
                    return;
                }
            };
        crate::run::trace(&format!("node {} up", id(i)));
        self.net
            .handlers
            .lock()
            .unwrap()
            .insert(id(i), node.peer_handler());
        self.nodes.lock().unwrap()[i] = Some(node);
    }

    /// What node `i`'s disk holds before it restarts: its vote is not behind the vote it has
    /// shown its peers, and its log is not purged past the applied point recorded (the
    /// entries a restart re-applies from there must still be in it; openraft refuses such a
    /// log, in debug builds at once).
    async fn check_disk(&self, i: usize, vfs: &Arc<dyn tern_store::vfs::Vfs>) {
        let read = async {
            let opened = Store::open_with_vfs(self.dirs[i].path(), vfs.clone())
                .and_then(|store| Ok((LogStore::open(&store, SyncPolicy::Always)?, store)));
            let (mut log, store) = opened.map_err(|e| format!("its disk does not open: {e}"))?;
            let vote = log.read_vote().await.ok().flatten();
            // A log that cannot say what it purged is a violation as much as a disk that does
            // not open: the check must not pass by not looking.
            let purged = log
                .get_log_state()
                .await
                .map_err(|e| format!("its log's state does not read: {e}"))?
                .last_purged_log_id;
            let applied = tern_raft::state_machine::recorded_applied(&store)
                .map_err(|e| format!("its applied point does not read: {e}"))?;
            Ok::<_, String>((vote, purged, applied))
        };
        let (durable, purged, applied) = match read.await {
            Ok(r) => r,
            Err(e) => {
                self.violation(format!("node {}: {e}", id(i)));
                return;
            }
        };
        if purged.map(|p| p.index) > applied.map(|a| a.index) {
            self.violation(format!(
                "log purged past the applied point: node {}'s disk has its log purged through \
                 {} and the applied point recorded at {}",
                id(i),
                purged.map_or(0, |p| p.index),
                applied.map_or("none".to_string(), |a| a.index.to_string())
            ));
        }
        let shown = self
            .net
            .seen
            .lock()
            .unwrap()
            .votes_shown
            .get(&id(i))
            .copied();
        let Some(shown) = shown else { return };
        if !durable.is_some_and(|d| d >= shown) {
            self.violation(format!(
                "vote went backwards: node {} answered a candidate with vote {shown}, its disk \
                 holds {} after the restart",
                id(i),
                durable.map_or("no vote".to_string(), |d| d.to_string())
            ));
        }
    }

    /// The node dies: with a power loss of its disk (unsynced data lost) or as a process
    /// crash (the page cache survives). It stops answering at once.
    pub async fn kill(&mut self, i: usize, power_loss: bool) {
        if power_loss {
            self.disks[i].power_loss();
        } else {
            self.disks[i].crash();
        }
        self.net.handlers.lock().unwrap().remove(&id(i));
        let node = self.nodes.lock().unwrap()[i].take();
        let Some(mut node) = node else { return };
        // Clients hold a clone for at most one call (bounded by their timeout).
        let node = loop {
            match Arc::try_unwrap(node) {
                Ok(n) => break n,
                Err(n) => {
                    node = n;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        };
        crate::run::trace(&format!("node {} shutting down", id(i)));
        node.shutdown().await;
        crate::run::trace(&format!("node {} down", id(i)));
        let boot = self.boots[i];
        self.stepping
            .lock()
            .unwrap()
            .retain(|(j, b, _)| !(*j == i && *b == boot));
    }

    pub fn is_up(&self, i: usize) -> bool {
        self.nodes.lock().unwrap()[i].is_some()
    }

    pub async fn stop(mut self) {
        for i in 0..self.total() {
            if self.is_up(i) {
                self.kill(i, false).await;
            }
        }
        self.stepper.abort();
    }
}

/// Bounds one round of a store's turns (a store with work left is stepped again next round).
const MAX_TURNS_PER_ROUND: usize = 64;

/// Runs the stores' writer turns, one round every `step_ms` of virtual time, and gives the
/// disks the virtual clock.
async fn step_stores(
    stepping: Arc<Mutex<Vec<(usize, u64, Store)>>>,
    clock: Arc<AtomicU64>,
    step_ms: u64,
) {
    let start = tokio::time::Instant::now();
    loop {
        clock.store(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let stores: Vec<Store> = stepping
            .lock()
            .unwrap()
            .iter()
            .map(|(_, _, s)| s.clone())
            .collect();
        for s in &stores {
            for _ in 0..MAX_TURNS_PER_ROUND {
                if !s.step() {
                    break;
                }
            }
        }
        drop(stores);
        tokio::time::sleep(Duration::from_millis(step_ms)).await;
    }
}
