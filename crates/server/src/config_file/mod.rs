//! The TOML config file: `[listener]`, `[limits]`, `[sys]`, `[state]`, `[store]`, `[http]` and any number of
//! `[[stream]]`.
//! Every key is optional; an unknown key or a value of the wrong type or range is an error that
//! names the key and its table.

use std::path::Path;

use serde::de::DeserializeOwned;
use std::time::Duration;

use tern_broker::{BrokerConfig, Durability, Keep, StreamSpec, SyncPolicy};
use toml::{Table, Value};

/// What the file sets.
#[derive(Debug, Clone)]
pub struct FileConfig {
    pub bind: Option<String>,
    /// `[[listener]]` tables in order (empty: the one `[listener] bind` / `--bind` listener).
    pub listeners: Vec<crate::listeners::ListenerConfig>,
    pub broker: BrokerConfig,
    /// `[[stream]]` tables in order; empty means the default stream. When none captures
    /// every topic, the store appends the default stream after them.
    pub streams: Vec<StreamSpec>,
    /// `[state] sync`: the state streams' sync policy (sessions, subscriptions, retained).
    pub state_sync: SyncPolicy,
    /// `[store] max_disk_bytes`: the message streams' disk budget (not the state streams');
    /// `None` (the default, or 0 in the file) means none.
    pub max_disk_bytes: Option<u64>,
    /// `[auth]` (crate::auth_config).
    pub auth: crate::auth_config::AuthConfig,
    /// `[http]`: the admin HTTP listener (`crate::http::config`).
    pub http: Option<crate::http::HttpSection>,
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
            auth: Default::default(),
            http: None,
        }
    }
}

#[derive(Debug)]
pub enum ConfigFileError {
    Read(std::io::Error),
    Parse(String),
    UnknownTable(String),
    NotATable(String),
    UnknownField {
        key: String,
        table: &'static str,
    },
    BadValue {
        key: String,
        table: &'static str,
        reason: String,
    },
}

impl std::fmt::Display for ConfigFileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigFileError::Read(e) => write!(f, "cannot read: {e}"),
            ConfigFileError::Parse(e) => write!(f, "invalid TOML: {e}"),
            ConfigFileError::UnknownTable(t) => write!(f, "unknown table `{t}`"),
            ConfigFileError::NotATable(t) => write!(f, "`{t}` must be a table"),
            ConfigFileError::UnknownField { key, table } => {
                write!(f, "unknown field `{key}` in [{table}]")
            }
            ConfigFileError::BadValue { key, table, reason } => {
                write!(f, "invalid value for `{key}` in [{table}]: {reason}")
            }
        }
    }
}

impl std::error::Error for ConfigFileError {}

pub fn load(path: &Path) -> Result<FileConfig, ConfigFileError> {
    let text = std::fs::read_to_string(path).map_err(ConfigFileError::Read)?;
    parse(&text)
}

fn get<T: DeserializeOwned>(
    value: &Value,
    key: &str,
    table: &'static str,
) -> Result<T, ConfigFileError> {
    value
        .clone()
        .try_into()
        .map_err(|e: toml::de::Error| ConfigFileError::BadValue {
            key: key.to_string(),
            table,
            reason: e.message().trim().to_string(),
        })
}

