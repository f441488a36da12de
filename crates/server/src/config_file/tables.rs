//! The file's tables as serde reads them, one derived struct per table, each with
//! `deny_unknown_fields` (an unknown key is an error naming it), and the functions that check
//! ranges and turn them into the broker's types. A key left out keeps the broker's default.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use tern_broker::{BrokerConfig, StreamSpec, SyncPolicy};

use super::{ConfigFileError, DEFAULT_SYNC_INTERVAL_MS, FileConfig, sync_policy};
use crate::auth_config::AuthConfig;
use crate::http::HttpSection;
use crate::listeners::ListenerConfig;

/// The whole file: every table is optional.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileTables {
    listener: Option<ListenerSection>,
    #[serde(default)]
    limits: LimitsTable,
    #[serde(default)]
    sys: SysTable,
    #[serde(default)]
    state: StateTable,
    #[serde(default)]
    store: StoreTable,
    #[serde(default)]
    runtime: RuntimeTable,
    http: Option<HttpSection>,
    #[serde(default)]
    auth: AuthConfig,
    #[serde(default)]
    stream: StreamTables,
    cluster: Option<ClusterTable>,
}

/// `[cluster]`: this node's place in a cluster (docs/cluster.md).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClusterTable {
    node_id: u64,
    bind: String,
    peers: Vec<String>,
    heartbeat_interval_ms: Option<u64>,
    election_timeout_min_ms: Option<u64>,
    election_timeout_max_ms: Option<u64>,
    snapshot_every_entries: Option<u64>,
    log_kept_behind_snapshot: Option<u64>,
    /// Mutual TLS on the cluster port: all three or none (docs/cluster.md, "Security").
    tls_cert: Option<std::path::PathBuf>,
    tls_key: Option<std::path::PathBuf>,
    tls_ca: Option<std::path::PathBuf>,
    /// The cluster CA's revocation lists (with the three above).
    tls_crl: Option<std::path::PathBuf>,
}

impl ClusterTable {
    /// The TLS files, if all three are set; an error if only some are.
    fn tls_files(&self) -> Result<Option<crate::tls::ClusterTlsFiles>, ConfigFileError> {
        match (&self.tls_cert, &self.tls_key, &self.tls_ca) {
            (None, None, None) if self.tls_crl.is_some() => Err(bad(
                "tls_crl",
                "[cluster]",
                "needs tls_cert, tls_key and tls_ca (mutual TLS on the cluster port)".into(),
            )),
            (None, None, None) => Ok(None),
            (Some(cert), Some(key), Some(ca)) => Ok(Some(crate::tls::ClusterTlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                ca: ca.clone(),
                crl: self.tls_crl.clone(),
            })),
            _ => Err(bad(
                "tls_cert/tls_key/tls_ca",
                "[cluster]",
                "set all three (mutual TLS on the cluster port) or none".into(),
            )),
        }
    }

    fn into_config(self, sync: SyncPolicy) -> Result<tern_raft::NodeConfig, ConfigFileError> {
        let table = "[cluster]";
        if self.node_id == 0 {
            return Err(bad("node_id", table, "must be 1 or more".into()));
        }
        let mut node = tern_raft::NodeConfig::from_cluster(
            self.node_id,
            &self.bind,
            &self.peers,
            std::path::PathBuf::new(),
        )
        .map_err(|e| bad("bind/peers", table, e.to_string()))?;
        if node.peers.iter().any(|(id, _)| id.0 == 0) {
            return Err(bad("peers", table, "node ids must be 1 or more".into()));
        }
        node.sync = sync;
        node.heartbeat_interval_ms = self.heartbeat_interval_ms.unwrap_or(DEFAULT_HEARTBEAT_MS);
        node.election_timeout_min_ms = self
            .election_timeout_min_ms
            .unwrap_or(DEFAULT_ELECTION_MIN_MS);
        node.election_timeout_max_ms = self
            .election_timeout_max_ms
            .unwrap_or(node.election_timeout_min_ms * 2);
        if node.heartbeat_interval_ms == 0
            || node.election_timeout_min_ms <= node.heartbeat_interval_ms
            || node.election_timeout_max_ms <= node.election_timeout_min_ms
        {
            let reason = "want 0 < heartbeat_interval_ms < election_timeout_min_ms < election_timeout_max_ms";
            return Err(bad("election_timeout_min_ms", table, reason.into()));
        }
        if let Some(n) = self.snapshot_every_entries {
            if n == 0 {
                return Err(bad(
                    "snapshot_every_entries",
                    table,
                    "must be above 0".into(),
                ));
            }
            node.snapshot_every_entries = n;
        }
        if let Some(n) = self.log_kept_behind_snapshot {
            node.log_kept_behind_snapshot = n;
        }
        Ok(node)
    }
}

