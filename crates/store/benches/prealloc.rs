//! Group commits into a block file reserved with `fallocate` (what the store does) against
//! commits into a block that grows with every one, and into one reserved by writing zeros
//! (ARCHITECTURE §4; BENCHMARKS.md, "Session 6: preallocated blocks"). The three kinds of
//! stream live in one process and run in interleaved rounds (the order rotated every round),
//! so that the shared disk's swings hit them alike. The other two run on a `Vfs` whose files
//! refuse `allocate`, as on a file system that cannot reserve space (the store then appends
//! exactly as it did before blocks were reserved), or write the reservation out as zeros (no
//! unwritten extents for a commit to convert, at the price of writing every block twice).
//!
//! Prints, per case, the median over rounds of the mean µs per commit (window 1: one record,
//! one `pwrite` and one `fdatasync` per commit) or per record (window 256: group commits of
//! up to 256 records), with the range over rounds.
//! Run: `cargo bench -p tern-store --bench prealloc` (`ROUNDS=n`, `COMMITS=n` to change the
//! default 15 rounds of 200 commits; the store goes to `TMPDIR`, which must be the disk to
//! measure, not a tmpfs).

use std::collections::VecDeque;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use tern_store::vfs::{RealVfs, VFile, Vfs};
use tern_store::{Store, Stream, StreamConfig};

/// The real file system, with `allocate` refused (blocks grow) or done by writing zeros.
#[derive(Debug, Clone, Copy)]
enum Other {
    Growing,
    ZeroFilled,
}

#[derive(Debug)]
struct OtherFile(Arc<dyn VFile>, Other);

/// Zeros written per call when a reservation is written out.
const ZERO_CHUNK_BYTES: u64 = 1 << 20;

impl VFile for OtherFile {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_all_at(buf, offset)
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.0.read_exact_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn start_sync(
        &self,
        _done: tern_store::vfs::SyncDone,
    ) -> Option<Box<dyn tern_store::vfs::SyncInFlight>> {
        None
    }
    fn file_len(&self) -> io::Result<u64> {
        self.0.file_len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
    fn allocate(&self, len_bytes: u64) -> io::Result<()> {
        match self.1 {
            Other::Growing => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "this bench's growing blocks",
            )),
            Other::ZeroFilled => {
                let zeros = vec![0u8; ZERO_CHUNK_BYTES as usize];
                let mut at = self.0.file_len()?;
                while at < len_bytes {
                    let n = (len_bytes - at).min(ZERO_CHUNK_BYTES);
                    self.0.write_all_at(&zeros[..n as usize], at)?;
                    at += n;
                }
                Ok(())
            }
        }
    }
}

impl Vfs for Other {
    fn open_rw(&self, path: &Path, create_new: bool) -> io::Result<Arc<dyn VFile>> {
        Ok(Arc::new(OtherFile(
            RealVfs.open_rw(path, create_new)?,
            *self,
        )))
    }
    fn read_file(&self, path: &Path) -> io::Result<Vec<u8>> {
        RealVfs.read_file(path)
    }
    fn write_file(&self, path: &Path, data: &[u8]) -> io::Result<()> {
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
        RealVfs.sync_dir(dir)
    }
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        RealVfs.list_dir(dir)
    }
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Appends `n` records of `payload` with at most `window` outstanding; µs per record.
fn run(s: &Stream, payload: &[u8], window: usize, n: usize) -> f64 {
    let mut pending = VecDeque::with_capacity(window);
    let start = Instant::now();
    for _ in 0..n {
        if pending.len() == window
            && let Some(t) = pending.pop_front()
        {
            let t: tern_store::Ticket = t;
            t.wait().expect("append");
        }
        pending.push_back(s.append(b"bench/topic", b"", payload).expect("append"));
    }
    while let Some(t) = pending.pop_front() {
        t.wait().expect("append");
    }
    start.elapsed().as_secs_f64() * 1e6 / n as f64
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let rounds = env_or("ROUNDS", 15);
    let commits = env_or("COMMITS", 200);
    let dir = tempfile::tempdir().expect("temp dir");
    let open = |name: &str, vfs: Arc<dyn Vfs>| {
        let store = Store::open_with_vfs(dir.path().join(name), vfs).expect("store");
        let s = store.stream("s", StreamConfig::default()).expect("stream");
        (store, s)
    };
    let (_g, growing) = open("growing", Arc::new(Other::Growing));
    let (_r, reserved) = open("reserved", Arc::new(RealVfs));
    let (_z, zeroed) = open("zeroed", Arc::new(Other::ZeroFilled));
    let kinds = [
        ("growing", &growing),
        ("fallocate", &reserved),
        ("zeroed", &zeroed),
    ];
    for (size, window, n) in [
        (64, 1, commits),
        (1024, 1, commits),
        (64, 256, commits * 64),
    ] {
        let payload = vec![0xab_u8; size];
        let mut times = [Vec::new(), Vec::new(), Vec::new()];
        for round in 0..rounds {
            for i in 0..kinds.len() {
                let k = (round + i) % kinds.len();
                times[k].push(run(kinds[k].1, &payload, window, n));
            }
        }
        let unit = if window == 1 { "commit" } else { "record" };
        for (k, t) in times.iter_mut().enumerate() {
            let (lo, hi) = (
                t.iter().copied().fold(f64::MAX, f64::min),
                t.iter().copied().fold(0.0, f64::max),
            );
            println!(
                "{size} B, window {window}, {:9}: median {:7.1} µs per {unit} ({lo:.1}-{hi:.1}, {rounds} rounds of {n})",
                kinds[k].0,
                median(t),
            );
        }
    }
}
