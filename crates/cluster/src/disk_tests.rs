//! The replicated disk against a consensus that the tests control: what a fsync waits for,
//! the order and merging of operations, failure for good, the limits on what is pending and
//! in flight. With a replica behind it: `disk_replica_tests.rs`.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tern_raft::{
    Applier, ClusterStatus, Committed, Consensus, ConsensusError, LogIndex, NodeId, Proposal, Role,
};
use tern_store::vfs::{VFile, Vfs};

use super::{DiskLimits, ReplicatedDisk};
use crate::ops::Op;

/// A consensus of one: batches enter the log when submitted, commit (and are applied to
/// `applier`, if any) when not `held`, and fail while `failing`.
#[derive(Default)]
pub(super) struct FakeState {
    /// Commits wait while set (the batches are in the log).
    held: AtomicBool,
    /// Submissions wait while set (before the batch enters the log).
    submit_held: AtomicBool,
    /// Submissions begun.
    submits: AtomicU64,
    failing: AtomicBool,
    term: AtomicU64,
    log: Mutex<Vec<Vec<Bytes>>>,
    pub(super) applier: Mutex<Option<Box<dyn Applier>>>,
}

#[derive(Default)]
pub(super) struct Fake(Arc<FakeState>);

impl std::ops::Deref for Fake {
    type Target = FakeState;
    fn deref(&self) -> &FakeState {
        &self.0
    }
}

impl Fake {
    pub(super) fn ops(&self) -> Vec<Op> {
        let log = self.log.lock().unwrap();
        log.iter()
            .flatten()
            .map(|b| Op::decode(b).unwrap())
            .collect()
    }
}

impl Consensus for Fake {
    async fn submit(&self, ops: Vec<Bytes>) -> Result<Proposal, ConsensusError> {
        self.submits.fetch_add(1, Ordering::SeqCst);
        while self.submit_held.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let index = {
            let mut log = self.log.lock().unwrap();
            log.push(ops.clone());
            log.len() as LogIndex
        };
        let state = self.0.clone();
        Ok(Proposal::new(async move {
            while state.held.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            if state.failing.load(Ordering::SeqCst) {
                return Err(ConsensusError::NotLeader { leader: None });
            }
            if let Some(a) = state.applier.lock().unwrap().as_mut() {
                a.apply(index, &ops).unwrap();
            }
            Ok(Committed { index })
        }))
    }
    async fn propose(&self, ops: Vec<Bytes>) -> Result<Committed, ConsensusError> {
        self.submit(ops).await?.await
    }
    fn status(&self) -> ClusterStatus {
        ClusterStatus {
            node_id: NodeId(1),
            role: Role::Leader,
            term: self.term.load(Ordering::SeqCst),
            leader: Some(NodeId(1)),
            last_log_index: None,
            applied_index: None,
            snapshot_index: None,
            purged_index: None,
            voters: vec![NodeId(1)],
            learners: vec![],
            replication: vec![],
            quorum_ack_age_ms: Some(0),
            elections_started: 0,
            quorum_ack_max_age_ms: 1000,
        }
    }
    async fn add_learner(&self, _: NodeId, _: SocketAddr) -> Result<(), ConsensusError> {
        Err(ConsensusError::Unsupported("fake"))
    }
    async fn promote(&self, _: NodeId) -> Result<(), ConsensusError> {
        Err(ConsensusError::Unsupported("fake"))
    }
    async fn remove(&self, _: NodeId) -> Result<(), ConsensusError> {
        Err(ConsensusError::Unsupported("fake"))
    }
    async fn transfer_leader(&self, _: NodeId) -> Result<(), ConsensusError> {
        Err(ConsensusError::Unsupported("fake"))
    }
}

pub(super) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

pub(super) fn start(fake: &Arc<Fake>, root: &Path, rt: &tokio::runtime::Runtime) -> ReplicatedDisk {
    std::fs::create_dir_all(root).unwrap();
    ReplicatedDisk::start(root.to_path_buf(), fake.clone(), 0, rt.handle().clone()).unwrap()
}

