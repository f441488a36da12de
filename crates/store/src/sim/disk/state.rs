//! The simulated disk's state: inodes (cache and durable images, dirty pages), the cached and
//! durable name spaces, pending name changes, and the fault decisions.

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Node {
    Dir,
    File(u64),
}

#[derive(Debug, Default)]
pub(super) struct Inode {
    /// What reads see (and the file's length).
    pub(super) cache: Vec<u8>,
    /// What survives a power loss.
    pub(super) durable: Vec<u8>,
    /// Pages of `cache` written since they were last written back.
    pub(super) dirty: BTreeSet<u64>,
}

impl Inode {
    /// Copies page `p` (or its first `upto` bytes) from the cache to the durable image.
    pub(super) fn write_back(&mut self, p: u64, ps: usize, upto: Option<usize>) {
        let s = p as usize * ps;
        let mut e = (s + ps).min(self.cache.len());
        if let Some(t) = upto {
            e = e.min(s + t);
        }
        if s >= e {
            return;
        }
        if self.durable.len() < e {
            self.durable.resize(e, 0);
        }
        self.durable[s..e].copy_from_slice(&self.cache[s..e]);
    }

    pub(super) fn write(&mut self, off: usize, data: &[u8], ps: usize) {
        let old_len = self.cache.len();
        let end = off + data.len();
        if end > old_len {
            self.cache.resize(end, 0);
        }
        self.cache[off..end].copy_from_slice(data);
        let from = off.min(old_len);
        if end > from {
            for p in from / ps..=(end - 1) / ps {
                self.dirty.insert(p as u64);
            }
        }
    }

    pub(super) fn set_len(&mut self, len: usize, ps: usize) {
        let old = self.cache.len();
        if len < old {
            self.cache.truncate(len);
            self.dirty.retain(|&p| (p as usize) * ps < len);
        } else if len > old {
            self.cache.resize(len, 0);
            for p in old / ps..=(len - 1) / ps {
                self.dirty.insert(p as u64);
            }
        }
    }

    /// `fallocate` growing the file to `len` zeros. Only pages whose durable image still holds
    /// bytes cut off by an unsynced truncation are dirtied (they must read as zeros once
    /// synced); beyond the durable image nothing is, so a power loss before the next sync
    /// keeps the old length, or the new one as zeros ("length only"), like any size change.
    pub(super) fn allocate(&mut self, len: usize, ps: usize) {
        let old = self.cache.len();
        if len <= old {
            return;
        }
        let stale_end = len.min(self.durable.len());
        if stale_end > old {
            for p in old / ps..=(stale_end - 1) / ps {
                self.dirty.insert(p as u64);
            }
        }
        self.cache.resize(len, 0);
    }

    /// A successful `fdatasync`: length and dirty pages reach the disk.
    pub(super) fn sync(&mut self, ps: usize) {
        self.durable.resize(self.cache.len(), 0);
        for p in std::mem::take(&mut self.dirty) {
            self.write_back(p, ps, None);
        }
    }

    /// A failed `fdatasync`: a prefix of the dirty pages is written back.
    pub(super) fn failed_sync(&mut self, r: &mut SimRng, ps: usize, model: SyncErrorModel) {
        let pages: Vec<u64> = self.dirty.iter().copied().collect();
        let k = r.below(pages.len() as u64 + 1) as usize;
        for &p in &pages[..k] {
            self.write_back(p, ps, None);
            self.dirty.remove(&p);
        }
        if model == SyncErrorModel::DropDirty {
            self.dirty.clear();
        }
    }

    /// The power fails: decide what of the unsynced state survives. Returns the outcome.
    pub(super) fn lose_power(&mut self, r: &mut SimRng, ps: usize) -> Option<&'static str> {
        let changed = !self.dirty.is_empty() || self.cache.len() != self.durable.len();
        let what = if !changed {
            None
        } else {
            let pages: Vec<u64> = self.dirty.iter().copied().collect();
            let orig_len = self.durable.len();
            let mode = r.below(100);
            let what = if mode < 40 {
                "lost"
            } else if mode < 75 {
                let k = r.below(pages.len() as u64 + 1) as usize;
                for &p in &pages[..k] {
                    self.write_back(p, ps, None);
                }
                if let Some(&p) = pages.get(k) {
                    let t = r.below(ps as u64) as usize;
                    self.write_back(p, ps, Some(t));
                }
                "in order, torn"
            } else if mode < 90 {
                for &p in &pages {
                    if r.chance(0.5) {
                        self.write_back(p, ps, None);
                    }
                }
                if r.chance(0.5) {
                    self.durable.resize(self.cache.len(), 0);
                }
                "random pages"
            } else {
                self.durable.resize(self.cache.len(), 0);
                "length only"
            };
            if self.cache.len() < orig_len && r.chance(0.5) {
                self.durable.truncate(self.cache.len());
            }
            Some(what)
        };
        self.cache = self.durable.clone();
        self.dirty.clear();
        what
    }
}

