//! A stream handle: appends (tickets), reads, removals. Cheap to clone; the writer thread
//! stops (after writing everything queued) when the last handle is dropped.
//!
//! # Invariants
//! - Readers only serve records with `seq <= visible_seq`, i.e. durable under the sync policy,
//!   so a record once served cannot vanish in a crash (short of media corruption).
//! - Records are served only after their checksum has been verified on this read.

use std::sync::mpsc::sync_channel;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use bytes::Bytes;

use crate::config::{MAX_BATCH_RECORDS, MAX_RECORD_BYTES, MAX_TOPIC_BYTES, StreamConfig};
use crate::error::{Result, StoreError};
use crate::filter::FilterSet;
use crate::format::{self, Entry, FLAG_BATCH_MORE, FLAG_TOMBSTONE, KIND_DATA, RawRecord};
use crate::lockfile::LockFile;
use crate::queue::{Op, Queue, QueuedOp, Removed};
use crate::recovery::{self, RecoveryReport};
use crate::shared::{Shared, lock};
use crate::state::{Corruption, ENTRY_DELETED, RemovedLog};
use crate::ticket::Ticket;
use crate::vfs::{VFile, Vfs};
use crate::writer::{Writer, now_ns};

/// Most entries one `read_from` call walks (matching or not) before it returns, so that a
/// sparse filter cannot hold the stream lock for long.
pub const MAX_SCAN_ENTRIES: usize = 65_536;

/// Entries of one block to read after the state lock is released.
struct BlockRead {
    file: Arc<dyn VFile>,
    base: u64,
    sealed: bool,
    path: std::path::PathBuf,
    entries: Vec<Entry>,
}

impl BlockRead {
    fn of(b: &crate::state::Block, entries: Vec<Entry>) -> Self {
        BlockRead {
            file: b.file.clone(),
            base: b.base_seq,
            sealed: b.sealed,
            path: b.path.clone(),
            entries,
        }
    }
}

/// A stored record. The byte fields share one read buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub seq: u64,
    pub time_ns: u64,
    pub topic: Bytes,
    pub properties: Bytes,
    pub payload: Bytes,
    pub(crate) tombstone: bool,
}

impl Record {
    fn from_raw(r: RawRecord) -> Self {
        Record {
            seq: r.seq,
            time_ns: r.time_ns,
            tombstone: r.flags & FLAG_TOMBSTONE != 0,
            topic: r.topic,
            properties: r.props,
            payload: r.payload,
        }
    }

    /// True for a keyed-state delete.
    pub fn is_tombstone(&self) -> bool {
        self.tombstone
    }
}

/// One record of an `append_batch`.
#[derive(Debug, Clone, Copy, Default)]
pub struct NewRecord<'a> {
    pub topic: &'a [u8],
    pub properties: &'a [u8],
    pub payload: &'a [u8],
    /// Record time in ns since the Unix epoch; `None` takes the system clock.
    pub time_ns: Option<u64>,
}

/// A page of `read_from`.
#[derive(Debug, Clone, Default)]
pub struct ReadBatch {
    pub records: Vec<Record>,
    /// Where the next call should start.
    pub next_seq: u64,
}

/// Live records of one topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicStats {
    pub count: u64,
    pub first_seq: u64,
    pub last_seq: u64,
}

/// A snapshot of a stream's numbers.
#[derive(Debug, Clone)]
pub struct StreamInfo {
    pub msgs: u64,
    pub bytes: u64,
    /// Oldest and newest live sequence (None when empty).
    pub first_seq: Option<u64>,
    pub last_seq: Option<u64>,
    /// Highest sequence that is durable (every ticket up to it has completed).
    pub durable_seq: u64,
    pub blocks: usize,
    pub topics: usize,
    pub failed: bool,
    pub quarantined: Vec<Corruption>,
}

struct Handle {
    sh: Arc<Shared>,
    writer: Mutex<Option<JoinHandle<()>>>,
    report: RecoveryReport,
    _lock: Option<Arc<LockFile>>,
    /// Marks the stream as open in its `Store`.
    _token: Option<Arc<()>>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        {
            let mut q = lock(&self.sh.queue);
            q.closed = true;
        }
        self.sh.writer_cv.notify_all();
        self.sh.space_cv.notify_all();
        if let Some(j) = lock(&self.writer).take() {
            let _ = j.join();
        }
    }
}