/// A disk over a consensus whose commits wait (`held`), with file `a` just written `data`:
/// its proposal is submitted (or about to be) and does not commit until released.
struct HeldWrite {
    fake: Arc<Fake>,
    disk: ReplicatedDisk,
    file: Arc<dyn VFile>,
    dir: tempfile::TempDir,
    /// Last: the proposer's and committer's runtime outlives the disk.
    _rt: tokio::runtime::Runtime,
}

fn held_write(data: &[u8]) -> HeldWrite {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(Fake::default());
    fake.held.store(true, Ordering::SeqCst);
    let disk = start(&fake, dir.path(), &rt);
    let file = disk.open_rw(&dir.path().join("a"), true).unwrap();
    file.write_all_at(data, 0).unwrap();
    HeldWrite {
        fake,
        disk,
        file,
        dir,
        _rt: rt,
    }
}

#[test]
fn a_sync_returns_only_once_the_writes_before_it_are_committed() {
    let h = held_write(b"hello");
    let (fake, f, dir) = (&h.fake, &h.file, &h.dir);
    let (tx, rx) = std::sync::mpsc::channel();
    let syncing = f.clone();
    std::thread::spawn(move || tx.send(syncing.sync_data().is_ok()).unwrap());
    // Held: the proposal cannot commit, so the sync must not return.
    assert!(
        rx.recv_timeout(Duration::from_millis(200)).is_err(),
        "sync before commit"
    );
    fake.held.store(false, Ordering::SeqCst);
    assert!(rx.recv_timeout(Duration::from_secs(10)).unwrap());
    assert_eq!(
        fake.ops(),
        vec![
            Op::Create(crate::ops::RelPath::under(dir.path(), &dir.path().join("a")).unwrap()),
            Op::Write {
                path: crate::ops::RelPath::under(dir.path(), &dir.path().join("a")).unwrap(),
                offset: 0,
                data: Bytes::from_static(b"hello"),
            },
        ]
    );
}

/// A flag a started sync's `done` sets.
fn done_flag() -> (Arc<AtomicBool>, tern_store::vfs::SyncDone) {
    let flag = Arc::new(AtomicBool::new(false));
    let set = flag.clone();
    (flag, Box::new(move || set.store(true, Ordering::SeqCst)))
}

#[test]
fn a_started_sync_is_done_only_once_the_writes_before_it_are_committed() {
    let h = held_write(b"one");
    let (fake, f) = (&h.fake, &h.file);
    let (done1, tell1) = done_flag();
    let first = f
        .start_sync(tell1)
        .expect("a replicated file overlaps its syncs");
    // The next batch is written while the first sync runs.
    f.write_all_at(b"two", 3).unwrap();
    let (done2, tell2) = done_flag();
    let second = f.start_sync(tell2).expect("overlaps");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        tx.send((first.wait().is_ok(), second.wait().is_ok()))
            .unwrap()
    });
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !done1.load(Ordering::SeqCst) && !done2.load(Ordering::SeqCst),
        "done before commit"
    );
    assert!(
        rx.try_recv().is_err(),
        "a started sync returned before its commit"
    );
    fake.held.store(false, Ordering::SeqCst);
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(10)).unwrap(),
        (true, true)
    );
    wait_until("both told done", || {
        done1.load(Ordering::SeqCst) && done2.load(Ordering::SeqCst)
    });
    // Nothing left to commit: a sync started now is done at once.
    let (done3, tell3) = done_flag();
    let third = f.start_sync(tell3).expect("overlaps");
    assert!(done3.load(Ordering::SeqCst));
    third.wait().unwrap();
}

