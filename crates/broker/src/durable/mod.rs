//! [`DurableStore`]: the persistence seam ([`crate::model::Persistence`]) over `tern-store` (ARCHITECTURE §3–§5).
//!
//! # On-disk schema (one `tern-store` directory, `--data-dir`)
//! Message streams (configured; a stream `messages` capturing every topic is appended when no
//! configured stream captures every topic, so that no topic is kept in memory only unless its
//! stream says `durability = "never"`):
//! - a message record per stored PUBLISH: topic = the MQTT topic, properties = QoS, retain,
//!   publisher and MQTT 5 properties ([`codec::encode_meta`]), payload = the payload;
//! - `$tern/rx/{client}` (payload: packet id u16 BE ++ the session's incarnation u64 BE, so a
//!   later session under the same client id ignores it): "(session, pi) received", appended in
//!   the **same batch** as its QoS 2 message, so both are durable together or not at all;
//! - `$tern/rel/{client}` (payload: the sequence of the rx record it releases, u64 BE):
//!   appended on PUBREL, in the rx record's stream; PUBCOMP leaves once it is durable;
//! - `$tern/reset/{client}` (empty): a persistent session started afresh or ended; earlier rx
//!   records of that client in this stream are void.
//!
//! Clients cannot publish under `$tern/` and session replay skips it. State streams (keyed,
//! compacted `KvStream`s; their sync policy is [`DurableConfig::state_sync`], `[state] sync`,
//! never a message stream's). SUBACK / UNSUBACK of a persistent session wait for its `s`
//! record; the PUBACK / PUBREC of a retained PUBLISH waits for its `tern.retained` record:
//! - `tern.sessions`, one stream for every key space of session state so that its log order
//!   orders them:
//!   - `s` ++ client id → protocol, expiry, the time it lost its connection, subscriptions
//!     ([`codec::SessionRecord`]);
//!   - `c` ++ client id → per message stream, the sequence below which every record its
//!     filters match was completed ([`codec::encode_positions`]);
//!   - `p`, `o`, `d`: outbound QoS 2 exchanges (PUBLISH sent under a packet id, PUBREL pending,
//!     completed), see the `exchanges` module;
//!   - `g` ++ `$share/{group}/{filter}` → a share group's cursor, like `c` (`shared` module);
//!   - `w` ++ client id → the client's will, its delay, open or closed at (`wills` module);
//!   - `x` ++ message stream name → u64 BE: the rx checkpoint, below which every `$tern/rx`
//!     record of that stream was released (or voided) durably; recovery reads `$tern/#` from
//!     there ([`reclaim`]);
//! - `tern.retained`: topic → meta length (u32 BE) ++ meta ++ payload; cleared = deleted.
//!
//! Message streams with `keep = "interest"` lose their blocks once no one needs them; the
//! retention limits never remove open state and never count `$tern/` records per topic
//! ([`reclaim`]).
//!
//! A persistent session's queued messages are not copied: at start-up they are the records
//! after its cursor that its (non-shared) filters match, minus those of live or completed
//! outbound exchanges. A share group's queue is the records after the group's cursor that its
//! filter matches, minus those its members' QoS 2 exchanges cover. Wills still owed are fired
//! or re-armed.
//!
//! # Invariants
//! - Cursor safety: the cursor written for a session is `min(floor, held)` where `floor` is the
//!   lowest sequence appended but not yet routed (or the next sequence), read **before** the
//!   session's held messages are listed; a message leaves the unrouted set only after it was
//!   pushed to every target session. So no matching record below a cursor is still owed.
//! - The first PUBLISH of a stored QoS 2 message to a persistent session leaves only once its
//!   `p` record is durable, so a resend after a crash carries the packet id the subscriber may
//!   already hold (exactly once outbound).
//! - The unrouted lock is held across the append, so the set and `next_seq` never miss a
//!   sequence that a concurrent checkpoint could pass.

mod admin;
pub(crate) mod codec;
pub(crate) mod config;
mod exchanges;
mod keyspace;
mod message_store;
mod reclaim;
mod recover;
mod shared;
mod wills;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::AtomicU64;