pub fn parse(text: &str) -> Result<FileConfig, ConfigFileError> {
    let root: Table = text
        .parse()
        .map_err(|e: toml::de::Error| ConfigFileError::Parse(e.to_string()))?;
    let mut config = FileConfig::default();
    for (name, section) in &root {
        if name == "stream" {
            let Value::Array(items) = section else {
                return Err(ConfigFileError::NotATable("stream".into()));
            };
            for item in items {
                let Value::Table(table) = item else {
                    return Err(ConfigFileError::NotATable("stream".into()));
                };
                config.streams.push(parse_stream(table)?);
            }
            continue;
        }
        if let ("listener", Value::Array(items)) = (name.as_str(), section) {
            config.listeners = crate::listeners::parse_tables(items)?;
            continue;
        }
        let Value::Table(section) = section else {
            return Err(ConfigFileError::NotATable(name.clone()));
        };
        match name.as_str() {
            "listener" => {
                for (key, value) in section {
                    match key.as_str() {
                        "bind" => {
                            let bind: String = get(value, key, "listener")?;
                            if bind.parse::<std::net::SocketAddr>().is_err() {
                                return Err(ConfigFileError::BadValue {
                                    key: key.clone(),
                                    table: "listener",
                                    reason: format!(
                                        "`{bind}` is not an address like 127.0.0.1:1883"
                                    ),
                                });
                            }
                            config.bind = Some(bind);
                        }
                        _ => return Err(unknown(key, "listener")),
                    }
                }
            }
            "limits" => parse_limits(section, &mut config.broker)?,
            "sys" => {
                for (key, value) in section {
                    match key.as_str() {
                        "interval_s" => config.broker.sys_interval_s = get(value, key, "sys")?,
                        _ => return Err(unknown(key, "sys")),
                    }
                }
            }
            "state" => config.state_sync = parse_state(section)?,
            "store" => config.max_disk_bytes = parse_store(section)?,
            "auth" => {
                config.auth =
                    Value::Table(section.clone())
                        .try_into()
                        .map_err(|e: toml::de::Error| ConfigFileError::BadValue {
                            key: "auth".into(),
                            table: "auth",
                            reason: e.message().trim().to_string(),
                        })?
            }
            "http" => config.http = Some(get(&Value::Table(section.clone()), "http", "http")?),
            other => return Err(ConfigFileError::UnknownTable(other.to_string())),
        }
    }
    let mut durable = tern_broker::DurableConfig {
        streams: config.streams.clone(),
        ..Default::default()
    };
    if let Err(reason) = durable.validate() {
        return Err(ConfigFileError::BadValue {
            key: "name/filters".into(),
            table: "stream",
            reason,
        });
    }
    // The streams are valid: what is left to refuse is a budget below a stream's block.
    durable.max_disk_bytes = config.max_disk_bytes;
    if let Err(reason) = durable.validate_disk_budget() {
        return Err(ConfigFileError::BadValue {
            key: "max_disk_bytes".into(),
            table: "store",
            reason,
        });
    }
    if let Err(error) = config.broker.validate() {
        let table = if error.field == "sys_interval_s" {
            "sys"
        } else {
            "limits"
        };
        return Err(ConfigFileError::BadValue {
            key: error.field.to_string(),
            table,
            reason: error.reason.to_string(),
        });
    }
    Ok(config)
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

/// `[state]`: the sync policy of the state streams, on its own (never a `[[stream]]`'s).
fn parse_state(section: &Table) -> Result<SyncPolicy, ConfigFileError> {
    const T: &str = "state";
    let mut sync = "always".to_string();
    let mut interval_ms = DEFAULT_SYNC_INTERVAL_MS;
    for (key, v) in section {
        let k = key.as_str();
        match k {
            "sync" => sync = get(v, k, T)?,
            "sync_interval_ms" => interval_ms = get(v, k, T)?,
            _ => return Err(unknown(k, T)),
        }
    }
    sync_policy(&sync, interval_ms).map_err(|reason| ConfigFileError::BadValue {
        key: "sync".into(),
        table: T,
        reason,
    })
}

/// Smallest disk budget accepted: below it a few messages fill it (a typo's guard; the
/// state streams are not counted, docs/ARCHITECTURE.md §6.1).
pub const MIN_DISK_BUDGET_BYTES: u64 = 65_536;

/// `[store]`: store-wide limits. `max_disk_bytes = 0` (or unset) means no budget.
fn parse_store(section: &Table) -> Result<Option<u64>, ConfigFileError> {
    const T: &str = "store";
    let mut budget = None;
    for (key, v) in section {
        let k = key.as_str();
        match k {
            "max_disk_bytes" => {
                let bytes: u64 = get(v, k, T)?;
                if bytes != 0 && bytes < MIN_DISK_BUDGET_BYTES {
                    return Err(ConfigFileError::BadValue {
                        key: k.to_string(),
                        table: T,
                        reason: format!(
                            "must be 0 (no budget) or at least {MIN_DISK_BUDGET_BYTES}"
                        ),
                    });
                }
                budget = (bytes != 0).then_some(bytes);
            }
            _ => return Err(unknown(k, T)),
        }
    }
    Ok(budget)
}

fn parse_stream(section: &Table) -> Result<StreamSpec, ConfigFileError> {
    const T: &str = "stream";
    let bad = |key: &str, reason: String| ConfigFileError::BadValue {
        key: key.to_string(),
        table: T,
        reason,
    };
    let mut spec = StreamSpec::default_stream();
    let mut sync = "always".to_string();
    let mut interval_ms = DEFAULT_SYNC_INTERVAL_MS;
    let mut named = false;
    for (key, v) in section {
        let k = key.as_str();
        match k {
            "name" => {
                spec.name = get(v, k, T)?;
                named = true;
            }
            "filters" => spec.filters = get(v, k, T)?,
            "max_age_s" => {
                spec.store.limits.max_age = Some(Duration::from_secs(get::<u64>(v, k, T)?))
            }
            "max_msgs" => spec.store.limits.max_msgs = Some(get(v, k, T)?),
            "max_bytes" => spec.store.limits.max_bytes = Some(get(v, k, T)?),
            "max_msgs_per_topic" => spec.store.limits.max_msgs_per_topic = Some(get(v, k, T)?),
            "block_size_bytes" => spec.store.block_size_bytes = get(v, k, T)?,
            "sync" => sync = get(v, k, T)?,
            "sync_interval_ms" => interval_ms = get(v, k, T)?,
            "durability" => {
                let d: String = get(v, k, T)?;
                spec.durability = d.parse::<Durability>().map_err(|e| bad(k, e))?;
            }
            "keep" => {
                let v: String = get(v, k, T)?;
                spec.keep = v.parse::<Keep>().map_err(|e| bad(k, e))?;
            }
            _ => return Err(unknown(k, T)),
        }
    }
    if !named {
        return Err(bad("name", "every [[stream]] needs a name".into()));
    }
    spec.store.sync = sync_policy(&sync, interval_ms).map_err(|e| bad("sync", e))?;
    Ok(spec)
}

fn unknown(key: &str, table: &'static str) -> ConfigFileError {
    ConfigFileError::UnknownField {
        key: key.to_string(),
        table,
    }
}

fn parse_limits(section: &Table, b: &mut BrokerConfig) -> Result<(), ConfigFileError> {
    const T: &str = "limits";
    for (key, v) in section {
        let k = key.as_str();
        match k {
            "max_packet_size_bytes" => b.max_packet_size_bytes = get(v, k, T)?,
            "receive_maximum" => b.receive_maximum = get(v, k, T)?,
            "topic_alias_maximum" => b.topic_alias_maximum = get(v, k, T)?,
            "max_keep_alive_s" => b.max_keep_alive_s = get(v, k, T)?,
            "connect_timeout_ms" => b.connect_timeout_ms = get(v, k, T)?,
            "max_inflight_messages" => b.max_inflight_messages = get(v, k, T)?,
            "max_queued_messages" => b.max_queued_messages = get(v, k, T)?,
            "max_queued_bytes" => b.max_queued_bytes = get(v, k, T)?,
            "max_queued_bytes_total" => b.max_queued_bytes_total = get(v, k, T)?,
            "max_connections" => b.max_connections = get(v, k, T)?,
            "max_session_expiry_interval_s" => b.max_session_expiry_interval_s = get(v, k, T)?,
            "max_subscriptions_per_session" => b.max_subscriptions_per_session = get(v, k, T)?,
            "max_sessions" => b.max_sessions = get(v, k, T)?,
            "max_retained_messages" => b.max_retained_messages = get(v, k, T)?,
            "max_client_id_len" => b.max_client_id_len = get(v, k, T)?,
            "outbound_queue_max_bytes" => b.outbound_queue_max_bytes = get(v, k, T)?,
            "outbound_queue_max_messages" => b.outbound_queue_max_messages = get(v, k, T)?,
            "slow_subscriber_timeout_ms" => b.slow_subscriber_timeout_ms = get(v, k, T)?,
            "max_topic_levels" => b.max_topic_levels = get(v, k, T)?,
            "max_topic_length_bytes" => b.max_topic_length_bytes = get(v, k, T)?,
            "max_connect_rate_per_ip" => b.max_connect_rate_per_ip = get(v, k, T)?,
            "connect_rate_burst" => b.connect_rate_burst = get(v, k, T)?,
            "reject_control_chars" => b.reject_control_chars = get(v, k, T)?,
            _ => return Err(unknown(k, T)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
