//! A seed's plan: the network's weather, the workload and the faults, all drawn from the
//! seed (the execution is not: real threads and real time, see main.rs).

use std::fmt;

use tern_store::sim::SimRng;

/// Which node a fault strikes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Leader,
    Follower,
}

#[derive(Clone, Copy, Debug)]
pub enum Fault {
    /// The node's process is killed (its page cache survives); it restarts after `down_ms`.
    Crash { target: Target, down_ms: u64 },
    /// The node loses power (unsynced writes of its Raft log are lost).
    PowerLoss { target: Target, down_ms: u64 },
    /// Every node loses power at once; all restart after `down_ms`.
    PowerLossAll { down_ms: u64 },
    /// The leader is cut off from the other nodes (not from its clients) for `ms`.
    PartitionLeader { ms: u64 },
    /// The node's Raft messages are held for `ms` (a stalled process as its peers see it).
    Pause { target: Target, ms: u64 },
}

pub struct Plan {
    pub drop_pct: u64,
    pub max_delay_ms: u64,
    /// Messages each publisher (v5 QoS 2, v3.1.1 QoS 2, v5 QoS 1) publishes once the faults
    /// are over (it publishes from the start, one per `pace_ms` at most).
    pub msgs: [u64; 3],
    pub pace_ms: u64,
    /// (ms after the previous fault ended, fault).
    pub faults: Vec<(u64, Fault)>,
    /// Entries between snapshots and kept behind one (one seed in three), so that a node
    /// back from a fault may catch up by installing a snapshot of the replica's files.
    pub snapshots: Option<(u64, u64)>,
    /// The intermittent subscriber's (ms online, ms offline).
    pub intermittent: (u64, u64),
}

fn target(r: &mut SimRng) -> Target {
    if r.chance(0.6) {
        Target::Leader
    } else {
        Target::Follower
    }
}

impl Plan {
    pub fn new(seed: u64) -> Plan {
        let mut r = SimRng::keyed(&[seed, 0x706c616e]);
        let msgs = [r.range(10, 60), r.range(10, 60), r.range(10, 40)];
        let count = r.range(2, 5);
        let faults = (0..count)
            .map(|_| {
                let gap = r.range(300, 1500);
                let down_ms = r.range(200, 1500);
                let f = match r.below(10) {
                    0..=2 => Fault::Crash {
                        target: target(&mut r),
                        down_ms,
                    },
                    3..=4 => Fault::PowerLoss {
                        target: target(&mut r),
                        down_ms,
                    },
                    5 => Fault::PowerLossAll { down_ms },
                    6..=7 => Fault::PartitionLeader {
                        ms: r.range(500, 2500),
                    },
                    _ => Fault::Pause {
                        target: target(&mut r),
                        ms: r.range(300, 1500),
                    },
                };
                (gap, f)
            })
            .collect();
        let (drop_pct, max_delay_ms, pace_ms) = (r.below(3), r.range(1, 10), r.range(10, 30));
        let snapshots = r.chance(1.0 / 3.0).then(|| (r.range(30, 300), r.below(50)));
        let intermittent = (r.range(300, 1000), r.range(300, 1500));
        Plan {
            drop_pct,
            max_delay_ms,
            msgs,
            pace_ms,
            faults,
            snapshots,
            intermittent,
        }
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tail={:?} pace={}ms drop={}% delay<={}ms ",
            self.msgs, self.pace_ms, self.drop_pct, self.max_delay_ms
        )?;
        if let Some((every, kept)) = self.snapshots {
            write!(f, "snapshots={every}/{kept} ")?;
        }
        let (on, off) = self.intermittent;
        write!(f, "sub3={on}/{off}ms faults=[")?;
        for (i, (gap, fault)) in self.faults.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "+{gap}ms {fault:?}")?;
        }
        write!(f, "]")
    }
}
