//! Opening a stream directory: loading sealed blocks through their indexes, scanning the
//! active block, truncating a torn tail, quarantining damaged sealed blocks, replaying
//! delete markers and restoring the next sequence.
//!
//! # Invariants
//! - The next sequence is above every sequence any block, marker, quarantined range or torn
//!   record header ever showed, and at least the active block's base: sequences are never
//!   reused, even when the newest records were removed.
//! - A batch whose last record is missing from the tail is dropped whole.
//! - A block's records end at the last valid record followed only by zeros (its reserved
//!   space) or by the file's end. A torn tail is cut there (the file shortened) before the
//!   writer reserves the active block again, so no byte of it survives past later appends.
//! - Delete markers of quarantined blocks (kept in their indexes under `quarantine/`) are
//!   applied on every open, so a crash before they are written again loses no deletion.
//! - A sealed block shorter than its intact index says is damaged, not a clean shorter
//!   block: compaction replaces a block's index before the block itself, so no index
//!   outlives its block's longer version.
//! - Intact records past a damaged one are not served (the tail is cut), but the next
//!   sequence stays above theirs.
//! - Nothing read from a file moves the next sequence past [`MAX_SEQ`]: a record or marker
//!   beyond it is damage, and an index that does not fit its block is rebuilt.
//! - Before a stream is served, its active block and its directory are synced: recovery
//!   builds only on durable state, whatever the previous process left in the page cache.

use std::ops::RangeInclusive;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use crate::config::{StreamConfig, SyncPolicy};
use crate::error::{Result, StoreError};
use crate::format::{self, BLOCK_HEADER_LEN, IndexData, MAX_SEQ, encode_block_header};
use crate::scan::{Scan, all_zero, scan};
use crate::state::{Block, Corruption, State, TRASH_DIR, block_file_name, index_file_name};
use crate::vfs::{VFile, Vfs, path_in};

mod files;
mod load;

use files::trim_sealed;
pub(crate) use files::{create_block, open_new_block, preallocate, write_header};
use load::Loader;

/// Longest block file recovery reads: record offsets are u32 (blocks stay far below it, see
/// `MAX_BLOCK_SIZE_BYTES`), so a longer file is damage, and reading it could exhaust memory.
const MAX_BLOCK_FILE_BYTES: u64 = u32::MAX as u64;

/// What recovery found when a stream was opened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Bytes cut from the end of the active block (a torn or damaged tail).
    pub truncated_bytes: u64,
    /// Sequences that were lost with the cut tail, as far as they could be read.
    pub lost: Option<RangeInclusive<u64>>,
    /// Sealed blocks found damaged and moved to `quarantine/`.
    pub quarantined: Vec<Corruption>,
    /// Sealed blocks whose index was missing or stale and was rebuilt.
    pub indexes_rebuilt: usize,
}

pub(crate) struct Opened {
    pub state: State,
    pub active_file: Arc<dyn VFile>,
    pub active_len: u64,
    pub next_seq: u64,
    pub last_time_ns: u64,
    pub report: RecoveryReport,
    /// Delete ranges that lived in quarantined blocks and must be written again.
    pub reemit: Vec<(u64, u64)>,
}

/// The base sequence a block file name shows; `None` for other names and for bases no
/// stream can reach (a stray file is left alone rather than let it move the next sequence).
fn parse_block_name(name: &str) -> Option<u64> {
    let stem = name.strip_suffix(".blk")?;
    if stem.len() != 20 {
        return None;
    }
    let base = stem.parse().ok().filter(|&b| b <= MAX_SEQ);
    if base.is_none() {
        tracing::warn!(
            file = name,
            "ignoring a block file whose name is no base sequence"
        );
    }
    base
}

/// Whether an index (checksum already verified) can describe block `base` of a stream whose
/// next block starts at `next_base`: anything else is rebuilt from the block.
fn index_fits(ix: &IndexData, base: u64, next_base: Option<u64>) -> bool {
    let bound = next_base.map_or(MAX_SEQ, |n| n.saturating_sub(1).min(MAX_SEQ));
    ix.entries.first().is_none_or(|e| e.seq >= base)
        && ix.entries.last().is_none_or(|e| e.seq <= bound)
        && ix.deletes.iter().all(|&(_, hi)| hi <= MAX_SEQ)
}

