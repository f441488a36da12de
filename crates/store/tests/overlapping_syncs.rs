//! The writer on a file system whose syncs overlap (`VFile::start_sync`, as a replicated
//! disk's): it writes the next batch while the last one's sync runs. A ticket must still
//! complete only after a sync covering its record returned `Ok`, in order, and a failed
//! sync must fail every ticket behind it: checked here by reopening on the real file
//! system, which serves only what reached the file and survived the failure's cut-back.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tern_store::vfs::FaultyVfs;
use tern_store::{MAX_SYNCS_IN_FLIGHT, Store, StreamConfig};

fn cfg() -> StreamConfig {
    StreamConfig {
        // Small blocks: rolls (which settle every sync in flight) come every few turns.
        block_size_bytes: 16 * 1024,
        ..Default::default()
    }
}

const THREADS: u32 = 4;
const PER_THREAD: u32 = 1500;
const WINDOW: usize = 32;

/// Outcome per sequence: the payload of an acknowledged append, or `None` for a failed one.
type Outcomes = BTreeMap<u64, Option<Vec<u8>>>;

/// `THREADS` appenders, each with `WINDOW` appends outstanding; a deleter removes some
/// acknowledged records as it goes (ops between pipelined turns); the `fail_sync_after`th
/// sync from then on fails. Returns every outcome and
/// the sequences deleted.
fn load(
    vfs: &FaultyVfs,
    dir: &std::path::Path,
    fail_sync_after: Option<u64>,
) -> (Outcomes, Vec<u64>) {
    let store = Store::open_with_vfs(dir, Arc::new(vfs.clone())).expect("open");
    let s = store.stream("s", cfg()).expect("stream");
    if let Some(n) = fail_sync_after {
        vfs.fail_sync_after(n);
    }
    let outcomes = Arc::new(Mutex::new(Outcomes::new()));
    let deleted = Arc::new(Mutex::new(Vec::new()));
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (s, outcomes) = (&s, outcomes.clone());
            scope.spawn(move || {
                let mut i = 0;
                while i < PER_THREAD {
                    let mut window = Vec::new();
                    for _ in 0..WINDOW.min((PER_THREAD - i) as usize) {
                        let payload = format!("{t}:{i}").into_bytes();
                        window.push((s.append(b"t", b"", &payload), payload));
                        i += 1;
                    }
                    for (ticket, payload) in window {
                        let Ok(ticket) = ticket else { continue };
                        let seq = ticket.seq();
                        let ok = ticket.wait().is_ok();
                        outcomes.lock().unwrap().insert(seq, ok.then_some(payload));
                    }
                }
            });
        }
        let (s, outcomes, deleted) = (&s, outcomes.clone(), deleted.clone());
        scope.spawn(move || {
            for _ in 0..40 {
                std::thread::sleep(std::time::Duration::from_millis(2));
                let victim = outcomes
                    .lock()
                    .unwrap()
                    .iter()
                    .rev()
                    .find(|(seq, ok)| ok.is_some() && *seq % 7 == 0)
                    .map(|(seq, _)| *seq);
                if let Some(seq) = victim
                    && s.delete(&[seq]).is_ok()
                {
                    deleted.lock().unwrap().push(seq);
                }
            }
        });
    });
    if fail_sync_after.is_some() {
        // The premise: some sync after the arming failed, and so the stream.
        assert!(s.info().failed, "no sync failed");
    }
    let outcomes = std::mem::take(&mut *outcomes.lock().unwrap());
    let deleted = std::mem::take(&mut *deleted.lock().unwrap());
    (outcomes, deleted)
}

/// Reopens on the real file system: every acknowledged record that was not deleted is
/// there with its payload, every deleted one is gone.
fn check_reopened(dir: &std::path::Path, outcomes: &Outcomes, deleted: &[u64]) {
    let store = Store::open(dir).expect("reopen");
    let s = store.stream("s", cfg()).expect("stream");
    for (seq, payload) in outcomes {
        let Some(payload) = payload else { continue };
        let got = s.get(*seq).expect("read");
        if deleted.contains(seq) {
            assert!(got.is_none(), "deleted {seq} is back after a reopen");
        } else {
            let r = got.unwrap_or_else(|| panic!("acknowledged {seq} lost"));
            assert_eq!(&r.payload[..], &payload[..], "seq {seq}");
        }
    }
}

#[test]
fn overlapping_syncs_lose_nothing_acknowledged_and_really_overlap() {
    let dir = tempfile::tempdir().unwrap();
    let vfs = FaultyVfs::default();
    vfs.overlap_syncs();
    let (outcomes, deleted) = load(&vfs, dir.path(), None);
    assert_eq!(outcomes.len(), (THREADS * PER_THREAD) as usize);
    assert!(outcomes.values().all(Option::is_some), "a ticket failed");
    assert!(!deleted.is_empty(), "the deleter never ran between turns");
    // The premise: the writer did keep two syncs running at once.
    assert!(
        vfs.max_syncs_in_flight() >= 2,
        "no two syncs overlapped (max {})",
        vfs.max_syncs_in_flight()
    );
    // The limit: a writer never runs more than its named number of syncs at once.
    assert!(
        vfs.max_syncs_in_flight() <= MAX_SYNCS_IN_FLIGHT as u64,
        "{} syncs in flight at once",
        vfs.max_syncs_in_flight()
    );
    check_reopened(dir.path(), &outcomes, &deleted);
}

#[test]
fn a_failed_overlapping_sync_fails_every_ticket_behind_it_and_loses_nothing_acknowledged() {
    for fail_after in [3, 17, 40, 90] {
        let dir = tempfile::tempdir().unwrap();
        let vfs = FaultyVfs::default();
        vfs.overlap_syncs();
        let (outcomes, deleted) = load(&vfs, dir.path(), Some(fail_after));
        // A sync with no ticket behind it may be the one that fails (a deletion's, once the
        // appenders are done): then every later append is refused at once, not by a ticket.
        let first_failed = outcomes
            .iter()
            .find(|(_, ok)| ok.is_none())
            .map_or(u64::MAX, |(seq, _)| *seq);
        let last_acked = outcomes
            .iter()
            .rev()
            .find(|(_, ok)| ok.is_some())
            .map_or(0, |(seq, _)| *seq);
        // Tickets complete in order: nothing after a failed one was acknowledged.
        assert!(
            last_acked < first_failed,
            "fail_after {fail_after}: {last_acked} acknowledged after {first_failed} failed"
        );
        check_reopened(dir.path(), &outcomes, &deleted);
    }
}