/// A durable, append-only stream of records. See the crate docs.
#[derive(Clone)]
pub struct Stream {
    h: Arc<Handle>,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("name", &self.h.sh.name)
            .finish()
    }
}

impl Stream {
    pub(crate) fn open_dir(
        vfs: Arc<dyn Vfs>,
        dir: std::path::PathBuf,
        name: String,
        config: StreamConfig,
        lockfile: Option<Arc<LockFile>>,
        token: Option<Arc<()>>,
    ) -> Result<Stream> {
        config.validate()?;
        let o = recovery::open_dir(&vfs, &dir, &config)?;
        let durable = o.next_seq - 1;
        let queue = Queue::new(o.next_seq, o.last_time_ns);
        let sh = Arc::new(Shared::new(
            name.clone(),
            dir,
            vfs,
            config,
            o.state,
            queue,
            durable,
        ));
        let writer = Writer::new(sh.clone(), o.active_file, o.active_len, durable, o.reemit);
        let j = std::thread::Builder::new()
            .name(format!("tern-store-{name}"))
            .spawn(move || writer.run())
            .map_err(|e| StoreError::io("spawn writer thread", &name, &e))?;
        Ok(Stream {
            h: Arc::new(Handle {
                sh,
                writer: Mutex::new(Some(j)),
                report: o.report,
                _lock: lockfile,
                _token: token,
            }),
        })
    }

    fn sh(&self) -> &Arc<Shared> {
        &self.h.sh
    }

    pub fn name(&self) -> &str {
        &self.h.sh.name
    }

    pub fn config(&self) -> &StreamConfig {
        &self.h.sh.config
    }

