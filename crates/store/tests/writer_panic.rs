//! A writer thread that panics in the middle of a turn (a bug) fails its stream: every
//! caller waiting on it gets an error, none waits forever. The tickets of records it was
//! writing, and an op (a removal) queued behind the turn, which only the writer answers.

use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use tern_store::vfs::FaultyVfs;
use tern_store::{Store, StreamConfig};

/// Long enough that only a caller left waiting for good reaches it.
const GIVE_UP: Duration = Duration::from_secs(20);

#[test]
fn a_writer_that_panics_answers_its_queued_ops_and_tickets_with_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let vfs = FaultyVfs::default();
    let store = Store::open_with_vfs(dir.path(), Arc::new(vfs.clone())).expect("open");
    let s = store.stream("s", StreamConfig::default()).expect("stream");
    s.append(b"t", b"", b"before")
        .expect("append")
        .wait()
        .expect("durable before the fault");

    let release = vfs.panic_in_next_sync();
    // The writer takes this record and blocks in its sync...
    let ticket = s.append(b"t", b"", b"in the turn").expect("append");
    // ...while a removal queues behind the turn and waits for the writer's reply.
    let (done_tx, done_rx) = mpsc::channel();
    // Not a scoped thread: a removal left waiting for good must not hold up the test's end.
    let remover = s.clone();
    std::thread::spawn(move || {
        let _ = done_tx.send(remover.delete(&[1]).map(|_| ()));
    });
    // Premise: the removal is queued (not refused) before the writer dies. A removal that
    // came after would be refused at once, and the test would prove less.
    let deadline = std::time::Instant::now() + GIVE_UP;
    while s.queued_ops() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "premise: the removal was never queued"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        done_rx.try_recv().is_err(),
        "premise: the removal waits for the writer"
    );
    let _ = release.send(());
    let removal = done_rx
        .recv_timeout(GIVE_UP)
        .expect("the removal still waits after the writer panicked");
    assert!(removal.is_err(), "a removal after the panic: {removal:?}");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(ticket.wait().map(|_| ()));
    });
    let written = rx
        .recv_timeout(GIVE_UP)
        .expect("the ticket still waits after the writer panicked");
    assert!(
        written.is_err(),
        "the record of the panicked turn: {written:?}"
    );
    let after = s.append(b"t", b"", b"after").and_then(|t| t.wait());
    assert!(after.is_err(), "an append to the failed stream: {after:?}");
}
