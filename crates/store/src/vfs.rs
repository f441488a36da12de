//! The file abstraction the store does all its I/O through, so tests can inject failures.
//!
//! [`RealVfs`] maps straight onto `std::fs` (`pwrite`, `pread`, `fdatasync`). [`FaultyVfs`]
//! wraps it and fails the Nth write or sync after being armed; a failing write still writes
//! half of its buffer first, the way a real short write or a full disk leaves a torn tail.
//! With the `sim` feature, `crate::sim::SimDisk` models a page cache and power loss.

use std::fmt::Debug;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// An open file.
pub trait VFile: Send + Sync + Debug {
    /// Writes all of `buf` at `offset`.
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Reads exactly `buf.len()` bytes at `offset`.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// `fdatasync`.
    fn sync_data(&self) -> io::Result<()>;
    /// Starts a sync of everything written to the file so far and returns without waiting
    /// for it, where this file system can run syncs side by side: a replicated disk, where
    /// a sync is a consensus round and rounds overlap, so a writer writes its next batch
    /// while the last one commits. `None` where it cannot; the caller then calls
    /// `sync_data`, which blocks.
    ///
    /// Contract: a handle's `wait` returns `Ok` only once everything written to this file
    /// before `start_sync` was called is as durable as after `sync_data`; once one sync of a
    /// file failed, no later one of it succeeds (what the failed one did not make durable
    /// may never be); `done` is called exactly once, when `wait` would no longer block
    /// (also when `None` is returned: then at once, or never — the caller must not count on
    /// it); the caller waits for its handles in the order it started them.
    fn start_sync(&self, done: SyncDone) -> Option<Box<dyn SyncInFlight>>;
    fn file_len(&self) -> io::Result<u64>;
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Reserves the file's first `len_bytes` bytes and makes it at least that long, reading
    /// zeros past the old length (`fallocate` that sets the size; it never shortens). Writes
    /// into reserved space change no file size, so their `fdatasync` need not commit one
    /// (see `recovery::preallocate`). Fails with `ErrorKind::Unsupported` where the file
    /// system cannot reserve space. Like any size change, durable once the file is synced.
    fn allocate(&self, len_bytes: u64) -> io::Result<()>;
}

/// Told that a sync started by [`VFile::start_sync`] is done (succeeded or failed), on
/// whatever thread finished it. It must not block.
pub type SyncDone = Box<dyn FnOnce() + Send>;

/// A sync started by [`VFile::start_sync`], not yet waited for.
pub trait SyncInFlight: Send {
    /// Blocks until the sync is done: `Ok` as [`VFile::start_sync`] promises, or why what it
    /// covers may never be durable.
    fn wait(self: Box<Self>) -> io::Result<()>;
}

/// Directory and file operations.
pub trait Vfs: Send + Sync + Debug {
    /// Opens a file for reading and writing; `create_new` fails if it exists.
    fn open_rw(&self, path: &Path, create_new: bool) -> io::Result<Arc<dyn VFile>>;
    fn read_file(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// Writes a whole file without syncing it (used for rebuildable index files).
    fn write_file(&self, path: &Path, data: &[u8]) -> io::Result<()>;
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Moves a file that is being thrown away from `from` to `to`, where nothing reads it
    /// again and it is only removed later (the store's `trash/`). The contract is that of a
    /// rename for `from` (gone, durably so once its directory is synced); of `to` only that
    /// it may exist until removed. A file system may therefore keep `to`'s contents or not:
    /// the replicated disk records only the removal of `from`, where a rename would copy
    /// the data nobody reads through consensus.
    fn discard(&self, from: &Path, to: &Path) -> io::Result<()>;
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// `fsync` of a directory, making creates, renames and removes in it durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// File names (not paths) in a directory.
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// A second name for the file at `from` (snapshots); unsupported unless overridden.
    fn hard_link(&self, from: &Path, to: &Path) -> io::Result<()> {
        let _ = (from, to);
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "hard links are not supported by this file system layer",
        ))
    }
    /// How the writers of streams on this file system run: `false` (production), each on a
    /// thread of its own; `true`, stepped by the caller (`Store::step`, `Stream::step`) on
    /// the caller's thread, so that a simulator running everything on one thread decides
    /// the order of every writer turn. See `writer::drive`.
    fn stepped_writers(&self) -> bool {
        false
    }
    /// Wall-clock time in ns since the Unix epoch: record times and `max_age` expiry.
    fn now_ns(&self) -> u64 {
        system_now_ns()
    }
    /// A monotonic clock in ns from an arbitrary origin: the writer's timers (interval
    /// syncs, the expiry timer). A simulator answers virtual time for both clocks.
    fn monotonic_ns(&self) -> u64 {
        process_monotonic_ns()
    }
    /// Defects the store should give itself, so a test can prove its checker finds them.
    /// Exists only with the `sim` feature; only a simulated disk answers anything but none.
    #[cfg(feature = "sim")]
    fn injected_bugs(&self) -> Bugs {
        Bugs::NONE
    }
}

