//! A stream handle: appends (tickets), reads, removals. Cheap to clone; the writer
//! stops (after writing everything queued) when the last handle is dropped.
//!
//! # Invariants
//! - Readers only serve records with `seq <= visible_seq`, i.e. durable under the sync policy,
//!   so a record once served cannot vanish in a crash (short of media corruption).
//! - Records are served only after their checksum has been verified on this read.

use std::sync::mpsc::sync_channel;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::config::{
    MAX_BATCH_BYTES, MAX_BATCH_RECORDS, MAX_RECORD_BYTES, MAX_TOPIC_BYTES, StreamConfig,
};
use crate::error::{Result, StoreError};
use crate::filter::FilterSet;
use crate::format::{self, FLAG_BATCH_MORE, FLAG_TOMBSTONE, KIND_DATA};
use crate::lockfile::LockFile;
use crate::queue::{Op, Queue, QueuedOp, Removed};
pub use crate::record::{NewRecord, ReadBatch, Record};
use crate::recovery::{self, RecoveryReport};
use crate::shared::{Shared, lock};
use crate::state::RemovedLog;
use crate::ticket::Ticket;
use crate::vfs::Vfs;
use crate::writer::Writer;

mod info;

pub use info::{StreamInfo, StreamMetrics, TopicStats};