/// Delete markers listed in a quarantined block's index, if the index is intact.
fn index_markers(vfs: &dyn Vfs, dir: &Path, name: &str) -> Vec<(u64, u64)> {
    vfs.read_file(&path_in(dir, &format!("quarantine/{name}")))
        .ok()
        .and_then(|b| format::decode_index(&Bytes::from(b)))
        .map(|ix| ix.deletes)
        .unwrap_or_default()
        .into_iter()
        .filter(|&(_, hi)| hi <= MAX_SEQ)
        .collect()
}

/// Delete markers of every block quarantined so far. They are applied on every open: the
/// copy written again into the active block after a quarantine may have been lost in a
/// crash, and deleted records must not come back.
fn all_quarantined_markers(vfs: &dyn Vfs, dir: &Path) -> Vec<(u64, u64)> {
    let Ok(names) = vfs.list_dir(&dir.join("quarantine")) else {
        return Vec::new();
    };
    names
        .iter()
        .filter(|n| n.ends_with(".idx"))
        .flat_map(|n| index_markers(vfs, dir, n))
        .collect()
}

pub(crate) fn quarantine_block(
    vfs: &dyn Vfs,
    dir: &Path,
    base: u64,
    range: RangeInclusive<u64>,
    detail: String,
) -> Result<Corruption> {
    let qdir = dir.join("quarantine");
    vfs.create_dir_all(&qdir)
        .map_err(|e| StoreError::io("create quarantine", &qdir, &e))?;
    let from = path_in(dir, &block_file_name(base));
    let to = path_in(&qdir, &block_file_name(base));
    vfs.rename(&from, &to)
        .map_err(|e| StoreError::io("quarantine block", &from, &e))?;
    // The index goes along: its delete markers are still needed (see `index_markers`).
    let _ = vfs.rename(
        &path_in(dir, &index_file_name(base)),
        &path_in(&qdir, &index_file_name(base)),
    );
    vfs.sync_dir(&qdir)
        .map_err(|e| StoreError::io("fsync directory", &qdir, &e))?;
    vfs.sync_dir(dir)
        .map_err(|e| StoreError::io("fsync directory", dir, &e))?;
    tracing::error!(path = %to.display(), first = range.start(), last = range.end(), %detail,
        "corrupt sealed block quarantined; its sequences are not served");
    Ok(Corruption {
        path: to,
        range,
        detail,
    })
}

/// Creates `dir` if needed, and makes its entry durable in its parent: also when it exists,
/// since a process that created it may have died before syncing the parent.
/// A failure to sync the parent of a directory that already existed is only logged (its
/// parent may be one we cannot open, e.g. above the store).
pub(crate) fn ensure_dir(vfs: &dyn Vfs, dir: &Path) -> Result<()> {
    let existed = vfs.list_dir(dir).is_ok();
    if !existed {
        vfs.create_dir_all(dir)
            .map_err(|e| StoreError::io("create directory", dir, &e))?;
    }
    // A relative path of one component (`data`) has the empty path as its parent: that is
    // the working directory.
    let parent = match dir.parent() {
        Some(p) if p.as_os_str().is_empty() => Some(Path::new(".")),
        other => other,
    };
    if let Some(parent) = parent {
        match vfs.sync_dir(parent) {
            Ok(()) => {}
            Err(e) if existed => {
                tracing::warn!(dir = %parent.display(), error = %e, "could not fsync directory");
            }
            Err(e) => return Err(StoreError::io("fsync directory", parent, &e)),
        }
    }
    Ok(())
}

