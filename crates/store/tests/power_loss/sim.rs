//! One seed's run: the streams on a simulated disk, the model beside them, and the
//! workload's operations (appends, bursts, flushes, removals, housekeeping).

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Crashes {
    /// Power losses (between steps and inside calls) and process crashes.
    PowerLoss,
    /// Only process crashes (`kill -9`: the page cache survives), as the repository's
    /// crash tests do.
    ProcessOnly,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Opts {
    pub(crate) steps: usize,
    pub(crate) bugs: Bugs,
    pub(crate) crashes: Crashes,
    /// Inject EIO on writes and syncs.
    pub(crate) errors: bool,
    pub(crate) verbose: bool,
}

impl Opts {
    pub(crate) fn new(steps: usize) -> Opts {
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
pub(crate) enum After {
    /// The disk's cache is its durable image: everything read is durable.
    PowerLoss,
    /// A process crash or a reopen: only syncing streams promise what they serve.
    Reopen,
}

#[derive(Debug, Default, Clone)]
pub(crate) struct Summary {
    pub(crate) steps: usize,
    pub(crate) appended: u64,
    pub(crate) durable_checked: u64,
    pub(crate) recoveries: u64,
    pub(crate) failures_seen: u64,
    pub(crate) power_losses: u64,
    pub(crate) digest: u64,
}

pub(crate) struct Sim {
    pub(crate) seed: u64,
    pub(crate) opts: Opts,
    pub(crate) rng: SimRng,
    pub(crate) _dir: tempfile::TempDir,
    pub(crate) root: PathBuf,
    pub(crate) disk: SimDisk,
    pub(crate) store: Option<Store>,
    pub(crate) handles: Vec<Option<Stream>>,
    pub(crate) models: Vec<Model>,
    pub(crate) log: Vec<String>,
    pub(crate) pl_seen: u64,
    pub(crate) sum: Summary,
}

pub(crate) fn policy_name(p: SyncPolicy) -> &'static str {
    match p {
        SyncPolicy::Always => "always",
        SyncPolicy::Interval(_) => "interval",
        SyncPolicy::Never => "never",
    }
}

impl Sim {
    pub(crate) fn new(seed: u64, opts: Opts) -> Sim {
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

    pub(crate) fn note(&mut self, s: String) {
        if self.opts.verbose {
            eprintln!("{s}");
        }
        self.log.push(s);
    }

    pub(crate) fn h(&self, i: usize) -> R<&Stream> {
        self.handles[i]
            .as_ref()
            .ok_or_else(|| format!("stream {i} is not open"))
    }

    pub(crate) fn stream_dir(&self, i: usize) -> PathBuf {
        self.root.join("streams").join(&self.models[i].name)
    }

    pub(crate) fn crashed(&self) -> bool {
        self.disk.power_losses() != self.pl_seen
    }

    // ---- the workload ----

    pub(crate) fn payload(&mut self) -> Vec<u8> {
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
    pub(crate) fn issue(&mut self, i: usize, batch: bool) -> R<Option<Ticket>> {
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
    pub(crate) fn settle(&mut self, i: usize, tickets: Vec<Ticket>) -> R {
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
    pub(crate) fn wait_written(&mut self, i: usize, seq: u64) -> R {
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

    pub(crate) fn append(&mut self, i: usize, batch: bool) -> R {
        let t = self.issue(i, batch)?;
        self.settle(i, t.into_iter().collect())
    }

    /// Several appends in one group commit, deterministically: the first one's write is
    /// held until the others are queued, so they form the writer's next turn together.
    pub(crate) fn burst(&mut self, i: usize) -> R {
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

    pub(crate) fn flush(&mut self, i: usize) -> R {
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

    pub(crate) fn removal(&mut self, i: usize) -> R {
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

    pub(crate) fn housekeeping(&mut self, i: usize) -> R {
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
    pub(crate) fn drain(&mut self, i: usize) -> R {
        let log = self.h(i)?.drain_removed();
        if !log.ranges.is_empty() {
            let m = &mut self.models[i];
            m.remove(|s, _| log.ranges.iter().any(|r| r.contains(&s)), false);
        }
        Ok(())
    }

    // ---- observing and checking ----
}