/// Name changes in one directory that are not durable yet (applied together).
#[derive(Debug)]
pub(super) struct NsOp {
    pub(super) dir: PathBuf,
    pub(super) changes: Vec<(PathBuf, Option<Node>)>,
}

#[derive(Debug)]
pub(super) struct Hold {
    pub(super) under: PathBuf,
    /// Only a write whose bytes contain this is caught (empty: any write).
    pub(super) needle: Vec<u8>,
    pub(super) held: bool,
}

impl Hold {
    /// Whether this (armed, not yet holding) hold catches a write of `buf` to `path`.
    pub(super) fn catches(&self, path: &std::path::Path, buf: &[u8]) -> bool {
        !self.held
            && path.starts_with(&self.under)
            && (self.needle.is_empty() || buf.windows(self.needle.len()).any(|w| w == self.needle))
    }
}

pub(super) enum Decision {
    Ok,
    Eio,
    PowerLoss,
}

pub(super) const MAX_EVENTS: usize = 256;

#[derive(Debug)]
pub(super) struct DiskState {
    pub(super) cfg: SimConfig,
    pub(super) seed: u64,
    pub(super) root: PathBuf,
    pub(super) boot: u64,
    pub(super) inodes: BTreeMap<u64, Inode>,
    pub(super) next_ino: u64,
    pub(super) cache_ns: BTreeMap<PathBuf, Node>,
    pub(super) durable_ns: BTreeMap<PathBuf, Node>,
    pub(super) pending: Vec<NsOp>,
    pub(super) op_counts: HashMap<(u64, OpKind), u64>,
    pub(super) script_counts: Vec<u64>,
    pub(super) latency_calls: u64,
    pub(super) stats: SimStats,
    pub(super) trace: u64,
    pub(super) hold: Option<Hold>,
    pub(super) events: VecDeque<String>,
    pub(super) op_log: Vec<String>,
}

pub(super) fn eio(what: &str) -> io::Error {
    io::Error::other(format!("EIO (simulated): {what}"))
}

pub(super) fn dead() -> io::Error {
    eio("the disk is gone for this process (power loss or crash)")
}

pub(super) fn not_found(p: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{}: not found", p.display()),
    )
}

/// Hash of a path relative to the disk's root, so that runs in different directories
/// make the same choices.
pub(super) fn hash_rel(root: &Path, p: &Path) -> u64 {
    let rel = p.strip_prefix(root).unwrap_or(p);
    hash_bytes(rel.as_os_str().as_encoded_bytes())
}

impl DiskState {
    pub(super) fn key(&self, p: &Path) -> u64 {
        hash_rel(&self.root, p)
    }

    pub(super) fn check_boot(&self, boot: u64) -> io::Result<()> {
        if boot == self.boot {
            Ok(())
        } else {
            Err(dead())
        }
    }

    pub(super) fn event(&mut self, e: String) {
        if self.events.len() == MAX_EVENTS {
            self.events.pop_front();
        }
        self.events.push_back(e);
    }

    pub(super) fn trace(&mut self, parts: &[u64]) {
        self.trace = parts.iter().fold(self.trace, |h, &p| mix(h, p));
        if self.cfg.record_ops {
            self.op_log.push(format!("{parts:x?}"));
        }
    }

    /// Traces a call: a tag, the path, and numbers (offsets, lengths).
    pub(super) fn trace_at(&mut self, tag: u64, p: &Path, rest: &[u64]) {
        let mut parts = vec![tag, self.key(p)];
        parts.extend_from_slice(rest);
        self.trace(&parts);
    }

    pub(super) fn untraced(&self, p: &Path) -> bool {
        p.parent()
            .and_then(Path::file_name)
            .and_then(|n| n.to_str())
            .is_some_and(|n| self.cfg.untraced_dirs.iter().any(|d| d == n))
    }

