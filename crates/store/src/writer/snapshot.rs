//! Snapshots: a copy of the stream as it is at the end of one writer turn, for online
//! backups. Runs in the writer turn after its commit: the stream directory changes
//! only in the writer's turns, so nothing moves while the copy is made.
//!
//! # Invariants
//! - Sealed blocks are never written again (compaction writes a new file and renames it over
//!   the old name; removal renames into `trash/`): a hard link to one is a stable copy of it.
//! - The active block is copied up to the length written so far, which recovery treats as it
//!   treats the file after a `kill -9` at this moment.
//! - Index files are not copied: recovery rebuilds a missing index from its block.
//! - The copy is durable (files and directory synced) before the snapshot is reported done.

use std::path::Path;

use super::Writer;
use crate::error::{Result, StoreError};
use crate::queue::Removed;
use crate::shared::lock;

/// Largest active block copied in one read (block sizes are bounded by the config).
const COPY_CHUNK_BYTES: usize = 1 << 20;

impl Writer {
    /// Takes every snapshot asked for in this turn and replies to each.
    pub(super) fn run_snapshots(&mut self) {
        for (dest, reply) in std::mem::take(&mut self.snapshots) {
            let result = self.snapshot(&dest);
            if let Err(e) = &result {
                tracing::warn!(stream = %self.sh.name, dest = %dest.display(), error = %e,
                    "snapshot failed");
            }
            let _ = reply.try_send(result.map(|()| Removed::default()));
        }
    }

    fn snapshot(&self, dest: &Path) -> Result<()> {
        let sh = &self.sh;
        let vfs = &sh.vfs;
        vfs.create_dir_all(dest)
            .map_err(|e| StoreError::io("create snapshot dir", dest, &e))?;
        let paths: Vec<std::path::PathBuf> = lock(&sh.state)
            .blocks
            .iter()
            .map(|b| b.path.clone())
            .collect();
        let Some((active, sealed)) = paths.split_last() else {
            return Ok(());
        };
        for path in sealed {
            let to = dest.join(file_name(path)?);
            vfs.hard_link(path, &to)
                .map_err(|e| StoreError::io("link block into snapshot", &to, &e))?;
        }
        let to = dest.join(file_name(active)?);
        let copy = vfs
            .open_rw(&to, true)
            .map_err(|e| StoreError::io("create snapshot block", &to, &e))?;
        let mut offset = 0u64;
        let mut buf = vec![0u8; COPY_CHUNK_BYTES];
        while offset < self.active_len {
            let n = usize::try_from(self.active_len - offset)
                .unwrap_or(usize::MAX)
                .min(COPY_CHUNK_BYTES);
            self.active_file
                .read_exact_at(&mut buf[..n], offset)
                .map_err(|e| StoreError::io("read active block", active, &e))?;
            copy.write_all_at(&buf[..n], offset)
                .map_err(|e| StoreError::io("write snapshot block", &to, &e))?;
            offset += n as u64;
        }
        copy.sync_data()
            .map_err(|e| StoreError::io("fdatasync", &to, &e))?;
        vfs.sync_dir(dest)
            .map_err(|e| StoreError::io("fsync directory", dest, &e))
    }
}

fn file_name(path: &Path) -> Result<&std::ffi::OsStr> {
    path.file_name().ok_or_else(|| {
        let e = std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "block path without a name",
        );
        StoreError::io("snapshot", path, &e)
    })
}
