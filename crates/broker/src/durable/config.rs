//! Configuration of the durable store: the message streams (name, captured filters, limits,
//! sync policy, durability policy) and the sync policy of the state streams.
//!
//! # Invariants
//! - Once [`DurableConfig::with_default_stream`] ran, every topic falls in some stream: a
//!   topic is kept in memory only when its stream says [`Durability::Never`], never because no
//!   stream captures it.
//! - The state streams' sync policy is [`DurableConfig::state_sync`], set on its own; no
//!   message stream's policy leaks into it.

use tern_store::{StreamConfig, SyncPolicy};

/// Which messages of a stream are written (ARCHITECTURE §4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// QoS 1 and 2 are stored, QoS 0 is not.
    #[default]
    Default,
    /// Every message is stored, QoS 0 too.
    Always,
    /// Nothing is stored (memory only).
    Never,
}

impl std::str::FromStr for Durability {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "default" => Ok(Durability::Default),
            "always" => Ok(Durability::Always),
            "never" => Ok(Durability::Never),
            other => Err(format!("`{other}` is not one of default, always, never")),
        }
    }
}

/// What a message stream keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Keep {
    /// A block goes once nothing needs anything in it: no persistent session's durable cursor
    /// below it, nothing unrouted, no open inbound QoS 2 exchange, no outbound exchange
    /// (`keep = "interest"`, the default). The retention limits apply on top.
    #[default]
    Interest,
    /// Everything within the retention limits stays, as a replay log (`keep = "retention"`).
    Retention,
}

impl std::str::FromStr for Keep {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "interest" => Ok(Keep::Interest),
            "retention" => Ok(Keep::Retention),
            other => Err(format!("`{other}` is not one of interest, retention")),
        }
    }
}

/// One message stream.
#[derive(Debug, Clone)]
pub struct StreamSpec {
    /// Store stream name (letters, digits, `-`, `_`, `.`; not starting with `tern.`).
    pub name: String,
    /// Topic filters it captures; empty captures every topic (`$` topics too, which a leading
    /// `#` does not match). A message goes to the first stream (in configuration order) whose
    /// filters match its topic; the default stream, appended last when no stream captures
    /// every topic, takes the rest.
    pub filters: Vec<String>,
    pub durability: Durability,
    /// Whether blocks go once no one needs them, or only by the retention limits.
    pub keep: Keep,
    /// Block size, sync policy and retention limits.
    pub store: StreamConfig,
}

/// Name of the default stream: the only stream when none is configured, appended after the
/// configured ones when none of them captures every topic.
pub(crate) const DEFAULT_STREAM_NAME: &str = "messages";
/// Prefix of the store's own state streams; not available to configured streams.
pub(crate) const STATE_STREAM_PREFIX: &str = "tern.";

impl StreamSpec {
    /// The default stream: every topic, sync `always`, durability `default`.
    pub fn default_stream() -> StreamSpec {
        StreamSpec {
            name: DEFAULT_STREAM_NAME.into(),
            filters: Vec::new(),
            durability: Durability::Default,
            keep: Keep::Interest,
            store: StreamConfig::default(),
        }
    }
}

/// Bounds on what one recovered session brings back (the broker's own limits).
#[derive(Debug, Clone, Copy)]
pub struct SessionLimits {
    /// `max_queued_messages`: beyond it the oldest recovered messages are dropped (counted).
    pub max_pending_per_session: usize,
    /// `max_queued_bytes`: likewise, by bytes (topic + payload + a fixed overhead each), so
    /// that recovery never reads more of an offline session's backlog into memory than the
    /// running broker would keep for it.
    pub max_pending_bytes_per_session: usize,
    // No in-flight bound: a session's QoS 2 exchanges come back whole, each under its packet
    // id (at most 65,535 by the id space, and at most the `max_inflight_messages` of the run
    // that wrote them); dropping one would break exactly-once.
}

impl Default for SessionLimits {
    fn default() -> Self {
        SessionLimits {
            max_pending_per_session: 100_000,
            max_pending_bytes_per_session: 64 * 1024 * 1024,
        }
    }
}

/// The streams of a broker's data directory.
#[derive(Debug, Clone)]
pub struct DurableConfig {
    pub streams: Vec<StreamSpec>,
    pub sessions: SessionLimits,
    /// Sync policy of the state streams (`tern.sessions`: sessions, subscriptions, cursors,
    /// "PUBREL pending"; `tern.retained`), `[state] sync` in the config file. Default
    /// `always`: SUBACK, UNSUBACK and the ack of a retained PUBLISH wait for an fdatasync.
    pub state_sync: SyncPolicy,
    /// `[store] max_disk_bytes`: the disk budget of the message streams (as the store measures
    /// their blocks). At it, new messages that would be written are refused (QoS>0) or
    /// dropped (QoS 0) until retention frees space; `None`: no budget. The state streams are
    /// not counted: retention cannot free them, so they could hold the budget forever; their
    /// compaction bounds them (docs/ARCHITECTURE.md §6.1).
    pub max_disk_bytes: Option<u64>,
}