/// The real file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealVfs;

#[derive(Debug)]
struct RealFile(File);

impl VFile for RealFile {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_all_at(buf, offset)
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.0.read_exact_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn start_sync(&self, _done: SyncDone) -> Option<Box<dyn SyncInFlight>> {
        // `fdatasync` blocks its caller; running it beside the writer would take a thread
        // of its own, and one local disk gains little from two syncs at once.
        None
    }
    fn file_len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
    fn allocate(&self, len_bytes: u64) -> io::Result<()> {
        use rustix::fs::{FallocateFlags, fallocate};
        // Mode 0 (no KEEP_SIZE): the file's size becomes `len_bytes`, so later writes below
        // it are not appends. EOPNOTSUPP (tmpfs on old kernels, some network file systems)
        // maps to `ErrorKind::Unsupported`.
        fallocate(&self.0, FallocateFlags::empty(), 0, len_bytes).map_err(io::Error::from)
    }
}

impl Vfs for RealVfs {
    fn open_rw(&self, path: &Path, create_new: bool) -> io::Result<Arc<dyn VFile>> {
        let mut o = OpenOptions::new();
        o.read(true).write(true);
        if create_new {
            o.create_new(true);
        }
        Ok(Arc::new(RealFile(o.open(path)?)))
    }
    fn read_file(&self, path: &Path) -> io::Result<Vec<u8>> {
        fs::read(path)
    }
    fn write_file(&self, path: &Path, data: &[u8]) -> io::Result<()> {
        fs::write(path, data)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }
    fn discard(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }
    fn hard_link(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::hard_link(from, to)
    }
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        fs::create_dir_all(dir)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for e in fs::read_dir(dir)? {
            if let Ok(name) = e?.file_name().into_string() {
                out.push(name);
            }
        }
        Ok(out)
    }
}

/// Counters shared by a [`FaultyVfs`] and the files it opened.
#[derive(Debug)]
pub struct FaultPlan {
    /// Writes still allowed before one fails (`u64::MAX` = never fail).
    pub writes_left: AtomicU64,
    /// Syncs (file or directory) still allowed before one fails.
    pub syncs_left: AtomicU64,
    /// Files answer [`VFile::start_sync`] (off by default: as a real file, `None`).
    pub overlapping_syncs: std::sync::atomic::AtomicBool,
    /// Started and not yet waited for, now and at most so far.
    pub syncs_in_flight: AtomicU64,
    pub max_syncs_in_flight: AtomicU64,
    /// Set by [`FaultyVfs::panic_in_next_sync`]: the next file sync waits on it, then panics.
    pub sync_panic: std::sync::Mutex<Option<std::sync::mpsc::Receiver<()>>>,
}

impl FaultPlan {
    fn take(counter: &AtomicU64) -> bool {
        // Returns true when this call must fail.
        counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                if n == u64::MAX {
                    None
                } else {
                    Some(n.saturating_sub(1))
                }
            })
            .map(|prev| prev == 0)
            .unwrap_or(false)
    }
}