/// Most entries one `read_from` call walks (matching or not) before it returns, so that a
/// sparse filter cannot hold the stream lock for long.
pub const MAX_SCAN_ENTRIES: usize = 65_536;

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
        if let Some(w) = self.sh.take_stepper() {
            w.close();
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
        let mut writer = Writer::new(sh.clone(), o.active_file, o.active_len, durable, o.reemit);
        let thread = if sh.is_stepped() {
            writer.start();
            sh.install_stepper(Box::new(writer));
            None
        } else {
            let j = std::thread::Builder::new()
                .name(format!("tern-store-{name}"))
                .spawn(move || writer.run())
                .map_err(|e| StoreError::io("spawn writer thread", &name, &e))?;
            Some(j)
        };
        Ok(Stream {
            h: Arc::new(Handle {
                sh,
                writer: Mutex::new(thread),
                report: o.report,
                _lock: lockfile,
                _token: token,
            }),
        })
    }

    pub(crate) fn sh(&self) -> &Arc<Shared> {
        &self.h.sh
    }

    /// Appends made while the guard lives do not wake the writer; its drop does, so that
    /// a run of appends goes into one group commit (`wake` module). Not across an `.await`.
    pub fn defer_wakes(&self) -> crate::DeferWakes {
        crate::DeferWakes::new(self.sh().clone())
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

    /// Waits, as `append_batch` would, until the writer queue has room for `records`, without
    /// queueing them. A caller that must not wait while it holds a lock of its own calls this
    /// without it, then `try_append_batch` under it (another appender may take the room
    /// first: then it waits again). Fails as `append_batch` would.
    pub fn wait_for_room(&self, records: &[NewRecord<'_>]) -> Result<()> {
        let total = Self::batch_bytes(records)?;
        drop(self.room(total, true)?);
        Ok(())
    }

    /// The bytes `recs` take in the writer queue, or why they cannot be appended.
    fn batch_bytes(recs: &[NewRecord<'_>]) -> Result<usize> {
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
        if total > MAX_BATCH_BYTES {
            return Err(StoreError::RecordTooLarge {
                size_bytes: total,
                limit_bytes: MAX_BATCH_BYTES,
            });
        }
        Ok(total)
    }

    /// The writer queue once it has room for `total_bytes` (waiting for it if `wait`, else
    /// `QueueFull`), or why nothing can be queued.
    fn room(&self, total: usize, wait: bool) -> Result<std::sync::MutexGuard<'_, Queue>> {
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
                return Ok(q);
            }
            if !wait {
                return Err(StoreError::QueueFull {
                    stream: sh.name.clone(),
                });
            }
            if sh.is_stepped() {
                // No writer thread will make room: a turn on this thread does.
                drop(q);
                sh.step(false);
                q = lock(&sh.queue);
                continue;
            }
            q.appenders_waiting += 1;
            q.wake_writer(&sh.writer_cv);
            q = sh.space_cv.wait(q).unwrap_or_else(|e| e.into_inner());
            q.appenders_waiting -= 1;
        }
    }

    fn enqueue(&self, recs: &[NewRecord<'_>], flags: u8, wait: bool) -> Result<Ticket> {
        let total = Self::batch_bytes(recs)?;
        let sh = self.sh();
        let now = if recs.iter().any(|r| r.time_ns.is_none()) {
            sh.vfs.now_ns()
        } else {
            0
        };
        let mut q = self.room(total, wait)?;
        let first = q.next_seq;
        let queued_before = q.buf.len();
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
        sh.unwritten_bytes.fetch_add(
            (q.buf.len() - queued_before) as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        let last = q.next_seq - 1;
        q.wake_after_append(&sh.writer_cv);
        drop(q);
        Ok(Ticket::new(sh.clone(), first, last))
    }

    /// Queues an op without waiting for its outcome.
    pub(crate) fn send_op(&self, op: Op) {
        let sh = self.sh();
        let (tx, _rx) = sync_channel(1);
        let mut q = lock(&sh.queue);
        if q.closed {
            return;
        }
        let off = q.buf.len();
        q.ops.push((off, QueuedOp { op, reply: tx }));
        q.wake_writer(&sh.writer_cv);
    }

    fn op(&self, op: Op) -> Result<Removed> {
        let sh = self.sh();
        let (tx, rx) = sync_channel(1);
        let waits_for = {
            let mut q = lock(&sh.queue);
            if sh.failed.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(sh.failed_error());
            }
            if q.closed {
                return Err(StoreError::Closed(sh.name.clone()));
            }
            let off = q.buf.len();
            q.ops.push((off, QueuedOp { op, reply: tx }));
            q.wake_writer(&sh.writer_cv);
            q.next_seq - 1
        };
        sh.reply(&rx, waits_for)
    }

    /// A second ticket for a record already appended (`seq` from an earlier ticket): it
    /// completes when that record is durable, or fails if the stream failed first. For a
    /// waiter that did not issue the write (a retried QoS 2 PUBLISH answered as a duplicate
    /// waits for the original's write). A record refused by a `Discard::New` limit reports
    /// its refusal to whichever of its tickets reads it first.
    pub fn ticket_for(&self, seq: u64) -> Ticket {
        Ticket::new(self.sh().clone(), seq, seq)
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

    /// Stepped writers (`Vfs::stepped_writers`): runs one writer turn of this stream on
    /// this thread if records or ops are queued or a timer is due (by `Vfs::monotonic_ns`).
    /// Returns whether a turn ran; always false with writer threads.
    pub fn step(&self) -> bool {
        self.sh().step(false)
    }

    /// Stepped writers: when this stream's next writer timer fires (`Vfs::monotonic_ns`),
    /// if one is armed. None with writer threads.
    pub fn next_timer_ns(&self) -> Option<u64> {
        self.sh().next_timer_ns()
    }

    /// Blocks until everything appended before the call is durable.
    pub fn flush(&self) -> Result<()> {
        self.op(Op::Flush).map(|_| ())
    }

    /// Writes a copy of the stream into the directory `dest` (created; on the same file
    /// system: sealed blocks are hard-linked, the active block is copied), as it is at the end
    /// of the writer's next turn: everything appended before this call is in it. Opening
    /// `dest` as a stream recovers it like a stream after a `kill -9` at that moment. The
    /// writer does nothing else meanwhile (a few milliseconds: links and one block copy).
    pub fn snapshot(&self, dest: &std::path::Path) -> Result<()> {
        self.op(Op::Snapshot {
            dest: dest.to_path_buf(),
        })
        .map(|_| ())
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
        self.expire(self.sh().vfs.now_ns())
    }

    /// Removes every record below `floor` (e.g. what no consumer still needs).
    pub fn remove_below(&self, floor: u64) -> Result<Removed> {
        self.op(Op::RemoveBelow { floor })
    }

    /// Removes the leading sealed blocks whose records are all below `floor`, one step per
    /// block: the block holding `floor` and the active block stay whole, no record is walked
    /// and no delete marker written. What is removed is not reported by `drain_removed`.
    pub fn remove_blocks_below(&self, floor: u64) -> Result<Removed> {
        self.op(Op::RemoveBlocksBelow { floor })
    }

    /// `remove_blocks_below` without waiting for the writer: the removal is queued and made
    /// durable with a later group commit (for callers that must not block, e.g. an async task).
    pub fn queue_remove_blocks_below(&self, floor: u64) {
        self.send_op(Op::RemoveBlocksBelow { floor });
    }

    /// Retention limits (`max_age`, `max_msgs`, `max_bytes`, `max_msgs_per_topic`) never
    /// remove a record at or above `floor` from now on (`u64::MAX`: no such floor, the
    /// default). A limit that cannot be met without crossing it is exceeded until the floor
    /// moves. Explicit removals (`remove_below`, `purge`, `delete`) are not affected.
    pub fn set_retention_floor(&self, floor: u64) {
        self.sh()
            .retention_floor
            .store(floor, std::sync::atomic::Ordering::SeqCst);
    }

    /// The retention floor ([`Stream::set_retention_floor`]; `u64::MAX`: none).
    pub fn retention_floor(&self) -> u64 {
        self.sh()
            .retention_floor
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Lowers the retention floor to `floor` if it is above it (one atomic step), e.g. as a
    /// record that must outlive the limits is appended.
    pub fn lower_retention_floor(&self, floor: u64) {
        self.sh()
            .retention_floor
            .fetch_min(floor, std::sync::atomic::Ordering::SeqCst);
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
