//! The state machine's own tests: where the applier's slow file work runs.

use std::sync::mpsc;
use std::time::Duration;

use openraft::{CommittedLeaderId, StoredMembership};

use super::*;

/// How long the gated applier waits for the runtime before it reports itself starved: only
/// the failing case waits it out.
const GATE_WAIT: Duration = Duration::from_secs(5);

/// An applier whose snapshot install and persist wait for a message sent by a task on the
/// runtime that called them: on a runtime of one thread they get it only if they do not
/// run on that thread.
struct Gated {
    gate: mpsc::Receiver<()>,
}

impl Gated {
    fn pass(&self, what: &str) -> Result<(), ApplyError> {
        self.gate
            .recv_timeout(GATE_WAIT)
            .map_err(|_| ApplyError(format!("{what} held the runtime's only thread: starved")))
    }
}

impl Applier for Gated {
    fn apply(&mut self, _index: LogIndex, _ops: &[Bytes]) -> Result<(), ApplyError> {
        Ok(())
    }

    fn snapshot(&mut self) -> Result<Vec<u8>, ApplyError> {
        self.pass("snapshot")?;
        Ok(b"state".to_vec())
    }

    fn install_snapshot(&mut self, _index: LogIndex, _data: &[u8]) -> Result<(), ApplyError> {
        self.pass("install_snapshot")
    }

    fn persist(&mut self) -> Result<(), ApplyError> {
        self.pass("persist")
    }
}

/// The sender side of the gate: a task on the current runtime, which runs only while the
/// runtime's thread is free.
fn open_gate_from_the_runtime(tx: mpsc::Sender<()>, times: usize) {
    tokio::spawn(async move {
        for _ in 0..times {
            let _ = tx.send(());
            tokio::task::yield_now().await;
        }
    });
}

/// `#[tokio::test]` runs on one thread: a snapshot installed, or one built (which persists
/// first), on that thread would block the task that lets it finish. Since session 14 they
/// run on the blocking pool, and the worker stays free for the Raft core and the clients.
#[tokio::test]
async fn a_snapshot_install_and_build_leave_the_runtime_thread_free() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("store");
    let (tx, rx) = mpsc::channel();
    let mut sm = StateMachine::open(
        &store,
        SyncPolicy::Always,
        Box::new(Gated { gate: rx }),
        ApplierWork::BlockingPool,
    )
    .expect("sm");

    let last = LogId::new(CommittedLeaderId::new(3, NodeId(2)), 40);
    let meta = Meta {
        last_log_id: Some(last),
        last_membership: StoredMembership::default(),
        snapshot_id: "40-0".into(),
    };
    open_gate_from_the_runtime(tx.clone(), 1);
    sm.install_snapshot(&meta, Box::new(Cursor::new(b"state".to_vec())))
        .await
        .expect("install_snapshot returns once the gate opened");
    let (applied, _) = sm.applied_state().await.expect("applied");
    assert_eq!(applied, Some(last));

    // Building one persists the applier first, then takes its state: two gates.
    open_gate_from_the_runtime(tx, 2);
    let built = sm.build_snapshot().await.expect("build_snapshot");
    assert_eq!(built.meta.last_log_id, Some(last));
    assert_eq!(built.snapshot.into_inner(), b"state".to_vec());
}

/// An applier whose state is the last index applied, and whose `persist` takes a moment
/// (an fsync), so that applies keep coming while a snapshot is built, as under load.
struct Counting {
    at: LogIndex,
}

impl Applier for Counting {
    fn apply(&mut self, index: LogIndex, _ops: &[Bytes]) -> Result<(), ApplyError> {
        self.at = index;
        Ok(())
    }

    fn snapshot(&mut self) -> Result<Vec<u8>, ApplyError> {
        Ok(self.at.to_le_bytes().to_vec())
    }

    fn install_snapshot(&mut self, _index: LogIndex, _data: &[u8]) -> Result<(), ApplyError> {
        Ok(())
    }

    fn persist(&mut self) -> Result<(), ApplyError> {
        std::thread::sleep(Duration::from_millis(2));
        Ok(())
    }
}

fn normal_entry(index: LogIndex) -> Entry {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, NodeId(1)), index),
        payload: EntryPayload::Normal(crate::types::Batch(Vec::new())),
    }
}

/// openraft purges the log up to a snapshot's point once `build_snapshot` returns; after a
/// power loss the state machine starts again from the recorded applied point and needs the
/// entries after it. So the recorded point must never be older than a snapshot built. Found
/// by the cluster-broker simulator under CPU contention (seed 12944, about one run in three):
/// the snapshot named the point reached after the record, a power loss later node 1's Raft
/// core stopped for good on "try to get log at index 1470 but got Some(1471)".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_never_names_a_point_past_the_recorded_applied_point() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("store");
    let mut sm = StateMachine::open(
        &store,
        SyncPolicy::Always,
        Box::new(Counting { at: 0 }),
        ApplierWork::BlockingPool,
    )
    .expect("sm");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut applying = sm.clone();
    let stop_applying = stop.clone();
    let applies = tokio::spawn(async move {
        let mut index = 1;
        while !stop_applying.load(Ordering::Relaxed) {
            applying
                .apply(vec![normal_entry(index)])
                .await
                .expect("apply");
            index += 1;
            tokio::task::yield_now().await;
        }
    });
    for _ in 0..20 {
        let built = sm.build_snapshot().await.expect("build_snapshot");
        let raw = sm.inner.kv.get(KEY_APPLIED).expect("kv").expect("recorded");
        let recorded: Applied = decode(&raw).expect("decode");
        let index = |l: Option<LogId>| l.map(|l| l.index);
        assert!(
            index(recorded.last_applied) >= index(built.meta.last_log_id),
            "the log may be purged up to {:?}, but a power loss restarts from {:?}",
            built.meta.last_log_id,
            recorded.last_applied
        );
    }
    stop.store(true, Ordering::Relaxed);
    applies.await.expect("applies");
}

/// An `apply`'s record and a snapshot's can be in flight together; the older one landing
/// last must not take the recorded point back below the snapshot's (the log up to that may
/// be gone). An installed snapshot replaces the point whatever it was.
#[tokio::test]
async fn the_recorded_point_goes_back_only_to_an_installed_snapshot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("store");
    let sm = StateMachine::open(
        &store,
        SyncPolicy::Always,
        Box::new(Counting { at: 0 }),
        ApplierWork::BlockingPool,
    )
    .expect("sm");
    let at = |index: LogIndex| Applied {
        last_applied: Some(normal_entry(index).log_id),
        membership: StoredMembership::default(),
    };
    let recorded = || -> Option<LogIndex> {
        let raw = sm.inner.kv.get(KEY_APPLIED).expect("kv").expect("recorded");
        let a: Applied = decode(&raw).expect("decode");
        a.last_applied.map(|l| l.index)
    };
    sm.record(at(75), Record::Forward).await.expect("record");
    sm.record(at(40), Record::Forward).await.expect("record");
    assert_eq!(
        recorded(),
        Some(75),
        "an older record landing last took the point back"
    );
    sm.record(at(30), Record::Replace).await.expect("record");
    assert_eq!(
        recorded(),
        Some(30),
        "an installed snapshot's point replaces the record"
    );
}