/// `[cluster] heartbeat_interval_ms` by default: openraft's 50 ms doubled, for a loaded
/// machine whose fsyncs stall the Raft tasks.
const DEFAULT_HEARTBEAT_MS: u64 = 100;
/// `[cluster] election_timeout_min_ms` by default (the maximum is twice it). openraft 0.9's
/// voters refuse a candidate until their leader lease (the maximum) has run out, so a dead
/// leader is replaced after 0.6-1.2 s: inside the 3 s a failover may take, engine start
/// included.
const DEFAULT_ELECTION_MIN_MS: u64 = 300;

/// `[listener]` (one table: `bind` only) or `[[listener]]` (any number of full tables).
#[derive(Debug)]
enum ListenerSection {
    Single(SingleListener),
    Many(Vec<ListenerConfig>),
}

impl<'de> Deserialize<'de> for ListenerSection {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SectionVisitor;
        impl<'de> Visitor<'de> for SectionVisitor {
            type Value = ListenerSection;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a [listener] table or [[listener]] tables")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                SingleListener::deserialize(MapAccessDeserializer::new(map))
                    .map(ListenerSection::Single)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                Vec::deserialize(SeqAccessDeserializer::new(seq)).map(ListenerSection::Many)
            }
        }
        deserializer.deserialize_any(SectionVisitor)
    }
}

/// `[listener]`: the one plain TCP listener's address (`--bind` overrides it).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [listener] table")]
struct SingleListener {
    bind: Option<String>,
}

/// `[limits]`: each key is the [`BrokerConfig`] field of the same name.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [limits] table")]
struct LimitsTable {
    max_packet_size_bytes: Option<u32>,
    receive_maximum: Option<u16>,
    topic_alias_maximum: Option<u16>,
    max_keep_alive_s: Option<u16>,
    connect_timeout_ms: Option<u64>,
    max_inflight_messages: Option<u16>,
    max_queued_messages: Option<usize>,
    max_queued_bytes: Option<usize>,
    max_queued_bytes_total: Option<usize>,
    max_connections: Option<usize>,
    max_session_expiry_interval_s: Option<u32>,
    max_subscriptions_per_session: Option<usize>,
    max_sessions: Option<usize>,
    max_retained_messages: Option<usize>,
    max_client_id_len: Option<usize>,
    outbound_queue_max_bytes: Option<usize>,
    outbound_queue_max_messages: Option<usize>,
    slow_subscriber_timeout_ms: Option<u64>,
    max_topic_levels: Option<usize>,
    max_topic_length_bytes: Option<usize>,
    max_connect_rate_per_ip: Option<u32>,
    connect_rate_burst: Option<u32>,
    reject_control_chars: Option<bool>,
}