use parking_lot::Mutex;
use tern_store::{FilterSet, KvStream, Store, StoreError, Stream, StreamConfig};

use exchanges::ClientExchanges;
use keyspace::Keyspace;
use tern_wire::QoS;

pub use config::{
    DiskBudgetError, Durability, DurableConfig, Keep, MIN_DISK_BUDGET_BYTES, SessionLimits,
    StreamSpec,
};

use crate::hash::Map;
use crate::model::SubRecord;
use crate::model::message::Message;
use crate::model::{
    CursorStore, ExchangeStore, HeldSeqs, MessageLog, OutboundSent, PersistError, Recovered,
    Recovery, RetainedStore, SessionStore, StoreAdmin, StoreRef, Ticket, WillStore,
};
use codec::SessionRecord;

use crate::model::topics::{
    QOS2_RECEIVED_PREFIX as RX_PREFIX, QOS2_RELEASED_PREFIX as REL_PREFIX,
    SESSION_RESET_PREFIX as RESET_PREFIX,
};
/// Records read per `read_from` call while recovering.
const RECOVERY_READ_RECORDS: usize = 4096;
const RECOVERY_READ_BYTES: usize = 8 * 1024 * 1024;

struct Unrouted {
    seqs: BTreeSet<u64>,
    next_seq: u64,
}

struct Slot {
    spec: StreamSpec,
    filters: FilterSet,
    stream: Stream,
    unrouted: Mutex<Unrouted>,
}

/// The durable store of a broker (see the module doc for the schema).
pub struct DurableStore {
    slots: Vec<Slot>,
    sessions: Keyspace,
    cursors: Keyspace,
    /// Outbound QoS 2 exchanges (`exchanges` module): PUBLISH sent, PUBREL pending, done.
    sent: Keyspace,
    outbound: Keyspace,
    done: Keyspace,
    /// Per message stream name: where recovery starts reading `$tern/#` (`reclaim` module).
    rx_start: Keyspace,
    reclaim: Mutex<reclaim::ReclaimState>,
    /// `$tern/` records read by the last recovery (tests show the rx checkpoint at work).
    control_records_read: std::sync::atomic::AtomicU64,
    retained: KvStream,
    /// Persistent sessions as last written to `tern.sessions`.
    mirror: Mutex<Map<String, SessionRecord>>,
    /// Inbound QoS 2: client → packet id → its rx record.
    rx: Mutex<Map<String, Map<u16, StoreRef>>>,
    /// `$tern/rel` records appended and not durable yet, by (stream, seq): a fingerprint of
    /// the client id and the packet id, so that a PUBREL retry waits for its first PUBREL's
    /// record (`qos2_release_retry`, docs/simulation.md finding 17). Pruned below each
    /// stream's durable mark as records are released.
    releasing: Mutex<std::collections::BTreeMap<(u16, u64), (u64, u16)>>,
    /// Outbound QoS 2 exchanges of persistent sessions, as written.
    exchanges: Mutex<Map<String, ClientExchanges>>,
    /// Cursors as last written, per client.
    written_cursors: Mutex<Map<String, Vec<u64>>>,
    /// Bumped under the `mirror` or `written_cursors` lock whenever a persistent session
    /// appears or goes or a cursor is written: reclamation reuses its minimum of the
    /// sessions' cursors while this stays (`reclaim`).
    cursors_generation: AtomicU64,
    /// Share-group cursors (`shared` module), by `$share/{group}/{filter}`.
    groups: Keyspace,
    /// Share-group cursors as last written: the groups the store keeps.
    group_cursors: Mutex<Map<String, Vec<u64>>>,
    /// Wills (`wills` module), and per client the token and encoded record of its will.
    wills: Keyspace,
    will_state: Mutex<Map<String, (u64, Vec<u8>)>>,
    will_tokens: AtomicU64,
    limits: config::SessionLimits,
    /// `[store] max_disk_bytes` (see [`DurableStore::disk_budget_reached`]).
    disk_budget: Option<u64>,
    /// Bytes of the message streams' blocks as last measured (with the messages accepted and
    /// not yet written), plus what was appended since.
    /// The state streams are not counted: retention cannot free them, so counting them
    /// could stall publishing forever (docs/simulation.md, finding 12); their own
    /// compaction bounds them (ARCHITECTURE §6.1).
    disk_used: AtomicU64,
    store: Store,
    /// The file system the store runs on, and the wall clock the broker's records use
    /// (`Vfs::now_ns`: the system clock in production, virtual time in the simulator).
    vfs: std::sync::Arc<dyn tern_store::vfs::Vfs>,
}

