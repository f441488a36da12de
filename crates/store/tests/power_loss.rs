//! The randomized power-loss checker (issue 12): from a seed, a workload of appends, batches,
//! group commits, flushes, retention removals (remove_below, delete, purge, expire, limits),
//! compactions, seals, reopens and reads over one to three streams (sync always / interval /
//! never, blocks of 4-16 KiB) runs on a [`SimDisk`]; power losses strike between steps and
//! inside I/O calls, processes crash, writes and syncs fail with EIO. After every recovery,
//! and at random points in between, what the store serves is checked against what it
//! promised:
//!
//! - a record is there, byte for byte, unless its removal was requested, if its ticket
//!   completed under `always`/`interval`, a completed `flush` or removal covered it, a read
//!   served it under `always`/`interval` (readers only see durable records), or it was
//!   there after a power loss (whatever survives one is durable);
//! - every record served is one that was appended (topic, payload, time), in sequence order,
//!   with no record missing before it (no holes), a batch all or nothing, and `get` and
//!   filtered reads agree with the full read;
//! - a removal acknowledged under `always`/`interval` is never undone;
//! - sequence numbers are never reused: new ones are above every record ever durable;
//! - a stream that saw a write or sync error refuses writes and removals until reopened;
//! - recovery fails only because of an injected fault, and never quarantines a block (the
//!   simulated disk never rots, so a damaged block could only be the store's own doing).
//!
//! Records that were never acknowledged may or may not be there.
//!
//! A failing seed prints itself with the steps and disk events that led to it.
//! `TERN_SIM_SEED=n` replays one seed with its log, `TERN_SIM_SEEDS=n` runs more seeds (from
//! `TERN_SIM_SEED_BASE`, default 0), `TERN_SIM_STEPS=n` makes each run longer (default 120),
//! `TERN_SIM_OPLOG=file` writes the disk's call trace (to diff two runs of a seed).
//!
//! Also here: the seeds that found store bugs, a replay check, and the sensitivity tests:
//! bugs injected into the store (`tern_store::sim::Bugs`) are found, and the same workload
//! with process crashes only (what `kill -9` tests can do) finds none of them.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tern_store::sim::{Bugs, MetadataOrder, SimConfig, SimDisk, SimRng, SyncErrorModel};
use tern_store::{
    Discard, FilterSet, Limits, NewRecord, Record, Store, StoreError, Stream, StreamConfig,
    SyncPolicy, Ticket, topic_matches,
};

const TOPICS: [&str; 4] = ["a/x", "a/y", "b", "c/d/e"];
const FILTERS: [&str; 4] = ["a/+", "b", "#", "c/#"];
const MAX_AGE_NS: u64 = 4000;
/// Interval syncs happen only on flushes, removals and rolls: a timer would make the run
/// depend on wall-clock time.
const INTERVAL: Duration = Duration::from_secs(3600);

type R<T = ()> = Result<T, String>;
/// Which records a removal asked for.
type Pred = Box<dyn Fn(u64, &Rec) -> bool>;

