//! The replica: every node's copy of the leader's store files, as of the last applied Raft
//! entry. The state machine ([`ReplicaApplier`]) applies committed batches of file operations
//! to it; a snapshot is the replica's files (the broker's state, not the log); a node that
//! becomes leader copies its replica to a fresh working copy and opens its broker there.
//!
//! # Invariants
//! - Operations apply in log order, each at most once per run; applying a suffix again after
//!   a crash converges to the same files (every operation is idempotent or re-creates what
//!   the later ones change: see [`apply_op`]).
//! - With a syncing policy, every file and directory an `apply` call touched is fsynced
//!   before it returns, so the applied point recorded after it never runs ahead of the files.
//! - The working copy is taken under the same lock as `apply`, so it is the replica at one
//!   applied index, never half of a batch.

use std::collections::{BTreeSet, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tern_raft::{Applier, ApplyError, LogIndex};

use crate::ops::{Op, RelPath, for_each_nonzero_chunk};

/// Most file handles the applier keeps open between batches.
pub const MAX_OPEN_FILES: usize = 256;
/// Largest snapshot built or installed (it is held in memory whole by openraft 0.9).
pub const MAX_SNAPSHOT_BYTES: usize = 1 << 30;
/// Granularity at which runs of zeros (preallocated block space) are left out of snapshots
/// and working copies.
const CHUNK_BYTES: usize = 64 << 10;

struct State {
    root: PathBuf,
    /// fsync what each batch touched (off with `sync = "never"`).
    sync: bool,
    files: HashMap<RelPath, File>,
    touched_files: BTreeSet<RelPath>,
    touched_dirs: BTreeSet<PathBuf>,
    applied: Option<LogIndex>,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A handle on a node's replica, shared by its state machine and its lifecycle.
#[derive(Clone)]
pub struct Replica {
    state: Arc<Mutex<State>>,
}

impl Replica {
    /// The replica below `root` (created if missing).
    pub fn open(root: PathBuf, sync: bool) -> io::Result<Replica> {
        finish_cut_install(&root, sync)?;
        fs::create_dir_all(&root)?;
        Ok(Replica {
            state: Arc::new(Mutex::new(State {
                root,
                sync,
                files: HashMap::new(),
                touched_files: BTreeSet::new(),
                touched_dirs: BTreeSet::new(),
                applied: None,
            })),
        })
    }

    /// The state machine applying committed batches to this replica.
    pub fn applier(&self) -> Box<dyn Applier> {
        Box::new(ReplicaApplier(self.clone()))
    }

    /// The last index applied in this run (`None` before the first batch).
    pub fn applied(&self) -> Option<LogIndex> {
        lock(&self.state).applied
    }

    /// Replaces `dest` with a copy of the replica as of its last applied batch (runs of
    /// zeros left as holes), and returns the index that is.
    pub fn copy_to(&self, dest: &Path) -> io::Result<Option<LogIndex>> {
        let st = lock(&self.state);
        if dest.exists() {
            fs::remove_dir_all(dest)?;
        }
        copy_tree(&st.root, dest)?;
        Ok(st.applied)
    }
}

struct ReplicaApplier(Replica);

fn apply_error(index: LogIndex, what: impl std::fmt::Display) -> ApplyError {
    ApplyError(format!("replica: entry {index}: {what}"))
}

impl Applier for ReplicaApplier {
    fn apply(&mut self, index: LogIndex, ops: &[Bytes]) -> Result<(), ApplyError> {
        let mut st = lock(&self.0.state);
        for bytes in ops {
            let op = Op::decode(bytes).map_err(|e| apply_error(index, e))?;
            apply_op(&mut st, &op).map_err(|e| apply_error(index, format!("{op:?}: {e}")))?;
        }
        st.applied = Some(index);
        Ok(())
    }

    fn persist(&mut self) -> Result<(), ApplyError> {
        let mut st = lock(&self.0.state);
        if st.sync {
            sync_touched(&mut st).map_err(|e| ApplyError(format!("replica: fsync: {e}")))
        } else {
            st.touched_files.clear();
            st.touched_dirs.clear();
            Ok(())
        }
    }

    fn snapshot(&mut self) -> Result<Vec<u8>, ApplyError> {
        let st = lock(&self.0.state);
        let files = read_tree(&st.root, MAX_SNAPSHOT_BYTES)
            .map_err(|e| ApplyError(format!("snapshot: {e}")))?;
        tracing::info!(applied = ?st.applied, files = files.files.len(), "cluster: snapshot of the replica built");
        postcard::to_allocvec(&files).map_err(|e| ApplyError(format!("snapshot: {e}")))
    }

    fn install_snapshot(&mut self, index: LogIndex, data: &[u8]) -> Result<(), ApplyError> {
        let bad = |e: &dyn std::fmt::Display| ApplyError(format!("snapshot at {index}: {e}"));
        let (tree, rest): (Tree, _) = postcard::take_from_bytes(data).map_err(|e| bad(&e))?;
        if !rest.is_empty() {
            return Err(bad(&"trailing bytes"));
        }
        let mut st = lock(&self.0.state);
        st.files.clear();
        st.touched_files.clear();
        st.touched_dirs.clear();
        let root = st.root.clone();
        swap_in(&root, &tree, st.sync).map_err(|e| bad(&e))?;
        st.applied = Some(index);
        tracing::info!(
            index,
            files = tree.files.len(),
            "cluster: replica replaced by a snapshot"
        );
        Ok(())
    }
}

fn path_of(st: &State, p: &RelPath) -> io::Result<PathBuf> {
    p.join(&st.root).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("path {:?} leaves the replica", p.as_str()),
        )
    })
}

