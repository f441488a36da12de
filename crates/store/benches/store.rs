//! Store benchmarks: append throughput under each sync policy and window of outstanding
//! appends, the same with tickets polled as futures, and expiry by age over whole blocks
//! (100k vs 1M records).
//! Run: `cargo bench -p tern-store --bench store`. The 1 GiB recovery figure comes from
//! `cargo run --release -p tern-store --example recovery_1gib`.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use criterion::{
    BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group, criterion_main,
};
use tern_store::{Limits, Store, StreamConfig, SyncPolicy};

fn appends(c: &mut Criterion) {
    let mut g = c.benchmark_group("append");
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(2));
    g.sample_size(10);
    g.throughput(Throughput::Elements(1));
    let cases: &[(&str, SyncPolicy, usize)] = &[
        ("always/1", SyncPolicy::Always, 1),
        ("always/16", SyncPolicy::Always, 16),
        ("always/256", SyncPolicy::Always, 256),
        ("never/256", SyncPolicy::Never, 256),
        ("never/4096", SyncPolicy::Never, 4096),
    ];
    for &size in &[64usize, 1024] {
        for &(name, sync, window) in cases {
            let dir = tempfile::tempdir().unwrap();
            let store = Store::open(dir.path()).unwrap();
            let s = store
                .stream(
                    "b",
                    StreamConfig {
                        sync,
                        limits: Limits {
                            max_bytes: Some(256 << 20),
                            ..Default::default()
                        },
                        ..Default::default()
                    },
                )
                .unwrap();
            let payload = vec![0xabu8; size];
            g.bench_function(BenchmarkId::new(format!("{size}B"), name), |b| {
                b.iter_custom(|iters| {
                    let mut pending = VecDeque::with_capacity(window);
                    let start = Instant::now();
                    for _ in 0..iters {
                        if pending.len() == window {
                            let t: tern_store::Ticket = pending.pop_front().unwrap();
                            t.wait().unwrap();
                        }
                        pending.push_back(s.append(b"bench/topic", b"", &payload).unwrap());
                    }
                    if let Some(t) = pending.pop_back() {
                        t.wait().unwrap();
                    }
                    start.elapsed()
                });
            });
        }
    }
    // The broker's shape: many connections, each with a few acks outstanding.
    let threads = 16usize;
    let per_thread_window = 16usize;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let s = store
        .stream(
            "mp",
            StreamConfig {
                limits: Limits {
                    max_bytes: Some(256 << 20),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .unwrap();
    g.bench_function(BenchmarkId::new("64B", "always/16x16-threads"), |b| {
        b.iter_custom(|iters| {
            let per = iters.div_ceil(threads as u64);
            let start = Instant::now();
            std::thread::scope(|sc| {
                for _ in 0..threads {
                    let s = s.clone();
                    sc.spawn(move || {
                        let payload = [0xabu8; 64];
                        let mut pending = VecDeque::with_capacity(per_thread_window);
                        for _ in 0..per {
                            if pending.len() == per_thread_window {
                                let t: tern_store::Ticket = pending.pop_front().unwrap();
                                t.wait().unwrap();
                            }
                            pending.push_back(s.append(b"bench/topic", b"", &payload).unwrap());
                        }
                        for t in pending {
                            t.wait().unwrap();
                        }
                    });
                }
            });
            start.elapsed()
        });
    });
    g.finish();
}

/// Wakes the benchmark's thread (a `Ticket` polled as a future, as the broker's tasks do).
struct Unpark(std::thread::Thread);

impl std::task::Wake for Unpark {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.unpark();
    }
}

/// Polls `t` from the thread's task until it completes, parking between wakes.
fn poll_until_done(t: &mut tern_store::Ticket, cx: &mut std::task::Context<'_>) {
    use std::future::Future;
    while std::pin::Pin::new(&mut *t).poll(cx).is_pending() {
        std::thread::park();
    }
}

/// The ticket's async path (simulation finding 9): every append's ticket polled once while
/// pending, which registers its waker with the stream, and the oldest awaited by polling.
/// `never` keeps the fdatasync out, so the waker bookkeeping is a visible share of the cost.
fn polled_tickets(c: &mut Criterion) {
    let mut g = c.benchmark_group("polled");
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(2));
    g.sample_size(10);
    g.throughput(Throughput::Elements(1));
    for &(name, sync, window) in &[
        ("never/256", SyncPolicy::Never, 256usize),
        ("always/16", SyncPolicy::Always, 16),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let s = store
            .stream(
                "p",
                StreamConfig {
                    sync,
                    limits: Limits {
                        max_bytes: Some(256 << 20),
                        ..Default::default()
                    },
                    ..Default::default()
                },
            )
            .unwrap();
        let waker = std::task::Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
        g.bench_function(BenchmarkId::new("64B", name), |b| {
            b.iter_custom(|iters| {
                use std::future::Future;
                let mut cx = std::task::Context::from_waker(&waker);
                let payload = [0xabu8; 64];
                let mut pending = VecDeque::with_capacity(window);
                let start = Instant::now();
                for _ in 0..iters {
                    if pending.len() == window {
                        let mut t: tern_store::Ticket = pending.pop_front().unwrap();
                        poll_until_done(&mut t, &mut cx);
                    }
                    let mut t = s.append(b"bench/topic", b"", &payload).unwrap();
                    let _ = std::pin::Pin::new(&mut t).poll(&mut cx);
                    pending.push_back(t);
                }
                for mut t in pending {
                    poll_until_done(&mut t, &mut cx);
                }
                start.elapsed()
            });
        });
    }
    g.finish();
}