macro_rules! fail {
    ($($t:tt)*) => { return Err(format!($($t)*)) };
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Removal {
    None,
    /// Requested (by an op that failed, a limit, or a policy that does not sync removals):
    /// the record may be there or not.
    Pending,
    /// Acknowledged under a syncing policy: must never be served again.
    Acked,
}

#[derive(Debug, Clone)]
struct Rec {
    topic: usize,
    payload: Vec<u8>,
    time: u64,
    /// Promised to survive a power loss.
    durable: bool,
    removal: Removal,
    /// The batch it was appended in (first..=last).
    batch: (u64, u64),
    /// A `Discard::New` limit may have rejected it and its ticket has not said (under
    /// `interval` a rejection is reported at the next sync, or as a failure if none comes).
    maybe_rejected: bool,
}

struct Model {
    name: String,
    cfg: StreamConfig,
    recs: BTreeMap<u64, Rec>,
    /// Every sequence at or below it was durable or served once: never to be reused.
    floor: u64,
    time: u64,
    /// Tickets not yet complete (interval).
    pending: Vec<Ticket>,
}

impl Model {
    fn syncs(&self) -> bool {
        self.cfg.sync != SyncPolicy::Never
    }

    fn mark_durable_upto(&mut self, seq: u64) {
        for r in self.recs.range_mut(..=seq).map(|(_, r)| r) {
            r.durable = true;
        }
    }

    fn settle(&mut self, t: &Ticket, res: &Result<u64, StoreError>) {
        match res {
            Ok(_) => {
                for s in t.first_seq()..=t.seq() {
                    if let Some(r) = self.recs.get_mut(&s) {
                        r.durable |= self.cfg.sync != SyncPolicy::Never;
                        r.maybe_rejected = false;
                    }
                }
            }
            Err(StoreError::LimitReached { .. }) => {
                for s in t.first_seq()..=t.seq() {
                    self.recs.remove(&s);
                }
            }
            Err(_) => {}
        }
    }

    /// Settles the tickets that completed.
    fn poll_pending(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        for t in pending {
            match t.try_result() {
                Some(res) => self.settle(&t, &res),
                None => self.pending.push(t),
            }
        }
    }

    fn remove(&mut self, pred: impl Fn(u64, &Rec) -> bool, acked: bool) {
        let to = if acked && self.syncs() {
            Removal::Acked
        } else {
            Removal::Pending
        };
        for (&s, r) in self.recs.iter_mut() {
            if pred(s, r) && r.removal != Removal::Acked {
                r.removal = to;
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Crashes {
    /// Power losses (between steps and inside calls) and process crashes.
    PowerLoss,
    /// Only process crashes (`kill -9`: the page cache survives), as the repository's
    /// crash tests do.
    ProcessOnly,
}

#[derive(Debug, Clone, Copy)]
struct Opts {
    steps: usize,
    bugs: Bugs,
    crashes: Crashes,
    /// Inject EIO on writes and syncs.
    errors: bool,
    verbose: bool,
}

impl Opts {
    fn new(steps: usize) -> Opts {
        Opts {
            steps,
            bugs: Bugs::NONE,
            crashes: Crashes::PowerLoss,
            errors: true,
            verbose: false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum After {
    /// The disk's cache is its durable image: everything read is durable.
    PowerLoss,
    /// A process crash or a reopen: only syncing streams promise what they serve.
    Reopen,
}

#[derive(Debug, Default, Clone)]
struct Summary {
    steps: usize,
    appended: u64,
    durable_checked: u64,
    recoveries: u64,
    failures_seen: u64,
    power_losses: u64,
    digest: u64,
}

struct Sim {
    seed: u64,
    opts: Opts,
    rng: SimRng,
    _dir: tempfile::TempDir,
    root: PathBuf,
    disk: SimDisk,
    store: Option<Store>,
    handles: Vec<Option<Stream>>,
    models: Vec<Model>,
    log: Vec<String>,
    pl_seen: u64,
    sum: Summary,
}

fn policy_name(p: SyncPolicy) -> &'static str {
    match p {
        SyncPolicy::Always => "always",
        SyncPolicy::Interval(_) => "interval",
        SyncPolicy::Never => "never",
    }
}

impl Sim {
    fn new(seed: u64, opts: Opts) -> Sim {
        let mut rng = SimRng::keyed(&[seed, 0x5eed]);
        let errors = opts.errors;
        let pick = |rng: &mut SimRng, xs: &[f64]| *rng.pick(xs);
        let cfg = SimConfig {
            page_size: *rng.pick(&[512, 4096]),
            write_error: if errors {
                pick(&mut rng, &[0.0, 0.002, 0.01])
            } else {
                0.0
            },
            sync_error: if errors {
                pick(&mut rng, &[0.0, 0.002, 0.01])
            } else {
                0.0
            },
            dir_sync_error: if errors {
                pick(&mut rng, &[0.0, 0.0, 0.01])
            } else {
                0.0
            },
            power_loss: match opts.crashes {
                Crashes::PowerLoss => pick(&mut rng, &[0.0, 0.003, 0.01, 0.02]),
                Crashes::ProcessOnly => 0.0,
            },
            sync_error_model: if rng.chance(0.5) {
                SyncErrorModel::KeepDirty
            } else {
                SyncErrorModel::DropDirty
            },
            metadata_order: if rng.chance(0.8) {
                MetadataOrder::Ordered
            } else {
                MetadataOrder::Unordered
            },
            latency: None,
            faults: Vec::new(),
            bugs: opts.bugs,
            untraced_dirs: vec!["trash".into()],
            record_ops: std::env::var("TERN_SIM_OPLOG").is_ok(),
            stepped_writers: false,
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().to_path_buf();
        let disk = SimDisk::new(&root, seed, cfg.clone());
        let n = rng.range(1, 3) as usize;
        let mut models = Vec::new();
        for i in 0..n {
            let sync = match rng.below(100) {
                0..45 => SyncPolicy::Always,
                45..75 => SyncPolicy::Interval(INTERVAL),
                _ => SyncPolicy::Never,
            };
            let mut limits = Limits {
                max_age: Some(Duration::from_nanos(MAX_AGE_NS)),
                ..Default::default()
            };
            match rng.below(100) {
                0..50 => {}
                50..70 => limits.max_msgs = Some(rng.range(20, 80)),
                70..85 => limits.max_msgs_per_topic = Some(rng.range(2, 10)),
                _ => {
                    limits.max_msgs = Some(rng.range(20, 80));
                    limits.discard = Discard::New;
                }
            }
            let cfg = StreamConfig {
                block_size_bytes: *rng.pick(&[4096, 8192, 16384]),
                sync,
                limits,
                expire_interval: Duration::from_secs(3600),
                index_cache_blocks: rng.range(1, 3) as usize,
                verify_on_open: rng.chance(0.1),
                ..Default::default()
            };
            models.push(Model {
                name: format!("s{i}"),
                cfg,
                recs: BTreeMap::new(),
                floor: 0,
                time: 1_000_000,
                pending: Vec::new(),
            });
        }
        let mut sim = Sim {
            seed,
            opts,
            rng,
            _dir: dir,
            root,
            disk,
            store: None,
            handles: (0..n).map(|_| None).collect(),
            models,
            log: Vec::new(),
            pl_seen: 0,
            sum: Summary::default(),
        };
        let mut d = format!(
            "disk: page {} B, EIO write {} sync {} dirsync {}, power loss {}/call, {:?}, {:?}",
            cfg.page_size,
            cfg.write_error,
            cfg.sync_error,
            cfg.dir_sync_error,
            cfg.power_loss,
            cfg.sync_error_model,
            cfg.metadata_order
        );
        for m in &sim.models {
            let l = &m.cfg.limits;
            let _ = write!(
                d,
                "\n  {}: sync {}, block {} B, max_msgs {:?} max_per_topic {:?} {:?}, cache {}, verify {}",
                m.name,
                policy_name(m.cfg.sync),
                m.cfg.block_size_bytes,
                l.max_msgs,
                l.max_msgs_per_topic,
                l.discard,
                m.cfg.index_cache_blocks,
                m.cfg.verify_on_open
            );
        }
        sim.note(d);
        sim
    }

    fn note(&mut self, s: String) {
        if self.opts.verbose {
            eprintln!("{s}");
        }
        self.log.push(s);
    }

    fn h(&self, i: usize) -> R<&Stream> {
        self.handles[i]
            .as_ref()
            .ok_or_else(|| format!("stream {i} is not open"))
    }

    fn stream_dir(&self, i: usize) -> PathBuf {
        self.root.join("streams").join(&self.models[i].name)
    }

    fn crashed(&self) -> bool {
        self.disk.power_losses() != self.pl_seen
    }

    // ---- the workload ----

    fn payload(&mut self) -> Vec<u8> {
        let len = match self.rng.below(100) {
            0..70 => self.rng.below(120),
            70..95 => self.rng.range(120, 700),
            _ => self.rng.range(700, 2500),
        } as usize;
        let mut p = Vec::with_capacity(len);
        let mut x = self.rng.next_u64();
        for _ in 0..len {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            p.push((x >> 56) as u8);
        }
        p
    }

    /// Queues one append or batch on stream `i`; returns its ticket (None if refused).
    fn issue(&mut self, i: usize, batch: bool) -> R<Option<Ticket>> {
        let n = if batch { self.rng.range(2, 5) } else { 1 };
        self.models[i].time += self.rng.below(40);
        let time = self.models[i].time;
        let mut recs = Vec::new();
        for _ in 0..n {
            let t = self.rng.below(TOPICS.len() as u64) as usize;
            recs.push((t, self.payload()));
        }
        let h = self.h(i)?.clone();
        let res = if batch {
            let nr: Vec<NewRecord> = recs
                .iter()
                .map(|(t, p)| NewRecord {
                    topic: TOPICS[*t].as_bytes(),
                    payload: p,
                    time_ns: Some(time),
                    ..Default::default()
                })
                .collect();
            h.append_batch(&nr)
        } else {
            h.append_at(time, TOPICS[recs[0].0].as_bytes(), b"", &recs[0].1)
        };
        let t = match res {
            Ok(t) => t,
            Err(StoreError::Failed { .. }) if h.info().failed => return Ok(None),
            Err(e) => fail!(
                "{}: append refused on a healthy stream: {e}",
                self.models[i].name
            ),
        };
        let m = &mut self.models[i];
        let last_known = m.recs.keys().next_back().copied().unwrap_or(0);
        if t.first_seq() <= m.floor.max(last_known) {
            fail!(
                "{}: sequence {} reused (floor {}, newest known {last_known})",
                m.name,
                t.first_seq(),
                m.floor
            );
        }
        if t.seq() - t.first_seq() + 1 != n {
            fail!(
                "{}: batch of {n} got {}..={}",
                m.name,
                t.first_seq(),
                t.seq()
            );
        }
        for (k, (topic, payload)) in recs.into_iter().enumerate() {
            m.recs.insert(
                t.first_seq() + k as u64,
                Rec {
                    topic,
                    payload,
                    time,
                    durable: false,
                    removal: Removal::None,
                    batch: (t.first_seq(), t.seq()),
                    maybe_rejected: m.cfg.limits.discard == Discard::New,
                },
            );
        }
        self.sum.appended += n;
        Ok(Some(t))
    }

    /// Waits for tickets the way an application of the policy would.
    fn settle(&mut self, i: usize, tickets: Vec<Ticket>) -> R {
        let Some(last) = tickets.last().map(Ticket::seq) else {
            return Ok(());
        };
        if let SyncPolicy::Interval(_) = self.models[i].cfg.sync {
            self.models[i].pending.extend(tickets);
            return self.wait_written(i, last);
        }
        for t in tickets {
            let (first, seq) = (t.first_seq(), t.seq());
            let res = t.wait();
            let m = &mut self.models[i];
            match &res {
                Ok(_) | Err(StoreError::LimitReached { .. }) => {}
                Err(StoreError::Failed { .. } | StoreError::Io { .. }) => {}
                Err(e) => fail!("{}: ticket {first}..={seq}: unexpected {e}", m.name),
            }
            if res.is_ok() {
                let durable = m.syncs();
                for s in first..=seq {
                    if let Some(r) = m.recs.get_mut(&s) {
                        r.durable |= durable;
                        r.maybe_rejected = false;
                    }
                }
            }
            if let Err(StoreError::LimitReached { .. }) = res {
                for s in first..=seq {
                    m.recs.remove(&s);
                }
            }
        }
        Ok(())
    }

    /// Under `interval` a ticket completes only at a sync: wait until the writer has
    /// written the record instead, so the next step finds the writer idle.
    fn wait_written(&mut self, i: usize, seq: u64) -> R {
        let h = self.h(i)?.clone();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let info = h.info();
            if info.written_seq >= seq || info.failed || self.crashed() {
                return Ok(());
            }
            if Instant::now() > deadline {
                fail!("{}: the writer never wrote {seq}", self.models[i].name);
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    fn append(&mut self, i: usize, batch: bool) -> R {
        let t = self.issue(i, batch)?;
        self.settle(i, t.into_iter().collect())
    }

    /// Several appends in one group commit, deterministically: the first one's write is
    /// held until the others are queued, so they form the writer's next turn together.
    fn burst(&mut self, i: usize) -> R {
        if self.models[i].cfg.limits.discard == Discard::New {
            // A rejected first append writes nothing, and the hold would catch nothing.
            return self.append(i, false);
        }
        let dir = self.stream_dir(i);
        self.disk.hold_next_write(&dir);
        let mut tickets = Vec::new();
        let first = self.issue(i, false);
        let first = match first {
            Ok(t) => t,
            Err(e) => {
                self.disk.release();
                return Err(e);
            }
        };
        if let Some(t) = first {
            tickets.push(t);
            if self.disk.wait_held(Duration::from_secs(10)) {
                let k = self.rng.range(1, 6);
                for _ in 0..k {
                    let batch = self.rng.chance(0.3);
                    match self.issue(i, batch) {
                        Ok(Some(t)) => tickets.push(t),
                        Ok(None) => break,
                        Err(e) => {
                            self.disk.release();
                            return Err(e);
                        }
                    }
                }
            } else if !self.crashed() && !self.h(i)?.info().failed {
                self.disk.release();
                fail!(
                    "{}: the writer never wrote the burst's first record",
                    self.models[i].name
                );
            }
        }
        self.disk.release();
        self.settle(i, tickets)
    }

    fn flush(&mut self, i: usize) -> R {
        let h = self.h(i)?.clone();
        let written = self.models[i].recs.keys().next_back().copied().unwrap_or(0);
        let res = h.flush();
        let m = &mut self.models[i];
        m.poll_pending();
        match res {
            Ok(()) if m.syncs() => m.mark_durable_upto(written),
            Ok(()) => {}
            Err(StoreError::Failed { .. } | StoreError::Io { .. }) => {}
            Err(e) => fail!("{}: flush: {e}", m.name),
        }
        Ok(())
    }

    fn removal(&mut self, i: usize) -> R {
        let h = self.h(i)?.clone();
        let m = &self.models[i];
        let first = m.recs.keys().next().copied().unwrap_or(1);
        let last = m.recs.keys().next_back().copied().unwrap_or(1);
        let time = m.time;
        let kind = self.rng.below(4);
        let (res, pred): (_, Pred) = match kind {
            0 => {
                let floor = self.rng.range(first, last + 1);
                self.note(format!("    remove_below({floor})"));
                (h.remove_below(floor), Box::new(move |s, _| s < floor))
            }
            1 => {
                let seqs: Vec<u64> = (0..self.rng.range(1, 3))
                    .map(|_| self.rng.range(first, last))
                    .collect();
                self.note(format!("    delete({seqs:?})"));
                let set: BTreeSet<u64> = seqs.iter().copied().collect();
                (h.delete(&seqs), Box::new(move |s, _| set.contains(&s)))
            }
            2 => {
                let f = *self.rng.pick(&FILTERS);
                self.note(format!("    purge({f})"));
                (
                    h.purge(&FilterSet::new([f])),
                    Box::new(move |_, r: &Rec| {
                        topic_matches(f.as_bytes(), TOPICS[r.topic].as_bytes())
                    }),
                )
            }
            _ => {
                let now = time.saturating_sub(self.rng.below(2 * MAX_AGE_NS)) + MAX_AGE_NS;
                let cutoff = now - MAX_AGE_NS;
                self.note(format!("    expire({now}): below time {cutoff}"));
                (h.expire(now), Box::new(move |_, r: &Rec| r.time < cutoff))
            }
        };
        let m = &mut self.models[i];
        m.poll_pending();
        match res {
            Ok(removed) => {
                // The reported ranges are what went; the rest of what was asked for must be
                // gone already.
                let ranges = removed.ranges.clone();
                m.remove(
                    |s, r| pred(s, r) || ranges.iter().any(|x| x.contains(&s)),
                    true,
                );
                if m.syncs() {
                    // A removal's reply waits for a sync that covers every earlier append.
                    m.mark_durable_upto(last);
                }
            }
            Err(StoreError::Failed { .. } | StoreError::Io { .. }) => m.remove(pred, false),
            Err(e) => fail!("{}: removal: {e}", m.name),
        }
        Ok(())
    }

    fn housekeeping(&mut self, i: usize) -> R {
        let h = self.h(i)?.clone();
        let res = if self.rng.chance(0.5) {
            let n = self.rng.range(1, 4) as usize;
            self.note(format!("    compact({n})"));
            h.compact(n)
        } else {
            self.note("    seal".into());
            h.seal()
        };
        let m = &mut self.models[i];
        m.poll_pending();
        match res {
            Ok(()) => {}
            Err(StoreError::Failed { .. } | StoreError::Io { .. }) => {}
            Err(e) => fail!("{}: compact/seal: {e}", m.name),
        }
        Ok(())
    }

    /// Takes the writer's own removals (limits): they may be durable or not.
    fn drain(&mut self, i: usize) -> R {
        let log = self.h(i)?.drain_removed();
        if !log.ranges.is_empty() {
            let m = &mut self.models[i];
            m.remove(|s, _| log.ranges.iter().any(|r| r.contains(&s)), false);
        }
        Ok(())
    }

    // ---- observing and checking ----

    fn read_all(&self, i: usize) -> R<Vec<Record>> {
        let h = self.h(i)?;
        let mut out = Vec::new();
        let mut from = 0;
        loop {
            let b = h
                .read_from(from, &FilterSet::all(), 256, 1 << 20)
                .map_err(|e| format!("{}: read_from({from}): {e}", self.models[i].name))?;
            out.extend(b.records);
            if b.next_seq <= from {
                break;
            }
            from = b.next_seq;
        }
        Ok(out)
    }

    /// Checks what stream `i` serves against the model. `recovered`: right after an open,
    /// when records that are gone for good are dropped from the model.
    fn check(&mut self, i: usize, served: &[Record], recovered: Option<After>) -> R {
        let name = self.models[i].name.clone();
        let h = self.h(i)?.clone();
        let m = &self.models[i];
        let mut prev = 0;
        let mut by_seq = BTreeMap::new();
        for r in served {
            if r.seq <= prev {
                fail!("{name}: served {} after {prev}: out of order", r.seq);
            }
            prev = r.seq;
            let Some(want) = m.recs.get(&r.seq) else {
                fail!(
                    "{name}: served seq {} which was never appended (or was rejected)",
                    r.seq
                );
            };
            if r.topic != TOPICS[want.topic].as_bytes()
                || r.payload != want.payload
                || r.time_ns != want.time
                || !r.properties.is_empty()
            {
                fail!(
                    "{name}: seq {} served with different content (topic {:?}, {} bytes, time {}; want {:?}, {} bytes, time {})",
                    r.seq,
                    String::from_utf8_lossy(&r.topic),
                    r.payload.len(),
                    r.time_ns,
                    TOPICS[want.topic],
                    want.payload.len(),
                    want.time
                );
            }
            if want.removal == Removal::Acked {
                fail!(
                    "{name}: seq {} served after its removal was acknowledged",
                    r.seq
                );
            }
            by_seq.insert(r.seq, r);
        }
        // The disk never rots: a damaged block could only come from the store's own writes.
        let quarantined = &h.info().quarantined;
        if !quarantined.is_empty() {
            fail!(
                "{name}: blocks quarantined under sync {}: {quarantined:?}",
                policy_name(m.cfg.sync)
            );
        }
        for (&s, r) in &m.recs {
            let present = by_seq.contains_key(&s);
            if r.durable && r.removal == Removal::None && !present {
                fail!(
                    "{name}: seq {s} lost: it was durable (acknowledged, flushed or served) and never removed"
                );
            }
            if !present && r.removal == Removal::None && !r.maybe_rejected && s < prev {
                fail!("{name}: seq {s} missing while the later {prev} is served (a hole)");
            }
            if present && r.batch.0 != r.batch.1 {
                for b in r.batch.0..=r.batch.1 {
                    let whole = by_seq.contains_key(&b)
                        || m.recs.get(&b).is_none_or(|x| x.removal != Removal::None);
                    if !whole {
                        fail!(
                            "{name}: batch {}..={} served in part ({s} without {b})",
                            r.batch.0,
                            r.batch.1
                        );
                    }
                }
            }
        }
        for &s in by_seq.keys().take(3).chain(by_seq.keys().rev().take(3)) {
            let got = h.get(s).map_err(|e| format!("{name}: get({s}): {e}"))?;
            if got.as_ref().map(|r| &r.payload) != by_seq.get(&s).map(|r| &r.payload) {
                fail!("{name}: get({s}) disagrees with read_from");
            }
        }
        let next = h.next_seq();
        if let Some(after) = recovered {
            if next <= m.floor || next <= prev {
                fail!(
                    "{name}: next sequence {next} after recovery reuses one (floor {}, newest served {prev})",
                    m.floor
                );
            }
            self.sum.durable_checked += m.recs.values().filter(|r| r.durable).count() as u64;
            let durable_now = after == After::PowerLoss || m.syncs();
            let m = &mut self.models[i];
            let old = std::mem::take(&mut m.recs);
            for (s, mut r) in old {
                if by_seq.contains_key(&s) {
                    r.durable |= durable_now;
                    r.removal = Removal::None;
                    r.maybe_rejected = false;
                    m.floor = m.floor.max(if durable_now { s } else { 0 });
                    m.recs.insert(s, r);
                } else if r.removal != Removal::None && s < next {
                    // Its removal may not be durable yet: it may come back.
                    m.recs.insert(s, r);
                }
            }
            if let Some(t) = served.last() {
                m.time = m.time.max(t.time_ns);
            }
        } else if m.syncs() {
            // Readers see only durable records.
            let m = &mut self.models[i];
            for s in by_seq.keys() {
                if let Some(r) = m.recs.get_mut(s) {
                    r.durable = true;
                }
                m.floor = m.floor.max(*s);
            }
        }
        Ok(())
    }

    fn check_live(&mut self, i: usize) -> R {
        self.drain(i)?;
        let served = self.read_all(i)?;
        self.check(i, &served, None)?;
        // A filtered read is the full read, filtered.
        let f = *self.rng.pick(&FILTERS);
        let h = self.h(i)?.clone();
        let got: Vec<u64> = h
            .read_from(0, &FilterSet::new([f]), 100_000, usize::MAX)
            .map_err(|e| format!("read_from filter {f}: {e}"))?
            .records
            .iter()
            .map(|r| r.seq)
            .collect();
        let want: Vec<u64> = served
            .iter()
            .filter(|r| topic_matches(f.as_bytes(), &r.topic))
            .map(|r| r.seq)
            .collect();
        if got != want {
            fail!(
                "{}: filter {f}: served {got:?}, want {want:?}",
                self.models[i].name
            );
        }
        Ok(())
    }

    // ---- crashes, failures, recovery ----

    /// Drops every handle (writers stop; on a dead boot their I/O fails) and settles tickets.
    fn shutdown(&mut self) {
        for i in 0..self.handles.len() {
            // The writer's own removals of the last turns (in memory: works on a dead disk).
            let _ = self.drain(i);
            drop(self.handles[i].take());
        }
        for m in &mut self.models {
            m.poll_pending();
            m.pending.clear();
        }
        self.store = None;
    }

    fn open_stream(&mut self, i: usize) -> R {
        let store = self.store.as_ref().ok_or("no store")?;
        let m = &self.models[i];
        let h = store
            .stream(&m.name, m.cfg.clone())
            .map_err(|e| format!("open {}: {e}", m.name))?;
        // Wait for the writer's first turn, so what follows finds it idle.
        h.flush()
            .map_err(|e| format!("first flush of {}: {e}", m.name))?;
        self.handles[i] = Some(h);
        Ok(())
    }

    fn try_open_all(&mut self) -> R {
        let store = Store::open_with_vfs(&self.root, self.disk.vfs())
            .map_err(|e| format!("open store: {e}"))?;
        self.store = Some(store);
        for i in 0..self.models.len() {
            self.open_stream(i)?;
        }
        Ok(())
    }

    /// Opens everything again, retrying while I/O errors or power losses strike the
    /// recovery itself, then checks what every stream serves.
    fn recover(&mut self, mut after: After) -> R {
        self.sum.recoveries += 1;
        let mut attempt = 0;
        let saved = self.disk.config();
        let observed = loop {
            attempt += 1;
            let pl = self.disk.power_losses();
            let res = self.try_open_all().and_then(|()| {
                (0..self.models.len())
                    .map(|i| self.read_all(i))
                    .collect::<R<Vec<_>>>()
            });
            if self.disk.power_losses() != pl {
                after = After::PowerLoss;
            }
            match res {
                Ok(obs) if self.disk.power_losses() == pl => break obs,
                Ok(_) => self.note("    recovery: power lost while reading".into()),
                // Only an injected fault may stop a recovery.
                Err(e) if self.disk.power_losses() == pl && !e.contains("EIO (simulated)") => {
                    fail!("recovery failed without an injected fault: {e}")
                }
                Err(e) => self.note(format!("    recovery attempt {attempt}: {e}")),
            }
            self.shutdown();
            if attempt == 8 {
                // Give the store a disk that lets it recover.
                self.note("    recovery: faults off".into());
                self.disk.update_config(|c| {
                    c.write_error = 0.0;
                    c.sync_error = 0.0;
                    c.dir_sync_error = 0.0;
                    c.power_loss = 0.0;
                });
            }
            if attempt > 12 {
                fail!("recovery keeps failing");
            }
        };
        self.disk.update_config(|c| *c = saved);
        self.pl_seen = self.disk.power_losses();
        for (i, served) in observed.iter().enumerate() {
            let r = self.h(i)?.recovery_report().clone();
            self.note(format!(
                "    {}: recovered {} records, next {}, cut {} bytes, lost {:?}, quarantined {}",
                self.models[i].name,
                served.len(),
                self.h(i)?.next_seq(),
                r.truncated_bytes,
                r.lost,
                r.quarantined.len()
            ));
            self.check(i, served, Some(after))?;
        }
        Ok(())
    }

    fn power_loss(&mut self) -> R {
        self.disk.power_loss();
        self.shutdown();
        self.recover(After::PowerLoss)
    }

    fn process_crash(&mut self) -> R {
        self.disk.crash();
        self.shutdown();
        self.recover(After::Reopen)
    }

    /// Closes and reopens one stream (its writer syncs on the way out).
    fn reopen(&mut self, i: usize) -> R {
        self.drain(i)?;
        drop(self.handles[i].take());
        self.models[i].poll_pending();
        self.models[i].pending.clear();
        let pl = self.disk.power_losses();
        let res = self.open_stream(i);
        if self.disk.power_losses() != pl {
            return Ok(()); // The caller notices the power loss.
        }
        match res {
            Ok(()) => {
                let served = self.read_all(i)?;
                self.check(i, &served, Some(After::Reopen))
            }
            Err(e) => {
                // An injected error during recovery: start over with everything.
                self.note(format!("    reopen failed: {e}"));
                self.shutdown();
                self.recover(After::Reopen)
            }
        }
    }

    /// After every step: a power loss inside a call means recovery; a stream that failed
    /// must refuse writes, and is reopened.
    fn after_step(&mut self) -> R {
        if self.crashed() {
            self.note("    power lost inside a call".into());
            self.shutdown();
            return self.recover(After::PowerLoss);
        }
        for i in 0..self.models.len() {
            self.models[i].poll_pending();
            let h = self.h(i)?.clone();
            if !h.info().failed {
                self.drain(i)?;
                continue;
            }
            self.sum.failures_seen += 1;
            self.note(format!(
                "    {} failed: {:?}",
                self.models[i].name,
                h.append(b"x", b"", b"y").err()
            ));
            match h.append(b"x", b"", b"y") {
                Err(StoreError::Failed { .. }) => {}
                other => fail!(
                    "{}: a failed stream accepted a write: {other:?}",
                    self.models[i].name
                ),
            }
            match h.remove_below(1) {
                Err(StoreError::Failed { .. }) => {}
                other => fail!(
                    "{}: a failed stream accepted a removal: {other:?}",
                    self.models[i].name
                ),
            }
            drop(h);
            self.reopen(i)?;
            if self.crashed() {
                return self.after_step();
            }
        }
        Ok(())
    }

    fn step(&mut self, n: usize) -> R {
        let i = self.rng.below(self.models.len() as u64) as usize;
        let k = self.rng.below(100);
        let name = self.models[i].name.clone();
        let what = match k {
            0..30 => "append",
            30..40 => "batch",
            40..52 => "burst",
            52..58 => "flush",
            58..68 => "check",
            68..76 => "removal",
            76..82 => "compact/seal",
            82..85 => "reopen",
            85..88 => "process crash",
            88..92 => "power loss",
            _ => "append",
        };
        self.note(format!("{n}: {what} {name}"));
        match what {
            "append" => self.append(i, false)?,
            "batch" => self.append(i, true)?,
            "burst" => self.burst(i)?,
            "flush" => self.flush(i)?,
            "check" => self.check_live(i)?,
            "removal" => self.removal(i)?,
            "compact/seal" => self.housekeeping(i)?,
            "reopen" => self.reopen(i)?,
            "process crash" if self.opts.crashes == Crashes::PowerLoss => self.process_crash()?,
            "process crash" | "power loss" if self.opts.crashes == Crashes::ProcessOnly => {
                self.process_crash()?
            }
            _ => self.power_loss()?,
        }
        self.after_step()
    }

    fn run(&mut self) -> R {
        self.recover(After::PowerLoss)?;
        for n in 0..self.opts.steps {
            self.step(n)?;
            self.sum.steps = n + 1;
        }
        // The end: one more crash, then the disk behaves, and every stream takes an append.
        match self.opts.crashes {
            Crashes::PowerLoss => self.power_loss()?,
            Crashes::ProcessOnly => self.process_crash()?,
        }
        self.disk.update_config(|c| {
            c.write_error = 0.0;
            c.sync_error = 0.0;
            c.dir_sync_error = 0.0;
            c.power_loss = 0.0;
        });
        for i in 0..self.models.len() {
            self.append(i, false)?;
            self.flush(i)?;
            self.check_live(i)?;
        }
        self.shutdown();
        self.sum.power_losses = self.disk.stats().power_losses;
        self.sum.digest = self.disk.trace_digest();
        Ok(())
    }

    fn report(&self, err: &str) -> String {
        let mut s = format!(
            "seed {} FAILED: {err}\nreplay: TERN_SIM_SEED={} cargo test -p tern-store --test power_loss -- --nocapture\n",
            self.seed, self.seed
        );
        s.push_str("--- setup and last steps ---\n");
        s.push_str(&self.log[0]);
        s.push('\n');
        for l in self
            .log
            .iter()
            .skip(1)
            .rev()
            .take(40)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            s.push_str(l);
            s.push('\n');
        }
        s.push_str("--- last disk events ---\n");
        for e in self.disk.events().iter().rev().take(25).rev() {
            s.push_str(e);
            s.push('\n');
        }
        s
    }
}

/// Runs one seed; `Err` holds the report of a failure.
fn run_seed(seed: u64, opts: Opts) -> Result<Summary, String> {
    let mut sim = Sim::new(seed, opts);
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sim.run()));
    if let Ok(p) = std::env::var("TERN_SIM_OPLOG") {
        let _ = std::fs::write(p, sim.disk.op_log().join("\n"));
    }
    match res {
        Ok(Ok(())) => Ok(sim.sum.clone()),
        Ok(Err(e)) => {
            sim.disk.release();
            let r = sim.report(&e);
            sim.shutdown();
            Err(r)
        }
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            sim.disk.release();
            Err(sim.report(&format!("panic: {msg}")))
        }
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn steps() -> usize {
    env_u64("TERN_SIM_STEPS").unwrap_or(120) as usize
}

/// Runs seeds on a few threads; returns the failing seeds' reports (by seed) and the totals
/// of the passing ones. With `stop`, hands out no more seeds after a failure.
fn run_many(seeds: std::ops::Range<u64>, opts: Opts, stop: bool) -> (Vec<(u64, String)>, Summary) {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU64, Ordering};
    let next = AtomicU64::new(seeds.start);
    let failed: Mutex<Vec<(u64, String)>> = Mutex::new(Vec::new());
    let total = Mutex::new(Summary::default());
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 4));
    std::thread::scope(|sc| {
        for _ in 0..threads {
            sc.spawn(|| {
                loop {
                    let seed = next.fetch_add(1, Ordering::SeqCst);
                    if seed >= seeds.end || (stop && !failed.lock().unwrap().is_empty()) {
                        return;
                    }
                    match run_seed(seed, opts) {
                        Ok(s) => {
                            let mut t = total.lock().unwrap();
                            t.steps += s.steps;
                            t.appended += s.appended;
                            t.recoveries += s.recoveries;
                            t.power_losses += s.power_losses;
                            t.failures_seen += s.failures_seen;
                            t.durable_checked += s.durable_checked;
                        }
                        Err(r) => failed.lock().unwrap().push((seed, r)),
                    }
                }
            });
        }
    });
    let mut failed = failed.into_inner().unwrap();
    failed.sort_by_key(|f| f.0);
    (failed, total.into_inner().unwrap())
}

/// Runs seeds `base..base+n` (or `TERN_SIM_SEED` alone, verbosely) and fails with the first
/// failing seed's report.
fn run_seeds(default_n: u64, opts: Opts) {
    if let Some(seed) = env_u64("TERN_SIM_SEED") {
        let opts = Opts {
            verbose: true,
            ..opts
        };
        match run_seed(seed, opts) {
            Ok(s) => eprintln!("seed {seed} passed: {s:?}"),
            Err(r) => panic!("{r}"),
        }
        return;
    }
    let n = env_u64("TERN_SIM_SEEDS").unwrap_or(default_n);
    let base = env_u64("TERN_SIM_SEED_BASE").unwrap_or(0);
    let start = Instant::now();
    let (failed, total) = run_many(base..base + n, opts, true);
    if let Some((_, r)) = failed.first() {
        panic!("{r}");
    }
    eprintln!(
        "power_loss: {n} seeds from {base} in {:.1?}: {} steps, {} records appended, {} recoveries ({} power losses), {} stream failures, {} durable records checked",
        start.elapsed(),
        total.steps,
        total.appended,
        total.recoveries,
        total.power_losses,
        total.failures_seen,
        total.durable_checked
    );
}

#[test]
fn power_loss_checker() {
    run_seeds(200, Opts::new(steps()));
}

/// Seeds (and run lengths) that found store bugs, each also a scenario of its own in
/// `tests/sim_regressions.rs`: 3 a new block's unsynced header, 34 `never` sealing without a
/// sync, 62 recovery building on an unsynced block name, 134 compaction's index and rename
/// order, 138 and 428 a failed fsync's dropped pages, 140 `seal()` replying before its
/// roll, 286 compaction leaving a dangling batch flag, 5066 a batch of block removals
/// undoing a delete, 23150 a new block's header only the page cache held, 40242
/// compaction dropping a marker before the dead block it targets was gone, 40939 recovery
/// removing dead blocks before the active block's name was durable. 149 found a gap in the
/// checker itself.
const REGRESSION_SEEDS: [(u64, usize); 13] = [
    (3, 120),
    (34, 120),
    (62, 120),
    (134, 120),
    (138, 120),
    (140, 120),
    (149, 120),
    (286, 120),
    (428, 120),
    (5066, 600),
    (23150, 120),
    (40242, 1000),
    (40939, 1000),
];

#[test]
fn regression_seeds() {
    for (seed, steps) in REGRESSION_SEEDS {
        if let Err(r) = run_seed(seed, Opts::new(steps)) {
            panic!("{r}");
        }
    }
}

/// The same seed gives the same disk history (trace digest) and the same outcome.
#[test]
fn a_seed_replays_exactly() {
    if env_u64("TERN_SIM_SEED").is_some() {
        return;
    }
    for seed in [3, 17, 42] {
        let a = run_seed(seed, Opts::new(60)).unwrap_or_else(|r| panic!("{r}"));
        let b = run_seed(seed, Opts::new(60)).unwrap_or_else(|r| panic!("{r}"));
        assert_eq!(
            (a.digest, a.appended, a.power_losses),
            (b.digest, b.appended, b.power_losses),
            "seed {seed} did not replay"
        );
    }
}

const INJECTED: [(&str, Bugs); 3] = [
    (
        "ack-before-fsync",
        Bugs {
            ack_before_fsync: true,
            ..Bugs::NONE
        },
    ),
    (
        "skip-sync-on-roll",
        Bugs {
            skip_sync_on_roll: true,
            ..Bugs::NONE
        },
    ),
    (
        "skip-dir-sync-on-roll",
        Bugs {
            skip_dir_sync_on_roll: true,
            ..Bugs::NONE
        },
    ),
];

/// Seeds each sensitivity test runs.
const FIND_WITHIN: u64 = 40;

/// Sensitivity: with a known bug injected into the store, the checker fails, with a report
/// naming the broken promise. Prints how many of the first `FIND_WITHIN` seeds find each
/// bug; at least a quarter must.
#[test]
fn the_checker_finds_injected_bugs() {
    for (name, bugs) in INJECTED {
        let opts = Opts {
            bugs,
            ..Opts::new(steps())
        };
        let (failed, _) = run_many(0..FIND_WITHIN, opts, false);
        let Some((seed, report)) = failed.first() else {
            panic!("{name}: not found in {FIND_WITHIN} seeds");
        };
        let first = report.lines().next().unwrap_or_default();
        eprintln!(
            "{name}: found by {} of {FIND_WITHIN} seeds, first by seed {seed}: {first}",
            failed.len()
        );
        assert!(
            failed.len() as u64 >= FIND_WITHIN / 4,
            "{name}: found too rarely"
        );
    }
}

/// The point of the simulated power loss: the same workload with process crashes only
/// (`kill -9`: the page cache survives, as in `crash.rs`) and no I/O errors passes with
/// every injected bug, over the seeds that find them all above.
#[test]
fn kill_9_alone_finds_none_of_them() {
    for (name, bugs) in INJECTED {
        let opts = Opts {
            bugs,
            crashes: Crashes::ProcessOnly,
            errors: false,
            ..Opts::new(steps())
        };
        let (failed, total) = run_many(0..FIND_WITHIN, opts, true);
        if let Some((seed, r)) = failed.first() {
            panic!("{name}: a process crash found it (seed {seed}):\n{r}");
        }
        eprintln!(
            "{name}: {FIND_WITHIN} seeds with process crashes only pass ({} recoveries)",
            total.recoveries
        );
    }
}

/// The switch itself: with `ack_before_fsync` a ticket completes although its fsync fails.
#[test]
fn the_ack_before_fsync_switch_takes_effect() {
    use tern_store::sim::{FaultAction, OpKind, ScriptedFault};

    for bug in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let cfg = SimConfig {
            faults: vec![ScriptedFault {
                op: OpKind::Sync,
                path_contains: "streams/s/".into(),
                nth: 3,
                action: FaultAction::Eio,
            }],
            bugs: Bugs {
                ack_before_fsync: bug,
                ..Bugs::NONE
            },
            ..Default::default()
        };
        let disk = SimDisk::new(dir.path(), 1, cfg);
        let store = Store::open_with_vfs(dir.path(), disk.vfs()).unwrap();
        let s = store.stream("s", StreamConfig::default()).unwrap();
        // Syncs 1 and 2 are the new block's and recovery's; 3, this append's, fails.
        let res = s.append(b"t", b"", b"x").unwrap().wait();
        assert_eq!(res.is_ok(), bug, "bug {bug}: {res:?}");
        assert!(s.flush().is_err() && s.info().failed);
    }
}