/// Framing of one record on disk beyond its topic, properties and payload (header, CRC,
/// lengths), rounded up: used only to estimate disk use between two measurements.
const RECORD_OVERHEAD_ESTIMATE: u64 = 48;

fn io_error(e: StoreError) -> PersistError {
    PersistError(e.to_string())
}

fn report_damage(stream: &Stream) {
    let report = stream.recovery_report();
    if report.truncated_bytes > 0 {
        tracing::warn!(
            stream = stream.name(),
            truncated_bytes = report.truncated_bytes,
            lost = ?report.lost,
            "torn tail truncated at start-up"
        );
    }
    for c in &report.quarantined {
        tracing::error!(stream = stream.name(), damage = ?c, "damaged block quarantined; serving the rest");
    }
}

impl DurableStore {
    /// The wall clock in ns since the Unix epoch, as the store's file system tells it: session
    /// close times, will close times, record ages.
    pub(crate) fn now_ns(&self) -> u64 {
        self.vfs.now_ns()
    }

    /// Stepped writers (a simulator's disk, `Vfs::stepped_writers`): runs one writer turn of
    /// every stream the store has open, in name order (`Store::step`), on this thread; the
    /// simulator calls it on its own schedule so that each commit happens at a point of its
    /// choosing. Returns whether any turn ran; always false with writer threads (production).
    pub fn step_writers(&self) -> bool {
        self.store.step()
    }

    /// Opens (creating if needed) the store in `dir` and the configured streams (plus the
    /// default stream when none captures every topic, [`DurableConfig::with_default_stream`]),
    /// reporting any damage found by recovery in the log.
    pub fn open(dir: &Path, config: DurableConfig) -> Result<DurableStore, StoreError> {
        DurableStore::open_with_vfs(dir, config, std::sync::Arc::new(tern_store::vfs::RealVfs))
    }

    /// [`DurableStore::open`] doing every stream I/O through `vfs`
    /// ([`Store::open_with_vfs`]): the broker-level simulator opens the store on a simulated
    /// disk through this, the one path production takes too.
    pub fn open_with_vfs(
        dir: &Path,
        config: DurableConfig,
        vfs: std::sync::Arc<dyn tern_store::vfs::Vfs>,
    ) -> Result<DurableStore, StoreError> {
        config.validate().map_err(StoreError::InvalidConfig)?;
        let config = config.with_default_stream();
        let store = Store::open_with_vfs(dir, vfs.clone())?;
        let slots = config
            .streams
            .iter()
            .map(|spec| open_slot(&store, spec))
            .collect::<Result<Vec<_>, _>>()?;
        // State streams are small: every checksum is verified at start-up, so damage is
        // quarantined (and reported) before they are read.
        let state = StreamConfig {
            sync: config.state_sync,
            verify_on_open: true,
            block_size_bytes: 1024 * 1024,
            ..StreamConfig::default()
        };
        let kv = |name: &str| -> Result<KvStream, StoreError> {
            let kv = store.kv(name, state.clone())?;
            report_damage(kv.stream());
            Ok(kv)
        };
        // Sessions, cursors and PUBREL-pending entries share one stream: its log order makes a
        // later write (say, clearing an entry the cursor passed) never durable before an
        // earlier one (that cursor).
        let session_state = kv("tern.sessions")?;
        log_opened(&config);
        let durable = DurableStore {
            sessions: Keyspace::new(&session_state, b's'),
            cursors: Keyspace::new(&session_state, b'c'),
            sent: Keyspace::new(&session_state, b'p'),
            outbound: Keyspace::new(&session_state, b'o'),
            done: Keyspace::new(&session_state, b'd'),
            groups: Keyspace::new(&session_state, b'g'),
            wills: Keyspace::new(&session_state, b'w'),
            rx_start: Keyspace::new(&session_state, b'x'),
            reclaim: Mutex::new(reclaim::ReclaimState::default()),
            control_records_read: std::sync::atomic::AtomicU64::new(0),
            retained: kv("tern.retained")?,
            slots,
            mirror: Mutex::new(Map::default()),
            rx: Mutex::new(Map::default()),
            releasing: Mutex::new(std::collections::BTreeMap::new()),
            exchanges: Mutex::new(Map::default()),
            written_cursors: Mutex::new(Map::default()),
            cursors_generation: AtomicU64::new(0),
            group_cursors: Mutex::new(Map::default()),
            will_state: Mutex::new(Map::default()),
            will_tokens: AtomicU64::new(1),
            limits: config.sessions,
            disk_budget: config.max_disk_bytes,
            disk_used: AtomicU64::new(0),
            store,
            vfs,
        };
        durable.refresh_disk_usage();
        Ok(durable)
    }

