//! Stepped writers (`SimConfig::stepped_writers`, issue 12): with them a store runs no
//! thread of its own, every writer turn runs when the caller steps it (or blocks on it), and
//! time is the simulated disk's clock, so a workload replays call for call from its seed.
//!
//! - `stepped_workload_replays_exactly`: several streams, interleaved appends, deletes and
//!   removals that roll and free blocks, retention by count and by age on the virtual clock,
//!   a power loss and a reopen: two runs of a seed give the same disk history
//!   (`trace_digest`) and read back the same records.
//! - `threaded_workload_still_holds`: the same workload with writer threads keeps its
//!   promises. Its digests are printed: they differ from run to run (scheduling decides
//!   group commits and the order of calls across streams), which is what stepping removes.
//! - `one_thread_never_blocks`: a full queue, a flush, a blocking ticket under an interval
//!   policy, a removal and a close all complete on one thread with nobody stepping, and an
//!   async ticket stays pending until a step completes it.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tern_store::sim::{SimConfig, SimDisk, SimRng};
use tern_store::{FilterSet, Limits, NewRecord, Store, Stream, StreamConfig, SyncPolicy, Ticket};

/// Virtual time at the start of a run, ns since the epoch.
const T0_NS: u64 = 1_700_000_000_000_000_000;
const MAX_AGE: Duration = Duration::from_millis(400);
const STEPS: usize = 600;
/// The step at which the power fails.
const POWER_LOSS_AT: usize = 350;
const TOPICS: [&str; 3] = ["a/x", "a/y", "b"];

fn configs() -> Vec<(&'static str, StreamConfig)> {
    let base = StreamConfig {
        block_size_bytes: 4096,
        // Short in real time too, so writer threads look at the virtual clock often.
        expire_interval: Duration::from_millis(50),
        ..Default::default()
    };
    vec![
        // No limits: everything acknowledged and not removed must be read back.
        (
            "plain",
            StreamConfig {
                sync: SyncPolicy::Always,
                ..base.clone()
            },
        ),
        (
            "aged",
            StreamConfig {
                sync: SyncPolicy::Interval(Duration::from_millis(20)),
                limits: Limits {
                    max_age: Some(MAX_AGE),
                    ..Default::default()
                },
                ..base.clone()
            },
        ),
        (
            "capped",
            StreamConfig {
                sync: SyncPolicy::Never,
                limits: Limits {
                    max_msgs: Some(60),
                    ..Default::default()
                },
                ..base
            },
        ),
    ]
}

/// What a run leaves: the disk's history and every stream's records.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    digest: u64,
    /// Per stream: (seq, time, topic, payload) of every record read back.
    records: BTreeMap<String, Vec<(u64, u64, String, String)>>,
}

struct Run {
    rng: SimRng,
    disk: SimDisk,
    clock: Arc<AtomicU64>,
    store: Option<Store>,
    streams: Vec<Stream>,
    tickets: Vec<(usize, Ticket)>,
    /// Payload of every record of `plain` acknowledged, by seq, minus removals.
    acked_plain: BTreeMap<u64, String>,
    /// Removals asked of `plain` (deleted seqs, highest floor), also for records whose
    /// ticket completes later.
    deleted_plain: BTreeSet<u64>,
    floor_plain: u64,
    /// Payload last appended under each seq, per stream (for read-back checks).
    appended: Vec<BTreeMap<u64, String>>,
    n: u64,
}

impl Run {
    fn new(seed: u64, root: &std::path::Path, stepped: bool) -> Run {
        let disk = SimDisk::new(
            root,
            seed,
            SimConfig {
                stepped_writers: stepped,
                ..SimConfig::default()
            },
        );
        let clock = Arc::new(AtomicU64::new(T0_NS));
        let c = clock.clone();
        disk.set_clock(Arc::new(move || c.load(Ordering::SeqCst)));
        let mut run = Run {
            rng: SimRng::new(seed),
            disk,
            clock,
            store: None,
            streams: Vec::new(),
            tickets: Vec::new(),
            acked_plain: BTreeMap::new(),
            deleted_plain: BTreeSet::new(),
            floor_plain: 0,
            appended: vec![BTreeMap::new(); 3],
            n: 0,
        };
        run.open(root);
        run
    }

    fn open(&mut self, root: &std::path::Path) {
        let store = Store::open_with_vfs(root, self.disk.vfs()).expect("open store");
        self.streams = configs()
            .into_iter()
            .map(|(name, cfg)| store.stream(name, cfg).expect("open stream"))
            .collect();
        self.store = Some(store);
    }

    fn store(&self) -> &Store {
        self.store.as_ref().expect("open")
    }

