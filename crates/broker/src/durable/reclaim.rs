//! Reclamation by interest, the retention floor of open state, and the inbound QoS 2
//! checkpoint (ARCHITECTURE §5, "Reclamation").
//!
//! Per message stream, every [`RECLAIM_INTERVAL_MS`] (from the checkpointer):
//! - **open-state floor**: the oldest open inbound QoS 2 `$tern/rx` record and the oldest
//!   message of a live outbound QoS 2 exchange (sent or PUBREL pending). It is the stream's
//!   retention floor: `max_age`, `max_msgs`, `max_bytes` and `max_msgs_per_topic` never
//!   remove at or above it (and `$tern/` records are exempt from `max_msgs_per_topic`: their
//!   topic is one per client). Set here, and lowered at once as an rx record or an exchange
//!   is added ([`DurableStore::pin`]), under the lock of the map it is added to.
//! - **interest floor**: the lowest of the unrouted floor, the open-state floor, every
//!   persistent session's cursor as written (a session without one yet pins everything) and
//!   every share group's cursor as written (a group's queued messages are held by its cursor).
//!   Non-persistent sessions hold their messages in memory (`Arc`) and pin nothing; retained
//!   messages live in `tern.retained` and pin nothing either. Blocks wholly below it are removed (`keep = "interest"` streams only), one
//!   step per block.
//! - **rx scan start**: the lowest of the unrouted floor, the oldest open rx record and the
//!   next sequence; written to `tern.sessions` (key space `x`, per stream) so that recovery
//!   reads `$tern/#` from there, not from sequence 1.
//!
//! # Invariants
//! - Nothing is removed below a cursor that is not durable: floors are computed from the
//!   cursors as written and applied only at a later pass, once `tern.sessions` is durable up
//!   to its last sequence read under the cursor map's lock (a cursor enters the map after its
//!   append, or with its append under that lock).
//! - An rx scan start `c` is written only once every `$tern/rel` record of an rx record
//!   below `c` is durable: the start is computed under the rx lock, which `qos2_released`
//!   holds across its append, with the stream's last sequence at that moment as the mark,
//!   and written once the stream is durable to the mark.
//! - Unrouted floors are read before the rx map, so an rx record appended but not yet in
//!   the map lies above its message, which is unrouted until `append_publish` returned.

use std::time::Duration;

// tokio's clock (the same as std's outside a paused runtime) so that reclamation runs in a
// simulation's virtual time.
use tokio::time::Instant;

use super::{DurableStore, Keep};
use crate::durable::config::Durability;
use crate::hash::Map;

/// How often the floors are computed (each is applied at the next computation).
pub(crate) const RECLAIM_INTERVAL_MS: u64 = 250;

/// Floors computed at one pass, applied at a later one once what they rest on is durable.
#[derive(Debug, Clone)]
pub(super) struct Pending {
    interest: Vec<u64>,
    rx_start: Vec<u64>,
    /// `tern.sessions` must be durable to here (the cursors the floors rest on).
    sessions_mark: u64,
    /// Each message stream must be durable to here (the `$tern/rel` records below `rx_start`).
    stream_marks: Vec<u64>,
}

#[derive(Debug, Default)]
pub(super) struct ReclaimState {
    last: Option<Instant>,
    pending: Option<Pending>,
    /// The lowest written cursor of the persistent sessions per stream (1 while one has
    /// none), as of `cursors_generation`: reused while that stays, so an idle pass costs
    /// nothing per session (100,000 offline sessions were 400,000 map lookups a second).
    sessions_floor: Option<(u64, Vec<u64>)>,
    /// The rx scan starts as last written, per stream.
    written_rx_start: Vec<u64>,
}

impl ReclaimState {
    pub(super) fn new(written_rx_start: Vec<u64>) -> Self {
        ReclaimState {
            written_rx_start,
            ..ReclaimState::default()
        }
    }
}

/// Encodes the rx scan start of one stream (the value of its `x` key).
pub(super) fn encode_rx_start(seq: u64) -> [u8; 8] {
    seq.to_be_bytes()
}

pub(super) fn decode_rx_start(value: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(value.try_into().ok()?))
}