#[test]
fn a_started_sync_over_a_failed_proposal_is_done_and_fails() {
    let h = held_write(b"one");
    let (fake, f) = (&h.fake, &h.file);
    let (done, tell) = done_flag();
    let sync = f.start_sync(tell).expect("overlaps");
    fake.failing.store(true, Ordering::SeqCst);
    fake.held.store(false, Ordering::SeqCst);
    assert!(
        sync.wait().is_err(),
        "a started sync over a failed proposal succeeded"
    );
    wait_until("done told", || done.load(Ordering::SeqCst));
    // Started after the failure: done at once, and failed.
    let (done, tell) = done_flag();
    let late = f.start_sync(tell).expect("overlaps");
    assert!(done.load(Ordering::SeqCst));
    assert!(late.wait().is_err());
}

#[test]
fn contiguous_writes_merge_and_others_keep_their_order() {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(Fake::default());
    // Submissions wait: the proposer may take the create alone and wait in its submit;
    // whatever follows is recorded before it can take more.
    fake.submit_held.store(true, Ordering::SeqCst);
    let disk = start(&fake, dir.path(), &rt);
    let f = disk.open_rw(&dir.path().join("a"), true).unwrap();
    while fake.submits.load(Ordering::SeqCst) == 0 {
        std::thread::sleep(Duration::from_millis(1)); // the proposer took the create
    }
    f.write_all_at(b"ab", 0).unwrap();
    f.write_all_at(b"cd", 2).unwrap();
    f.write_all_at(b"zz", 10).unwrap();
    f.set_len(12).unwrap();
    fake.submit_held.store(false, Ordering::SeqCst);
    f.sync_data().unwrap();
    let writes: Vec<(u64, Vec<u8>)> = fake
        .ops()
        .into_iter()
        .filter_map(|op| match op {
            Op::Write { offset, data, .. } => Some((offset, data.to_vec())),
            _ => None,
        })
        .collect();
    assert_eq!(writes, vec![(0, b"abcd".to_vec()), (10, b"zz".to_vec())]);
    assert!(matches!(
        fake.ops().last(),
        Some(Op::SetLen { len: 12, .. })
    ));
}

#[test]
fn a_failed_proposal_fails_the_disk_for_good() {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(Fake::default());
    let disk = start(&fake, dir.path(), &rt);
    let f = disk.open_rw(&dir.path().join("a"), true).unwrap();
    f.write_all_at(b"1", 0).unwrap();
    f.sync_data().unwrap();
    fake.failing.store(true, Ordering::SeqCst);
    f.write_all_at(b"2", 1).unwrap();
    assert!(f.sync_data().is_err(), "a sync over a failed proposal");
    let submitted = fake.ops().len();
    fake.failing.store(false, Ordering::SeqCst);
    // Nothing after the gap is made or proposed, even once consensus works again.
    assert!(f.write_all_at(b"3", 2).is_err());
    assert!(f.sync_data().is_err());
    assert!(disk.failure().is_some());
    disk.join_proposer();
    assert_eq!(fake.ops().len(), submitted);
}

#[test]
fn join_proposer_returns_while_a_proposal_never_commits() {
    // The leader cut off from every follower: its last proposals never commit. Stopping the
    // engine (shutdown, a lost quorum) must not wait for them: `tern serve` did not exit on
    // SIGTERM when its followers had died under load (session 15).
    let h = held_write(b"stuck");
    let (fake, disk, f) = (&h.fake, &h.disk, &h.file);
    let syncing = f.clone();
    let sync = std::thread::spawn(move || syncing.sync_data());
    wait_until("the proposal submitted", || {
        fake.submits.load(Ordering::SeqCst) >= 1
    });
    disk.fail("shutting down");
    let (tx, rx) = std::sync::mpsc::channel();
    let joining = disk.clone();
    std::thread::spawn(move || {
        joining.join_proposer();
        let _ = tx.send(());
    });
    assert!(
        rx.recv_timeout(Duration::from_secs(5)).is_ok(),
        "join_proposer still waits for a proposal that cannot commit"
    );
    assert!(
        sync.join().unwrap().is_err(),
        "a sync over an uncommitted proposal succeeded"
    );
    fake.held.store(false, Ordering::SeqCst); // lets the runtime's task finish
}

