//! Configuration of the durable store: the message streams (name, captured filters, limits,
//! sync policy, durability policy).

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

/// One message stream.
#[derive(Debug, Clone)]
pub struct StreamSpec {
    /// Store stream name (letters, digits, `-`, `_`, `.`; not starting with `tern.`).
    pub name: String,
    /// Topic filters it captures; empty captures every topic. A message goes to the first
    /// stream (in configuration order) whose filters match its topic, or to none.
    pub filters: Vec<String>,
    pub durability: Durability,
    /// Block size, sync policy and retention limits.
    pub store: StreamConfig,
}

/// Name of the stream used when none is configured.
pub const DEFAULT_STREAM_NAME: &str = "messages";
/// Prefix of the store's own state streams; not available to configured streams.
pub const STATE_STREAM_PREFIX: &str = "tern.";

impl StreamSpec {
    /// The default stream: every topic, sync `always`, durability `default`.
    pub fn default_stream() -> StreamSpec {
        StreamSpec {
            name: DEFAULT_STREAM_NAME.into(),
            filters: Vec::new(),
            durability: Durability::Default,
            store: StreamConfig::default(),
        }
    }
}

/// Bounds on what one recovered session brings back (the broker's own limits).
#[derive(Debug, Clone, Copy)]
pub struct SessionLimits {
    /// `max_queued_messages`: beyond it the oldest recovered messages are dropped (counted).
    pub max_pending_per_session: usize,
    /// `max_inflight_messages`: recovered messages put back in flight.
    pub max_inflight_per_session: usize,
}

impl Default for SessionLimits {
    fn default() -> Self {
        SessionLimits {
            max_pending_per_session: 100_000,
            max_inflight_per_session: 1024,
        }
    }
}

/// The streams of a broker's data directory.
#[derive(Debug, Clone)]
pub struct DurableConfig {
    pub streams: Vec<StreamSpec>,
    pub sessions: SessionLimits,
}

impl Default for DurableConfig {
    fn default() -> Self {
        DurableConfig {
            streams: vec![StreamSpec::default_stream()],
            sessions: SessionLimits::default(),
        }
    }
}

impl DurableConfig {
    /// Sync policy of the state streams (sessions, cursors, outbound QoS 2, retained): the
    /// first stream's, so that `--sync never` leaves nothing syncing.
    pub fn state_sync(&self) -> SyncPolicy {
        self.streams
            .first()
            .map_or(SyncPolicy::Always, |s| s.store.sync)
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.streams.len() > usize::from(u16::MAX) {
            return Err("too many streams".into());
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
}