    /// Bytes of every stream's block files, message and state streams (no directory walk:
    /// the store knows the length of each block it holds).
    pub fn disk_bytes(&self) -> u64 {
        self.streams()
            .chain(self.state_streams())
            .map(|s| s.info().disk_bytes)
            .sum()
    }

    /// Bytes of the message streams' block files: what `[store] max_disk_bytes` counts.
    pub fn message_disk_bytes(&self) -> u64 {
        self.streams().map(|s| s.info().disk_bytes).sum()
    }

    /// The budget's measure: [`DurableStore::message_disk_bytes`] plus the messages accepted
    /// and not yet written (queued, or in a write in progress), which the blocks do not show
    /// yet: replacing the running estimate with the blocks alone forgot them, so a burst
    /// could pass the budget by the publishers' windows.
    fn message_disk_bytes_with_unwritten(&self) -> u64 {
        self.streams()
            .map(|s| s.info().disk_bytes_with_unwritten)
            .sum()
    }

    /// The stream a message to `topic` at `qos` would be written to, if it would be.
    fn writes(&self, topic: &str, qos: QoS) -> Option<(usize, &Slot)> {
        let (index, slot) = self.slot_for(topic)?;
        let write = match slot.spec.durability {
            Durability::Never => false,
            Durability::Default => qos != QoS::AtMostOnce,
            Durability::Always => true,
        };
        write.then_some((index, slot))
    }

    /// The message streams, in configuration order (the appended default stream last).
    pub fn streams(&self) -> impl Iterator<Item = &Stream> {
        self.slots.iter().map(|s| &s.stream)
    }