impl LimitsTable {
    /// Sets the keys the table names; their ranges are [`BrokerConfig::validate`]'s.
    fn apply(self, b: &mut BrokerConfig) {
        fn set<T>(field: &mut T, value: Option<T>) {
            if let Some(value) = value {
                *field = value;
            }
        }
        set(&mut b.max_packet_size_bytes, self.max_packet_size_bytes);
        set(&mut b.receive_maximum, self.receive_maximum);
        set(&mut b.topic_alias_maximum, self.topic_alias_maximum);
        set(&mut b.max_keep_alive_s, self.max_keep_alive_s);
        set(&mut b.connect_timeout_ms, self.connect_timeout_ms);
        set(&mut b.max_inflight_messages, self.max_inflight_messages);
        set(&mut b.max_queued_messages, self.max_queued_messages);
        set(&mut b.max_queued_bytes, self.max_queued_bytes);
        set(&mut b.max_queued_bytes_total, self.max_queued_bytes_total);
        set(&mut b.max_connections, self.max_connections);
        set(
            &mut b.max_session_expiry_interval_s,
            self.max_session_expiry_interval_s,
        );
        set(
            &mut b.max_subscriptions_per_session,
            self.max_subscriptions_per_session,
        );
        set(&mut b.max_sessions, self.max_sessions);
        set(&mut b.max_retained_messages, self.max_retained_messages);
        set(&mut b.max_client_id_len, self.max_client_id_len);
        set(
            &mut b.outbound_queue_max_bytes,
            self.outbound_queue_max_bytes,
        );
        set(
            &mut b.outbound_queue_max_messages,
            self.outbound_queue_max_messages,
        );
        set(
            &mut b.slow_subscriber_timeout_ms,
            self.slow_subscriber_timeout_ms,
        );
        set(&mut b.max_topic_levels, self.max_topic_levels);
        set(&mut b.max_topic_length_bytes, self.max_topic_length_bytes);
        set(&mut b.max_connect_rate_per_ip, self.max_connect_rate_per_ip);
        set(&mut b.connect_rate_burst, self.connect_rate_burst);
        set(&mut b.reject_control_chars, self.reject_control_chars);
    }
}

/// `[sys]`: the `$SYS` publish interval (0 disables).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [sys] table")]
struct SysTable {
    interval_s: Option<u64>,
}

/// `[state]`: the sync policy of the state streams, on its own (never a `[[stream]]`'s).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [state] table")]
struct StateTable {
    sync: Option<String>,
    sync_interval_ms: Option<u64>,
}

/// `[store]`: store-wide limits. `max_disk_bytes = 0` (or unset) means no budget.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [store] table")]
struct StoreTable {
    max_disk_bytes: Option<u64>,
}

/// `[runtime]`: the async runtime's worker threads (unset: one per core).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [runtime] table")]
struct RuntimeTable {
    worker_threads: Option<usize>,
}

/// Most worker threads `[runtime] worker_threads` takes: past the cores they only contend.
pub(super) const MAX_WORKER_THREADS: usize = 1024;

impl RuntimeTable {
    fn worker_threads(&self) -> Result<Option<usize>, ConfigFileError> {
        match self.worker_threads {
            Some(n) if n == 0 || n > MAX_WORKER_THREADS => Err(bad(
                "worker_threads",
                "[runtime]",
                format!("{n} is not between 1 and {MAX_WORKER_THREADS}"),
            )),
            n => Ok(n),
        }
    }
}

/// `[[stream]]`: an array of tables (`[stream]`, one table, is the likely slip it names).
#[derive(Debug, Default)]
struct StreamTables(Vec<StreamTable>);

impl<'de> Deserialize<'de> for StreamTables {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TablesVisitor;
        impl<'de> Visitor<'de> for TablesVisitor {
            type Value = StreamTables;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("[[stream]] tables")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                Vec::deserialize(SeqAccessDeserializer::new(seq)).map(StreamTables)
            }
        }
        deserializer.deserialize_seq(TablesVisitor)
    }
}

/// One `[[stream]]`: only `name` is required; unset limits are unlimited.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [[stream]] table")]
struct StreamTable {
    name: String,
    #[serde(default)]
    filters: Vec<String>,
    max_age_s: Option<u64>,
    max_msgs: Option<u64>,
    max_bytes: Option<u64>,
    max_msgs_per_topic: Option<u64>,
    block_size_bytes: Option<u64>,
    sync: Option<String>,
    sync_interval_ms: Option<u64>,
    durability: Option<String>,
    keep: Option<String>,
}

