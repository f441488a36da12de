//! The replicated disk as the store sees it: its files and directory operations, each
//! change made locally and recorded (`Inner::change`), each sync a wait for the commit of
//! what was recorded before it.

use std::fmt;
use std::io;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use tern_store::vfs::{RealVfs, SyncDone, SyncInFlight, VFile, Vfs};

use super::{Inner, PendingOp, ReplicatedDisk};
use crate::ops::{Op, RelPath};

/// A sync of a replicated file in flight: the operations recorded before it started.
struct ReplicatedSync {
    disk: Arc<Inner>,
    target: u64,
}

impl SyncInFlight for ReplicatedSync {
    fn wait(self: Box<Self>) -> io::Result<()> {
        self.disk.wait_committed(self.target)
    }
}

struct ReplicatedFile {
    path: RelPath,
    file: Arc<dyn VFile>,
    disk: Arc<Inner>,
}

impl fmt::Debug for ReplicatedFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ReplicatedFile({})", self.path.as_str())
    }
}

impl VFile for ReplicatedFile {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.disk.write(&self.path, self.file.as_ref(), buf, offset)
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.disk.sync()
    }
    fn start_sync(&self, done: SyncDone) -> Option<Box<dyn SyncInFlight>> {
        // What is recorded now is proposed as the proposer takes it (up to
        // `MAX_PROPOSALS_IN_FLIGHT` rounds side by side); the handle waits for its commit.
        let target = self.disk.on_committed(done);
        Some(Box::new(ReplicatedSync {
            disk: self.disk.clone(),
            target,
        }))
    }
    fn file_len(&self) -> io::Result<u64> {
        self.file.file_len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        let op = PendingOp::Other(Op::SetLen {
            path: self.path.clone(),
            len,
        });
        self.disk.change(op, || self.file.set_len(len))
    }
    fn allocate(&self, len_bytes: u64) -> io::Result<()> {
        let op = PendingOp::Other(Op::Allocate {
            path: self.path.clone(),
            len: len_bytes,
        });
        self.disk.change(op, || self.file.allocate(len_bytes))
    }
}

impl Vfs for ReplicatedDisk {
    fn open_rw(&self, path: &Path, create_new: bool) -> io::Result<Arc<dyn VFile>> {
        let rel = self.inner.rel(path)?;
        let file = if create_new {
            let op = PendingOp::Other(Op::Create(rel.clone()));
            self.inner.change(op, || RealVfs.open_rw(path, true))?
        } else {
            RealVfs.open_rw(path, false)?
        };
        Ok(Arc::new(ReplicatedFile {
            path: rel,
            file,
            disk: self.inner.clone(),
        }))
    }
    fn read_file(&self, path: &Path) -> io::Result<Vec<u8>> {
        RealVfs.read_file(path)
    }
    fn write_file(&self, path: &Path, data: &[u8]) -> io::Result<()> {
        let op = PendingOp::Other(Op::WriteFile {
            path: self.inner.rel(path)?,
            data: Bytes::copy_from_slice(data),
        });
        self.inner.change(op, || RealVfs.write_file(path, data))
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let op = PendingOp::Other(Op::Remove(self.inner.rel(path)?));
        self.inner.change(op, || RealVfs.remove_file(path))
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let (rel_from, rel_to) = (self.inner.rel(from)?, self.inner.rel(to)?);
        self.inner.change_then(|| {
            RealVfs.rename(from, to)?;
            let mut ops = self.inner.copy_ops(to, &rel_to)?;
            ops.push(PendingOp::Other(Op::Remove(rel_from)));
            Ok(((), ops))
        })
    }
    /// Replicated as the removal of `from` only: `to` is never read (the contract), so its
    /// data is not copied through consensus; the replica has no `to`, and its later
    /// removal is a removal of a missing file there (done).
    fn discard(&self, from: &Path, to: &Path) -> io::Result<()> {
        let rel_from = self.inner.rel(from)?;
        self.inner.rel(to)?;
        self.inner.change_then(|| {
            RealVfs.rename(from, to)?;
            Ok(((), vec![PendingOp::Other(Op::Remove(rel_from))]))
        })
    }
    /// Replicated as a copy: the replica's file does not follow later writes to `from` (the
    /// store links only sealed blocks, into snapshots, which nothing writes again).
    fn hard_link(&self, from: &Path, to: &Path) -> io::Result<()> {
        let rel_to = self.inner.rel(to)?;
        self.inner.change_then(|| {
            RealVfs.hard_link(from, to)?;
            Ok(((), self.inner.copy_ops(to, &rel_to)?))
        })
    }
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        if dir == self.inner.root {
            return RealVfs.create_dir_all(dir);
        }
        let op = PendingOp::Other(Op::CreateDir(self.inner.rel(dir)?));
        self.inner.change(op, || RealVfs.create_dir_all(dir))
    }
    /// The store's injected bugs (the cluster simulator's `ack-at-sync-start`).
    #[cfg(feature = "inject")]
    fn injected_bugs(&self) -> tern_store::vfs::Bugs {
        use crate::inject::{Bug, on};
        tern_store::vfs::Bugs {
            ack_at_sync_start: on(Bug::AckAtSyncStart),
            ..tern_store::vfs::Bugs::NONE
        }
    }
    fn sync_dir(&self, _dir: &Path) -> io::Result<()> {
        self.inner.sync()
    }
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        RealVfs.list_dir(dir)
    }
}
