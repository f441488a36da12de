//! What the store reports about itself to operators ([`StreamStats`]) and why an operator's
//! action failed ([`ActionError`]): shared by the persistence seam, the admin API and `/metrics`.

use tern_store::{HistogramSnapshot, StreamInfo, StreamMetrics};

/// A stream of the durable store, as the admin API and `/metrics` show it.
#[derive(Debug, Clone)]
pub struct StreamStats {
    pub name: String,
    /// `"message"` (a `[[stream]]`) or `"state"` (`tern.sessions`, `tern.retained`).
    pub kind: &'static str,
    /// Topic filters of a message stream (empty: every topic).
    pub filters: Vec<String>,
    /// Retention limits (`None`: unlimited) and the keep policy of a message stream.
    pub max_age_s: Option<u64>,
    pub max_msgs: Option<u64>,
    pub max_bytes: Option<u64>,
    pub keep: Option<&'static str>,
    pub info: StreamInfo,
    pub metrics: StreamMetrics,
    pub(crate) fsync_us: HistogramSnapshot,
    pub(crate) batch_records: HistogramSnapshot,
}

/// Why an action could not be done.
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    #[error("no such {what}: {name}")]
    NotFound { what: &'static str, name: String },
    #[error("the store failed: {0}")]
    Store(String),
    /// The request cannot be done as asked (a bad or taken backup label, ...).
    #[error("{0}")]
    Invalid(String),
}