/// A block's records all lie below the next block's base: a roll starts the next block at the
/// next sequence, and compaction keeps a block's base. Records past it mean two writers shared
/// the directory (say, a broker still running while its data directory was removed and a new
/// one started on the same path): reads would skip records, and compaction would drop values
/// it takes for superseded. Nothing is guessed: the stream does not open.
fn refuse_overlap(path: &Path, sc: &Scan, next_base: Option<u64>) -> Result<()> {
    let (Some(next), Some(last)) = (next_base, sc.ix.entries.last()) else {
        return Ok(());
    };
    if last.seq < next {
        return Ok(());
    }
    Err(StoreError::Corrupt {
        path: path.to_path_buf(),
        range: next..=last.seq,
        detail: format!(
            "records up to sequence {} reach into the next block (base {next}): two processes \
             wrote this stream at once (was the data directory removed or replaced while a \
             broker was running?); move the directory aside and restore a backup",
            last.seq
        ),
    })
}

pub(crate) fn open_dir(
    shared_vfs: &Arc<dyn Vfs>,
    dir: &Path,
    config: &StreamConfig,
) -> Result<Opened> {
    let vfs: &dyn Vfs = &**shared_vfs;
    ensure_dir(vfs, dir)?;
    let bases = block_bases(vfs, dir)?;
    let mut loader = Loader {
        vfs,
        dir,
        config,
        report: RecoveryReport::default(),
        reemit: Vec::new(),
        blocks: Vec::new(),
        next_seq: 1,
    };
    for (i, &base) in bases.iter().enumerate() {
        loader.load(base, bases.get(i + 1).copied())?;
    }
    let Loader {
        report,
        reemit,
        mut blocks,
        next_seq,
        ..
    } = loader;
    let next_seq = ensure_active_block(vfs, dir, &mut blocks, &report, next_seq)?;
    let (mut state, last_time_ns) = build_state(shared_vfs, dir, config, blocks);
    remove_dead_blocks(vfs, dir, &mut state)?;
    let (active_file, active_len) = sync_active(vfs, dir, &state)?;
    state.visible_seq = next_seq - 1;
    state.quarantined = report.quarantined.clone();
    Ok(Opened {
        reemit,
        state,
        active_file,
        active_len,
        next_seq,
        last_time_ns,
        report,
    })
}

/// The bases of the stream's block files, in order, once what a crash left behind is gone:
/// compaction outputs never installed, removed blocks the reaper had not freed, indexes
/// whose block is gone.
fn block_bases(vfs: &dyn Vfs, dir: &Path) -> Result<Vec<u64>> {
    let names = vfs
        .list_dir(dir)
        .map_err(|e| StoreError::io("list", dir, &e))?;
    let mut bases: Vec<u64> = names.iter().filter_map(|n| parse_block_name(n)).collect();
    bases.sort_unstable();
    for n in names.iter().filter(|n| n.ends_with(".compact")) {
        let _ = vfs.remove_file(&path_in(dir, n));
    }
    // Blocks removed before a crash whose data the reaper had not freed yet.
    let trash = dir.join(TRASH_DIR);
    if let Ok(names) = vfs.list_dir(&trash) {
        for n in names {
            let _ = vfs.remove_file(&trash.join(n));
        }
    }
    // Indexes whose block is gone (their removal is left to the reaper).
    for n in names.iter().filter(|n| n.ends_with(".idx")) {
        let base = n.strip_suffix(".idx").and_then(|b| b.parse::<u64>().ok());
        if base.is_some_and(|b| bases.binary_search(&b).is_err()) {
            let _ = vfs.remove_file(&path_in(dir, n));
        }
    }
    Ok(bases)
}

/// Raises `next_seq` above every quarantined range, record and marker loaded, and starts a
/// fresh active block if the newest one was quarantined (or there is none). Returns the
/// next sequence.
fn ensure_active_block(
    vfs: &dyn Vfs,
    dir: &Path,
    blocks: &mut Vec<Block>,
    report: &RecoveryReport,
    mut next_seq: u64,
) -> Result<u64> {
    for q in &report.quarantined {
        if *q.range.end() != u64::MAX {
            next_seq = next_seq.max(q.range.end() + 1);
        }
    }
    let need_new = blocks.last().is_none_or(|b| b.sealed);
    for b in blocks.iter() {
        if let Some(s) = b.last_seq() {
            next_seq = next_seq.max(s + 1);
        }
        for &(_, hi) in &b.markers {
            next_seq = next_seq.max(hi.saturating_add(1));
        }
    }
    if need_new {
        if let Some(b) = blocks.last_mut() {
            b.sealed = true;
        }
        blocks.push(create_block(vfs, dir, next_seq)?);
    }
    Ok(next_seq)
}