    /// What recovery found when this stream was opened.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.h.report
    }

    /// Appends one record stamped with the system clock. Waits while the writer queue is
    /// full (back-pressure); the sequence is assigned at once (`Ticket::seq`).
    pub fn append(&self, topic: &[u8], properties: &[u8], payload: &[u8]) -> Result<Ticket> {
        self.enqueue(
            &[NewRecord {
                topic,
                properties,
                payload,
                time_ns: None,
            }],
            0,
            true,
        )
    }

    /// Like `append` with a caller-supplied time (ns since the epoch). Times are clamped to
    /// never go below the previous record's.
    pub fn append_at(
        &self,
        time_ns: u64,
        topic: &[u8],
        properties: &[u8],
        payload: &[u8],
    ) -> Result<Ticket> {
        self.enqueue(
            &[NewRecord {
                topic,
                properties,
                payload,
                time_ns: Some(time_ns),
            }],
            0,
            true,
        )
    }

    /// Like `append` but returns `StoreError::QueueFull` instead of waiting.
    pub fn try_append(&self, topic: &[u8], properties: &[u8], payload: &[u8]) -> Result<Ticket> {
        self.enqueue(
            &[NewRecord {
                topic,
                properties,
                payload,
                time_ns: None,
            }],
            0,
            false,
        )
    }

    /// Appends several records with consecutive sequences that become durable together:
    /// after a crash either all of them are there or none. The ticket's `seq` is the last
    /// one, `first_seq` the first.
    pub fn append_batch(&self, records: &[NewRecord<'_>]) -> Result<Ticket> {
        self.enqueue(records, 0, true)
    }

    /// `append_batch` without waiting for queue space.
    pub fn try_append_batch(&self, records: &[NewRecord<'_>]) -> Result<Ticket> {
        self.enqueue(records, 0, false)
    }

    pub(crate) fn append_tombstone(&self, topic: &[u8]) -> Result<Ticket> {
        self.enqueue(
            &[NewRecord {
                topic,
                ..Default::default()
            }],
            FLAG_TOMBSTONE,
            true,
        )
    }

    fn enqueue(&self, recs: &[NewRecord<'_>], flags: u8, wait: bool) -> Result<Ticket> {
        if recs.is_empty() {
            return Err(StoreError::InvalidBatch("no records"));
        }
        if recs.len() > MAX_BATCH_RECORDS {
            return Err(StoreError::InvalidBatch(
                "more than MAX_BATCH_RECORDS records",
            ));
        }
        let mut total = 0;
        for r in recs {
            if r.topic.len() > MAX_TOPIC_BYTES {
                return Err(StoreError::RecordTooLarge {
                    size_bytes: r.topic.len(),
                    limit_bytes: MAX_TOPIC_BYTES,
                });
            }
            let len = format::record_len(r.topic.len(), r.properties.len(), r.payload.len());
            if len > MAX_RECORD_BYTES {
                return Err(StoreError::RecordTooLarge {
                    size_bytes: len,
                    limit_bytes: MAX_RECORD_BYTES,
                });
            }
            total += len;
        }
        let now = if recs.iter().any(|r| r.time_ns.is_none()) {
            now_ns()
        } else {
            0
        };
        let sh = self.sh();
        let mut q = lock(&sh.queue);
        loop {
            if sh.failed.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(sh.failed_error());
            }
            if q.closed {
                return Err(StoreError::Closed(sh.name.clone()));
            }
            if q.buf.is_empty() || q.buf.len() + total <= sh.config.max_queue_bytes {
                break;
            }
            if !wait {
                return Err(StoreError::QueueFull {
                    stream: sh.name.clone(),
                });
            }
            q.appenders_waiting += 1;
            if q.writer_waiting {
                q.writer_waiting = false;
                sh.writer_cv.notify_one();
            }
            q = sh.space_cv.wait(q).unwrap_or_else(|e| e.into_inner());
            q.appenders_waiting -= 1;
        }
        let first = q.next_seq;
        let n = recs.len();
        for (i, r) in recs.iter().enumerate() {
            let seq = q.next_seq;
            q.next_seq += 1;
            let t = r.time_ns.unwrap_or(now).max(q.last_time_ns);
            q.last_time_ns = t;
            let f = if i + 1 < n {
                flags | FLAG_BATCH_MORE
            } else {
                flags
            };
            format::encode_record(
                &mut q.buf,
                KIND_DATA,
                f,
                seq,
                t,
                r.topic,
                r.properties,
                r.payload,
            );
        }
        q.records += n;
        let last = q.next_seq - 1;
        if q.writer_waiting {
            q.writer_waiting = false;
            sh.writer_cv.notify_one();
        }
        drop(q);
        Ok(Ticket::new(sh.clone(), first, last))
    }

    /// Queues an op without waiting for its outcome.
    fn send_op(&self, op: Op) {
        let sh = self.sh();
        let (tx, _rx) = sync_channel(1);
        let mut q = lock(&sh.queue);
        if q.closed {
            return;
        }
        let off = q.buf.len();
        q.ops.push((off, QueuedOp { op, reply: tx }));
        if q.writer_waiting {
            q.writer_waiting = false;
            sh.writer_cv.notify_one();
        }
    }

    fn op(&self, op: Op) -> Result<Removed> {
        let sh = self.sh();
        let (tx, rx) = sync_channel(1);
        {
            let mut q = lock(&sh.queue);
            if sh.failed.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(sh.failed_error());
            }
            if q.closed {
                return Err(StoreError::Closed(sh.name.clone()));
            }
            let off = q.buf.len();
            q.ops.push((off, QueuedOp { op, reply: tx }));
            if q.writer_waiting {
                q.writer_waiting = false;
                sh.writer_cv.notify_one();
            }
        }
        rx.recv().map_err(|_| StoreError::Closed(sh.name.clone()))?
    }

    /// Highest sequence whose ticket has completed (one atomic load).
    pub fn durable_seq(&self) -> u64 {
        self.sh()
            .durable_seq
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The sequence the next append will get.
    pub fn next_seq(&self) -> u64 {
        lock(&self.sh().queue).next_seq
    }

    /// Blocks until everything appended before the call is durable.
    pub fn flush(&self) -> Result<()> {
        self.op(Op::Flush).map(|_| ())
    }

    /// Seals the active block now (if it holds records) and starts a new one.
    pub fn seal(&self) -> Result<()> {
        self.op(Op::Seal).map(|_| ())
    }

    /// Applies `max_age` as of `now_ns`: whole blocks whose newest record is older go in one
    /// step each, and only the boundary block is walked. Blocks until durable.
    pub fn expire(&self, now_ns: u64) -> Result<Removed> {
        self.op(Op::Expire { now_ns })
    }

    /// `expire` with the system clock.
    pub fn expire_now(&self) -> Result<Removed> {
        self.expire(now_ns())
    }

    /// Removes every record below `floor` (e.g. what no consumer still needs).
    pub fn remove_below(&self, floor: u64) -> Result<Removed> {
        self.op(Op::RemoveBelow { floor })
    }

    /// Removes every record whose topic matches one of the filters.
    pub fn purge(&self, filters: &FilterSet) -> Result<Removed> {
        self.op(Op::Purge {
            filters: filters.clone(),
        })
    }

    /// Removes single records.
    pub fn delete(&self, seqs: &[u64]) -> Result<Removed> {
        self.op(Op::Delete {
            seqs: seqs.to_vec(),
        })
    }

    /// Rewrites up to `max_blocks` sealed blocks that hold deleted records, oldest first.
    pub fn compact(&self, max_blocks: usize) -> Result<()> {
        self.op(Op::Compact { max_blocks }).map(|_| ())
    }

    /// Takes the ranges the writer removed on its own (limits, timer expiry) since last call.
    pub fn drain_removed(&self) -> RemovedLog {
        std::mem::take(&mut lock(&self.sh().state).removed_log)
    }

    /// The record with this sequence, if it exists and is durable.
    pub fn get(&self, seq: u64) -> Result<Option<Record>> {
        let found = {
            let mut st = lock(&self.sh().state);
            if seq > st.visible_seq {
                return Ok(None);
            }
            let Some((bi, ei)) = st.locate(seq)? else {
                return Ok(None);
            };
            let b = &st.blocks[bi];
            let e = b.entries[ei];
            if e.flags & ENTRY_DELETED != 0 {
                return Ok(None);
            }
            BlockRead::of(b, vec![e])
        };
        let mut out = self.read_entries(&found)?;
        Ok(out.pop())
    }

    /// Records from `start_seq` on whose topic matches `filters`, at most `max_records` and
    /// about `max_bytes` (at least one record is returned if any matches). Blocks with no
    /// matching topic are skipped without being read.
    pub fn read_from(
        &self,
        start_seq: u64,
        filters: &FilterSet,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<ReadBatch> {
        let mut plan: Vec<BlockRead> = Vec::new();
        let mut next_seq;
        {
            let mut st = lock(&self.sh().state);
            next_seq = start_seq.max(st.blocks.front().map_or(1, |b| b.base_seq));
            let mut scanned = 0;
            let mut n = 0;
            let mut bytes = 0usize;
            let first_block = st.block_pos(start_seq).unwrap_or(0);
            let visible = st.visible_seq;
            'blocks: for bi in first_block..st.blocks.len() {
                if st.blocks[bi].live == 0 {
                    continue;
                }
                let b = &st.blocks[bi];
                let m = if filters.is_all() {
                    None
                } else {
                    Some(b.matching_topics(filters))
                };
                if m.as_ref().is_some_and(|m| !m.iter().any(|&x| x)) {
                    if let Some(s) = b.last_seq() {
                        next_seq = next_seq.max(s.min(visible) + 1);
                    }
                    continue;
                }
                st.load(bi)?;
                let b = &st.blocks[bi];
                let from = b
                    .entries
                    .partition_point(|e| e.seq < start_seq)
                    .max(b.first_live_from());
                let mut picked = Vec::new();
                for e in &b.entries[from..] {
                    if e.seq > visible
                        || n >= max_records
                        || (n > 0 && bytes >= max_bytes)
                        || scanned >= MAX_SCAN_ENTRIES
                    {
                        if !picked.is_empty() {
                            plan.push(BlockRead::of(b, picked));
                        }
                        break 'blocks;
                    }
                    scanned += 1;
                    next_seq = e.seq + 1;
                    if e.flags & ENTRY_DELETED != 0
                        || m.as_ref().is_some_and(|m| !m[e.topic as usize])
                    {
                        continue;
                    }
                    n += 1;
                    bytes += e.len as usize;
                    picked.push(*e);
                }
                if !picked.is_empty() {
                    plan.push(BlockRead::of(b, picked));
                }
            }
        }
        let mut records = Vec::new();
        for r in &plan {
            records.extend(self.read_entries(r)?);
        }
        Ok(ReadBatch { records, next_seq })
    }

    /// Reads and verifies entries of one block, with one `pread` when they lie close.
    fn read_entries(&self, r: &BlockRead) -> Result<Vec<Record>> {
        let BlockRead {
            file,
            base,
            sealed,
            path,
            entries,
        } = r;
        let (base, sealed) = (*base, *sealed);
        let (Some(first), Some(last)) = (entries.first(), entries.last()) else {
            return Ok(Vec::new());
        };
        let span_start = first.offset as u64;
        let span_len = (last.offset as u64 + last.len as u64 - span_start) as usize;
        let sum: usize = entries.iter().map(|e| e.len as usize).sum();
        let mut out = Vec::with_capacity(entries.len());
        let one_read = span_len <= 2 * sum + 64 * 1024;
        let span = if one_read {
            let mut buf = vec![0u8; span_len];
            file.read_exact_at(&mut buf, span_start)
                .map_err(|e| StoreError::io("read", path, &e))?;
            Some(Bytes::from(buf))
        } else {
            None
        };
        for e in entries {
            let (buf, off) = match &span {
                Some(s) => (s.clone(), (e.offset as u64 - span_start) as usize),
                None => {
                    let mut b = vec![0u8; e.len as usize];
                    file.read_exact_at(&mut b, e.offset as u64)
                        .map_err(|err| StoreError::io("read", path, &err))?;
                    (Bytes::from(b), 0)
                }
            };
            match format::decode_record(&buf, off) {
                Ok(r) if r.seq == e.seq && r.len == e.len as usize => out.push(Record::from_raw(r)),
                Ok(_) => {
                    return Err(self.corrupt(
                        base,
                        sealed,
                        e.seq,
                        "record does not match its index".into(),
                    ));
                }
                Err(d) => return Err(self.corrupt(base, sealed, e.seq, format!("{d:?}"))),
            }
        }
        Ok(out)
    }

    /// A read found damage: quarantine a sealed block, report it.
    fn corrupt(&self, base: u64, sealed: bool, seq: u64, detail: String) -> StoreError {
        let sh = self.sh();
        let mut st = lock(&sh.state);
        let Some(bi) = st.blocks.iter().position(|b| b.base_seq == base) else {
            return StoreError::Corrupt {
                path: sh.dir.clone(),
                range: seq..=seq,
                detail,
            };
        };
        let path = st.blocks[bi].path.clone();
        if !sealed || bi + 1 == st.blocks.len() {
            return StoreError::Corrupt {
                path,
                range: seq..=seq,
                detail,
            };
        }
        let end = st.blocks[bi + 1].base_seq - 1;
        let Some((b, _removed)) = st.remove_block(bi) else {
            return StoreError::Corrupt {
                path,
                range: seq..=seq,
                detail,
            };
        };
        if !b.markers.is_empty() {
            self.send_op(Op::RewriteMarkers {
                ranges: b.markers.clone(),
            });
        }
        match crate::recovery::quarantine_block(&*sh.vfs, &sh.dir, base, base..=end, detail.clone())
        {
            Ok(c) => {
                st.quarantined.push(c.clone());
                StoreError::Corrupt {
                    path: c.path,
                    range: c.range,
                    detail,
                }
            }
            Err(e) => e,
        }
    }

    /// Reads every sealed block in full and checks every record's checksum (a scrub).
    /// Damaged blocks are quarantined and returned; the rest stays served. Costs one
    /// sequential read of the stream; meant for a low-priority background task.
    pub fn verify(&self) -> Result<Vec<Corruption>> {
        let sealed: Vec<(u64, u64, Arc<dyn VFile>, std::path::PathBuf)> = {
            let st = lock(&self.sh().state);
            let n = st.blocks.len().saturating_sub(1);
            st.blocks
                .iter()
                .take(n)
                .map(|b| (b.base_seq, b.len, b.file.clone(), b.path.clone()))
                .collect()
        };
        let mut found = Vec::new();
        for (base, len, file, path) in sealed {
            let mut raw = vec![0u8; len as usize];
            file.read_exact_at(&mut raw, 0)
                .map_err(|e| StoreError::io("read", &path, &e))?;
            let mut detail = format::decode_block_header(&raw)
                .err()
                .map(|e| format!("block header: {e}"));
            if detail.is_none() {
                let sc = recovery::scan(&Bytes::from(raw), base);
                detail = sc
                    .damage
                    .map(|(off, what)| format!("at offset {off}: {what}"));
            }
            if let Some(detail) = detail {
                if let StoreError::Corrupt {
                    path,
                    range,
                    detail,
                } = self.corrupt(base, true, base, detail)
                {
                    found.push(Corruption {
                        path,
                        range,
                        detail,
                    });
                }
            }
        }
        Ok(found)
    }

    /// Newest live record of a topic.
    pub fn last_for_topic(&self, topic: &[u8]) -> Result<Option<Record>> {
        let seq = {
            let mut st = lock(&self.sh().state);
            match st.topic_bounds(topic)? {
                Some((_, last)) if last <= st.visible_seq => last,
                Some((_, _)) => {
                    // The newest is not durable yet: find the newest that is.
                    let mut found = None;
                    let visible = st.visible_seq;
                    for bi in (0..st.blocks.len()).rev() {
                        let Some(&tid) = st.blocks[bi].topic_ids.get(topic) else {
                            continue;
                        };
                        st.load(bi)?;
                        if let Some(e) = st.blocks[bi].entries.iter().rev().find(|e| {
                            e.topic == tid && e.flags & ENTRY_DELETED == 0 && e.seq <= visible
                        }) {
                            found = Some(e.seq);
                            break;
                        }
                    }
                    match found {
                        Some(s) => s,
                        None => return Ok(None),
                    }
                }
                None => return Ok(None),
            }
        };
        self.get(seq)
    }

    /// Count and first/last sequence of a topic's live records.
    pub fn topic_stats(&self, topic: &[u8]) -> Result<Option<TopicStats>> {
        let mut st = lock(&self.sh().state);
        let Some(count) = st.topics.get(topic).map(|t| t.count) else {
            return Ok(None);
        };
        Ok(st
            .topic_bounds(topic)?
            .map(|(first_seq, last_seq)| TopicStats {
                count,
                first_seq,
                last_seq,
            }))
    }

    /// Live counts of every topic.
    pub fn topic_counts(&self) -> Vec<(Bytes, u64)> {
        let st = lock(&self.sh().state);
        st.topics
            .iter()
            .map(|(t, s)| (t.clone(), s.count))
            .collect()
    }

    pub fn info(&self) -> StreamInfo {
        let sh = self.sh();
        let mut st = lock(&sh.state);
        let bounds = st.bounds();
        StreamInfo {
            msgs: st.live,
            bytes: st.live_bytes,
            first_seq: bounds.map(|b| b.0),
            last_seq: bounds.map(|b| b.1),
            durable_seq: sh.durable_seq.load(std::sync::atomic::Ordering::SeqCst),
            blocks: st.blocks.len(),
            topics: st.topics.len(),
            failed: sh.failed.load(std::sync::atomic::Ordering::SeqCst),
            quarantined: st.quarantined.clone(),
        }
    }

    /// Writes everything queued, stops the writer and releases the stream (other clones
    /// become closed). Equivalent to dropping the last handle, but reports a failure.
    pub fn close(self) -> Result<()> {
        let sh = self.h.sh.clone();
        let r = self.flush();
        drop(self);
        if sh.failed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(sh.failed_error());
        }
        r.or_else(|e| {
            if matches!(e, StoreError::Closed(_)) {
                Ok(())
            } else {
                Err(e)
            }
        })
    }
}