    fn append(&mut self, i: usize) {
        let topic = *self.rng.pick(&TOPICS);
        self.n += 1;
        let payload = format!("{i}-{}", self.n);
        let t = if self.rng.chance(0.2) {
            let p2 = format!("{payload}b");
            let t = self.streams[i]
                .append_batch(&[
                    NewRecord {
                        topic: topic.as_bytes(),
                        payload: payload.as_bytes(),
                        ..Default::default()
                    },
                    NewRecord {
                        topic: b"b",
                        payload: p2.as_bytes(),
                        ..Default::default()
                    },
                ])
                .expect("append batch");
            self.appended[i].insert(t.seq(), p2);
            self.appended[i].insert(t.first_seq(), payload);
            t
        } else {
            let t = self.streams[i]
                .append(topic.as_bytes(), b"", payload.as_bytes())
                .expect("append");
            self.appended[i].insert(t.seq(), payload);
            t
        };
        self.tickets.push((i, t));
    }

    /// Collects the tickets that completed; with `wait`, waits for all of them.
    fn settle(&mut self, wait: bool) {
        if wait {
            // A flush syncs now; a ticket alone would wait for the `aged` stream's interval
            // timer, which with writer threads fires only once the virtual clock moves.
            for s in &self.streams {
                s.flush().expect("flush");
            }
        }
        for (i, t) in std::mem::take(&mut self.tickets) {
            let first = t.first_seq();
            let r = if wait || t.is_done() {
                Some(t.wait())
            } else {
                self.tickets.push((i, t));
                None
            };
            if let (0, Some(r)) = (i, r) {
                let seq = r.expect("plain: append failed");
                for s in first..=seq {
                    if s < self.floor_plain || self.deleted_plain.contains(&s) {
                        continue;
                    }
                    if let Some(p) = self.appended[0].get(&s) {
                        self.acked_plain.entry(s).or_insert_with(|| p.clone());
                    }
                }
            }
        }
    }

    fn remove(&mut self, i: usize) {
        let s = &self.streams[i];
        let info = s.info();
        let (Some(first), Some(last)) = (info.first_seq, info.last_seq) else {
            return;
        };
        if self.rng.chance(0.5) {
            let seqs: Vec<u64> = (0..3).map(|_| self.rng.range(first, last)).collect();
            s.delete(&seqs).expect("delete");
            if i == 0 {
                for q in &seqs {
                    self.acked_plain.remove(q);
                }
                self.deleted_plain.extend(seqs);
            }
        } else {
            let floor = first + (last - first) / 3;
            s.remove_below(floor).expect("remove_below");
            if i == 0 {
                self.acked_plain.retain(|&q, _| q >= floor);
                self.floor_plain = self.floor_plain.max(floor);
            }
        }
    }

    /// One step of the workload: what it does depends only on the seed.
    fn step(&mut self, k: usize, root: &std::path::Path) {
        if k == POWER_LOSS_AT {
            self.settle(true);
            // A few appends the power loss may take.
            for i in 0..3 {
                self.append(i);
            }
            self.disk.power_loss();
            self.tickets.clear();
            self.streams.clear();
            self.store = None;
            // `plain` syncs every commit: what it acknowledged survives the power loss.
            self.open(root);
            return;
        }
        let i = self.rng.below(3) as usize;
        match self.rng.below(100) {
            0..60 => self.append(i),
            60..70 => self.remove(i),
            70..80 => {
                self.clock
                    .fetch_add(self.rng.range(1, 100) * 1_000_000, Ordering::SeqCst);
            }
            80..85 => self.streams[i].flush().expect("flush"),
            85..90 => self.settle(true),
            _ => {
                // Stepped: turns run here. Threaded: nothing to do, writers run by themselves.
                while self.store().step() {}
                self.settle(false);
            }
        }
    }

    fn finish(mut self) -> Outcome {
        self.settle(true);
        for s in &self.streams {
            s.flush().expect("final flush");
        }
        let mut records = BTreeMap::new();
        for (i, s) in self.streams.iter().enumerate() {
            let b = s
                .read_from(0, &FilterSet::new(["#"]), 100_000, usize::MAX)
                .expect("read");
            let got: Vec<(u64, u64, String, String)> = b
                .records
                .iter()
                .map(|r| {
                    let p = String::from_utf8_lossy(&r.payload).into_owned();
                    (
                        r.seq,
                        r.time_ns,
                        String::from_utf8_lossy(&r.topic).into_owned(),
                        p,
                    )
                })
                .collect();
            for (seq, _, _, p) in &got {
                assert_eq!(
                    self.appended[i].get(seq),
                    Some(p),
                    "{}: record {seq} is not what was appended",
                    s.name()
                );
            }
            if i == 0 {
                let seqs: Vec<u64> = got.iter().map(|r| r.0).collect();
                for q in self.acked_plain.keys() {
                    assert!(
                        seqs.binary_search(q).is_ok(),
                        "plain: acknowledged record {q} is gone"
                    );
                }
            }
            records.insert(s.name().to_string(), got);
        }
        Outcome {
            digest: self.disk.trace_digest(),
            records,
        }
    }
}