impl Default for DurableConfig {
    fn default() -> Self {
        DurableConfig {
            streams: vec![StreamSpec::default_stream()],
            sessions: SessionLimits::default(),
            state_sync: SyncPolicy::Always,
            max_disk_bytes: None,
        }
    }
}

impl DurableConfig {
    /// True if some stream captures every topic (no filters).
    pub(crate) fn captures_every_topic(&self) -> bool {
        self.streams.iter().any(|s| s.filters.is_empty())
    }

    /// Appends the default stream ([`DEFAULT_STREAM_NAME`], every topic) unless a stream
    /// already captures every topic, so that no topic is memory only by omission.
    pub(crate) fn with_default_stream(mut self) -> Self {
        if !self.captures_every_topic() {
            self.streams.push(StreamSpec::default_stream());
        }
        self
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.streams.len() > usize::from(u16::MAX) {
            return Err("too many streams".into());
        }
        if !self.captures_every_topic() {
            if let Some(s) = self.streams.iter().find(|s| s.name == DEFAULT_STREAM_NAME) {
                return Err(format!(
                    "stream `{}` has filters, but `{DEFAULT_STREAM_NAME}` names the default \
                     stream that takes every topic no configured stream captures: rename it, \
                     or drop its filters so that it captures every topic",
                    s.name
                ));
            }
        }
        let mut names = std::collections::HashSet::new();
        for s in &self.streams {
            if s.name.starts_with(STATE_STREAM_PREFIX) {
                return Err(format!(
                    "stream name `{}` uses the reserved prefix `tern.`",
                    s.name
                ));
            }
            if !names.insert(s.name.as_str()) {
                return Err(format!("stream `{}` configured twice", s.name));
            }
            for f in &s.filters {
                if tern_topic::classify_filter(f).is_err() {
                    return Err(format!("stream `{}`: invalid filter `{f}`", s.name));
                }
            }
        }
        Ok(())
    }

    /// The one check of a disk budget, both rules, for `tern serve` to refuse a config file
    /// (docs/ARCHITECTURE.md §6.1):
    /// - at least [`MIN_DISK_BUDGET_BYTES`]: below it a few messages fill the budget (a
    ///   typo's guard). The config file's 0 means no budget and reaches here as `None`.
    /// - at least the `block_size_bytes` of every written stream (the default stream too):
    ///   an active block counts whole against the budget (it is reserved to its block size,
    ///   ARCHITECTURE §4) and retention cannot free it, so a budget below one block of a
    ///   stream would refuse every message from that stream's first write on. A
    ///   `durability = "never"` stream is never written and holds nothing.
    ///
    /// Not part of [`DurableConfig::validate`], nor of [`super::DurableStore::open`]: the store
    /// works with any budget (at it, it refuses), and tests use tiny budgets on purpose.
    pub fn validate_disk_budget(&self) -> Result<(), DiskBudgetError> {
        let Some(budget_bytes) = self.max_disk_bytes else {
            return Ok(());
        };
        if budget_bytes < MIN_DISK_BUDGET_BYTES {
            return Err(DiskBudgetError::BelowMinimum { budget_bytes });
        }
        let streams = self.clone().with_default_stream().streams;
        match streams
            .into_iter()
            .filter(|s| s.durability != Durability::Never)
            .find(|s| s.store.block_size_bytes > budget_bytes)
        {
            Some(s) => Err(DiskBudgetError::BelowBlock {
                budget_bytes,
                block_size_bytes: s.store.block_size_bytes,
                stream: s.name,
            }),
            None => Ok(()),
        }
    }
}

/// Smallest disk budget [`DurableConfig::validate_disk_budget`] accepts: below it a few
/// messages fill it (the state streams are not counted, docs/ARCHITECTURE.md §6.1).
pub const MIN_DISK_BUDGET_BYTES: u64 = 65_536;

