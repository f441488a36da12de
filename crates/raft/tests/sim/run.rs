//! One seed: form the cluster, run clients through the plan's faults, heal, settle, check.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tern_raft::{Consensus, ConsensusError, LogIndex, Role};
use tern_store::sim::SimRng;

use crate::check;
use crate::plan::{Fault, Plan};
use crate::world::{World, id};

/// A client gives up on a call after this long (its outcome is then unknown).
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a membership change may take before the plan moves on.
const MEMBERSHIP_LIMIT: Duration = Duration::from_secs(10);
/// How long the healed cluster has to commit a last batch and apply it everywhere.
const SETTLE_LIMIT: Duration = Duration::from_secs(60);

/// A batch whose `propose` answered Ok: it must be committed and never lost.
#[derive(Debug, Clone)]
pub struct Acked {
    pub index: LogIndex,
    pub ops: Vec<Bytes>,
}

pub struct Outcome {
    pub plan: Plan,
    pub acked: usize,
    pub violations: Vec<String>,
    pub log: Vec<String>,
}

pub async fn run_seed(seed: u64) -> Outcome {
    let plan = Plan::new(seed);
    let mut w = World::new(seed, plan.nodes, plan.disk_step_ms).await;
    w.snapshots = plan.snapshots;
    {
        let mut l = w.net.links.lock().unwrap();
        l.drop_pct = plan.base_drop_pct;
        l.max_delay_ms = plan.base_delay_ms;
    }
    // Highest id first: the lowest forms the cluster once the others are there to vote.
    for i in (0..plan.nodes).rev() {
        w.start(i).await;
    }
    let acked: Arc<Mutex<Vec<Acked>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..plan.clients)
        .map(|c| {
            tokio::spawn(client(
                w.nodes.clone(),
                SimRng::keyed(&[seed, 0x636c69, c as u64]),
                c,
                acked.clone(),
                stop.clone(),
            ))
        })
        .collect();
    let mut log = Vec::new();
    let t0 = tokio::time::Instant::now();
    for (wait, fault) in &plan.faults {
        tokio::time::sleep(Duration::from_millis(*wait)).await;
        log.push(format!("at {}ms: {fault:?}", t0.elapsed().as_millis()));
        trace(&format!("{fault:?}"));
        if let Some(note) = inflict(&mut w, &plan, fault).await {
            log.push(format!("    {note}"));
        }
        restart_stopped(&mut w, &mut log).await;
    }
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        let _ = c.await;
    }
    trace("settling");
    let barrier = settle(&mut w, &mut log).await;
    trace(&format!("settled at {barrier:?}"));
    let acked = acked.lock().unwrap().clone();
    match barrier {
        Ok((b, members)) => check::check(&w, &acked, b, &members),
        Err(why) => w.violation(format!(
            "no settling: the healed cluster did not commit and apply a batch everywhere within {SETTLE_LIMIT:?}: {why}; {}",
            nodes_now(&w)
        )),
    }
    let shared_terms = check::terms_with_several_leaders(&w);
    let violations = w.violations.lock().unwrap().clone();
    let stats = {
        let seen = w.net.seen.lock().unwrap();
        format!(
            "messages={} dropped={} terms={} terms_with_several_leaders={shared_terms} core_stops={}",
            seen.messages,
            seen.dropped,
            seen.leaders.len(),
            w.core_stops
        )
    };
    log.push(stats);
    let installs: Vec<u64> = w
        .apps
        .iter()
        .map(|a| a.lock().unwrap().snapshots_installed)
        .collect();
    let replays: Vec<u64> = w.apps.iter().map(|a| a.lock().unwrap().replays).collect();
    log.push(format!(
        "snapshots installed per node: {installs:?}, replayed indexes skipped: {replays:?}"
    ));
    w.stop().await;
    Outcome {
        plan,
        acked: acked.len(),
        violations,
        log,
    }
}

