//! Compaction: rewriting sealed blocks without their deleted records and markers.
//!
//! Blocks are compacted oldest first. When block `i` is rewritten every older block is
//! already clean (holds no deleted record), and a delete marker can only target records at
//! or before its own block, so all of block `i`'s markers have become moot and are dropped
//! with its deleted records. For the same reason a live keyed-state tombstone in block `i`
//! is dropped too: no older value of its key is left anywhere. A block with nothing live
//! left is unlinked instead of rewritten.
//!
//! # Invariants
//! - A rewrite goes to a temporary file that is fsynced, renamed over the block and made
//!   durable with a directory fsync; a crash leaves either the old or the new block.
//! - The new index is durable (or the old one gone) before the rename, names included (a
//!   directory fsync): no index outlives the longer block it describes (recovery reads a
//!   block shorter than its index as lost data).
//! - The rewritten block keeps its base sequence, so sequences are never reused.
//! - Blocks found dead are removed (durably) before a newer block is rewritten: the rewrite
//!   drops markers that delete their records.
//! - A kept record whose batch successor was dropped loses its BATCH_MORE flag (re-encoded
//!   with a new checksum): a scan of the new block never sees a torn batch.

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;

use super::Writer;
use crate::error::{Result, StoreError};
use crate::format::{
    self, BLOCK_HEADER_LEN, Entry, FLAG_BATCH_MORE, FLAG_TOMBSTONE, encode_block_header,
};
use crate::shared::{Shared, lock};
use crate::state::{Block, ENTRY_DELETED, State};
use crate::vfs::VFile;

/// Sum of bytes held by deleted records and markers in sealed blocks.
pub(crate) fn garbage_bytes(st: &State) -> u64 {
    let n = st.blocks.len().saturating_sub(1);
    st.blocks
        .iter()
        .take(n)
        .map(|b| {
            let stored: u64 = b.len.saturating_sub(BLOCK_HEADER_LEN as u64);
            stored.saturating_sub(b.live_bytes)
        })
        .sum()
}

fn is_dirty(b: &Block) -> bool {
    b.live < b.n_entries as u64 || !b.markers.is_empty() || b.tombstones > 0
}

/// A block picked for rewriting, copied out so the I/O runs without the state lock.
struct Job {
    base: u64,
    path: PathBuf,
    file: Arc<dyn VFile>,
    len: u64,
    live: Vec<Entry>,
    topics: Vec<Bytes>,
}

/// Compacts up to `max_blocks` dirty sealed blocks, oldest first. Picking a block and
/// swapping its rewrite in take the state lock briefly; reading, writing and syncing the
/// new file happen without it, so readers are not stalled for the rewrite. Only the writer
/// thread (the caller) changes blocks' records, so a picked block cannot change meanwhile;
/// a reader may quarantine it, and then the rewrite is dropped.
pub(crate) fn compact(w: &mut Writer, max_blocks: usize) -> Result<()> {
    let sh = w.sh().clone();
    let mut done = 0;
    let mut cursor = 0u64;
    while done < max_blocks {
        let job = {
            let mut st = lock(&sh.state);
            let sealed = st.blocks.len().saturating_sub(1);
            let Some(bi) =
                (0..sealed).find(|&i| st.blocks[i].base_seq >= cursor && is_dirty(&st.blocks[i]))
            else {
                break;
            };
            cursor = st.blocks[bi].base_seq + 1;
            done += 1;
            st.load(bi)?;
            // Live tombstones go away with the rewrite.
            for ei in 0..st.blocks[bi].entries.len() {
                let e = st.blocks[bi].entries[ei];
                if e.flags & ENTRY_DELETED == 0 && e.flags & u32::from(FLAG_TOMBSTONE) != 0 {
                    st.delete_at(bi, ei);
                }
            }
            if st.blocks[bi].live == 0 {
                if let Some(b) = st.blocks.remove(bi) {
                    w.unlink.push(b);
                }
                continue;
            }
            let b = &st.blocks[bi];
            Job {
                base: b.base_seq,
                path: b.path.clone(),
                file: b.file.clone(),
                len: b.len,
                live: b
                    .entries
                    .iter()
                    .filter(|e| e.flags & ENTRY_DELETED == 0)
                    .copied()
                    .collect(),
                topics: b.topics.clone(),
            }
        };
        if !w.unlink.is_empty() {
            // The dead blocks found so far go first, durably: this rewrite drops the markers
            // that delete their records.
            w.remove_blocks()?;
        }
        let nb = rewrite(&sh, job)?;
        let mut st = lock(&sh.state);
        if let Some(bi) = st.blocks.iter().position(|b| b.base_seq == nb.base_seq) {
            st.blocks[bi] = nb;
        }
    }
    Ok(())
}

