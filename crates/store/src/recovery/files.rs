//! Block files: creating one (reserved to the block size, header durable before any record)
//! and the zero tails reservation leaves, which end the data instead of the file length.

use super::*;

/// Creates the active block `base` in `dir` at open, with a durable header and directory
/// entry. Not reserved: the writer reserves it with its first commit into it, so that a
/// stream that never writes (a `never` stream of the broker, an idle one) holds no space.
pub(crate) fn create_block(vfs: &dyn Vfs, dir: &Path, base: u64) -> Result<Block> {
    let path = path_in(dir, &block_file_name(base));
    let file = vfs
        .open_rw(&path, true)
        .map_err(|e| StoreError::io("create block", &path, &e))?;
    write_header(&*file, &path, base)?;
    vfs.sync_dir(dir)
        .map_err(|e| StoreError::io("fsync directory", dir, &e))?;
    Ok(Block::new(base, path, file, BLOCK_HEADER_LEN as u64))
}

/// Creates the file of block `base` at a roll (a record is about to be written to it),
/// reserves it and writes its header, synced (the one sync makes the reserved length
/// durable too), with the length reserved (0 where the file system refused). The caller
/// syncs the directory.
pub(crate) fn open_new_block(
    vfs: &dyn Vfs,
    path: &Path,
    base: u64,
    alloc_len_bytes: u64,
) -> Result<(Arc<dyn VFile>, u64)> {
    let file = vfs
        .open_rw(path, true)
        .map_err(|e| StoreError::io("create block", path, &e))?;
    let reserved_bytes = preallocate(&*file, path, alloc_len_bytes);
    write_header(&*file, path, base)?;
    Ok((file, reserved_bytes))
}

/// Reserves the block file to `alloc_len_bytes` (zeros past its data). On ext4 an
/// `fdatasync` after an append also commits the new file size to the journal, a second
/// device flush; into reserved space it need not (BENCHMARKS.md, "Session 6: preallocated
/// blocks"). Only a speed-up: where the file system refuses, blocks grow as they are
/// written, and recovery reads both kinds alike.
/// Returns the length reserved: `alloc_len_bytes`, or 0.
pub(crate) fn preallocate(file: &dyn VFile, path: &Path, alloc_len_bytes: u64) -> u64 {
    match file.allocate(alloc_len_bytes) {
        Ok(()) => alloc_len_bytes,
        Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {
            tracing::debug!(path = %path.display(), "file system cannot preallocate blocks");
            0
        }
        Err(e) => {
            // Out of space, most likely: the writes that follow will say so if it matters.
            tracing::warn!(path = %path.display(), error = %e, "could not preallocate block");
            0
        }
    }
}

/// Writes a new block's header and syncs it. If either fails the file is cut back to
/// nothing, the only length known durable: after a failed fdatasync Linux may never write
/// the page although reads still return it, and a reopen must find a torn creation, not a
/// header that only the page cache holds.
pub(crate) fn write_header(file: &dyn VFile, path: &Path, base: u64) -> Result<()> {
    let res = file
        .write_all_at(&encode_block_header(base), 0)
        .map_err(|e| StoreError::io("write block header", path, &e))
        .and_then(|()| {
            file.sync_data()
                .map_err(|e| StoreError::io("fdatasync", path, &e))
        });
    if res.is_err() {
        let _ = file.set_len(0);
    }
    res
}

/// Cuts a sealed block's zero tail (a crash between a roll's trim and its sync leaves the
/// reserved length): sealed blocks are exactly their records, so their index's length
/// matches the file on the next open.
pub(crate) fn trim_sealed(
    file: &dyn VFile,
    path: &Path,
    file_len: u64,
    data_end: u64,
) -> Result<()> {
    if file_len <= data_end {
        return Ok(());
    }
    file.set_len(data_end)
        .map_err(|e| StoreError::io("truncate", path, &e))?;
    file.sync_data()
        .map_err(|e| StoreError::io("fdatasync", path, &e))
}