    /// `$tern/` control records the last recovery read (with the rx checkpoint, only those
    /// from the oldest open inbound QoS 2 exchange on).
    pub fn control_records_read(&self) -> u64 {
        self.control_records_read
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Runs the reclamation step now (tests): computes floors, and applies the previous
    /// computation if what it rests on is durable.
    pub fn reclaim_now(&self) {
        self.reclaim_step(true);
    }

    /// The state streams: `tern.sessions`, then `tern.retained`.
    pub fn state_streams(&self) -> [&Stream; 2] {
        [self.sessions.kv.stream(), self.retained.stream()]
    }

    fn slot_for(&self, topic: &str) -> Option<(usize, &Slot)> {
        self.slots
            .iter()
            .enumerate()
            .find(|(_, s)| s.filters.matches(topic.as_bytes()))
    }

    /// Per message stream, the lowest sequence a cursor may not pass: the oldest message not
    /// yet routed, and never beyond what is durable. A sequence appended but not yet durable
    /// is lost in a crash and handed out again afterwards, to another message; a cursor
    /// written past it would mark that new message as done (the crash test found QoS 1 and
    /// QoS 2 replayed wrongly after cursors had moved back from such a floor).
    /// A persistent session appeared or went, or a cursor was written: called under the
    /// `mirror` or `written_cursors` lock that saw the change (see `cursors_generation`).
    fn cursors_changed(&self) {
        self.cursors_generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    fn floors(&self) -> Vec<u64> {
        self.slots
            .iter()
            .map(|s| {
                let u = s.unrouted.lock();
                let unrouted = u.seqs.first().copied().unwrap_or(u.next_seq);
                unrouted.min(s.stream.durable_seq() + 1)
            })
            .collect()
    }

    fn put_session(&self, client_id: &str, record: &SessionRecord) -> Ticket {
        match self.sessions.put(client_id.as_bytes(), &record.encode()) {
            Ok(ticket) => Ticket::from_store(ticket),
            Err(error) => {
                tracing::error!(%error, client_id, "cannot write session state");
                Ticket::failed(io_error(error))
            }
        }
    }

    /// A cursor (one sequence per message stream) as stored: by stream name, so a reordered
    /// configuration still finds its positions.
    fn encode_cursor(&self, cursor: &[u64]) -> Vec<u8> {
        let positions: Vec<(&str, u64)> = self
            .slots
            .iter()
            .zip(cursor)
            .map(|(s, &c)| (s.spec.name.as_str(), c))
            .collect();
        codec::encode_positions(&positions)
    }

    fn write_cursor(&self, client_id: &str, cursor: &[u64]) {
        if let Err(error) = self
            .cursors
            .put(client_id.as_bytes(), &self.encode_cursor(cursor))
        {
            tracing::error!(%error, client_id, "cannot write session cursor");
        }
    }

    /// "Earlier rx records of this client are void", in every stream that may hold some.
    fn reset_rx(&self, client_id: &str) {
        let topic = format!("{RESET_PREFIX}{client_id}");
        for slot in &self.slots {
            if slot.spec.durability == Durability::Never {
                continue;
            }
            if let Err(error) = slot.stream.append(topic.as_bytes(), &[], &[]) {
                tracing::error!(%error, client_id, "cannot write session reset");
            }
        }
    }
}

#[cfg(test)]
mod budget_tests;
#[cfg(test)]
mod reclaim_tests;

/// Opens one message stream of the configuration, pinned until recovery has found its open
/// state.
fn open_slot(store: &Store, spec: &StreamSpec) -> Result<Slot, StoreError> {
    let mut stream_config = spec.store.clone();
    // Control records are one topic per client: a per-topic limit must not count them, and no
    // limit may remove open state before recovery has found it.
    stream_config.limits.per_topic_exempt_prefix =
        Some(crate::model::topics::INTERNAL_PREFIX.as_bytes().to_vec());
    stream_config.start_pinned = true;
    let stream = store.stream(&spec.name, stream_config)?;
    report_damage(&stream);
    let next_seq = stream.info().last_seq.map_or(1, |s| s + 1);
    Ok(Slot {
        filters: FilterSet::new(spec.filters.iter()),
        spec: spec.clone(),
        stream,
        unrouted: Mutex::new(Unrouted {
            seqs: BTreeSet::new(),
            next_seq,
        }),
    })
}

/// What the operator reads at start-up: the message streams, the sync policies, the budget.
fn log_opened(config: &DurableConfig) {
    let names: Vec<&str> = config.streams.iter().map(|s| s.name.as_str()).collect();
    let syncs: Vec<String> = config
        .streams
        .iter()
        .map(|s| format!("{}={:?}", s.name, s.store.sync))
        .collect();
    tracing::info!(
        "store opened: message streams {names:?}; state streams sync {:?}; message streams sync {}",
        config.state_sync,
        syncs.join(" ")
    );
    if let Some(budget) = config.max_disk_bytes {
        tracing::info!(max_disk_bytes = budget, "disk budget");
    }
}