fn workload(seed: u64, stepped: bool) -> Outcome {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut run = Run::new(seed, dir.path(), stepped);
    for k in 0..STEPS {
        run.step(k, dir.path());
    }
    let aged_before = run.streams[1].info().msgs;
    // Past max_age and the expiry timer: the next turns expire the whole `aged` stream.
    run.clock.fetch_add(
        2 * u64::try_from(MAX_AGE.as_nanos()).expect("small"),
        Ordering::SeqCst,
    );
    if stepped {
        assert!(run.store().step(), "a due expiry timer is work for step");
        while run.store().step() {}
        assert_eq!(run.store().next_timer_ns(), {
            let t = run.clock.load(Ordering::SeqCst);
            Some(t + 50_000_000)
        });
        assert!(aged_before > 0, "the workload left nothing to expire");
        assert_eq!(
            run.streams[1].info().msgs,
            0,
            "max_age on the virtual clock"
        );
    }
    run.finish()
}

#[test]
fn stepped_workload_replays_exactly() {
    let mut digests = BTreeSet::new();
    for seed in [1, 7, 42] {
        let a = workload(seed, true);
        let b = workload(seed, true);
        assert!(
            !a.records["plain"].is_empty(),
            "seed {seed}: nothing read back"
        );
        assert_eq!(a, b, "seed {seed} did not replay");
        digests.insert(a.digest);
    }
    assert_eq!(digests.len(), 3, "different seeds, different histories");
}

#[test]
fn threaded_workload_still_holds() {
    for run in 0..3 {
        let o = workload(7, false);
        eprintln!("threaded run {run}: digest {:#018x}", o.digest);
    }
}

#[test]
fn one_thread_never_blocks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let disk = SimDisk::new(
        dir.path(),
        3,
        SimConfig {
            stepped_writers: true,
            ..SimConfig::default()
        },
    );
    let store = Store::open_with_vfs(dir.path(), disk.vfs()).expect("open");
    let s = store
        .stream(
            "s",
            StreamConfig {
                block_size_bytes: 4096,
                max_queue_bytes: 4096,
                sync: SyncPolicy::Interval(Duration::from_secs(3600)),
                ..Default::default()
            },
        )
        .expect("stream");
    assert!(!store.step(), "nothing to do yet");
    // No thread takes records off the queue: they wait for a step.
    let first = s.append(b"t", b"", &[1; 100]).expect("append");
    assert_eq!(s.info().written_seq, 0);
    let mut fut = pin!(first);
    let mut cx = Context::from_waker(Waker::noop());
    assert!(fut.as_mut().poll(&mut cx).is_pending());
    // Far past the queue's 4 KiB: full queues run turns on this thread.
    let payload = [7u8; 1000];
    let mut last = None;
    for _ in 0..200 {
        last = Some(
            s.append(b"t", b"", &payload)
                .expect("append past a full queue"),
        );
    }
    let last = last.expect("appended");
    assert!(
        s.info().written_seq > 150,
        "the full queue was written inline"
    );
    assert!(s.info().blocks > 1, "the appends rolled blocks");
    // Under a one-hour interval policy nothing is durable until a sync: a blocking wait
    // forces one instead of waiting for a timer that only the clock can move.
    assert!(s.durable_seq() < last.seq());
    let seq = last.seq();
    assert_eq!(last.wait().expect("wait"), seq);
    assert!(fut.as_mut().poll(&mut cx).is_ready());
    // An async ticket stays pending until a step completes it.
    let t = s.append(b"t", b"", b"x").expect("append");
    let mut fut = pin!(t);
    assert!(fut.as_mut().poll(&mut cx).is_pending());
    assert!(store.step());
    // Written, not synced: the interval's timer is an hour away.
    assert!(fut.as_mut().poll(&mut cx).is_pending());
    s.flush().expect("flush");
    assert!(matches!(fut.as_mut().poll(&mut cx), Poll::Ready(Ok(_))));
    // A removal that frees blocks, then a ticket no turn can complete.
    s.remove_below(seq).expect("remove_below");
    assert!(s.info().blocks < 3);
    let future = s.ticket_for(s.next_seq() + 5);
    assert!(matches!(
        future.wait(),
        Err(tern_store::StoreError::Stalled { .. })
    ));
    // Queued work is written when the last handle goes, with no thread to join.
    let t = s.append(b"t", b"", b"last").expect("append");
    let seq = t.seq();
    drop(s);
    assert_eq!(t.wait().expect("closed stream wrote its queue"), seq);
    drop(store);
    let store = Store::open_with_vfs(dir.path(), disk.vfs()).expect("reopen");
    let s = store.stream("s", StreamConfig::default()).expect("stream");
    assert_eq!(s.info().last_seq, Some(seq));
}
