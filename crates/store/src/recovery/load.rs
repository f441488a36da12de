//! Loading the block files of a stream one by one, oldest first ([`Loader`]): through an
//! intact index, by a scan, or into quarantine; a torn tail cut. `open_dir` then builds the
//! stream's state from what was loaded.

use std::path::PathBuf;

use super::*;

/// What recovery gathers block by block.
pub(super) struct Loader<'a> {
    pub vfs: &'a dyn Vfs,
    pub dir: &'a Path,
    pub config: &'a StreamConfig,
    pub report: RecoveryReport,
    /// Delete ranges of quarantined blocks, to write again.
    pub reemit: Vec<(u64, u64)>,
    pub blocks: Vec<Block>,
    /// Above every sequence seen so far.
    pub next_seq: u64,
}

/// One block file as found.
struct Found {
    base: u64,
    /// The next block's base; `None` for the newest block, the active one.
    next_base: Option<u64>,
    path: PathBuf,
    file: Arc<dyn VFile>,
    file_len: u64,
}

impl Found {
    fn is_active(&self) -> bool {
        self.next_base.is_none()
    }

    /// The last sequence this block may hold (the next block's base bounds it).
    fn end_bound(&self) -> u64 {
        self.next_base.map_or(u64::MAX, |n| n - 1)
    }

    /// Its base as its header gives it, or why it cannot.
    fn header(&self) -> Result<std::result::Result<u64, String>> {
        let file_len = self.file_len;
        if file_len > MAX_BLOCK_FILE_BYTES {
            // Never read into memory: no block of ours can be this long.
            return Ok(Err(format!(
                "file of {file_len} bytes, beyond any record offset"
            )));
        }
        if file_len < BLOCK_HEADER_LEN as u64 {
            return Ok(Err(format!("file of {file_len} bytes")));
        }
        let mut hbuf = [0u8; BLOCK_HEADER_LEN];
        self.file
            .read_exact_at(&mut hbuf, 0)
            .map_err(|e| StoreError::io("read block", &self.path, &e))?;
        Ok(format::decode_block_header(&hbuf))
    }
}

