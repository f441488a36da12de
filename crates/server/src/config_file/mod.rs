//! The TOML config file: `[listener]` or `[[listener]]`, `[limits]`, `[sys]`, `[state]`,
//! `[store]`, `[runtime]`, `[http]`, `[auth]`, `[cluster]` and any number of `[[stream]]`.
//!
//! serde reads the file into one derived struct per table (`tables.rs`, each with
//! `deny_unknown_fields`); small functions then check ranges and build a [`FileConfig`]. Every
//! key is optional but a `[[stream]]`'s `name` and a `[[listener]]`'s `bind`; an unknown key or
//! a value of the wrong type or range is an error that names the key and its table.

mod tables;

use std::path::Path;
use std::time::Duration;

use serde_path_to_error::Segment;
use tern_broker::{BrokerConfig, SyncPolicy};

/// What the file sets.
#[derive(Debug, Clone)]
pub struct FileConfig {
    pub bind: Option<String>,
    /// `[[listener]]` tables in order (empty: the one `[listener] bind` / `--bind` listener).
    pub listeners: Vec<crate::listeners::ListenerConfig>,
    pub broker: BrokerConfig,
    /// `[[stream]]` tables in order; empty means the default stream. When none captures
    /// every topic, the store appends the default stream after them.
    pub streams: Vec<tern_broker::StreamSpec>,
    /// `[state] sync`: the state streams' sync policy (sessions, subscriptions, retained).
    pub state_sync: SyncPolicy,
    /// `[store] max_disk_bytes`: the message streams' disk budget (not the state streams');
    /// `None` (the default, or 0 in the file) means none.
    pub max_disk_bytes: Option<u64>,
    /// `[runtime] worker_threads`: the async runtime's worker threads; `None`: one per core
    /// (tokio's default, which also reads `TOKIO_WORKER_THREADS`).
    pub worker_threads: Option<usize>,
    /// `[auth]` (crate::auth_config).
    pub auth: crate::auth_config::AuthConfig,
    /// `[http]`: the admin HTTP listener (`crate::http::config`).
    pub http: Option<crate::http::HttpSection>,
    /// `[cluster]`, checked (its `data_dir` is filled in from `--data-dir` at start, its
    /// `tls` from `cluster_tls`'s files by `plan` in main.rs).
    pub cluster: Option<tern_raft::NodeConfig>,
    /// `[cluster] tls_cert`, `tls_key`, `tls_ca`: all three (checked) or none.
    pub cluster_tls: Option<crate::tls::ClusterTlsFiles>,
}

impl Default for FileConfig {
    fn default() -> Self {
        FileConfig {
            bind: None,
            listeners: Vec::new(),
            broker: BrokerConfig::default(),
            streams: Vec::new(),
            state_sync: SyncPolicy::Always,
            max_disk_bytes: None,
            worker_threads: None,
            auth: Default::default(),
            http: None,
            cluster: None,
            cluster_tls: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    #[error("cannot read: {0}")]
    Read(#[source] std::io::Error),
    /// Not TOML (a syntax error, a key set twice): toml's message, which shows the line.
    #[error("invalid TOML: {0}")]
    Parse(String),
    /// What the derived tables refused (an unknown table or key, a wrong type, a missing
    /// key): where (`place`, e.g. "`sync` in [state], line 3") and serde's message.
    #[error("{place}: {message}")]
    Refused { place: String, message: String },
    /// A value of the right type out of its range (`table` as written, e.g. `[limits]`,
    /// `[[stream]] #2`).
    #[error("invalid value for `{key}` in {table}: {reason}")]
    BadValue {
        key: String,
        table: String,
        reason: String,
    },
}

pub fn load(path: &Path) -> Result<FileConfig, ConfigFileError> {
    let text = std::fs::read_to_string(path).map_err(ConfigFileError::Read)?;
    parse(&text)
}

pub fn parse(text: &str) -> Result<FileConfig, ConfigFileError> {
    let tables: tables::FileTables =
        serde_path_to_error::deserialize(toml::Deserializer::new(text))
            .map_err(|error| refused(text, error))?;
    let config = tables.into_config()?;
    let mut durable = tern_broker::DurableConfig {
        streams: config.streams.clone(),
        ..Default::default()
    };
    if let Err(reason) = durable.validate() {
        return Err(ConfigFileError::BadValue {
            key: "name/filters".into(),
            table: "[[stream]]".into(),
            reason,
        });
    }
    // The streams are valid: what is left to refuse is a budget too small for them.
    durable.max_disk_bytes = config.max_disk_bytes;
    if let Err(error) = durable.validate_disk_budget() {
        return Err(ConfigFileError::BadValue {
            key: "max_disk_bytes".into(),
            table: "[store]".into(),
            reason: error.to_string(),
        });
    }
    // Every field `BrokerConfig::validate` checks is a `[limits]` key.
    if let Err(error) = config.broker.validate() {
        return Err(ConfigFileError::BadValue {
            key: error.field.to_string(),
            table: "[limits]".into(),
            reason: error.reason.to_string(),
        });
    }
    Ok(config)
}

/// A serde error placed in the file: its path names the table and key, toml's span the line.
/// An error with no path is not about a table (TOML syntax, a key set twice).
fn refused(text: &str, error: serde_path_to_error::Error<toml::de::Error>) -> ConfigFileError {
    let path = error.path().clone();
    let error = error.into_inner();
    let mut segments = path.iter();
    let Some(Segment::Map { key: table }) = segments.next() else {
        return ConfigFileError::Parse(error.to_string());
    };
    let (table, next) = match segments.next() {
        None => (format!("`{table}` at the top level"), None),
        Some(Segment::Seq { index }) => (format!("[[{table}]] #{}", index + 1), segments.next()),
        next => (format!("[{table}]"), next),
    };
    let mut place = match next {
        Some(Segment::Map { key }) => format!("`{key}` in {table}"),
        _ => table,
    };
    if let Some(span) = error.span() {
        let before = text.as_bytes().get(..span.start).unwrap_or_default();
        let line = before.iter().filter(|&&byte| byte == b'\n').count() + 1;
        place = format!("{place}, line {line}");
    }
    ConfigFileError::Refused {
        place,
        message: error.message().trim().to_string(),
    }
}

/// Parses a sync policy name (`always`, `interval`, `never`).
pub fn sync_policy(name: &str, interval_ms: u64) -> Result<SyncPolicy, String> {
    match name {
        "always" => Ok(SyncPolicy::Always),
        "never" => Ok(SyncPolicy::Never),
        "interval" if interval_ms > 0 => {
            Ok(SyncPolicy::Interval(Duration::from_millis(interval_ms)))
        }
        "interval" => Err("sync_interval_ms must be above 0".into()),
        other => Err(format!("`{other}` is not one of always, interval, never")),
    }
}

/// Default of `sync_interval_ms` / `--sync-interval-ms`.
pub const DEFAULT_SYNC_INTERVAL_MS: u64 = 100;

#[cfg(test)]
mod error_tests;
#[cfg(test)]
mod tests;