/// Why [`DurableConfig::validate_disk_budget`] refuses a budget (its messages are the ones
/// `tern serve` prints for `[store] max_disk_bytes`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiskBudgetError {
    #[error("must be 0 (no budget) or at least {MIN_DISK_BUDGET_BYTES}")]
    BelowMinimum { budget_bytes: u64 },
    #[error(
        "[store] max_disk_bytes = {budget_bytes} is below stream `{stream}`'s block_size_bytes \
         ({block_size_bytes}): a stream's active block is reserved whole, so nothing could be \
         stored once it was written; raise the budget or lower the stream's block size (keep \
         blocks well below the budget: retention frees whole blocks)"
    )]
    BelowBlock {
        budget_bytes: u64,
        stream: String,
        block_size_bytes: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_disk_budget_below_a_streams_block_is_refused() {
        let mut config = DurableConfig {
            max_disk_bytes: Some(1024 * 1024),
            ..DurableConfig::default()
        };
        // The default stream's blocks are 4 MiB.
        let e = config.validate_disk_budget().unwrap_err();
        assert_eq!(
            e,
            DiskBudgetError::BelowBlock {
                budget_bytes: 1024 * 1024,
                stream: "messages".into(),
                block_size_bytes: 4 * 1024 * 1024,
            }
        );
        assert!(
            e.to_string()
                .contains("below stream `messages`'s block_size_bytes (4194304)"),
            "{e}"
        );
        // Also a stream appended only as the default (none captures every topic).
        config.streams = vec![stream("telemetry", &["sensors/#"])];
        config.streams[0].store.block_size_bytes = 64 * 1024;
        assert!(matches!(
            config.validate_disk_budget(),
            Err(DiskBudgetError::BelowBlock { stream, .. }) if stream == "messages"
        ));
        config.streams.push(stream("all", &[]));
        config.streams[1].store.block_size_bytes = 64 * 1024;
        assert_eq!(config.validate_disk_budget(), Ok(()));
        config.max_disk_bytes = Some(64 * 1024);
        assert_eq!(
            config.validate_disk_budget(),
            Ok(()),
            "the minimum, at the blocks"
        );
        config.streams[0].store.block_size_bytes = 64 * 1024 + 1;
        assert!(matches!(
            config.validate_disk_budget(),
            Err(DiskBudgetError::BelowBlock { stream, .. }) if stream == "telemetry"
        ));
        // A memory-only stream is never written: its blocks do not count.
        config.streams[0].durability = Durability::Never;
        config.streams[0].store.block_size_bytes = 4 * 1024 * 1024;
        assert_eq!(config.validate_disk_budget(), Ok(()));
        config.max_disk_bytes = None;
        assert_eq!(config.validate_disk_budget(), Ok(()));
    }

    /// Below 64 KiB a few messages fill the budget (a typo's guard): refused whatever the
    /// blocks. `DurableStore::open` takes any budget; this is `tern serve`'s one check of it.
    #[test]
    fn a_disk_budget_below_the_minimum_is_refused() {
        let mut all = stream("all", &[]);
        all.store.block_size_bytes = 4096;
        let mut config = DurableConfig {
            streams: vec![all],
            max_disk_bytes: Some(65_535),
            ..DurableConfig::default()
        };
        for budget in [65_535, 4096, 0] {
            config.max_disk_bytes = Some(budget);
            let e = config.validate_disk_budget().unwrap_err().to_string();
            assert_eq!(e, "must be 0 (no budget) or at least 65536");
        }
        config.max_disk_bytes = Some(65_536);
        assert_eq!(config.validate_disk_budget(), Ok(()));
    }

    fn stream(name: &str, filters: &[&str]) -> StreamSpec {
        StreamSpec {
            name: name.into(),
            filters: filters.iter().map(|f| f.to_string()).collect(),
            ..StreamSpec::default_stream()
        }
    }

    fn names(config: &DurableConfig) -> Vec<&str> {
        config.streams.iter().map(|s| s.name.as_str()).collect()
    }

    #[test]
    fn default_stream_is_appended_when_no_stream_captures_every_topic() {
        let config = DurableConfig {
            streams: vec![stream("telemetry", &["sensors/#"])],
            ..DurableConfig::default()
        };
        assert!(config.validate().is_ok());
        let config = config.with_default_stream();
        assert_eq!(names(&config), vec!["telemetry", DEFAULT_STREAM_NAME]);
        assert!(config.streams[1].filters.is_empty(), "captures every topic");
        // `#` does not capture `$` topics: the default stream still takes those.
        let config = DurableConfig {
            streams: vec![stream("all", &["#"])],
            ..DurableConfig::default()
        };
        assert_eq!(
            names(&config.with_default_stream()),
            vec!["all", "messages"]
        );
        // A stream without filters captures everything: nothing is appended.
        let config = DurableConfig {
            streams: vec![stream("a", &["a/#"]), stream("rest", &[])],
            ..DurableConfig::default()
        };
        assert_eq!(names(&config.with_default_stream()), vec!["a", "rest"]);
        assert_eq!(
            names(&DurableConfig::default().with_default_stream()),
            vec!["messages"]
        );
    }

    #[test]
    fn a_filtered_stream_may_not_take_the_default_stream_name() {
        let config = DurableConfig {
            streams: vec![stream("messages", &["a/#"])],
            ..DurableConfig::default()
        };
        let error = config.validate().unwrap_err();
        assert!(error.contains("`messages`"), "{error}");
        let config = DurableConfig {
            streams: vec![stream("messages", &["a/#"]), stream("rest", &[])],
            ..DurableConfig::default()
        };
        assert!(
            config.validate().is_ok(),
            "the name is free when nothing is appended"
        );
    }

    #[test]
    fn state_sync_is_its_own_setting_not_the_first_streams() {
        let mut first = stream("fast", &["fast/#"]);
        first.store.sync = SyncPolicy::Never;
        let config = DurableConfig {
            streams: vec![first],
            ..DurableConfig::default()
        };
        assert_eq!(config.state_sync, SyncPolicy::Always);
    }
}
