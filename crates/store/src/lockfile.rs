//! The store directory's lock: `flock(LOCK_EX | LOCK_NB)` on `<dir>/LOCK`. The kernel drops
//! the lock when the process dies, even by `kill -9`, so it is never left stale.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use rustix::fs::{FlockOperation, flock};

use crate::error::{Result, StoreError};

#[derive(Debug)]
pub(crate) struct LockFile {
    _file: File,
    pub path: PathBuf,
}

impl LockFile {
    pub fn acquire(dir: &Path) -> Result<LockFile> {
        let path = dir.join("LOCK");
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| StoreError::io("open lock file", &path, &e))?;
        match flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => {
                return Err(StoreError::Locked(dir.to_path_buf()));
            }
            Err(e) => return Err(StoreError::io("flock", &path, &e.into())),
        }
        // For people looking at the directory; the lock itself is the flock.
        let _ = file.set_len(0);
        let _ = writeln!(file, "{}", std::process::id());
        Ok(LockFile { _file: file, path })
    }
}
