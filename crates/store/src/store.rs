//! A store: one directory holding many named streams, guarded by a lock file.
//!
//! Layout: `<dir>/LOCK`, `<dir>/streams/<name>/<base_seq>.blk|.idx`, and per stream a
//! `quarantine/` directory for damaged blocks.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use crate::config::StreamConfig;
use crate::error::{Result, StoreError};
use crate::kv::KvStream;
use crate::lockfile::LockFile;
use crate::shared::{Shared, lock};
use crate::stream::Stream;
use crate::vfs::{RealVfs, Vfs};

/// Longest stream name.
pub const MAX_STREAM_NAME_BYTES: usize = 128;

/// An open store directory. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Store {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    vfs: Arc<dyn Vfs>,
    lock: Arc<LockFile>,
    /// Open streams by name: the token marks a stream open, the shared state is what
    /// `step` drives (name order).
    open: Mutex<BTreeMap<String, OpenStream>>,
}

/// An entry of `Inner::open`: the stream's open token and its shared state.
type OpenStream = (Weak<()>, Weak<Shared>);

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_STREAM_NAME_BYTES
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

impl Store {
    /// Opens (creating if needed) a store directory and takes its lock.
    pub fn open(dir: impl AsRef<Path>) -> Result<Store> {
        Store::open_with_vfs(dir, Arc::new(RealVfs))
    }

    /// Opens a store doing its stream I/O through `vfs` (fault-injection tests).
    pub fn open_with_vfs(dir: impl AsRef<Path>, vfs: Arc<dyn Vfs>) -> Result<Store> {
        let dir = dir.as_ref().to_path_buf();
        crate::recovery::ensure_dir(&*vfs, &dir)?;
        crate::recovery::ensure_dir(&*vfs, &dir.join("streams"))?;
        let lock = Arc::new(LockFile::acquire(&dir)?);
        tracing::debug!(lock = %lock.path.display(), "store opened");
        Ok(Store {
            inner: Arc::new(Inner {
                dir,
                vfs,
                lock,
                open: Mutex::new(BTreeMap::new()),
            }),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    fn stream_dir(&self, name: &str) -> Result<PathBuf> {
        if !valid_name(name) {
            return Err(StoreError::InvalidName(name.to_string()));
        }
        Ok(self.inner.dir.join("streams").join(name))
    }

    /// Opens (creating if needed) the named stream. A stream can be open once at a time;
    /// clone the returned handle to share it.
    pub fn stream(&self, name: &str, config: StreamConfig) -> Result<Stream> {
        let dir = self.stream_dir(name)?;
        let mut open = lock(&self.inner.open);
        if open.get(name).is_some_and(|(w, _)| w.strong_count() > 0) {
            return Err(StoreError::AlreadyOpen(name.to_string()));
        }
        let token = Arc::new(());
        let s = Stream::open_dir(
            self.inner.vfs.clone(),
            dir,
            name.to_string(),
            config,
            Some(self.inner.lock.clone()),
            Some(token.clone()),
        )?;
        open.insert(
            name.to_string(),
            (Arc::downgrade(&token), Arc::downgrade(s.sh())),
        );
        Ok(s)
    }

    /// Stepped writers (`Vfs::stepped_writers`, a simulator's mode): runs one writer turn,
    /// on this thread, for every open stream (kv streams included) that has records or ops
    /// queued or a timer due by `Vfs::monotonic_ns`, in stream name order. Returns whether
    /// any turn ran. Always false with writer threads (production), where turns run by
    /// themselves.
    pub fn step(&self) -> bool {
        let mut any = false;
        for sh in self.open_streams() {
            any |= sh.step(false);
        }
        any
    }

    /// Stepped writers: the earliest next timer of any open stream (`Vfs::monotonic_ns`):
    /// once nothing is queued, the time a simulator's clock must reach for `step` to have
    /// work again. None with writer threads.
    pub fn next_timer_ns(&self) -> Option<u64> {
        self.open_streams()
            .iter()
            .filter_map(|sh| sh.next_timer_ns())
            .min()
    }

    /// The open streams' shared state, in name order (taken out of the lock, so that a
    /// turn never runs under it).
    fn open_streams(&self) -> Vec<Arc<Shared>> {
        let mut open = lock(&self.inner.open);
        open.retain(|_, (token, _)| token.strong_count() > 0);
        open.values().filter_map(|(_, sh)| sh.upgrade()).collect()
    }

    /// Opens (creating if needed) a keyed-state stream.
    pub fn kv(&self, name: &str, config: StreamConfig) -> Result<KvStream> {
        KvStream::new(self.stream(name, KvStream::adjust(config))?)
    }

    /// Names of the streams in the directory.
    pub fn stream_names(&self) -> Result<Vec<String>> {
        let d = self.inner.dir.join("streams");
        let mut v = self
            .inner
            .vfs
            .list_dir(&d)
            .map_err(|e| StoreError::io("list", &d, &e))?;
        v.retain(|n| valid_name(n));
        v.sort();
        Ok(v)
    }
}