#[test]
fn a_disk_of_an_old_term_proposes_nothing() {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(Fake::default());
    let disk = start(&fake, dir.path(), &rt);
    fake.term.store(1, Ordering::SeqCst); // a new term began (this disk leads term 0)
    // The create may already find the disk failed (its proposal was refused).
    if let Ok(f) = disk.open_rw(&dir.path().join("a"), true) {
        let _ = f.write_all_at(b"x", 0);
        assert!(f.sync_data().is_err());
    }
    assert!(disk.sync_dir(dir.path()).is_err());
    assert!(fake.ops().is_empty());
}

/// Polls `done` until it holds (the tests wait on conditions; the bound only keeps a broken
/// build from hanging).
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "waited 30 s for {what}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn start_limited(
    fake: &Arc<Fake>,
    root: &Path,
    rt: &tokio::runtime::Runtime,
    limits: DiskLimits,
) -> ReplicatedDisk {
    std::fs::create_dir_all(root).unwrap();
    let handle = rt.handle().clone();
    ReplicatedDisk::start_limited(root.to_path_buf(), fake.clone(), 0, handle, limits).unwrap()
}

/// The file's bytes as the log's writes make them, in log order.
fn written(fake: &Fake) -> Vec<u8> {
    let mut out = Vec::new();
    for op in fake.ops() {
        if let Op::Write { offset, data, .. } = op {
            let end = offset as usize + data.len();
            out.resize(out.len().max(end), 0);
            out[offset as usize..end].copy_from_slice(&data);
        }
    }
    out
}

/// `MAX_PENDING_BYTES` (small here): while the proposer cannot submit, a writer records until
/// the pending bytes reach the limit, then waits (recording nothing more) until the proposer
/// takes them; then it goes on, and every byte reaches the log in order.
#[test]
fn a_writer_waits_while_the_pending_bytes_are_at_the_limit() {
    const PIECE: usize = 1000;
    const PIECES: usize = 10;
    let limits = DiskLimits {
        pending_bytes: 4096,
        ..DiskLimits::default()
    };
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(Fake::default());
    fake.submit_held.store(true, Ordering::SeqCst);
    let disk = start_limited(&fake, dir.path(), &rt, limits);
    let f = disk.open_rw(&dir.path().join("a"), true).unwrap();
    // The proposer took the create and waits in its submit: nothing pending now.
    wait_until("the first submit", || {
        fake.submits.load(Ordering::SeqCst) == 1
    });
    let writer = f.clone();
    let wrote = Arc::new(AtomicU64::new(0));
    let progress = wrote.clone();
    let writing = std::thread::spawn(move || {
        for i in 0..PIECES {
            let piece = vec![i as u8 + 1; PIECE];
            writer.write_all_at(&piece, (i * PIECE) as u64).unwrap();
            progress.fetch_add(1, Ordering::SeqCst);
        }
    });
    wait_until("the writer to wait or finish", || {
        disk.stats().writer_waits > 0 || writing.is_finished()
    });
    assert!(
        !writing.is_finished(),
        "all {PIECES} pieces recorded past a limit of {} pending bytes",
        limits.pending_bytes
    );
    {
        let st = super::lock(&disk.inner.state);
        // Merged into one write: its header, then the pieces; the last one crossed the limit.
        assert!(
            st.pending_bytes >= limits.pending_bytes,
            "{}",
            st.pending_bytes
        );
        assert!(
            st.pending_bytes < limits.pending_bytes + PIECE,
            "{}",
            st.pending_bytes
        );
        assert_eq!(st.recorded, 1 + wrote.load(Ordering::SeqCst));
    }
    assert_eq!(fake.submits.load(Ordering::SeqCst), 1);
    fake.submit_held.store(false, Ordering::SeqCst);
    writing.join().unwrap();
    f.sync_data().unwrap();
    let expected: Vec<u8> = (0..PIECES).flat_map(|i| vec![i as u8 + 1; PIECE]).collect();
    assert_eq!(written(&fake), expected);
}