    pub(super) fn rel<'a>(&self, p: &'a Path) -> std::borrow::Cow<'a, str> {
        p.strip_prefix(&self.root).unwrap_or(p).to_string_lossy()
    }

    /// Scripted faults first, then the probabilities, keyed by path and call number.
    pub(super) fn decide(&mut self, kind: OpKind, path: &Path) -> Decision {
        if kind == OpKind::Remove && self.untraced(path) {
            return Decision::Ok;
        }
        self.script_counts.resize(self.cfg.faults.len(), 0);
        let text = path.to_string_lossy();
        let mut scripted = None;
        for (i, f) in self.cfg.faults.iter().enumerate() {
            if f.op == kind && text.contains(f.path_contains.as_str()) {
                self.script_counts[i] += 1;
                if self.script_counts[i] == f.nth && scripted.is_none() {
                    scripted = Some(f.action);
                }
            }
        }
        let ph = self.key(path);
        let n = {
            let c = self.op_counts.entry((ph, kind)).or_insert(0);
            *c += 1;
            *c
        };
        match scripted {
            Some(FaultAction::Eio) => return Decision::Eio,
            Some(FaultAction::PowerLoss) => return Decision::PowerLoss,
            None => {}
        }
        let mut r = SimRng::keyed(&[self.seed, self.boot, ph, kind as u64, n]);
        let p_err = match kind {
            OpKind::Write => self.cfg.write_error,
            OpKind::Sync => self.cfg.sync_error,
            OpKind::SyncDir => self.cfg.dir_sync_error,
            _ => 0.0,
        };
        // Unlinks never crash the machine: the reaper thread issues them at its own time.
        if kind != OpKind::Remove && r.chance(self.cfg.power_loss) {
            Decision::PowerLoss
        } else if r.chance(p_err) {
            Decision::Eio
        } else {
            Decision::Ok
        }
    }

    /// An RNG for a decision that is not a call's fault (partial writes and write-backs).
    pub(super) fn rng(&self, tag: u64, path: &Path, extra: u64) -> SimRng {
        SimRng::keyed(&[self.seed, self.boot, tag, self.key(path), extra])
    }

    pub(super) fn node(&self, p: &Path) -> Option<Node> {
        self.cache_ns.get(p).copied()
    }

    pub(super) fn parent_is_dir(&self, p: &Path) -> bool {
        p.parent().is_some_and(|d| self.node(d) == Some(Node::Dir))
    }

    pub(super) fn under_root(&self, p: &Path) -> io::Result<()> {
        if p.starts_with(&self.root) {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{} is outside the simulated disk", p.display()),
            ))
        }
    }

    pub(super) fn push_ns(&mut self, dir: &Path, changes: Vec<(PathBuf, Option<Node>)>) {
        self.pending.push(NsOp {
            dir: dir.to_path_buf(),
            changes,
        });
    }

    pub(super) fn create_file(&mut self, p: &Path) -> u64 {
        let ino = self.next_ino;
        self.next_ino += 1;
        self.inodes.insert(ino, Inode::default());
        self.cache_ns.insert(p.to_path_buf(), Node::File(ino));
        let dir = p.parent().unwrap_or(&self.root).to_path_buf();
        self.push_ns(&dir, vec![(p.to_path_buf(), Some(Node::File(ino)))]);
        ino
    }

    pub(super) fn write(&mut self, ino: u64, off: usize, data: &[u8]) {
        let ps = self.cfg.page_size;
        if let Some(i) = self.inodes.get_mut(&ino) {
            i.write(off, data, ps);
        }
    }

    /// A write that failed or was cut by a power loss: a random prefix of it lands.
    pub(super) fn partial_write(&mut self, ino: u64, off: usize, data: &[u8], path: &Path) {
        let n = self
            .op_counts
            .get(&(self.key(path), OpKind::Write))
            .copied();
        let mut r = self.rng(1, path, n.unwrap_or(0));
        let k = r.below(data.len() as u64 + 1) as usize;
        self.write(ino, off, &data[..k]);
    }

    pub(super) fn sync_inode(&mut self, ino: u64, path: &Path, ok: bool) {
        let n = self.op_counts.get(&(self.key(path), OpKind::Sync)).copied();
        let mut r = self.rng(2, path, n.unwrap_or(0));
        let (ps, model) = (self.cfg.page_size, self.cfg.sync_error_model);
        if let Some(i) = self.inodes.get_mut(&ino) {
            if ok {
                i.sync(ps);
            } else {
                i.failed_sync(&mut r, ps, model);
            }
        }
    }

    /// Makes the pending name changes of `dir` durable.
    pub(super) fn sync_dir(&mut self, dir: &Path) {
        let mut rest = Vec::with_capacity(self.pending.len());
        for op in std::mem::take(&mut self.pending) {
            if op.dir == dir {
                for (p, n) in op.changes {
                    match n {
                        Some(n) => self.durable_ns.insert(p, n),
                        None => self.durable_ns.remove(&p),
                    };
                }
            } else {
                rest.push(op);
            }
        }
        self.pending = rest;
    }

    pub(super) fn power_loss(&mut self, why: &str) {
        self.stats.power_losses += 1;
        let pl = self.stats.power_losses;
        let mut summary = Vec::new();
        self.lose_name_changes(pl, &mut summary);
        let ns = self.surviving_names();
        self.lose_pages(pl, &ns, &mut summary);
        self.cache_ns = ns.clone();
        self.durable_ns = ns;
        self.boot += 1;
        self.hold = None;
        let e = format!("POWER LOSS #{pl} ({why}): {}", summary.join("; "));
        self.event(e);
    }

    /// Names: per directory, a prefix (or a subset) of its unsynced changes survives into
    /// `durable_ns`.
    fn lose_name_changes(&mut self, pl: u64, summary: &mut Vec<String>) {
        let mut by_dir: BTreeMap<PathBuf, Vec<usize>> = BTreeMap::new();
        for (i, op) in self.pending.iter().enumerate() {
            by_dir.entry(op.dir.clone()).or_default().push(i);
        }
        let mut kept = vec![false; self.pending.len()];
        for (dir, idxs) in &by_dir {
            let mut r = SimRng::keyed(&[self.seed, 0x9051, pl, self.key(dir)]);
            match self.cfg.metadata_order {
                MetadataOrder::Ordered => {
                    let k = r.below(idxs.len() as u64 + 1) as usize;
                    for &i in &idxs[..k] {
                        kept[i] = true;
                    }
                }
                MetadataOrder::Unordered => {
                    for &i in idxs {
                        kept[i] = r.chance(0.5);
                    }
                }
            }
            let k = idxs.iter().filter(|&&i| kept[i]).count();
            self.stats.names_lost += (idxs.len() - k) as u64;
            summary.push(format!(
                "{}: {k}/{} name changes",
                self.rel(dir),
                idxs.len()
            ));
        }
        for (i, op) in std::mem::take(&mut self.pending).into_iter().enumerate() {
            if kept[i] {
                for (p, n) in op.changes {
                    match n {
                        Some(n) => self.durable_ns.insert(p, n),
                        None => self.durable_ns.remove(&p),
                    };
                }
            }
        }
    }

    /// The durable names whose directory survived too (parents sort before children); the
    /// others go with it. Empties `durable_ns`.
    fn surviving_names(&mut self) -> BTreeMap<PathBuf, Node> {
        let mut ns: BTreeMap<PathBuf, Node> = BTreeMap::new();
        for (p, n) in std::mem::take(&mut self.durable_ns) {
            let keep = p == self.root || p.parent().is_some_and(|d| ns.get(d) == Some(&Node::Dir));
            if keep {
                ns.insert(p, n);
            }
        }
        ns
    }

    /// Data: per file still named in `ns`, what of its dirty pages reached the disk; the
    /// files no name reaches are gone.
    fn lose_pages(&mut self, pl: u64, ns: &BTreeMap<PathBuf, Node>, summary: &mut Vec<String>) {
        let names: HashMap<u64, PathBuf> = ns
            .iter()
            .filter_map(|(p, n)| match n {
                Node::File(i) => Some((*i, p.clone())),
                Node::Dir => None,
            })
            .collect();
        self.inodes.retain(|i, _| names.contains_key(i));
        let ps = self.cfg.page_size;
        let traced: BTreeSet<u64> = names
            .iter()
            .filter(|(_, p)| !self.untraced(p))
            .map(|(i, _)| *i)
            .collect();
        let mut trace = Vec::new();
        for (&ino, inode) in self.inodes.iter_mut() {
            let mut r = SimRng::keyed(&[self.seed, 0xda7a, pl, ino]);
            let before = inode.cache.len();
            if let Some(what) = inode.lose_power(&mut r, ps) {
                match what {
                    "lost" => self.stats.files_lost_all += 1,
                    "in order, torn" => self.stats.files_torn_in_order += 1,
                    "random pages" => self.stats.files_random_pages += 1,
                    _ => self.stats.files_length_only += 1,
                }
                let name = names.get(&ino).map(|p| {
                    p.strip_prefix(&self.root)
                        .unwrap_or(p)
                        .to_string_lossy()
                        .into_owned()
                });
                summary.push(format!(
                    "{}: {what}, {before} -> {} bytes",
                    name.unwrap_or_default(),
                    inode.cache.len()
                ));
            }
            // Lengths, not contents: the store stamps delete markers with the wall clock.
            if traced.contains(&ino) {
                trace.push(ino);
                trace.push(inode.cache.len() as u64);
            }
        }
        self.trace(&trace);
    }
}
