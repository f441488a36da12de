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
    let mut sm =
        StateMachine::open(&store, SyncPolicy::Always, Box::new(Gated { gate: rx })).expect("sm");

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
