//! [`SimDisk`]: the in-memory file system of the simulator. The model is documented on the
//! [module](super).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::{Bugs, SimRng, hash_bytes, mix};
use crate::vfs::{VFile, Vfs};

mod config;
mod file_ops;
mod path_ops;
mod state;
mod vfs;

pub use config::*;

use state::*;
use vfs::SimFile;
pub use vfs::SimVfs;

/// A clock in ns: both the wall clock (`Vfs::now_ns`) and the monotonic one.
pub type SimClock = Arc<dyn Fn() -> u64 + Send + Sync>;

struct Inner {
    st: Mutex<DiskState>,
    cv: Condvar,
    /// The time the store reads through this disk's `Vfs`; the real clocks when unset.
    clock: Mutex<Option<SimClock>>,
}

/// The simulated disk, mounted at a directory path. Cheap to clone (shared state).
#[derive(Clone)]
pub struct SimDisk {
    inner: Arc<Inner>,
}

impl fmt::Debug for SimDisk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.lock();
        f.debug_struct("SimDisk")
            .field("root", &st.root)
            .field("seed", &st.seed)
            .field("boot", &st.boot)
            .finish()
    }
}

impl SimDisk {
    /// An empty disk whose root directory `root` exists and is durable. Paths outside it
    /// are refused.
    pub fn new(root: impl Into<PathBuf>, seed: u64, cfg: SimConfig) -> SimDisk {
        let root = root.into();
        let mut ns = BTreeMap::new();
        ns.insert(root.clone(), Node::Dir);
        SimDisk {
            inner: Arc::new(Inner {
                st: Mutex::new(DiskState {
                    cfg,
                    seed,
                    root,
                    boot: 0,
                    inodes: BTreeMap::new(),
                    next_ino: 1,
                    cache_ns: ns.clone(),
                    durable_ns: ns,
                    pending: Vec::new(),
                    op_counts: HashMap::new(),
                    script_counts: Vec::new(),
                    latency_calls: 0,
                    stats: SimStats::default(),
                    trace: seed,
                    hold: None,
                    events: VecDeque::new(),
                    op_log: Vec::new(),
                }),
                cv: Condvar::new(),
                clock: Mutex::new(None),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, DiskState> {
        self.inner.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The file system as the current boot (process) sees it.
    pub fn vfs(&self) -> Arc<dyn Vfs> {
        Arc::new(self.sim_vfs())
    }

    pub fn sim_vfs(&self) -> SimVfs {
        SimVfs {
            disk: self.clone(),
            boot: self.lock().boot,
        }
    }

    /// The power fails now: see the module docs. Handles of the old boot fail from now on.
    pub fn power_loss(&self) {
        self.lock().power_loss("requested");
        self.inner.cv.notify_all();
    }

    /// The process dies (`kill -9`): nothing is lost, but its handles fail from now on.
    pub fn crash(&self) {
        let mut st = self.lock();
        st.stats.crashes += 1;
        st.boot += 1;
        st.hold = None;
        let b = st.boot;
        st.event(format!("PROCESS CRASH (boot {b} starts)"));
        drop(st);
        self.inner.cv.notify_all();
    }

    /// Power losses so far (requested, scheduled or random): a caller compares it before and
    /// after a step to learn that one struck inside it.
    pub fn power_losses(&self) -> u64 {
        self.lock().stats.power_losses
    }

    /// The current boot; it grows with every power loss and crash.
    pub fn boot(&self) -> u64 {
        self.lock().boot
    }

    pub fn config(&self) -> SimConfig {
        self.lock().cfg.clone()
    }

    /// Changes the configuration (e.g. stops injecting errors for a final check).
    pub fn update_config(&self, f: impl FnOnce(&mut SimConfig)) {
        f(&mut self.lock().cfg);
    }

    pub fn stats(&self) -> SimStats {
        self.lock().stats.clone()
    }

    /// A digest of every mutating call (kind, path, offsets, lengths, outcome) and of every
    /// power loss's outcome: equal digests mean the disk saw the same history.
    pub fn trace_digest(&self) -> u64 {
        self.lock().trace
    }

    /// One line per traced call, if `SimConfig::record_ops` is set.
    pub fn op_log(&self) -> Vec<String> {
        self.lock().op_log.clone()
    }

    /// The latest faults, power losses and crashes, for a failing seed's report.
    pub fn events(&self) -> Vec<String> {
        self.lock().events.iter().cloned().collect()
    }

    /// From now on the store's clocks (`Vfs::now_ns` for record times and `max_age`,
    /// `Vfs::monotonic_ns` for the writer's timers) read `clock`, e.g. a simulation's
    /// virtual time in ns since the epoch (it must never go back). Kept across boots.
    pub fn set_clock(&self, clock: SimClock) {
        *self.inner.clock.lock().unwrap_or_else(|e| e.into_inner()) = Some(clock);
    }

    /// What the store's clocks read: the clock set by `set_clock`, or `real`.
    fn clock_ns(&self, real: fn() -> u64) -> u64 {
        let clock = self
            .inner
            .clock
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        clock.map_or_else(real, |c| c())
    }

    /// The next `write_all_at` on a file under `under` blocks until [`release`](Self::release)
    /// (or a power loss or crash). Not for stepped writers, whose write would hold the
    /// only thread. With it a test makes group commit deterministic: append,
    /// wait until the writer thread is held in that turn's write, queue more records (they
    /// form the next turn), release.
    pub fn hold_next_write(&self, under: &Path) {
        self.hold_next_write_containing(under, &[]);
    }

    /// As [`hold_next_write`](Self::hold_next_write), for the next write under `under` whose
    /// bytes contain `needle`: a test that means one record's write (a message by its payload)
    /// is not fooled by another record the writer reaches first (a control record of an
    /// earlier step that a loaded machine wrote late).
    pub fn hold_next_write_containing(&self, under: &Path, needle: &[u8]) {
        self.lock().hold = Some(Hold {
            under: under.to_path_buf(),
            needle: needle.to_vec(),
            held: false,
        });
    }

    /// Waits until a call is held by [`hold_next_write`](Self::hold_next_write); false on timeout.
    pub fn wait_held(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        loop {
            match &st.hold {
                Some(h) if h.held => return true,
                Some(_) => {}
                None => return false,
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            st = self
                .inner
                .cv
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Lets a held call go on (and disarms a hold that caught nothing).
    pub fn release(&self) {
        self.lock().hold = None;
        self.inner.cv.notify_all();
    }

    /// Every file with its cached and durable lengths, for reports and tests of the disk.
    pub fn files(&self) -> Vec<(PathBuf, usize, usize)> {
        let st = self.lock();
        st.cache_ns
            .iter()
            .filter_map(|(p, n)| match n {
                Node::File(i) => st
                    .inodes
                    .get(i)
                    .map(|f| (p.clone(), f.cache.len(), f.durable.len())),
                Node::Dir => None,
            })
            .collect()
    }

    /// Sleeps for the configured latency, outside the lock.
    fn latency(&self) {
        let d = {
            let mut st = self.lock();
            let Some(max) = st.cfg.latency else { return };
            st.latency_calls += 1;
            let mut r = SimRng::keyed(&[st.seed, 0x1a7e, st.latency_calls]);
            Duration::from_nanos(r.below(max.as_nanos() as u64 + 1))
        };
        std::thread::sleep(d);
    }

    /// Blocks a write that an armed hold catches.
    fn hold<'a>(
        &'a self,
        mut st: MutexGuard<'a, DiskState>,
        path: &Path,
        buf: &[u8],
        boot: u64,
    ) -> io::Result<MutexGuard<'a, DiskState>> {
        match st.hold.as_mut() {
            Some(h) if h.catches(path, buf) => h.held = true,
            _ => return Ok(st),
        }
        self.inner.cv.notify_all();
        while st.hold.as_ref().is_some_and(|h| h.held) && st.boot == boot {
            st = self.inner.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st.check_boot(boot)?;
        Ok(st)
    }

    /// Applies a fault decision that is not `Ok`: counts it, and for a power loss runs it.
    fn fault(&self, st: &mut DiskState, d: &Decision, kind: OpKind, path: &Path) -> io::Error {
        let rel = st.rel(path).into_owned();
        match d {
            Decision::PowerLoss => {
                st.power_loss(&format!("during {kind:?} of {rel}"));
                self.inner.cv.notify_all();
                dead()
            }
            _ => {
                match kind {
                    OpKind::Write => st.stats.write_errors += 1,
                    OpKind::Sync => st.stats.sync_errors += 1,
                    OpKind::SyncDir => st.stats.dir_sync_errors += 1,
                    _ => {}
                }
                let b = st.boot;
                st.event(format!("EIO on {kind:?} of {rel} (boot {b})"));
                st.trace_at(0xe10, path, &[kind as u64]);
                eio(&format!("{kind:?} of {}", path.display()))
            }
        }
    }
}

#[cfg(test)]
mod tests;