impl DurableStore {
    /// One reclamation step (see the module doc); does nothing until [`RECLAIM_INTERVAL_MS`]
    /// passed since the last one, unless `force`.
    pub(super) fn reclaim_step(&self, force: bool) {
        let mut state = self.reclaim.lock();
        let now = Instant::now();
        if !force
            && state
                .last
                .is_some_and(|t| now.duration_since(t) < Duration::from_millis(RECLAIM_INTERVAL_MS))
        {
            return;
        }
        state.last = Some(now);
        if let Some(p) = state.pending.take() {
            let durable = self.sessions.kv.stream().durable_seq() >= p.sessions_mark
                && self
                    .slots
                    .iter()
                    .zip(&p.stream_marks)
                    .all(|(s, &m)| s.stream.durable_seq() >= m);
            if durable {
                self.apply(&mut state, &p);
            } else {
                state.pending = Some(p);
                return;
            }
        }
        state.pending = Some(self.compute(&mut state.sessions_floor));
    }

    fn apply(&self, state: &mut ReclaimState, p: &Pending) {
        state.written_rx_start.resize(self.slots.len(), 1);
        for (i, slot) in self.slots.iter().enumerate() {
            if slot.spec.durability == Durability::Never {
                continue;
            }
            if p.rx_start[i] > state.written_rx_start[i] {
                match self
                    .rx_start
                    .put(slot.spec.name.as_bytes(), &encode_rx_start(p.rx_start[i]))
                {
                    Ok(_) => state.written_rx_start[i] = p.rx_start[i],
                    Err(error) => {
                        tracing::warn!(%error, stream = slot.spec.name, "cannot write the rx checkpoint")
                    }
                }
            }
            if slot.spec.keep != Keep::Interest {
                continue;
            }
            let floor = p.interest[i];
            if slot.stream.info().first_seq.is_none_or(|f| f >= floor) {
                continue;
            }
            // Queued, not waited for: this runs on the checkpointer's async task.
            tracing::trace!(stream = slot.spec.name, floor, "reclaiming blocks below");
            slot.stream.queue_remove_blocks_below(floor);
        }
    }

    /// Computes the floors and sets the retention floors of open state at once.
    fn compute(&self, sessions_floor: &mut Option<(u64, Vec<u64>)>) -> Pending {
        let n = self.slots.len();
        // Unrouted floors first (see the module invariants).
        let unrouted = self.floors();
        let mut interest = unrouted.clone();
        let sessions_mark;
        {
            let mirror = self.mirror.lock();
            let written = self.written_cursors.lock();
            let groups = self.group_cursors.lock();
            // Every cursor in the maps was appended before it got there or under these locks
            // (`checkpoint`, `checkpoint_group_cursor`): all of them lie at or below this mark.
            sessions_mark = self.sessions.kv.stream().next_seq().saturating_sub(1);
            // Read under both locks, which every change to what it counts holds (the
            // generation is bumped under the lock that saw the change).
            let generation = self
                .cursors_generation
                .load(std::sync::atomic::Ordering::Relaxed);
            let floor = match sessions_floor {
                Some((g, floor)) if *g == generation && floor.len() == n => floor,
                _ => {
                    let floor = min_of_cursors(mirror.keys(), &written, n);
                    &mut sessions_floor.insert((generation, floor)).1
                }
            };
            for (f, &c) in interest.iter_mut().zip(floor.iter()) {
                *f = (*f).min(c);
            }
            // A share group's queue and the group's messages its members hold are held by
            // the group's cursor, not the members' (finding 8 of docs/simulation.md: blocks
            // of messages queued for a group whose members were away were removed, and a
            // member then took one in flight that a restart could not resend).
            for cursor in groups.values() {
                for (f, &c) in interest.iter_mut().zip(cursor) {
                    *f = (*f).min(c);
                }
            }
        }
        let mut rx_start = unrouted;
        let mut stream_marks = vec![0; n];
        // Open state: the retention floors are set under both locks, and `append_publish` /
        // `record_sent` / `record_pubrel` lower them under theirs, so no lowering is lost.
        let mut open = vec![u64::MAX; n];
        let exchanges = self.exchanges.lock();
        let rx = self.rx.lock();
        // A sent message is resent from the stream; a PUBREL-pending one only needs its
        // position, but keeping it is cheap and keeps the rule simple.
        for client in exchanges.values() {
            for stored in client.live.values().filter_map(|l| l.stored) {
                if let Some(f) = open.get_mut(usize::from(stored.stream)) {
                    *f = (*f).min(stored.seq);
                }
            }
        }
        for (i, slot) in self.slots.iter().enumerate() {
            stream_marks[i] = slot.stream.next_seq().saturating_sub(1);
        }
        for client in rx.values() {
            for r in client.values() {
                let i = usize::from(r.stream);
                if i < n {
                    rx_start[i] = rx_start[i].min(r.seq);
                    open[i] = open[i].min(r.seq);
                }
            }
        }
        if crate::inject::on(crate::inject::Bug::RetentionRemovesOpenQos2) {
            open.iter_mut().for_each(|f| *f = u64::MAX);
        }
        for (i, slot) in self.slots.iter().enumerate() {
            slot.stream.set_retention_floor(open[i]);
            interest[i] = interest[i].min(open[i]);
        }
        Pending {
            interest,
            rx_start,
            sessions_mark,
            stream_marks,
        }
    }