/// The stream's state from its loaded blocks, with every delete marker applied (those of
/// quarantined blocks too), and the newest record time.
fn build_state(
    shared_vfs: &Arc<dyn Vfs>,
    dir: &Path,
    config: &StreamConfig,
    blocks: Vec<Block>,
) -> (State, u64) {
    let mut state = State::new(
        config.limits.max_msgs_per_topic.is_some(),
        shared_vfs.clone(),
        config.index_cache_blocks,
    );
    let mut last_time_ns = 0;
    let mut markers = Vec::new();
    for b in blocks {
        if let Some(e) = b.entries.last() {
            last_time_ns = last_time_ns.max(e.time_ns);
        }
        markers.extend_from_slice(&b.markers);
        for e in &b.entries {
            state.on_insert(&b.topics[e.topic as usize], e.seq, e.len as u64);
        }
        state.blocks.push_back(b);
    }
    let quarantined_markers = all_quarantined_markers(&**shared_vfs, dir);
    for &(a, z) in markers.iter().chain(&quarantined_markers) {
        apply_delete_range(&mut state, a, z);
    }
    let n = state.blocks.len();
    state.evict(n.saturating_sub(1));
    (state, last_time_ns)
}

/// Removes the leading blocks the delete markers emptied.
fn remove_dead_blocks(vfs: &dyn Vfs, dir: &Path, state: &mut State) -> Result<()> {
    let dead = state.take_dead_front();
    if !dead.is_empty() {
        // The active block's name (its base keeps the next sequence above everything the
        // dead blocks showed) must be durable before they go.
        vfs.sync_dir(dir)
            .map_err(|e| StoreError::io("fsync directory", dir, &e))?;
    }
    for (i, b) in dead.iter().enumerate() {
        if i > 0 && !b.markers.is_empty() {
            // Its markers may delete records of the blocks removed just before: those
            // removals must be durable first (see `Writer::remove_blocks`).
            vfs.sync_dir(dir)
                .map_err(|e| StoreError::io("fsync directory", dir, &e))?;
        }
        let _ = vfs.remove_file(&b.path);
        let _ = vfs.remove_file(&b.index_path());
    }
    Ok(())
}

/// Syncs the active block and the directory; returns the active block's file and length.
/// What is served from now on, and what new records are appended to, must be durable,
/// not merely in the page cache: the previous process may have died, or failed, after
/// writing records or creating the active block without syncing them (and a reader
/// must never see a record that a power loss can take back). One sync of the active
/// block and one of the directory (the active block's name, removals above) per open.
fn sync_active(vfs: &dyn Vfs, dir: &Path, state: &State) -> Result<(Arc<dyn VFile>, u64)> {
    let n = state.blocks.len();
    let active = &state.blocks[n - 1];
    let (active_file, active_len) = (active.file.clone(), active.len);
    let active_path = &active.path;
    if let Err(e) = active_file.sync_data() {
        // On Linux the pages a failed fdatasync did not write are marked clean, and a retry
        // would find nothing to sync: write them again so the next open's sync covers them.
        if let Ok(raw) = vfs.read_file(active_path) {
            let _ = active_file.write_all_at(&raw, 0);
        }
        return Err(StoreError::io("fdatasync", active_path, &e));
    }
    vfs.sync_dir(dir)
        .map_err(|e| StoreError::io("fsync directory", dir, &e))?;
    Ok((active_file, active_len))
}

fn apply_delete_range(st: &mut State, a: u64, z: u64) {
    let start_block = st.block_pos(a).unwrap_or(0);
    for bi in start_block..st.blocks.len() {
        if st.blocks[bi].base_seq > z {
            break;
        }
        let from = st.blocks[bi].entries.partition_point(|e| e.seq < a);
        for ei in from..st.blocks[bi].entries.len() {
            if st.blocks[bi].entries[ei].seq > z {
                break;
            }
            st.delete_at(bi, ei);
        }
    }
}