/// A sync started by a [`FaultyVfs`] file: an `fdatasync` (or its injected failure) on a
/// thread of its own.
struct FaultySync {
    sync: Option<std::thread::JoinHandle<io::Result<()>>>,
    plan: Arc<FaultPlan>,
}

impl SyncInFlight for FaultySync {
    fn wait(mut self: Box<Self>) -> io::Result<()> {
        match self.sync.take().map(std::thread::JoinHandle::join) {
            Some(Ok(res)) => res,
            _ => Err(io::Error::other("the sync thread panicked")),
        }
    }
}

impl Drop for FaultySync {
    fn drop(&mut self) {
        self.plan.syncs_in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A [`Vfs`] that fails the Nth write or sync, for fault-injection tests.
#[derive(Debug, Clone)]
pub struct FaultyVfs {
    pub plan: Arc<FaultPlan>,
}

impl Default for FaultyVfs {
    fn default() -> Self {
        FaultyVfs {
            plan: Arc::new(FaultPlan {
                writes_left: AtomicU64::new(u64::MAX),
                syncs_left: AtomicU64::new(u64::MAX),
                overlapping_syncs: std::sync::atomic::AtomicBool::new(false),
                syncs_in_flight: AtomicU64::new(0),
                max_syncs_in_flight: AtomicU64::new(0),
                sync_panic: std::sync::Mutex::new(None),
            }),
        }
    }
}

impl FaultyVfs {
    /// After `n` more successful writes, every write fails.
    pub fn fail_write_after(&self, n: u64) {
        self.plan.writes_left.store(n, Ordering::SeqCst);
    }
    /// After `n` more successful syncs, every sync fails.
    pub fn fail_sync_after(&self, n: u64) {
        self.plan.syncs_left.store(n, Ordering::SeqCst);
    }
    /// Files start syncs that run side by side with later writes ([`VFile::start_sync`]), as
    /// a replicated disk's do.
    pub fn overlap_syncs(&self) {
        self.plan.overlapping_syncs.store(true, Ordering::SeqCst);
    }
    /// The most syncs started and not yet waited for at once so far.
    pub fn max_syncs_in_flight(&self) -> u64 {
        self.plan.max_syncs_in_flight.load(Ordering::SeqCst)
    }
    /// The next `sync_data` of a file (not a sync started with `overlap_syncs`) blocks until
    /// the returned sender sends (or is dropped), then panics: a writer that dies in the
    /// middle of a turn, with work queued behind it.
    pub fn panic_in_next_sync(&self) -> std::sync::mpsc::SyncSender<()> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        // Not `shared::lock`: `vfs` is the store's bottom layer (layering.rs).
        *self
            .plan
            .sync_panic
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(rx);
        tx
    }
}

#[derive(Debug)]
struct FaultyFile {
    inner: RealFile,
    plan: Arc<FaultPlan>,
}

fn injected(what: &str) -> io::Error {
    io::Error::other(format!("injected {what} failure"))
}

impl VFile for FaultyFile {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if FaultPlan::take(&self.plan.writes_left) {
            // A torn write: part of the data reaches the file.
            let _ = self.inner.write_all_at(&buf[..buf.len() / 2], offset);
            return Err(injected("write"));
        }
        self.inner.write_all_at(buf, offset)
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_exact_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        let panic_on = self
            .plan
            .sync_panic
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(release) = panic_on {
            let _ = release.recv();
            panic!("injected: a panic in fdatasync");
        }
        if FaultPlan::take(&self.plan.syncs_left) {
            return Err(injected("fsync"));
        }
        self.inner.sync_data()
    }
    fn start_sync(&self, done: SyncDone) -> Option<Box<dyn SyncInFlight>> {
        if !self.plan.overlapping_syncs.load(Ordering::SeqCst) {
            return None;
        }
        let file = self.inner.0.try_clone().ok()?;
        let now = self.plan.syncs_in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.plan
            .max_syncs_in_flight
            .fetch_max(now, Ordering::SeqCst);
        // Its own thread, so that it runs beside the writer's next batch.
        let plan = self.plan.clone();
        let sync = std::thread::spawn(move || {
            let res = if FaultPlan::take(&plan.syncs_left) {
                Err(injected("fsync"))
            } else {
                file.sync_data()
            };
            done();
            res
        });
        Some(Box::new(FaultySync {
            sync: Some(sync),
            plan: self.plan.clone(),
        }))
    }
    fn file_len(&self) -> io::Result<u64> {
        self.inner.file_len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
    fn allocate(&self, len_bytes: u64) -> io::Result<()> {
        self.inner.allocate(len_bytes)
    }
}

impl Vfs for FaultyVfs {
    fn open_rw(&self, path: &Path, create_new: bool) -> io::Result<Arc<dyn VFile>> {
        let mut o = OpenOptions::new();
        o.read(true).write(true);
        if create_new {
            o.create_new(true);
        }
        Ok(Arc::new(FaultyFile {
            inner: RealFile(o.open(path)?),
            plan: self.plan.clone(),
        }))
    }
    fn read_file(&self, path: &Path) -> io::Result<Vec<u8>> {
        RealVfs.read_file(path)
    }
    fn write_file(&self, path: &Path, data: &[u8]) -> io::Result<()> {
        if FaultPlan::take(&self.plan.writes_left) {
            return Err(injected("write"));
        }
        RealVfs.write_file(path, data)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        RealVfs.remove_file(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        RealVfs.rename(from, to)
    }
    fn discard(&self, from: &Path, to: &Path) -> io::Result<()> {
        RealVfs.discard(from, to)
    }
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        RealVfs.create_dir_all(dir)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        if FaultPlan::take(&self.plan.syncs_left) {
            return Err(injected("directory fsync"));
        }
        RealVfs.sync_dir(dir)
    }
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        RealVfs.list_dir(dir)
    }
}