/// Inflicts `fault` and heals it; returns a note for the seed's log, if any.
async fn inflict(w: &mut World, plan: &Plan, fault: &Fault) -> Option<String> {
    let ms = |m: u64| Duration::from_millis(m);
    match fault {
        Fault::Crash {
            node,
            power_loss,
            down_ms,
        } => {
            w.kill(*node, *power_loss).await;
            tokio::time::sleep(ms(*down_ms)).await;
            w.start(*node).await;
        }
        Fault::ClusterPowerLoss { down_ms } => {
            let up: Vec<usize> = (0..w.total()).filter(|&i| w.is_up(i)).collect();
            // All at once, before any node is stopped; stopping them is then a formality.
            for &i in &up {
                w.disks[i].power_loss();
            }
            for &i in &up {
                w.kill(i, false).await;
            }
            tokio::time::sleep(ms(*down_ms)).await;
            for &i in up.iter().rev() {
                w.start(i).await;
            }
        }
        Fault::Isolate { node, ms: t } => {
            w.net.links.lock().unwrap().side.insert(id(*node), 1);
            tokio::time::sleep(ms(*t)).await;
            w.net.links.lock().unwrap().side.clear();
        }
        Fault::Split { side, ms: t } => {
            for n in side {
                w.net.links.lock().unwrap().side.insert(id(*n), 1);
            }
            tokio::time::sleep(ms(*t)).await;
            w.net.links.lock().unwrap().side.clear();
        }
        Fault::Pause { node, ms: t } => {
            w.net.links.lock().unwrap().paused.insert(id(*node), true);
            tokio::time::sleep(ms(*t)).await;
            w.net.links.lock().unwrap().paused.clear();
        }
        Fault::Replace { old } => {
            let done = replace(w, *old).await;
            return Some(format!(
                "membership: {done} of 3 steps (add learner {}, promote it, remove {})",
                id(w.n),
                id(*old)
            ));
        }
        Fault::CrashInInstall {
            node,
            lag_ms,
            down_ms,
            at_pct,
        } => {
            let into = ms(w.applier_work_ms * at_pct / 100);
            return crash_in_install(w, *node, ms(*lag_ms), into, ms(*down_ms)).await;
        }
        Fault::Storm {
            drop_pct,
            max_delay_ms,
            ms: t,
        } => {
            {
                let mut l = w.net.links.lock().unwrap();
                l.drop_pct = *drop_pct;
                l.max_delay_ms = *max_delay_ms;
            }
            tokio::time::sleep(ms(*t)).await;
            let mut l = w.net.links.lock().unwrap();
            l.drop_pct = plan.base_drop_pct;
            l.max_delay_ms = plan.base_delay_ms;
        }
    }
    None
}

/// How long `CrashInInstall` keeps its node cut off at most, and then waits for its install.
const INSTALL_WAIT: Duration = Duration::from_secs(5);

