//! Matching, subscribing and unsubscribing against a trie of 100,000 subscriptions with
//! realistic shapes. Results and the command are recorded in BENCHMARKS.md.
//!
//! Times are the benchmark thread's CPU time by default, not wall time: the machine is a
//! shared 2-core VM where other builds otherwise inflate results several-fold. Set
//! `TERN_BENCH_CLOCK=wall` for wall-clock time.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{Criterion, criterion_group, criterion_main};
use tern_topic::{Match, SubscriptionTrie};

const SUBSCRIPTIONS: usize = 100_000;
const SITES: u64 = 100;
const DEVICES: u64 = 1_000;
const METRICS: [&str; 4] = ["temp", "humidity", "status", "battery"];
const TOPICS: usize = 4_096;

/// Thread CPU time or wall time, chosen once by `TERN_BENCH_CLOCK`.
struct Clock {
    cpu: bool,
    origin: Instant,
}

static WALL_TIME: WallTime = WallTime;

impl Clock {
    fn from_env() -> Self {
        Clock {
            cpu: std::env::var("TERN_BENCH_CLOCK").map_or(true, |v| v != "wall"),
            origin: Instant::now(),
        }
    }

    fn now(&self) -> Duration {
        if !self.cpu {
            return self.origin.elapsed();
        }
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant Linux
        // supports. No benchmark justifies this: it is the measuring instrument itself.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
        Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    }
}

impl Measurement for Clock {
    type Intermediate = Duration;
    type Value = Duration;
    fn start(&self) -> Duration {
        self.now()
    }
    fn end(&self, start: Duration) -> Duration {
        self.now().saturating_sub(start)
    }
    fn add(&self, a: &Duration, b: &Duration) -> Duration {
        *a + *b
    }
    fn zero(&self) -> Duration {
        Duration::ZERO
    }
    fn to_f64(&self, value: &Duration) -> f64 {
        value.as_nanos() as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        WALL_TIME.formatter()
    }
}

/// Counts live heap bytes so that the benchmark can report the trie's memory.
struct CountingAlloc;

static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only adds a relaxed counter.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAlloc = CountingAlloc;

/// What a broker would store per subscription (v5 subscription options + identifier).
#[derive(Clone, Copy)]
#[allow(dead_code)] // Fields are payload for the benchmark, never read.
struct Options {
    qos: u8,
    no_local: bool,
    retain_as_published: bool,
    subscription_id: Option<u32>,
}

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The mix: 60% exact, 20% `site/+/device/{d}/#`, 10% `site/{s}/device/{d}/+`,
/// 8% `site/{s}/device/+/{m}`, 2% `site/{s}/#`.
fn filter(rng: &mut Rng) -> String {
    let s = rng.below(SITES);
    let d = rng.below(DEVICES);
    let m = METRICS[rng.below(METRICS.len() as u64) as usize];
    match rng.below(100) {
        0..60 => format!("site/{s}/device/{d}/{m}"),
        60..80 => format!("site/+/device/{d}/#"),
        80..90 => format!("site/{s}/device/{d}/+"),
        90..98 => format!("site/{s}/device/+/{m}"),
        _ => format!("site/{s}/#"),
    }
}

fn options(key: u64) -> Options {
    Options {
        qos: (key % 3) as u8,
        no_local: false,
        retain_as_published: key % 2 == 0,
        subscription_id: Some(key as u32),
    }
}

fn build_trie(with_share_groups: bool) -> SubscriptionTrie<u64, Options> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut trie = SubscriptionTrie::new();
    for key in 0..SUBSCRIPTIONS as u64 {
        // A few hundred share groups ride along, as a broker would have them.
        if with_share_groups && key % 200 == 0 {
            let s = rng.below(SITES);
            trie.subscribe_shared("workers", &format!("site/{s}/#"), key, options(key))
                .expect("valid filter");
        } else {
            trie.subscribe(&filter(&mut rng), key, options(key))
                .expect("valid filter");
        }
    }
    trie
}

fn topics() -> Vec<String> {
    let mut rng = Rng(42);
    (0..TOPICS)
        .map(|_| {
            let s = rng.below(SITES);
            let d = rng.below(DEVICES);
            let m = METRICS[rng.below(METRICS.len() as u64) as usize];
            format!("site/{s}/device/{d}/{m}")
        })
        .collect()
}

fn count_matches(trie: &SubscriptionTrie<u64, Options>, topic: &str) -> usize {
    let mut count = 0usize;
    trie.for_each_match(topic, |m| match m {
        Match::Subscription { value, .. } => {
            black_box(value);
            count += 1;
        }
        Match::Shared(group) => {
            black_box(group.next_member());
            count += 1;
        }
    });
    count
}