/// The system clock in ns since the Unix epoch (0 before 1970).
pub fn system_now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// `Instant::now()` in ns since the first call in this process.
pub fn process_monotonic_ns() -> u64 {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    let origin = *ORIGIN.get_or_init(Instant::now);
    u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Joins a directory and a file name.
pub(crate) fn path_in(dir: &Path, name: &str) -> PathBuf {
    dir.join(name)
}

/// Deliberate defects the store can be told to have, to prove that a checker finds them.
/// They are read from [`Vfs::injected_bugs`], which only a [`SimDisk`](crate::sim::SimDisk),
/// a test's own `Vfs` and tern-cluster's replicated disk under its test-only `inject`
/// feature answer with anything but "none"; they exist only in builds with the `sim`
/// feature and no configuration can reach them. Defined here, beside the trait that
/// carries them, so the store below `sim` can read them (`sim` re-exports them).
#[cfg(feature = "sim")]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bugs {
    /// Complete tickets (publish the durable sequence) before the commit's `fdatasync`.
    pub ack_before_fsync: bool,
    /// Seal a block without syncing it first (only matters under `sync = interval`, where a
    /// commit does not sync by itself).
    pub skip_sync_on_roll: bool,
    /// Create a new block file without the directory fsync that makes its name durable.
    pub skip_dir_sync_on_roll: bool,
    /// Complete a pipelined commit's tickets when its sync starts (`VFile::start_sync`), not
    /// when it settles: on the cluster's replicated disk, a PUBACK before the majority commit.
    pub ack_at_sync_start: bool,
}

#[cfg(feature = "sim")]
impl Bugs {
    /// No bug: the store as built.
    pub const NONE: Bugs = Bugs {
        ack_before_fsync: false,
        skip_sync_on_roll: false,
        skip_dir_sync_on_roll: false,
        ack_at_sync_start: false,
    };
}