/// Writes the live records of `job` to a new file and renames it over the block.
fn rewrite(sh: &Shared, job: Job) -> Result<Block> {
    let mut raw = vec![0u8; job.len as usize];
    job.file
        .read_exact_at(&mut raw, 0)
        .map_err(|e| StoreError::io("read block", &job.path, &e))?;
    let Copied {
        out,
        topics,
        entries,
    } = copy_live(&job, &Bytes::from(raw))?;
    let tmp = job.path.with_extension("compact");
    let _ = sh.vfs.remove_file(&tmp);
    let file = sh
        .vfs
        .open_rw(&tmp, true)
        .map_err(|e| StoreError::io("create", &tmp, &e))?;
    file.write_all_at(&out, 0)
        .map_err(|e| StoreError::io("write", &tmp, &e))?;
    file.sync_data()
        .map_err(|e| StoreError::io("fdatasync", &tmp, &e))?;
    let mut nb = Block::from_index(
        job.base,
        job.path,
        file,
        format::IndexData {
            block_len: out.len() as u64,
            topics,
            entries,
            deletes: Vec::new(),
        },
    );
    nb.sealed = true;
    replace_index(sh, &nb)?;
    sh.vfs
        .rename(&tmp, &nb.path)
        .map_err(|e| StoreError::io("rename", &tmp, &e))?;
    sh.vfs
        .sync_dir(&sh.dir)
        .map_err(|e| StoreError::io("fsync directory", &sh.dir, &e))?;
    Ok(nb)
}

/// A block's live records, copied into a new block's bytes with their index.
struct Copied {
    out: Vec<u8>,
    topics: Vec<Bytes>,
    entries: Vec<Entry>,
}

/// Copies the records `job` keeps out of the block's bytes `raw`, each checked against the
/// index it was chosen from, with topics renumbered to those still used.
fn copy_live(job: &Job, raw: &Bytes) -> Result<Copied> {
    let mut out = Vec::with_capacity(raw.len());
    out.extend_from_slice(&encode_block_header(job.base));
    let mut topics: Vec<Bytes> = Vec::new();
    let mut entries = Vec::with_capacity(job.live.len());
    let mut remap = vec![u32::MAX; job.topics.len()];
    for (k, e) in job.live.iter().enumerate() {
        let corrupt = |detail: String| StoreError::Corrupt {
            path: job.path.clone(),
            range: e.seq..=e.seq,
            detail,
        };
        let r = format::decode_record(raw, e.offset as usize)
            .map_err(|d| corrupt(format!("during compaction: {d:?}")))?;
        if r.seq != e.seq {
            return Err(corrupt("index and block disagree".into()));
        }
        let t = &mut remap[e.topic as usize];
        if *t == u32::MAX {
            *t = topics.len() as u32;
            topics.push(job.topics[e.topic as usize].clone());
        }
        // A batch whose next record is gone ends here: a record left flagged BATCH_MORE
        // at the end of the block would read as a torn batch (and the block as damaged).
        let more = u32::from(FLAG_BATCH_MORE);
        let next_kept = job
            .live
            .get(k + 1)
            .is_some_and(|n| n.offset == e.offset + e.len);
        let flags = if e.flags & more != 0 && !next_kept {
            e.flags & !more
        } else {
            e.flags
        };
        entries.push(Entry {
            offset: out.len() as u32,
            topic: *t,
            flags,
            ..*e
        });
        if flags == e.flags {
            out.extend_from_slice(&raw[e.offset as usize..e.offset as usize + e.len as usize]);
        } else {
            format::encode_record(
                &mut out,
                r.kind,
                r.flags & !FLAG_BATCH_MORE,
                r.seq,
                r.time_ns,
                &r.topic,
                &r.props,
                &r.payload,
            );
        }
    }
    Ok(Copied {
        out,
        topics,
        entries,
    })
}

/// Puts the rewritten block's index in place of the old one before the block itself is
/// replaced, and durably (data and names, hence the directory fsync): an old index left
/// beside the shorter new block would make recovery take the block for one that lost its
/// tail. A crash in between leaves the old block with no index or a new one of another
/// length, and the block is rescanned.
fn replace_index(sh: &Shared, nb: &Block) -> Result<()> {
    let path = nb.index_path();
    match sh.vfs.remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(StoreError::io("remove index", &path, &e));
        }
        _ => {}
    }
    let written = sh.vfs.open_rw(&path, true).and_then(|f| {
        f.write_all_at(&format::encode_index(&nb.index_data()), 0)?;
        f.sync_data()
    });
    if let Err(e) = written {
        // The index is a cache: without one the block is rescanned on open.
        tracing::warn!(stream = %sh.name, error = %e, "could not write block index after compaction");
        let _ = sh.vfs.remove_file(&path);
    }
    // Without this, the rename below may reach the disk before the old index's removal.
    sh.vfs
        .sync_dir(&sh.dir)
        .map_err(|e| StoreError::io("fsync directory", &sh.dir, &e))
}
