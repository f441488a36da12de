//! [`DurableStore`]: the [`MessageStore`] over `tern-store` (ARCHITECTURE §3–§5).
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

pub mod codec;
pub mod config;
mod exchanges;
mod keyspace;
mod reclaim;
mod recover;
mod shared;
mod wills;

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use tern_store::{FilterSet, KvStream, NewRecord, Store, StoreError, Stream, StreamConfig};

use exchanges::ClientExchanges;
use keyspace::Keyspace;
use tern_wire::{Protocol, QoS, SubscriptionOptions};

pub use config::{DEFAULT_STREAM_NAME, Durability, DurableConfig, Keep, SessionLimits, StreamSpec};

use crate::message::Message;
use crate::persist::{HeldSeqs, MessageStore, PersistError, Recovered, StoreRef, Ticket};
use crate::session::SubRecord;
use codec::SessionRecord;

const RX_PREFIX: &str = "$tern/rx/";
const REL_PREFIX: &str = "$tern/rel/";
const RESET_PREFIX: &str = "$tern/reset/";
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
    mirror: Mutex<HashMap<String, SessionRecord>>,
    /// Inbound QoS 2: client → packet id → its rx record.
    rx: Mutex<HashMap<String, HashMap<u16, StoreRef>>>,
    /// Outbound QoS 2 exchanges of persistent sessions, as written.
    exchanges: Mutex<HashMap<String, ClientExchanges>>,
    /// Cursors as last written, per client.
    written_cursors: Mutex<HashMap<String, Vec<u64>>>,
    /// Share-group cursors (`shared` module), by `$share/{group}/{filter}`.
    groups: Keyspace,
    /// Share-group cursors as last written: the groups the store keeps.
    group_cursors: Mutex<HashMap<String, Vec<u64>>>,
    /// Wills (`wills` module), and per client the token and encoded record of its will.
    wills: Keyspace,
    will_state: Mutex<HashMap<String, (u64, Vec<u8>)>>,
    will_tokens: AtomicU64,
    limits: config::SessionLimits,
    /// `[store] max_disk_bytes` (see [`DurableStore::disk_budget_reached`]).
    disk_budget: Option<u64>,
    /// Bytes of every stream's blocks as last measured, plus what was appended since.
    disk_used: AtomicU64,
    _store: Store,
}

/// Framing of one record on disk beyond its topic, properties and payload (header, CRC,
/// lengths), rounded up: used only to estimate disk use between two measurements.
const RECORD_OVERHEAD_ESTIMATE: u64 = 48;

