//! A seed's plan: cluster size, network weather, and a sequence of faults, each healed before
//! the next (their order and timing chosen by the seed).

use std::fmt;

use tern_store::sim::SimRng;

#[derive(Debug, Clone)]
pub enum Fault {
    /// One node dies (power loss of its disk, or a process crash) and restarts later.
    Crash {
        node: usize,
        power_loss: bool,
        down_ms: u64,
    },
    /// Every node loses power at once; all restart.
    ClusterPowerLoss { down_ms: u64 },
    /// One node is cut off from the others.
    Isolate { node: usize, ms: u64 },
    /// The nodes split in two sides (the given ones on side 1).
    Split { side: Vec<usize>, ms: u64 },
    /// A node stops sending and receiving (a long GC pause, a stopped VM).
    Pause { node: usize, ms: u64 },
    /// A membership change under load: the spare node joins as a learner, is promoted once
    /// caught up, and voter `old` is removed (at most once a seed).
    Replace { old: usize },
    /// A node falls behind (cut off for `lag_ms`, and until a leader's log is purged past
    /// it), and once back, loses power in the middle of the snapshot install that catches it
    /// up, `at_pct` percent into the install's length; it restarts after `down_ms`. Planned
    /// only with small snapshots.
    CrashInInstall {
        node: usize,
        lag_ms: u64,
        down_ms: u64,
        at_pct: u64,
    },
    /// Bad weather: messages lost and delayed more than usual.
    Storm {
        drop_pct: u64,
        max_delay_ms: u64,
        ms: u64,
    },
}

#[derive(Debug, Clone)]
pub struct Plan {
    pub nodes: usize,
    pub clients: usize,
    pub base_drop_pct: u64,
    pub base_delay_ms: u64,
    /// Entries between snapshots, and kept behind one (None: the defaults, more than a
    /// seed writes): small values make lagging nodes catch up by snapshot.
    pub snapshots: Option<(u64, u64)>,
    /// Virtual ms between two rounds of the stores' writer turns (the disk's latency: how
    /// long a write waits in the page cache before its fsync).
    pub disk_step_ms: u64,
    /// (wait before, fault).
    pub faults: Vec<(u64, Fault)>,
}

impl Plan {
    pub fn new(seed: u64) -> Plan {
        let mut r = SimRng::keyed(&[seed, 0x706c616e]);
        let nodes = if r.below(4) == 0 { 5 } else { 3 };
        let mut faults = Vec::new();
        let mut replaced = false;
        for _ in 0..r.range(3, 8) {
            let wait = r.range(100, 2_000);
            let f = match r.below(13) {
                12 if !replaced => {
                    replaced = true;
                    Fault::Replace {
                        old: r.below(nodes as u64) as usize,
                    }
                }
                0..=2 => Fault::Crash {
                    node: r.below(nodes as u64) as usize,
                    power_loss: r.below(3) != 0,
                    down_ms: r.range(0, 3_000),
                },
                3 | 4 => Fault::ClusterPowerLoss {
                    down_ms: r.range(0, 1_000),
                },
                5 | 6 => Fault::Isolate {
                    node: r.below(nodes as u64) as usize,
                    ms: r.range(200, 4_000),
                },
                7 | 8 => {
                    let k = nodes / 2 + r.below(2) as usize; // a minority or a majority
                    let mut all: Vec<usize> = (0..nodes).collect();
                    let mut side = Vec::new();
                    for _ in 0..k.min(nodes - 1) {
                        let j = r.below(all.len() as u64) as usize;
                        side.push(all.remove(j));
                    }
                    side.sort();
                    Fault::Split {
                        side,
                        ms: r.range(200, 4_000),
                    }
                }
                9 | 10 => Fault::Pause {
                    node: r.below(nodes as u64) as usize,
                    ms: r.range(100, 3_000),
                },
                _ => Fault::Storm {
                    drop_pct: r.range(5, 40),
                    max_delay_ms: r.range(20, 400),
                    ms: r.range(200, 3_000),
                },
            };
            faults.push((wait, f));
        }
        let snapshots = (r.below(3) == 0).then(|| (r.range(20, 300), r.range(0, 50)));
        // Drawn apart, so the plans of seeds from before this fault existed stay as they were.
        let mut r2 = SimRng::keyed(&[seed, 0x696e7374]);
        if snapshots.is_some() && r2.below(2) == 0 {
            let at = r2.below(faults.len() as u64 + 1) as usize;
            let (node, lag_ms, down_ms) = (
                r2.below(nodes as u64) as usize,
                r2.range(500, 2_000),
                r2.range(0, 1_000),
            );
            let wait = r2.range(100, 1_000);
            let fault = Fault::CrashInInstall {
                node,
                lag_ms,
                down_ms,
                at_pct: r2.below(100),
            };
            faults.insert(at, (wait, fault));
        }
        Plan {
            nodes,
            clients: r.range(1, 4) as usize,
            base_drop_pct: r.below(3),
            base_delay_ms: r.range(1, 20),
            snapshots,
            disk_step_ms: r.range(1, 10), // inclusive, as every `range`
            faults,
        }
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "nodes={} clients={} drop={}% delay<={}ms disk_step={}ms snapshots={:?} faults:",
            self.nodes,
            self.clients,
            self.base_drop_pct,
            self.base_delay_ms,
            self.disk_step_ms,
            self.snapshots
        )?;
        for (wait, fault) in &self.faults {
            write!(f, " +{wait}ms {fault:?};")?;
        }
        Ok(())
    }
}