fn bench_match(c: &mut Criterion<Clock>) {
    let before_bytes = LIVE_BYTES.load(Ordering::Relaxed);
    let trie = build_trie(true);
    let trie_bytes = LIVE_BYTES.load(Ordering::Relaxed) - before_bytes;
    let topics = topics();
    let total: usize = topics.iter().map(|t| count_matches(&trie, t)).sum();
    eprintln!(
        "trie: {} subscriptions, {} nodes, {:.1} MiB heap ({} bytes per subscription), \
         {:.1} matches per topic on average",
        trie.len(),
        trie.node_count(),
        trie_bytes as f64 / (1024.0 * 1024.0),
        trie_bytes / trie.len(),
        total as f64 / topics.len() as f64
    );
    let mut group = c.benchmark_group("match_100k");
    let mut i = 0;
    group.bench_function("device_topic", |b| {
        b.iter(|| {
            i = (i + 1) % topics.len();
            count_matches(&trie, black_box(&topics[i]))
        })
    });
    // Same mix without share groups.
    let plain_trie = build_trie(false);
    let mut n = 0;
    group.bench_function("device_topic_no_groups", |b| {
        b.iter(|| {
            n = (n + 1) % topics.len();
            count_matches(&plain_trie, black_box(&topics[n]))
        })
    });
    // One filter with 10,000 subscribers (a broadcast topic): the cost of visiting them.
    let mut broadcast: SubscriptionTrie<u64, Options> = SubscriptionTrie::new();
    for key in 0..10_000 {
        broadcast
            .subscribe("fleet/broadcast/#", key, options(key))
            .expect("valid filter");
    }
    group.bench_function("fan_out_10k", |b| {
        b.iter(|| count_matches(&broadcast, black_box("fleet/broadcast/firmware")))
    });
    group.bench_function("no_match_topic", |b| {
        b.iter(|| count_matches(&trie, black_box("plant/7/line/3/speed")))
    });
    group.bench_function("sys_topic", |b| {
        b.iter(|| count_matches(&trie, black_box("$SYS/broker/clients/connected")))
    });
    group.finish();
}

/// Filters not yet in the trie, built before the clock starts.
fn fresh_filters(count: u64, salt: u64) -> Vec<String> {
    (0..count)
        .map(|i| format!("site/{}/device/{}/extra{salt}_{i}", i % SITES, i % DEVICES))
        .collect()
}

fn bench_subscribe(c: &mut Criterion<Clock>) {
    let clock = Clock::from_env();
    let mut trie = build_trie(true);
    let mut group = c.benchmark_group("churn_100k");
    let mut salt = 0;
    group.bench_function("subscribe_new_filter", |b| {
        b.iter_custom(|iters| {
            salt += 1;
            let filters = fresh_filters(iters, salt);
            let start = clock.now();
            for (i, f) in filters.iter().enumerate() {
                black_box(trie.subscribe(f, 1_000_000 + i as u64, options(1)).ok());
            }
            let elapsed = clock.now() - start;
            for (i, f) in filters.iter().enumerate() {
                trie.unsubscribe(f, &(1_000_000 + i as u64));
            }
            elapsed
        })
    });
    group.bench_function("unsubscribe_and_prune", |b| {
        b.iter_custom(|iters| {
            salt += 1;
            let filters = fresh_filters(iters, salt);
            for (i, f) in filters.iter().enumerate() {
                let _ = trie.subscribe(f, 1_000_000 + i as u64, options(1));
            }
            let start = clock.now();
            for (i, f) in filters.iter().enumerate() {
                black_box(trie.unsubscribe(f, &(1_000_000 + i as u64)));
            }
            clock.now() - start
        })
    });
    let mut key = 2_000_000u64;
    group.bench_function("subscribe_existing_filter_new_key", |b| {
        b.iter_custom(|iters| {
            let start = clock.now();
            for _ in 0..iters {
                key += 1;
                black_box(trie.subscribe("site/1/device/1/temp", key, options(1)).ok());
            }
            let elapsed = clock.now() - start;
            for k in key - iters + 1..=key {
                trie.unsubscribe("site/1/device/1/temp", &k);
            }
            elapsed
        })
    });
    group.finish();
    assert_eq!(trie.len(), SUBSCRIPTIONS, "churn left subscriptions behind");
}

fn config() -> Criterion<Clock> {
    Criterion::default()
        .with_measurement(Clock::from_env())
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench_match, bench_subscribe
}
criterion_main!(benches);