fn bad(key: &str, table: &str, reason: String) -> ConfigFileError {
    ConfigFileError::BadValue {
        key: key.to_string(),
        table: table.to_string(),
        reason,
    }
}

/// `sync` (default `always`) with `sync_interval_ms` (default 100) of `table`.
fn sync(
    name: Option<String>,
    interval_ms: Option<u64>,
    table: &str,
) -> Result<SyncPolicy, ConfigFileError> {
    let name = name.as_deref().unwrap_or("always");
    sync_policy(name, interval_ms.unwrap_or(DEFAULT_SYNC_INTERVAL_MS))
        .map_err(|reason| bad("sync", table, reason))
}

/// `[[stream]]` number `index + 1`, as in the messages that name it.
fn stream_table(index: usize) -> String {
    format!("[[stream]] #{}", index + 1)
}

impl StreamTable {
    fn into_spec(self, table: &str) -> Result<StreamSpec, ConfigFileError> {
        let mut spec = StreamSpec::default_stream();
        spec.name = self.name;
        spec.filters = self.filters;
        let limits = &mut spec.store.limits;
        limits.max_age = self.max_age_s.map(Duration::from_secs);
        limits.max_msgs = self.max_msgs;
        limits.max_bytes = self.max_bytes;
        limits.max_msgs_per_topic = self.max_msgs_per_topic;
        if let Some(bytes) = self.block_size_bytes {
            spec.store.block_size_bytes = bytes;
        }
        spec.store.sync = sync(self.sync, self.sync_interval_ms, table)?;
        if let Some(d) = self.durability {
            spec.durability = d.parse().map_err(|e| bad("durability", table, e))?;
        }
        if let Some(k) = self.keep {
            spec.keep = k.parse().map_err(|e| bad("keep", table, e))?;
        }
        Ok(spec)
    }
}

/// Each `[[listener]]` table alone ([`ListenerConfig::check`]), named by its position.
fn check_listeners(listeners: &[ListenerConfig]) -> Result<(), ConfigFileError> {
    for (index, listener) in listeners.iter().enumerate() {
        let table = format!("[[listener]] #{}", index + 1);
        listener
            .check()
            .map_err(|(key, reason)| bad(key, &table, reason))?;
    }
    Ok(())
}

impl FileTables {
    /// Every table's own checks; what spans tables (streams, budget, limits) is the caller's.
    pub(super) fn into_config(self) -> Result<FileConfig, ConfigFileError> {
        let mut config = FileConfig::default();
        match self.listener {
            Some(ListenerSection::Single(SingleListener { bind: Some(bind) })) => {
                if bind.parse::<SocketAddr>().is_err() {
                    let reason = format!("`{bind}` is not an address like 127.0.0.1:1883");
                    return Err(bad("bind", "[listener]", reason));
                }
                config.bind = Some(bind);
            }
            Some(ListenerSection::Single(SingleListener { bind: None })) | None => {}
            Some(ListenerSection::Many(listeners)) => {
                check_listeners(&listeners)?;
                config.listeners = listeners;
            }
        }
        self.limits.apply(&mut config.broker);
        if let Some(interval_s) = self.sys.interval_s {
            config.broker.sys_interval_s = interval_s;
        }
        config.state_sync = sync(self.state.sync, self.state.sync_interval_ms, "[state]")?;
        config.max_disk_bytes = self.store.max_disk_bytes.filter(|&bytes| bytes != 0);
        config.worker_threads = self.runtime.worker_threads()?;
        config.http = self.http;
        config.auth = self.auth;
        if let Some(table) = self.cluster {
            config.cluster_tls = table.tls_files()?;
            config.cluster = Some(table.into_config(config.state_sync)?);
        }
        config.streams = self
            .stream
            .0
            .into_iter()
            .enumerate()
            .map(|(index, table)| table.into_spec(&stream_table(index)))
            .collect::<Result<_, _>>()?;
        Ok(config)
    }
}