/// `Fault::CrashInInstall`: cuts `node` off for `lag` and until a leader's log is purged past
/// it, heals, and cuts its power `into` its install: from when the install shows (its log
/// purged past what it has applied: openraft purges as it hands the snapshot to the state
/// machine, and counts it applied once installed). An install takes the world's
/// `applier_work_ms` (`ApplierWork::Simulated`), while the node's log goes on.
async fn crash_in_install(
    w: &mut World,
    node: usize,
    lag: Duration,
    into: Duration,
    down: Duration,
) -> Option<String> {
    w.net.links.lock().unwrap().side.insert(id(node), 1);
    tokio::time::sleep(lag).await;
    let deadline = tokio::time::Instant::now() + INSTALL_WAIT;
    while tokio::time::Instant::now() < deadline && !purged_past(w, node) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let behind = purged_past(w, node);
    w.net.links.lock().unwrap().side.clear();
    let deadline = tokio::time::Instant::now() + INSTALL_WAIT;
    loop {
        let Some(st) = w.node(node).map(|n| n.status()) else {
            return Some(format!("node {} down: no install to crash in", id(node)));
        };
        if st.purged_index > st.applied_index {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            let st: Vec<_> = (0..w.total())
                .filter_map(|i| w.node(i))
                .map(|n| {
                    let s = n.status();
                    (
                        s.node_id.0,
                        s.role,
                        s.last_log_index,
                        s.applied_index,
                        s.purged_index,
                    )
                })
                .collect();
            return Some(format!(
                "no install on node {} to crash in (behind: {behind}): {st:?}",
                id(node)
            ));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::time::sleep(into).await;
    w.kill(node, true).await;
    tokio::time::sleep(down).await;
    w.start(node).await;
    Some(format!(
        "node {} lost power {} ms into an install",
        id(node),
        into.as_millis()
    ))
}

/// A leader has purged its log past the end of `node`'s.
fn purged_past(w: &World, node: usize) -> bool {
    let Some(last) = w.node(node).map(|n| n.status().last_log_index) else {
        return false;
    };
    (0..w.total()).filter_map(|i| w.node(i)).any(|n| {
        let st = n.status();
        st.role == Role::Leader && st.purged_index > last
    })
}

/// Adds the spare as a learner, promotes it, removes voter `old`, each step retried through
/// whichever node leads until it succeeds or [`MEMBERSHIP_LIMIT`] passes (then the change
/// stays partial: the checker reads the final membership from the leader).
async fn replace(w: &mut World, old: usize) -> usize {
    let spare = w.n;
    if !w.is_up(spare) {
        w.start(spare).await;
    }
    let deadline = tokio::time::Instant::now() + MEMBERSHIP_LIMIT;
    let mut step = 0;
    while step < 3 && tokio::time::Instant::now() < deadline {
        let leader = (0..w.total())
            .filter_map(|i| w.node(i))
            .find(|n| n.status().role == Role::Leader);
        if let Some(l) = leader {
            let call = async {
                match step {
                    0 => l.add_learner(id(spare), World::addr(spare)).await,
                    1 => l.promote(id(spare)).await,
                    _ => l.remove(id(old)).await,
                }
            };
            match tokio::time::timeout(CALL_TIMEOUT, call).await {
                Ok(Ok(())) => {
                    trace(&format!("membership step {step} done"));
                    step += 1;
                    continue;
                }
                Ok(Err(e)) => trace(&format!("membership step {step}: {e}")),
                Err(_) => trace(&format!("membership step {step}: timed out")),
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    step
}

/// Proposes batches to the node it believes leads, following `NotLeader` hints; each attempt
/// carries fresh operations (a re-sent batch would be a new one: dedupe is the broker's).
async fn client(
    nodes: Arc<Mutex<Vec<Option<Arc<tern_raft::RaftNode>>>>>,
    mut rng: SimRng,
    c: usize,
    acked: Arc<Mutex<Vec<Acked>>>,
    stop: Arc<AtomicBool>,
) {
    let n = nodes.lock().unwrap().len() as u64;
    let mut guess = rng.below(n) as usize;
    let mut k = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let node = nodes.lock().unwrap()[guess].clone();
        if let Some(node) = node {
            let ops: Vec<Bytes> = (0..rng.range(1, 4))
                .map(|j| Bytes::from(format!("c{c}-{k}-{j}")))
                .collect();
            k += 1;
            match tokio::time::timeout(CALL_TIMEOUT, node.propose(ops.clone())).await {
                Ok(Ok(done)) => acked.lock().unwrap().push(Acked {
                    index: done.index,
                    ops,
                }),
                Ok(Err(ConsensusError::NotLeader {
                    leader: Some((l, _)),
                })) if l.0 >= 1 && l.0 <= n => guess = (l.0 - 1) as usize,
                _ => guess = rng.below(n) as usize,
            }
        } else {
            guess = rng.below(n) as usize;
        }
        tokio::time::sleep(Duration::from_millis(rng.range(1, 30))).await;
    }
}

/// Commits one more batch through whichever node leads (so the last term has an entry of
/// its own), then waits until every member (voter or learner, as the leader sees them) has
/// applied it. Returns its index and the members' positions.
async fn settle(w: &mut World, log: &mut Vec<String>) -> Result<(LogIndex, Vec<usize>), String> {
    let deadline = tokio::time::Instant::now() + SETTLE_LIMIT;
    let mut attempt = 0u64;
    let (index, members) = loop {
        restart_stopped(w, log).await;
        if tokio::time::Instant::now() >= deadline {
            return Err(format!("no barrier committed ({attempt} proposed)"));
        }
        let leader = (0..w.total())
            .filter_map(|i| w.node(i))
            .find(|n| n.status().role == Role::Leader);
        if let Some(l) = leader {
            attempt += 1;
            let ops = vec![Bytes::from(format!("barrier-{attempt}"))];
            if let Ok(Ok(done)) = tokio::time::timeout(CALL_TIMEOUT, l.propose(ops)).await {
                let st = l.status();
                let members: Vec<usize> = (0..w.total())
                    .filter(|&i| st.voters.contains(&id(i)) || st.learners.contains(&id(i)))
                    .collect();
                break (done.index, members);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    loop {
        restart_stopped(w, log).await;
        let all = members.iter().all(|&i| {
            w.node(i)
                .is_some_and(|n| n.status().applied_index.is_some_and(|a| a >= index))
        });
        if all {
            return Ok((index, members));
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!(
                "barrier {index} committed, not applied on all of members {members:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The supervisor of a real node's process: a node whose Raft core stopped on its own (not
/// by the world) exits (`ClusterNode::run` returns an error) and is started again, here as
/// a crash without a power loss. Noted in the seed's log, and in `core_stops=`.
async fn restart_stopped(w: &mut World, log: &mut Vec<String>) {
    for i in 0..w.total() {
        let Some(node) = w.node(i) else { continue };
        if node.status().role != Role::Stopped {
            continue;
        }
        let why = node.core_stopped().await;
        drop(node);
        log.push(format!(
            "    node {}'s Raft core stopped on its own ({why}): restarted, as its supervisor would",
            id(i)
        ));
        w.core_stops += 1;
        w.kill(i, false).await;
        w.start(i).await;
    }
}

/// Every node as it is now (a failed settling's explanation): down, or its role, term,
/// leader, log, applied and purged points and membership.
fn nodes_now(w: &World) -> String {
    let one = |i: usize| match w.node(i) {
        None => format!("node {i}: down"),
        Some(n) => {
            let st = n.status();
            format!(
                "node {i}: {:?} term {} leader {:?} last log {:?} applied {:?} purged {:?} snapshot {:?} voters {:?} learners {:?}",
                st.role,
                st.term,
                st.leader,
                st.last_log_index,
                st.applied_index,
                st.purged_index,
                st.snapshot_index,
                st.voters,
                st.learners
            )
        }
    };
    (0..w.total()).map(one).collect::<Vec<_>>().join("; ")
}

/// With TERN_CSIM_TRACE set, prints progress (with the virtual time) as it happens.
pub fn trace(what: &str) {
    if std::env::var("TERN_CSIM_TRACE").is_ok() {
        eprintln!("[{:?}] {what}", tokio::time::Instant::now());
    }
}
