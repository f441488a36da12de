//! A store: one directory holding many named streams, guarded by a lock file.
//!
//! Layout: `<dir>/LOCK`, `<dir>/streams/<name>/<base_seq>.blk|.idx`, and per stream a
//! `quarantine/` directory for damaged blocks.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use crate::config::StreamConfig;
use crate::error::{Result, StoreError};
use crate::kv::KvStream;
use crate::lockfile::LockFile;
use crate::shared::lock;
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
    open: Mutex<HashMap<String, Weak<()>>>,
}

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
                open: Mutex::new(HashMap::new()),
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
        if open.get(name).is_some_and(|w| w.strong_count() > 0) {
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
        open.insert(name.to_string(), Arc::downgrade(&token));
        Ok(s)
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