impl Loader<'_> {
    /// Loads block `base` (the next one starts at `next_base`, if there is one).
    pub fn load(&mut self, base: u64, next_base: Option<u64>) -> Result<()> {
        let path = path_in(self.dir, &block_file_name(base));
        self.next_seq = self.next_seq.max(base);
        let file = self
            .vfs
            .open_rw(&path, false)
            .map_err(|e| StoreError::io("open block", &path, &e))?;
        let file_len = file
            .file_len()
            .map_err(|e| StoreError::io("stat block", &path, &e))?;
        let found = Found {
            base,
            next_base,
            path,
            file,
            file_len,
        };
        let header = found.header()?;
        if !matches!(header, Ok(b) if b == base) {
            let detail = header.err().unwrap_or_else(|| "base mismatch".into());
            return self.load_bad_header(found, detail);
        }
        // The length an intact index gives a sealed block: shorter data means the block lost
        // its tail (a cut at a record boundary scans clean, so only the index can tell).
        let mut indexed_len = None;
        if !found.is_active() {
            if let Some(ix) = self.read_index(&found) {
                if ix.block_len == found.file_len
                    && index_fits(&ix, base, next_base)
                    && !self.config.verify_on_open
                {
                    let mut b = Block::from_index(base, found.path, found.file, ix);
                    b.sealed = true;
                    self.blocks.push(b);
                    return Ok(());
                }
                indexed_len = Some(ix.block_len);
            }
        }
        self.load_scanned(found, indexed_len)
    }

    fn read_index(&self, found: &Found) -> Option<IndexData> {
        let ix_path = path_in(self.dir, &index_file_name(found.base));
        self.vfs
            .read_file(&ix_path)
            .ok()
            .and_then(|buf| format::decode_index(&Bytes::from(buf)))
    }

    /// A block whose header does not give its base: a creation torn in the active block
    /// (started again, empty), else damage (quarantined).
    fn load_bad_header(&mut self, found: Found, detail: String) -> Result<()> {
        let vfs = self.vfs;
        // Only zeros past the header: the reserved length without a record.
        let reserved_only = || {
            found.file_len <= MAX_BLOCK_FILE_BYTES
                && vfs
                    .read_file(&found.path)
                    .is_ok_and(|raw| all_zero(&raw, BLOCK_HEADER_LEN))
        };
        if found.is_active() && (found.file_len <= BLOCK_HEADER_LEN as u64 || reserved_only()) {
            // Torn while being created: nothing in it was ever acknowledged. A crash
            // between a roll's header write and its sync may leave the length whole
            // (the header's, or the reserved one) and the bytes zeros. (Past the
            // header no record is written before that sync, so a bad header followed
            // by anything but zeros is damage.)
            found
                .file
                .set_len(0)
                .map_err(|e| StoreError::io("truncate", &found.path, &e))?;
            write_header(&*found.file, &found.path, found.base)?;
            self.blocks.push(Block::new(
                found.base,
                found.path,
                found.file,
                BLOCK_HEADER_LEN as u64,
            ));
            return Ok(());
        }
        let mut end = found.end_bound();
        if found.is_active() {
            // The newest block: records past the bad header may still show the highest
            // sequence ever handed out, which must not be reused.
            let readable = found.file_len <= MAX_BLOCK_FILE_BYTES;
            if let Some(raw) = readable.then(|| vfs.read_file(&found.path).ok()).flatten() {
                let sc = scan(&Bytes::from(raw), found.base);
                let high = sc.ix.entries.last().map_or(0, |e| e.seq);
                self.next_seq = self
                    .next_seq
                    .max(high.max(sc.torn_high_seq).saturating_add(1));
            }
            end = self.next_seq.saturating_sub(1).max(found.base);
        }
        self.quarantine(&found, end, format!("block header: {detail}"))
    }

    fn quarantine(&mut self, found: &Found, end: u64, detail: String) -> Result<()> {
        let base = found.base;
        let corruption = quarantine_block(self.vfs, self.dir, base, base..=end, detail)?;
        self.report.quarantined.push(corruption);
        self.reemit
            .extend(index_markers(self.vfs, self.dir, &index_file_name(base)));
        Ok(())
    }

    /// A block read whole and scanned: its records up to any damage. A damaged tail is a
    /// torn write in the active block, and in any block of a stream that never syncs
    /// (blocks written before sealing synced them): cut. Elsewhere damage is corruption:
    /// quarantined.
    fn load_scanned(&mut self, found: Found, indexed_len: Option<u64>) -> Result<()> {
        let raw = Bytes::from(
            self.vfs
                .read_file(&found.path)
                .map_err(|e| StoreError::io("read block", &found.path, &e))?,
        );
        let mut sc = scan(&raw, found.base);
        self.next_seq = self.next_seq.max(sc.torn_high_seq.saturating_add(1));
        refuse_overlap(&found.path, &sc, found.next_base)?;
        let data_end = sc.ix.block_len;
        let missing_bytes = indexed_len.map_or(0, |l| l.saturating_sub(data_end));
        if sc.damage.is_none() && missing_bytes > 0 {
            sc.damage = Some((
                data_end,
                format!("{missing_bytes} bytes missing at the end"),
            ));
        }
        let tail_may_tear = found.is_active() || self.config.sync == SyncPolicy::Never;
        if tail_may_tear {
            return self.load_with_tail_cut(found, &raw, sc);
        }
        if let Some((off, what)) = sc.damage {
            return self.quarantine(
                &found,
                found.end_bound(),
                format!("at offset {off}: {what}"),
            );
        }
        self.report.indexes_rebuilt += 1;
        trim_sealed(&*found.file, &found.path, found.file_len, data_end)?;
        let mut b = Block::from_index(found.base, found.path, found.file, sc.ix);
        b.sealed = true;
        let ix = format::encode_index(&b.index_data());
        if let Err(e) = self.vfs.write_file(&b.index_path(), &ix) {
            tracing::warn!(error = %e, "could not rewrite block index");
        }
        self.blocks.push(b);
        Ok(())
    }

    /// A block whose tail may be torn: cut at its damage, if any, and loaded.
    fn load_with_tail_cut(&mut self, found: Found, raw: &[u8], sc: Scan) -> Result<()> {
        if let Some((off, what)) = &sc.damage {
            self.cut_tail(&found, raw, &sc, *off, what)?;
        }
        let data_end = sc.ix.block_len;
        let mut reserved_bytes = 0;
        if found.is_active() {
            // What the previous process reserved, if no cut took it. After a cut the
            // file ends at the last record (no byte of the torn one survives to lie
            // past later appends); the writer reserves it again with its first commit.
            if sc.damage.is_none() && found.file_len > data_end {
                reserved_bytes = found.file_len;
            }
        } else if sc.damage.is_none() {
            trim_sealed(&*found.file, &found.path, found.file_len, data_end)?;
        }
        let is_active = found.is_active();
        let mut b = Block::from_index(found.base, found.path, found.file, sc.ix);
        b.reserved_bytes = reserved_bytes;
        if !is_active {
            b.sealed = true;
            let ix = format::encode_index(&b.index_data());
            let _ = self.vfs.write_file(&b.index_path(), &ix);
        }
        self.blocks.push(b);
        Ok(())
    }

    /// Cuts the block at `off` (its damage, `what`), synced, and reports what was lost.
    fn cut_tail(
        &mut self,
        found: &Found,
        raw: &[u8],
        sc: &Scan,
        off: u64,
        what: &str,
    ) -> Result<()> {
        let lost_from = sc.ix.entries.last().map_or(found.base, |e| e.seq + 1);
        let lost_to = sc.torn_high_seq.max(lost_from);
        // Damaged bytes, not the zeros of reserved space after them.
        let written_end = raw.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
        let cut = (written_end as u64).saturating_sub(off);
        tracing::warn!(path = %found.path.display(), offset = off, bytes = cut, %what,
            first_lost = lost_from, last_lost_seen = lost_to, "truncating damaged tail of block");
        found
            .file
            .set_len(off)
            .map_err(|e| StoreError::io("truncate", &found.path, &e))?;
        found
            .file
            .sync_data()
            .map_err(|e| StoreError::io("fdatasync", &found.path, &e))?;
        let report = &mut self.report;
        report.truncated_bytes += cut;
        report.lost = Some(match report.lost.take() {
            Some(r) => (*r.start()).min(lost_from)..=(*r.end()).max(lost_to),
            None => lost_from..=lost_to,
        });
        Ok(())
    }
}