/// `MAX_PROPOSALS_IN_FLIGHT` (2 here): while nothing commits, the proposer submits two
/// proposals and no third (what was recorded meanwhile waits, gathered); once commits
/// resume, everything commits, in the order it was recorded.
#[test]
fn no_more_proposals_than_the_limit_are_in_flight() {
    let limits = DiskLimits {
        proposals_in_flight: 2,
        ..DiskLimits::default()
    };
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(Fake::default());
    fake.held.store(true, Ordering::SeqCst);
    let disk = start_limited(&fake, dir.path(), &rt, limits);
    let f = disk.open_rw(&dir.path().join("a"), true).unwrap();
    let submits = || fake.submits.load(Ordering::SeqCst);
    wait_until("the create's proposal", || submits() == 1);
    f.write_all_at(b"1", 0).unwrap();
    wait_until("the first write's proposal", || submits() == 2);
    f.write_all_at(b"2", 1).unwrap();
    wait_until(
        "the proposer to wait for a slot, or a third proposal",
        || disk.stats().proposer_waits > 0 || submits() > 2,
    );
    f.write_all_at(b"3", 2).unwrap();
    f.write_all_at(b"4", 10).unwrap();
    assert_eq!(submits(), 2, "proposals submitted while none committed");
    assert_eq!(super::lock(&disk.inner.state).committed, 0);
    fake.held.store(false, Ordering::SeqCst);
    f.sync_data().unwrap();
    // The held writes went out together, after the two in flight.
    assert_eq!(fake.log.lock().unwrap().len(), 3);
    let mut expected = b"123".to_vec();
    expected.extend_from_slice(&[0; 7]);
    expected.push(b'4');
    assert_eq!(written(&fake), expected);
    assert!(matches!(fake.ops().first(), Some(Op::Create(_))));
    let st = super::lock(&disk.inner.state);
    assert_eq!(st.committed, st.recorded);
}

/// The committer is a task on the runtime: when that runtime goes away (a process shutting
/// down, a test's runtime dropped) with a proposal still uncommitted, the task is dropped, and
/// the disk fails with it (`FailWhenDone`), so a writer waiting in `sync` gets an error rather
/// than waiting forever. Seen hanging with the guard taken out.
#[test]
fn a_sync_fails_when_the_committers_runtime_goes_away() {
    let HeldWrite {
        fake,
        disk,
        file,
        dir: _dir,
        _rt: rt,
    } = held_write(b"orphaned");
    sync_fails_once_dropped(&fake, &disk, &file, rt);
}

/// The same when the committer's task is dropped before its first poll: on a current-thread
/// runtime nobody drives, the committer is spawned but never runs, and dropping the runtime
/// drops it unpolled. Its guard must be in the task's future from the start (as an argument),
/// not made in its body: made in the body, this test's sync waited forever, and the test
/// above failed about 1 run in 8 of this crate's tests in parallel (session 22).
#[test]
fn a_sync_fails_when_the_committer_is_dropped_before_it_ran() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(Fake::default());
    let disk = start(&fake, dir.path(), &rt);
    let file = disk.open_rw(&dir.path().join("a"), true).unwrap();
    file.write_all_at(b"never run", 0).unwrap();
    sync_fails_once_dropped(&fake, &disk, &file, rt);
}

/// Starts a sync of `file`, waits for its proposal's submission, drops `rt` (the
/// committer's runtime) and checks that the sync fails, and the disk with it.
fn sync_fails_once_dropped(
    fake: &Fake,
    disk: &ReplicatedDisk,
    file: &Arc<dyn VFile>,
    rt: tokio::runtime::Runtime,
) {
    let (tx, rx) = std::sync::mpsc::channel();
    let syncing = file.clone();
    std::thread::spawn(move || {
        let _ = tx.send(syncing.sync_data());
    });
    wait_until("the proposal submitted", || {
        fake.submits.load(Ordering::SeqCst) >= 1
    });
    drop(rt);
    let synced = rx.recv_timeout(Duration::from_secs(10));
    assert!(
        matches!(synced, Ok(Err(_))),
        "the sync must fail once its committer is gone: {synced:?}"
    );
    assert!(disk.failure().is_some());
}