fn parent_of(path: &Path) -> PathBuf {
    path.parent().map(Path::to_path_buf).unwrap_or_default()
}

/// An open handle on `p`, created if missing (never truncated).
fn handle<'a>(st: &'a mut State, p: &RelPath) -> io::Result<&'a File> {
    if !st.files.contains_key(p) {
        if st.files.len() >= MAX_OPEN_FILES {
            st.files.clear();
        }
        let path = path_of(st, p)?;
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        st.files.insert(p.clone(), f);
        st.touched_dirs.insert(parent_of(&path));
    }
    st.touched_files.insert(p.clone());
    st.files
        .get(p)
        .ok_or_else(|| io::Error::other("handle vanished"))
}

fn ignore_missing(r: io::Result<()>) -> io::Result<()> {
    match r {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Applies one operation. Replaying a suffix of the log over files that already hold part of
/// it converges (`replaying_any_suffix_after_a_crash_converges_to_the_same_files`): writes,
/// lengths and whole-file writes set what they set whatever was there; a create truncates,
/// and every later write to that file is replayed too; removing a missing file is done.
fn apply_op(st: &mut State, op: &Op) -> io::Result<()> {
    match op {
        Op::Create(p) => {
            st.files.remove(p);
            let path = path_of(st, p)?;
            File::create(&path)?;
            st.touched_dirs.insert(parent_of(&path));
            handle(st, p).map(|_| ())
        }
        Op::Write { path, offset, data } => handle(st, path)?.write_all_at(data, *offset),
        Op::WriteFile { path, data } => {
            st.files.remove(path);
            let full = path_of(st, path)?;
            fs::write(&full, data)?;
            st.touched_files.insert(path.clone());
            st.touched_dirs.insert(parent_of(&full));
            Ok(())
        }
        Op::SetLen { path, len } => handle(st, path)?.set_len(*len),
        Op::Allocate { path, len } => {
            let f = handle(st, path)?;
            if f.metadata()?.len() < *len {
                f.set_len(*len)?;
            }
            Ok(())
        }
        Op::Remove(p) => {
            st.files.remove(p);
            st.touched_files.remove(p);
            let path = path_of(st, p)?;
            st.touched_dirs.insert(parent_of(&path));
            ignore_missing(fs::remove_file(&path))
        }
        Op::Barrier => Ok(()),
        Op::CreateDir(p) => {
            let path = path_of(st, p)?;
            st.touched_dirs.insert(parent_of(&path));
            fs::create_dir_all(&path)
        }
    }
}

fn sync_touched(st: &mut State) -> io::Result<()> {
    let files = std::mem::take(&mut st.touched_files);
    for p in &files {
        match st.files.get(p) {
            Some(f) => f.sync_data()?,
            // A handle dropped from the cache (or a whole-file write): fsync through a new
            // one; Linux flushes the file's pages whichever descriptor asks.
            None => match File::open(path_of(st, p)?) {
                Ok(f) => f.sync_data()?,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            },
        }
    }
    for d in std::mem::take(&mut st.touched_dirs) {
        match File::open(&d) {
            Ok(f) => f.sync_all()?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A file of a snapshot: its length and its non-zero chunks.
#[derive(Debug, Serialize, Deserialize)]
struct TreeFile {
    path: String,
    len: u64,
    chunks: Vec<(u64, Bytes)>,
}

/// A snapshot: directories (relative, parents first) and files.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Tree {
    dirs: Vec<String>,
    files: Vec<TreeFile>,
}

fn walk(root: &Path, rel: &str, tree: &mut Tree, budget: &mut usize) -> io::Result<()> {
    let dir = if rel.is_empty() {
        root.to_path_buf()
    } else {
        root.join(rel)
    };
    let mut entries: Vec<_> = fs::read_dir(&dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let Some(name) = e.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let child = if rel.is_empty() {
            name
        } else {
            format!("{rel}/{name}")
        };
        let kind = e.file_type()?;
        if kind.is_dir() {
            tree.dirs.push(child.clone());
            walk(root, &child, tree, budget)?;
        } else if kind.is_file() {
            let file = read_file_chunks(&root.join(&child), child, budget)?;
            tree.files.push(file);
        }
    }
    Ok(())
}

fn read_file_chunks(path: &Path, rel: String, budget: &mut usize) -> io::Result<TreeFile> {
    let f = File::open(path)?;
    let len = f.metadata()?.len();
    let mut chunks = Vec::new();
    let read = |buf: &mut [u8], at| f.read_exact_at(buf, at);
    for_each_nonzero_chunk(len, CHUNK_BYTES, read, |at, bytes| {
        *budget = budget.checked_sub(bytes.len()).ok_or_else(|| {
            io::Error::other(format!(
                "snapshot above MAX_SNAPSHOT_BYTES ({MAX_SNAPSHOT_BYTES}, or a test's budget)"
            ))
        })?;
        chunks.push((at, Bytes::copy_from_slice(bytes)));
        Ok(())
    })?;
    Ok(TreeFile {
        path: rel,
        len,
        chunks,
    })
}

/// The files below `root`, their zero chunks left out, refused above `max_bytes` of data.
fn read_tree(root: &Path, max_bytes: usize) -> io::Result<Tree> {
    let mut tree = Tree::default();
    let mut budget = max_bytes;
    walk(root, "", &mut tree, &mut budget)?;
    Ok(tree)
}

/// Where a snapshot's tree is written before it replaces the replica.
const STAGING_SUFFIX: &str = "installing";
/// Where the replaced tree waits while the new one takes its name.
const REPLACED_SUFFIX: &str = "replaced";
/// The replaced tree once the new one is in place, removed at the next open or install.
const REMOVED_SUFFIX: &str = "removed";

/// `root`'s sibling named `<root's name>.<suffix>`.
fn sibling(root: &Path, suffix: &str) -> PathBuf {
    let mut name = root.file_name().unwrap_or_default().to_os_string();
    name.push(".");
    name.push(suffix);
    root.with_file_name(name)
}

fn remove_tree_if_any(path: &Path) -> io::Result<()> {
    ignore_missing(fs::remove_dir_all(path))
}

fn sync_parent(root: &Path) -> io::Result<()> {
    File::open(parent_of(root))?.sync_all()
}

/// Replaces the tree at `root` by `tree` so that a failure, or a crash before the last rename,
/// leaves the old tree at `root` once [`finish_cut_install`] has run: the new tree is written
/// (and synced) beside it, the old one renamed aside, the new one renamed in, and only then
/// the old one renamed to its removal name (deleted at the next open or install). A crash
/// after that last rename and before the caller has recorded the snapshot's applied point
/// (one kv record) keeps the new tree under the old point: the entries after that point are
/// still in the log (tern-raft purges none past the recorded point) and are applied again
/// over the new tree, which converges like any replay (test
/// `entries_applied_again_over_a_snapshot_installed_before_a_crash_converge`).
fn swap_in(root: &Path, tree: &Tree, sync: bool) -> io::Result<()> {
    let staged = sibling(root, STAGING_SUFFIX);
    let aside = sibling(root, REPLACED_SUFFIX);
    let removed = sibling(root, REMOVED_SUFFIX);
    remove_tree_if_any(&staged)?;
    remove_tree_if_any(&removed)?;
    if let Err(e) = write_tree(&staged, tree, sync) {
        let _ = remove_tree_if_any(&staged);
        return Err(e);
    }
    if root.exists() {
        fs::rename(root, &aside)?;
    }
    fs::rename(&staged, root)?;
    // Synced before the next rename: a power loss must not keep the old tree's removal name
    // without the new tree in place.
    if sync {
        sync_parent(root)?;
    }
    if aside.exists() {
        fs::rename(&aside, &removed)?;
    }
    // Synced before the caller records the snapshot's applied point: a replaced tree still
    // aside after a power loss would be put back by `open` under the new point.
    if sync {
        sync_parent(root)?;
    }
    Ok(())
}

/// After a crash in [`swap_in`]: a staged tree is dropped; a replaced tree still aside means
/// the swap had not finished (the snapshot's applied point was not recorded), so it is put
/// back in place of whatever stands at `root`; a removed tree is deleted.
fn finish_cut_install(root: &Path, sync: bool) -> io::Result<()> {
    let staged = sibling(root, STAGING_SUFFIX);
    let aside = sibling(root, REPLACED_SUFFIX);
    let removed = sibling(root, REMOVED_SUFFIX);
    let cut = staged.exists() || aside.exists();
    remove_tree_if_any(&staged)?;
    if aside.exists() {
        remove_tree_if_any(root)?;
        fs::rename(&aside, root)?;
        tracing::warn!(replica = %root.display(), "cluster: a snapshot install cut short was undone");
    }
    if cut && sync {
        sync_parent(root)?;
    }
    remove_tree_if_any(&removed)
}

fn write_tree(root: &Path, tree: &Tree, sync: bool) -> io::Result<()> {
    fs::create_dir_all(root)?;
    let rel = |s: &str| {
        RelPath::under(Path::new("/"), &Path::new("/").join(s))
            .and_then(|r| r.join(root))
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("bad path {s:?}")))
    };
    let mut dirs = vec![root.to_path_buf()];
    for d in &tree.dirs {
        let p = rel(d)?;
        fs::create_dir_all(&p)?;
        dirs.push(p);
    }
    for f in &tree.files {
        let p = rel(&f.path)?;
        let file = File::create(&p)?;
        file.set_len(f.len)?;
        for (at, data) in &f.chunks {
            file.write_all_at(data, *at)?;
        }
        if sync {
            file.sync_data()?;
        }
    }
    if sync {
        for d in dirs.iter().rev() {
            File::open(d)?.sync_all()?;
        }
    }
    Ok(())
}

/// Copies `src` to `dest` (which must not exist) file by file, a chunk at a time (no size
/// limit: the working copy is as large as the state), leaving zero chunks as holes.
fn copy_tree(src: &Path, dest: &Path) -> io::Result<()> {
    fs::create_dir_all(dest)?;
    let mut entries: Vec<_> = fs::read_dir(src)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let (from, to) = (e.path(), dest.join(e.file_name()));
        let kind = e.file_type()?;
        if kind.is_dir() {
            copy_tree(&from, &to)?;
        } else if kind.is_file() {
            let (r, w) = (File::open(&from)?, File::create(&to)?);
            let len = r.metadata()?.len();
            w.set_len(len)?;
            let read = |buf: &mut [u8], at| r.read_exact_at(buf, at);
            for_each_nonzero_chunk(len, CHUNK_BYTES, read, |at, bytes| {
                w.write_all_at(bytes, at)
            })?;
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "replica_tests.rs"]
pub(crate) mod tests;