/// A stream of `n` old records in sealed blocks plus one fresh record.
fn expiry_setup(n: u64, payload_bytes: usize) -> (tempfile::TempDir, Store, tern_store::Stream) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    // Interval sync keeps the setup fast while leaving the blocks written back, as they
    // are in a stream running with `always`.
    let cfg = StreamConfig {
        sync: SyncPolicy::Interval(Duration::from_millis(5)),
        limits: Limits {
            max_age: Some(Duration::from_secs(60)),
            ..Default::default()
        },
        expire_interval: Duration::from_secs(3600),
        ..Default::default()
    };
    let s = store.stream("e", cfg).unwrap();
    let payload = vec![7u8; payload_bytes];
    for i in 0..n {
        let topic = format!("dev/{}", i % 100);
        drop(s.append_at(i, topic.as_bytes(), b"", &payload).unwrap());
    }
    s.seal().unwrap();
    s.append_at(1_000_000_000_000, b"dev/new", b"", &payload)
        .unwrap()
        .wait()
        .unwrap();
    (dir, store, s)
}

fn expiry(c: &mut Criterion) {
    let mut g = c.benchmark_group("expire_by_age");
    g.sampling_mode(SamplingMode::Flat);
    g.sample_size(10);
    g.warm_up_time(Duration::from_millis(1));
    g.measurement_time(Duration::from_millis(1));
    // 1M x 64 B and 100k x 1 KiB fill about the same number of 4 MiB blocks (26): if the
    // cost follows blocks, those two take about the same time; 100k x 64 B is 3 blocks.
    for &(name, n, payload) in &[
        ("100000x64B", 100_000u64, 64usize),
        ("1000000x64B", 1_000_000, 64),
        ("100000x1KiB", 100_000, 1024),
    ] {
        g.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let (dir, store, s) = expiry_setup(n, payload);
                    let blocks = s.info().blocks;
                    let start = Instant::now();
                    let r = s.expire(1_000_000_000_000).unwrap();
                    total += start.elapsed();
                    assert_eq!(r.records, n);
                    assert_eq!(s.info().blocks, 1, "{blocks} blocks before");
                    if std::env::var_os("TERN_BENCH_VERBOSE").is_some() {
                        eprintln!("{name}: {} blocks expired", blocks - 1);
                    }
                    drop((s, store, dir));
                }
                total
            });
        });
    }
    g.finish();
}

/// The machine's own cost of one 64-byte append plus `fdatasync`, to read the figures above
/// against: no store can commit faster than this per group.
fn baseline(c: &mut Criterion) {
    use std::io::Write;
    let mut g = c.benchmark_group("baseline");
    g.warm_up_time(Duration::from_millis(300));
    g.measurement_time(Duration::from_secs(2));
    g.sample_size(10);
    let dir = tempfile::tempdir().unwrap();
    let mut f = std::fs::File::create(dir.path().join("f")).unwrap();
    g.bench_function("write64+fdatasync", |b| {
        b.iter(|| {
            f.write_all(&[1u8; 64]).unwrap();
            f.sync_data().unwrap();
        })
    });
    g.finish();
}

criterion_group!(benches, baseline, appends, polled_tickets, expiry);
criterion_main!(benches);