fn io_error(e: StoreError) -> PersistError {
    PersistError(e.to_string())
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
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
        let store = Store::open_with_vfs(dir, vfs)?;
        let mut slots = Vec::with_capacity(config.streams.len());
        for spec in &config.streams {
            let mut stream_config = spec.store.clone();
            // Control records are one topic per client: a per-topic limit must not count them,
            // and no limit may remove open state before recovery has found it.
            stream_config.limits.per_topic_exempt_prefix = Some(b"$tern/".to_vec());
            stream_config.start_pinned = true;
            let stream = store.stream(&spec.name, stream_config)?;
            report_damage(&stream);
            let next_seq = stream.info().last_seq.map_or(1, |s| s + 1);
            slots.push(Slot {
                filters: FilterSet::new(spec.filters.iter()),
                spec: spec.clone(),
                stream,
                unrouted: Mutex::new(Unrouted {
                    seqs: BTreeSet::new(),
                    next_seq,
                }),
            });
        }
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
        let names: Vec<&str> = config.streams.iter().map(|s| s.name.as_str()).collect();
        tracing::info!(
            "store opened: message streams {names:?}; state streams sync {:?}",
            config.state_sync
        );
        if let Some(budget) = config.max_disk_bytes {
            tracing::info!(max_disk_bytes = budget, "disk budget");
        }
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
            mirror: Mutex::new(HashMap::new()),
            rx: Mutex::new(HashMap::new()),
            exchanges: Mutex::new(HashMap::new()),
            written_cursors: Mutex::new(HashMap::new()),
            group_cursors: Mutex::new(HashMap::new()),
            will_state: Mutex::new(HashMap::new()),
            will_tokens: AtomicU64::new(1),
            limits: config.sessions,
            disk_budget: config.max_disk_bytes,
            disk_used: AtomicU64::new(0),
            _store: store,
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

    fn write_cursor(&self, client_id: &str, cursor: &[u64]) {
        let positions: Vec<(&str, u64)> = self
            .slots
            .iter()
            .zip(cursor)
            .map(|(s, &c)| (s.spec.name.as_str(), c))
            .collect();
        if let Err(error) = self
            .cursors
            .put(client_id.as_bytes(), &codec::encode_positions(&positions))
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

impl MessageStore for DurableStore {
    fn append_publish(
        &self,
        client_id: &str,
        message: &Message,
        qos2_packet_id: Option<u16>,
    ) -> Option<Ticket> {
        let (index, slot) = self.writes(&message.topic, message.qos)?;
        let mut meta = Vec::with_capacity(16);
        codec::encode_meta(message, &mut meta);
        let record = NewRecord {
            topic: message.topic.as_bytes(),
            properties: &meta,
            payload: &message.payload,
            time_ns: None,
        };
        let incarnation = match qos2_packet_id {
            Some(_) => self
                .mirror
                .lock()
                .get(client_id)
                .map_or(0, |r| r.incarnation),
            None => 0,
        };
        let mut unrouted = slot.unrouted.lock();
        let result = match qos2_packet_id {
            Some(packet_id) => {
                let rx_topic = format!("{RX_PREFIX}{client_id}");
                let mut pi = [0u8; 10];
                pi[..2].copy_from_slice(&packet_id.to_be_bytes());
                pi[2..].copy_from_slice(&incarnation.to_be_bytes());
                slot.stream.append_batch(&[
                    record,
                    NewRecord {
                        topic: rx_topic.as_bytes(),
                        payload: &pi,
                        ..NewRecord::default()
                    },
                ])
            }
            None => slot.stream.append_batch(&[record]),
        };
        let ticket = match result {
            Ok(ticket) => ticket,
            Err(error) => {
                drop(unrouted);
                return Some(Ticket::failed(io_error(error)));
            }
        };
        if self.disk_budget.is_some() {
            let estimate = (message.topic.len() + meta.len() + message.payload.len()) as u64
                + RECORD_OVERHEAD_ESTIMATE * (1 + u64::from(qos2_packet_id.is_some()));
            self.disk_used.fetch_add(estimate, Ordering::Relaxed);
        }
        let seq = ticket.first_seq();
        unrouted.seqs.insert(seq);
        unrouted.next_seq = ticket.seq() + 1;
        drop(unrouted);
        let stream = index as u16;
        let _ = message.stored.set(StoreRef { stream, seq });
        if let Some(packet_id) = qos2_packet_id {
            let rx_ref = StoreRef {
                stream,
                seq: ticket.seq(),
            };
            let mut rx = self.rx.lock();
            match rx.get_mut(client_id) {
                Some(m) => {
                    m.insert(packet_id, rx_ref);
                }
                None => {
                    rx.insert(client_id.to_string(), HashMap::from([(packet_id, rx_ref)]));
                }
            }
            // Under the rx lock (see `reclaim`): limits never remove an open rx record.
            self.pin(rx_ref);
        }
        Some(Ticket::from_store(ticket))
    }

    fn message_released(&self, message: &Message) {
        if let Some(stored) = message.store_ref() {
            if let Some(slot) = self.slots.get(usize::from(stored.stream)) {
                slot.unrouted.lock().seqs.remove(&stored.seq);
            }
        }
    }

    fn qos2_released(&self, client_id: &str, packet_id: u16) -> Option<Ticket> {
        // The rx lock is held across the append: the rx checkpoint relies on every released
        // rx record's `rel` being appended before it is computed (`reclaim` module).
        let mut rx = self.rx.lock();
        let rx_ref = rx.get_mut(client_id)?.remove(&packet_id)?;
        let slot = self.slots.get(usize::from(rx_ref.stream))?;
        let topic = format!("{REL_PREFIX}{client_id}");
        let result = slot
            .stream
            .append(topic.as_bytes(), &[], &rx_ref.seq.to_be_bytes());
        drop(rx);
        Some(match result {
            Ok(ticket) => Ticket::from_store(ticket),
            Err(error) => Ticket::failed(io_error(error)),
        })
    }

    fn outbound_sent(&self, client_id: &str, packet_id: u16, stored: StoreRef) -> Option<Ticket> {
        self.record_sent(client_id, packet_id, stored)
    }

    fn outbound_pubrel_pending(
        &self,
        client_id: &str,
        packet_id: u16,
        stored: Option<StoreRef>,
    ) -> Option<Ticket> {
        self.record_pubrel(client_id, packet_id, stored)
    }

    fn outbound_completed(&self, client_id: &str, packet_id: u16) {
        self.record_completed(client_id, packet_id);
    }

    fn session_opened(
        &self,
        client_id: &str,
        protocol: Protocol,
        expiry_interval_s: u32,
        fresh: bool,
    ) {
        let record = {
            let mut mirror = self.mirror.lock();
            let record = mirror.entry(client_id.to_string()).or_default();
            if fresh {
                record.subscriptions.clear();
                record.incarnation = now_ns().max(record.incarnation + 1);
            }
            record.protocol_level = protocol.level();
            record.expiry_interval_s = expiry_interval_s;
            record.closed_at_unix_s = 0;
            record.clone()
        };
        if fresh {
            self.rx.lock().remove(client_id);
            self.reset_rx(client_id);
            let floors = self.floors();
            self.write_cursor(client_id, &floors);
            self.written_cursors
                .lock()
                .insert(client_id.to_string(), floors);
        }
        drop(self.put_session(client_id, &record));
    }

    fn session_closed(&self, client_id: &str, expiry_interval_s: u32) {
        let record = {
            let mut mirror = self.mirror.lock();
            let Some(record) = mirror.get_mut(client_id) else {
                return;
            };
            record.expiry_interval_s = expiry_interval_s;
            record.closed_at_unix_s = now_ns() / 1_000_000_000;
            record.clone()
        };
        drop(self.put_session(client_id, &record));
    }

    fn session_ended(&self, client_id: &str) {
        let had_rx = self
            .rx
            .lock()
            .remove(client_id)
            .is_some_and(|m| !m.is_empty());
        let persistent = self.mirror.lock().remove(client_id).is_some();
        if !persistent {
            return;
        }
        self.written_cursors.lock().remove(client_id);
        let _ = self.sessions.delete(client_id.as_bytes());
        let _ = self.cursors.delete(client_id.as_bytes());
        self.forget_exchanges(client_id);
        if had_rx {
            self.reset_rx(client_id);
        }
    }

    fn session_subscribed(
        &self,
        client_id: &str,
        filter: &str,
        options: SubscriptionOptions,
        subscription_id: Option<u32>,
    ) -> Option<Ticket> {
        let record = {
            let mut mirror = self.mirror.lock();
            let record = mirror.get_mut(client_id)?;
            let sub = SubRecord {
                options,
                subscription_id,
            };
            match record.subscriptions.iter_mut().find(|(f, _)| f == filter) {
                Some(existing) => existing.1 = sub,
                None => record.subscriptions.push((filter.to_string(), sub)),
            }
            record.clone()
        };
        // Before the session record, in the same stream: SUBACK's write covers both.
        self.group_joined(filter);
        Some(self.put_session(client_id, &record))
    }

    fn session_unsubscribed(&self, client_id: &str, filter: &str) -> Option<Ticket> {
        let record = {
            let mut mirror = self.mirror.lock();
            let record = mirror.get_mut(client_id)?;
            record.subscriptions.retain(|(f, _)| f != filter);
            record.clone()
        };
        Some(self.put_session(client_id, &record))
    }

    fn retained_changed(&self, topic: &str, message: Option<&Message>) -> Option<Ticket> {
        let result = match message {
            Some(m) => self
                .retained
                .put(topic.as_bytes(), &codec::encode_retained(m)),
            None => self.retained.delete(topic.as_bytes()),
        };
        Some(match result {
            Ok(ticket) => Ticket::from_store(ticket),
            Err(error) => {
                tracing::error!(%error, topic, "cannot write retained message");
                Ticket::failed(io_error(error))
            }
        })
    }

    fn recover(&self) -> Recovered {
        match recover::recover(self) {
            Ok(r) => r,
            Err(error) => {
                tracing::error!(%error, "cannot read the store's state; starting without it");
                Recovered::default()
            }
        }
    }

    fn removed_ranges(&self) -> Vec<(u16, std::ops::RangeInclusive<u64>)> {
        let mut out = Vec::new();
        for (index, slot) in self.slots.iter().enumerate() {
            let log = slot.stream.drain_removed();
            if log.ranges.is_empty() {
                continue;
            }
            let records: u64 = log.ranges.iter().map(|r| r.end() - r.start() + 1).sum();
            tracing::info!(
                stream = slot.spec.name,
                ranges = log.ranges.len(),
                first = log.ranges.first().map(|r| *r.start()),
                last = log.ranges.last().map(|r| *r.end()),
                records,
                overflowed = log.overflowed,
                "retention removed records"
            );
            out.extend(log.ranges.into_iter().map(|r| (index as u16, r)));
        }
        out
    }

    fn checkpoint_floors(&self) -> Vec<u64> {
        self.floors()
    }

    fn disk_budget_reached(&self, topic: &str, qos: QoS) -> bool {
        let Some(budget) = self.disk_budget else {
            return false;
        };
        self.disk_used.load(Ordering::Relaxed) >= budget && self.writes(topic, qos).is_some()
    }

    fn refresh_disk_usage(&self) {
        if self.disk_budget.is_some() {
            self.disk_used.store(self.disk_bytes(), Ordering::Relaxed);
        }
    }

    fn disk_usage(&self) -> Option<(u64, u64)> {
        let budget = self.disk_budget?;
        Some((self.disk_used.load(Ordering::Relaxed), budget))
    }

    fn reclaim(&self) {
        self.reclaim_step(false);
    }

    fn persistent_sessions(&self) -> Vec<std::sync::Arc<str>> {
        self.mirror
            .lock()
            .keys()
            .map(|k| k.as_str().into())
            .collect()
    }

    fn checkpoint(&self, client_id: &str, floors: &[u64], held: &HeldSeqs) -> bool {
        if !self.mirror.lock().contains_key(client_id) {
            return false;
        }
        let mut cursor = floors.to_vec();
        for &(stream, seq) in held {
            if let Some(c) = cursor.get_mut(usize::from(stream)) {
                *c = (*c).min(seq);
            }
        }
        {
            // The write is issued under the lock: reclamation reads the cursors and then the
            // state stream's last sequence under it, so every cursor it sees is covered by
            // the durability it waits for (`reclaim`).
            let mut written = self.written_cursors.lock();
            if written.get(client_id) == Some(&cursor) {
                return false;
            }
            if let Some(old) = written.get(client_id) {
                // Cursor safety says a cursor never moves back: a message below it was done.
                // One that does shows a held message below the last cursor (a bug upstream).
                if old.iter().zip(&cursor).any(|(o, n)| n < o) {
                    tracing::warn!(client_id, ?old, new = ?cursor, ?floors, "session cursor moved back");
                }
            }
            written.insert(client_id.to_string(), cursor.clone());
            self.write_cursor(client_id, &cursor);
        }
        self.clear_passed(client_id, &self.done_floor(client_id, &cursor));
        true
    }

    fn durable_groups(&self) -> Vec<std::sync::Arc<str>> {
        self.durable_group_list()
    }

    fn checkpoint_group(&self, share: &str, floors: &[u64], held: &HeldSeqs) -> bool {
        self.checkpoint_group_cursor(share, floors, held)
    }

    fn group_ended(&self, share: &str) {
        self.group_gone(share);
    }

    fn will_set(&self, client_id: &str, will: Option<(&Message, u32)>) -> u64 {
        self.set_will(client_id, will)
    }

    fn will_delayed(&self, client_id: &str, token: u64) {
        self.delay_will(client_id, token);
    }

    fn will_cleared(&self, client_id: &str, token: u64) -> Option<Ticket> {
        self.clear_will(client_id, token)
    }
}

#[cfg(test)]
mod budget_tests {
    use super::*;
    use bytes::Bytes;
    use tern_wire::{Properties, Str};

    fn msg(topic: &'static str, qos: QoS) -> Message {
        Message::new(
            Str::from_static(topic),
            Bytes::from(vec![0x42; 1000]),
            qos,
            false,
            Properties::default(),
            None,
            tokio::time::Instant::now(),
        )
    }

    /// `[store] max_disk_bytes`: measured from the blocks (plus what was appended since),
    /// reached only for messages that would be written (not QoS 0 under durability
    /// `default`, not a `never` stream), and no longer reached once removal freed blocks and
    /// the use was measured again.
    #[tokio::test]
    async fn disk_budget_counts_written_messages_and_frees_with_removal() {
        let dir = tempfile::tempdir().unwrap();
        let mut memory = StreamSpec::default_stream();
        memory.name = "memory".into();
        memory.filters = vec!["m/#".into()];
        memory.durability = Durability::Never;
        let mut messages = StreamSpec::default_stream();
        messages.store.block_size_bytes = 4096;
        let store = DurableStore::open(
            dir.path(),
            DurableConfig {
                streams: vec![memory, messages],
                max_disk_bytes: Some(16 * 1024),
                ..DurableConfig::default()
            },
        )
        .unwrap();
        let (start, budget) = store.disk_usage().unwrap();
        assert_eq!(budget, 16 * 1024);
        assert!(start < budget, "{start}");
        assert!(!store.disk_budget_reached("x", QoS::AtLeastOnce));
        let mut appended = 0;
        while !store.disk_budget_reached("x", QoS::AtLeastOnce) {
            let mut ticket = store
                .append_publish("p", &msg("x", QoS::AtLeastOnce), None)
                .expect("written");
            ticket.wait().await.unwrap();
            appended += 1;
            assert!(appended < 100, "budget never reached");
        }
        // The estimate agrees with the blocks once measured.
        store.refresh_disk_usage();
        assert!(store.disk_budget_reached("x", QoS::ExactlyOnce));
        assert!(store.disk_bytes() >= 16 * 1024);
        assert!(
            !store.disk_budget_reached("x", QoS::AtMostOnce),
            "QoS 0 is not written under durability `default`"
        );
        assert!(
            !store.disk_budget_reached("m/a", QoS::AtLeastOnce),
            "a `never` stream writes nothing"
        );
        let stream = store.streams().nth(1).unwrap();
        stream.purge(&FilterSet::new(["#"].iter())).unwrap();
        store.refresh_disk_usage();
        assert!(
            !store.disk_budget_reached("x", QoS::AtLeastOnce),
            "{:?}",
            store.disk_usage()
        );
    }
}
