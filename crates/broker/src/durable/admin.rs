//! The store's side of the admin API: per-stream numbers, purge, and the state barrier that
//! makes a removed session's deletions durable before the API answers.

use std::path::PathBuf;

use tern_store::{FilterSet, Stream};

use super::{DurableStore, Keep};
use crate::model::Ticket;
use crate::model::{ActionError, StreamStats};

/// Backups go under `<data dir>/backups/`: on the data directory's file system (sealed blocks
/// are hard-linked) and writable wherever the data directory is.
const BACKUP_DIR: &str = "backups";
/// Longest backup label.
const MAX_BACKUP_LABEL_BYTES: usize = 128;

/// Purge removes what this filter matches: every topic but `$`-topics, so the broker's own
/// `$tern/` control records (open QoS 2 exchanges) stay.
const PURGE_FILTER: &str = "#";

fn stats(stream: &Stream, kind: &'static str) -> StreamStats {
    let limits = &stream.config().limits;
    let histograms = stream.histograms();
    StreamStats {
        name: stream.name().to_string(),
        kind,
        filters: Vec::new(),
        max_age_s: limits.max_age.map(|d| d.as_secs()),
        max_msgs: limits.max_msgs,
        max_bytes: limits.max_bytes,
        keep: None,
        info: stream.info(),
        metrics: stream.metrics(),
        fsync_us: histograms.fsync_us,
        batch_records: histograms.batch_records,
    }
}

impl DurableStore {
    pub(super) fn admin_stream_stats(&self) -> Vec<StreamStats> {
        let mut out: Vec<StreamStats> = self
            .slots
            .iter()
            .map(|slot| {
                let mut s = stats(&slot.stream, "message");
                s.filters = slot.spec.filters.clone();
                s.keep = Some(match slot.spec.keep {
                    Keep::Interest => "interest",
                    Keep::Retention => "retention",
                });
                s
            })
            .collect();
        out.extend(self.state_streams().iter().map(|s| stats(s, "state")));
        out
    }

    pub(super) fn admin_purge(&self, name: &str) -> Result<u64, ActionError> {
        let slot = self
            .slots
            .iter()
            .find(|slot| slot.stream.name() == name)
            .ok_or_else(|| ActionError::NotFound {
                what: "stream",
                name: name.to_string(),
            })?;
        let removed = slot
            .stream
            .purge(&FilterSet::new([PURGE_FILTER]))
            .map_err(|e| ActionError::Store(e.to_string()))?;
        Ok(removed.records)
    }

    /// A consistent copy of the data directory in `<data dir>/backups/<label>` (see
    /// [`crate::admin`]'s `Broker::backup`): the state streams first, then the message
    /// streams, so that no copied cursor or exchange record names a sequence its message
    /// stream's copy does not hold.
    pub(super) fn admin_backup(&self, label: &str) -> Result<PathBuf, ActionError> {
        let valid = !label.is_empty()
            && label.len() <= MAX_BACKUP_LABEL_BYTES
            && !label.starts_with('.')
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !valid {
            return Err(ActionError::Invalid(format!(
                "backup label `{label}`: 1 to {MAX_BACKUP_LABEL_BYTES} letters, digits, - _ ., not starting with ."
            )));
        }
        let root = self.store.dir().join(BACKUP_DIR).join(label);
        if root.exists() {
            return Err(ActionError::Invalid(format!("{} exists", root.display())));
        }
        let streams = root.join("streams");
        let order = self
            .state_streams()
            .into_iter()
            .chain(self.slots.iter().map(|slot| &slot.stream));
        for stream in order {
            stream
                .snapshot(&streams.join(stream.name()))
                .map_err(|e| ActionError::Store(e.to_string()))?;
        }
        for dir in [&streams, &root] {
            if let Ok(f) = std::fs::File::open(dir) {
                f.sync_all()
                    .map_err(|e| ActionError::Store(format!("fsync {}: {e}", dir.display())))?;
            }
        }
        Ok(root)
    }

    pub(super) fn admin_state_barrier(&self) -> Option<Ticket> {
        let stream = self.sessions.kv.stream();
        let last = stream.next_seq().checked_sub(1)?;
        (last > 0).then(|| Ticket::from_store(stream.ticket_for(last)))
    }
}