    /// A record of open state was added at `at`: limits must not remove it from now on.
    pub(super) fn pin(&self, at: crate::model::StoreRef) {
        if crate::inject::on(crate::inject::Bug::RetentionRemovesOpenQos2) {
            return;
        }
        if let Some(slot) = self.slots.get(usize::from(at.stream)) {
            slot.stream.lower_retention_floor(at.seq);
        }
    }
}

impl DurableStore {
    /// [`DurableStore::pin`] for a message about to go out in a QoS 2 exchange; false (and
    /// nothing pinned that matters) if a limit removed it before. The pin comes first and
    /// the store settles the question under the lock its writer holds from reading the floor
    /// to removing below it (`Stream::is_removed`), so no removal slips in between.
    pub(super) fn pin_if_stored(&self, at: crate::model::StoreRef) -> bool {
        self.pin(at);
        let Some(slot) = self.slots.get(usize::from(at.stream)) else {
            return false;
        };
        match slot.stream.is_removed(at.seq) {
            Ok(removed) => !removed,
            Err(error) => {
                // Its block's index cannot be read: neither can a restarted broker's, which
                // would then drop the exchange with the client still holding its packet id.
                tracing::warn!(%error, stream = slot.spec.name, seq = at.seq, "cannot tell whether a message is still stored; not sent");
                false
            }
        }
    }
}

/// Per stream, the lowest cursor of the sessions `clients` (1 for a session with no cursor
/// written yet: it may need anything); `u64::MAX` where there is no session.
fn min_of_cursors<'a>(
    clients: impl Iterator<Item = &'a String>,
    written: &Map<String, Vec<u64>>,
    n: usize,
) -> Vec<u64> {
    let mut floor = vec![u64::MAX; n];
    for client in clients {
        match written.get(client) {
            Some(cursor) => {
                for (f, &c) in floor.iter_mut().zip(cursor) {
                    *f = (*f).min(c);
                }
            }
            None => floor.iter_mut().for_each(|f| *f = 1),
        }
    }
    floor
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rx_start_round_trips() {
        assert_eq!(decode_rx_start(&encode_rx_start(42)), Some(42));
        assert_eq!(decode_rx_start(b"short"), None);
    }

    /// The minimum of the sessions' cursors is reused while no cursor is written and no
    /// session appears or goes (idle: nothing per session); a session that appears without a
    /// cursor pins everything at the next computation, a cursor written counts at once.
    #[tokio::test]
    async fn the_sessions_floor_is_reused_only_while_no_cursor_changed() {
        use crate::model::{CursorStore, MessageLog, SessionStore};
        let dir = tempfile::tempdir().unwrap();
        let store =
            DurableStore::open(dir.path(), crate::durable::DurableConfig::default()).expect("open");
        store.session_opened("a", tern_wire::Protocol::V5, u32::MAX, true);
        for _ in 0..3 {
            let m = crate::model::Message::new(
                tern_wire::Str::from_static("t"),
                bytes::Bytes::from_static(b"x"),
                tern_wire::QoS::AtLeastOnce,
                false,
                tern_wire::Properties::default(),
                None,
                Instant::now(),
            );
            let mut ticket = store
                .append_publish("p", &m, None)
                .map(|a| a.record_on(&m))
                .expect("appended");
            ticket.wait().await.expect("durable");
            store.message_released(&m);
        }
        let floors = store.floors();
        assert!(floors[0] > 1, "{floors:?}");
        // "a" still holds the first message: its cursor is 1.
        store.checkpoint("a", &floors, &vec![(0, 1)]);
        let mut cache = None;
        assert_eq!(store.compute(&mut cache).interest, vec![1]);
        store.checkpoint("a", &floors, &Vec::new());
        assert_eq!(
            store.compute(&mut cache).interest,
            floors,
            "a cursor written"
        );
        assert_eq!(store.compute(&mut cache).interest, floors);
        // A session the store did not know, resumed: no cursor yet, it may need anything.
        store.session_opened("b", tern_wire::Protocol::V5, u32::MAX, false);
        assert_eq!(
            store.compute(&mut cache).interest,
            vec![1],
            "a session appeared"
        );
    }
}
