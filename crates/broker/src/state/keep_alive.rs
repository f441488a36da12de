//! Keep alive without a timer per connection: connections with a keep alive are entries in
//! one broker-wide table, which a sweeper task looks over every [`SWEEP_PERIOD_MS`]. A
//! connection's task records when it last received a packet ([`ConnCtl::touch`]); the sweeper
//! closes, through [`ConnCtl::kick`] with 0x8D, each connection whose 1.5 × keep alive has
//! passed since (MQTT-3.1.2-22, MQTT-3.1.2-24), once: a kicked connection keeps its entry
//! until its task drops it, and later sweeps pass over it.
//!
//! A tokio `Sleep` in every connection's future cost ~112 B of each idle connection (and its
//! task cell a size class); an entry here costs 16 B plus 8 B in `ConnCtl`.
//!
//! # Invariants
//! - A connection is never closed before 1.5 × keep alive without a packet, and at most
//!   [`SWEEP_PERIOD_MS`] after.
//! - The table holds exactly the connections whose [`Watched`] guard is alive (at most the
//!   live connections, so `max_connections` bounds it).
//! - The sweeper runs while the table has entries and the broker exists; it ends when either
//!   stops being so, and the next [`KeepAlive::watch`] starts it again.

use std::num::NonZeroU32;
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tern_wire::ReasonCode;
use tokio::time::Instant;

use crate::state::session::ConnCtl;

/// How often the sweeper looks: the most a connection outlives its keep alive. 1.5 × the
/// shortest keep alive (1 s) is 1,500 ms, so this is a sixth of it.
pub(crate) const SWEEP_PERIOD_MS: u64 = 250;

/// The broker-wide table of connections with a keep alive.
#[derive(Debug)]
pub(crate) struct KeepAlive {
    /// Milliseconds in [`ConnCtl::touch`] count from here.
    epoch: Instant,
    table: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    /// Slots by index; `None` is free (its index is in `free`).
    entries: Vec<Option<Entry>>,
    free: Vec<u32>,
    live: usize,
    /// A sweeper task is running (or about to): set and cleared under this lock only.
    sweeping: bool,
}

#[derive(Debug)]
struct Entry {
    ctl: Arc<ConnCtl>,
    /// 1.5 × the keep alive in force.
    timeout_ms: NonZeroU32,
}

/// A connection's place in the table; dropping it takes the connection out.
#[derive(Debug)]
pub(crate) struct Watched {
    table: Arc<KeepAlive>,
    index: u32,
}

impl Drop for Watched {
    fn drop(&mut self) {
        let mut table = self.table.table.lock();
        if let Some(slot) = table.entries.get_mut(self.index as usize) {
            if slot.take().is_some() {
                table.live -= 1;
                table.free.push(self.index);
            }
        }
    }
}

impl KeepAlive {
    pub(crate) fn new(epoch: Instant) -> KeepAlive {
        KeepAlive {
            epoch,
            table: Mutex::new(Table::default()),
        }
    }

    /// Milliseconds from the epoch to `at`, wrapping (what [`ConnCtl::touch`] records): a
    /// timeout is at most 65,535 s × 1.5, far below the 49 days of a wrap, so differences of
    /// these stay exact.
    pub(crate) fn millis(&self, at: Instant) -> u32 {
        // Truncation is the wrap.
        at.saturating_duration_since(self.epoch).as_millis() as u32
    }

    /// Watches `ctl` from now on, closing it once `timeout_ms` pass without a
    /// [`ConnCtl::touch`]; `None` (nothing watched) for a timeout of 0 (no keep alive).
    pub(crate) fn watch(self: &Arc<Self>, ctl: &Arc<ConnCtl>, timeout_ms: u32) -> Option<Watched> {
        let timeout_ms = NonZeroU32::new(timeout_ms)?;
        ctl.touch(self.millis(Instant::now()));
        let entry = Entry {
            ctl: ctl.clone(),
            timeout_ms,
        };
        let mut table = self.table.lock();
        let index = match table.free.pop() {
            Some(index) => {
                table.entries[index as usize] = Some(entry);
                index
            }
            None => {
                // At most `max_connections` entries (one per live connection), far below 2^32.
                let index = u32::try_from(table.entries.len()).unwrap_or(u32::MAX);
                table.entries.push(Some(entry));
                index
            }
        };
        table.live += 1;
        if !table.sweeping {
            table.sweeping = true;
            tokio::spawn(sweeper(Arc::downgrade(self)));
        }
        Some(Watched {
            table: self.clone(),
            index,
        })
    }

    /// Kicks every connection past its timeout; false (and the sweeper is to end) once the
    /// table is empty.
    fn sweep(&self) -> bool {
        self.sweep_at(self.millis(Instant::now())).is_some()
    }

    /// The connections this sweep kicked; `None` once the table is empty.
    fn sweep_at(&self, now_ms: u32) -> Option<usize> {
        let mut table = self.table.lock();
        if table.live == 0 {
            table.sweeping = false;
            // Its memory goes with the connections it held.
            table.entries = Vec::new();
            table.free = Vec::new();
            return None;
        }
        let mut kicked = 0;
        for entry in table.entries.iter().flatten() {
            // Kicked already (by a sweep, a takeover, an admin): its loop is closing it, and
            // every kick would wake it again until its entry is dropped.
            if entry.ctl.kick_reason().is_some() {
                continue;
            }
            let since_ms = now_ms.wrapping_sub(entry.ctl.last_packet_ms());
            // A packet recorded after `now_ms` was read (the connection raced this sweep)
            // shows as a difference past half the range: it is not a silence.
            if since_ms < u32::MAX / 2 && since_ms >= entry.timeout_ms.get() {
                // Seen by the connection's loop as `Close::KeepAlive` (DISCONNECT 0x8D).
                entry.ctl.kick(ReasonCode::KEEP_ALIVE_TIMEOUT);
                kicked += 1;
            }
        }
        Some(kicked)
    }
}

/// Sweeps every [`SWEEP_PERIOD_MS`] until the table is empty or the broker is gone. Holds
/// the table weakly: a dropped broker is not kept alive by its sweeper.
async fn sweeper(table: Weak<KeepAlive>) {
    let mut ticks = tokio::time::interval(Duration::from_millis(SWEEP_PERIOD_MS));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(table) = table.upgrade() else {
            return;
        };
        if !table.sweep() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_silent_connection_is_kicked_after_its_timeout_and_not_before_mqtt_3_1_2_24() {
        let keep_alive = Arc::new(KeepAlive::new(Instant::now()));
        let ctl = Arc::new(ConnCtl::default());
        let _watched = keep_alive.watch(&ctl, 1_500).unwrap();
        tokio::time::sleep(Duration::from_millis(1_400)).await;
        assert_eq!(ctl.kick_reason(), None);
        tokio::time::sleep(Duration::from_millis(100 + SWEEP_PERIOD_MS)).await;
        assert_eq!(ctl.kick_reason(), Some(ReasonCode::KEEP_ALIVE_TIMEOUT));
    }

    #[tokio::test(start_paused = true)]
    async fn a_touch_moves_the_deadline() {
        let keep_alive = Arc::new(KeepAlive::new(Instant::now()));
        let ctl = Arc::new(ConnCtl::default());
        let _watched = keep_alive.watch(&ctl, 1_500).unwrap();
        for _ in 0..4 {
            tokio::time::sleep(Duration::from_millis(1_000)).await;
            ctl.touch(keep_alive.millis(Instant::now()));
        }
        assert_eq!(ctl.kick_reason(), None);
    }

    /// A table holding `ctl` with a timeout of 1,500 ms, without a sweeper.
    fn table_with(ctl: &Arc<ConnCtl>) -> KeepAlive {
        let keep_alive = KeepAlive::new(Instant::now());
        let entry = Entry {
            ctl: ctl.clone(),
            timeout_ms: NonZeroU32::new(1_500).unwrap(),
        };
        keep_alive.table.lock().entries.push(Some(entry));
        keep_alive.table.lock().live = 1;
        keep_alive
    }

    #[test]
    fn a_wrapped_clock_still_measures_the_silence() {
        let ctl = Arc::new(ConnCtl::default());
        let keep_alive = table_with(&ctl);
        // Recorded just before the wrap, and (a race) just after the sweep's clock.
        ctl.touch(u32::MAX - 100);
        keep_alive.sweep_at(1_000);
        assert_eq!(ctl.kick_reason(), None);
        keep_alive.sweep_at(u32::MAX - 200);
        assert_eq!(ctl.kick_reason(), None);
        keep_alive.sweep_at(1_400);
        assert_eq!(ctl.kick_reason(), Some(ReasonCode::KEEP_ALIVE_TIMEOUT));
    }

    /// MQTT-3.1.2-24: closed once. The entry stays until the connection's task drops it, and
    /// the sweeps meanwhile (every 250 ms) do not kick (and wake) it again.
    #[test]
    fn an_expired_connection_is_kicked_once_mqtt_3_1_2_24() {
        let ctl = Arc::new(ConnCtl::default());
        ctl.touch(0);
        let keep_alive = table_with(&ctl);
        assert_eq!(keep_alive.sweep_at(1_499), Some(0));
        assert_eq!(keep_alive.sweep_at(1_500), Some(1));
        assert_eq!(ctl.kick_reason(), Some(ReasonCode::KEEP_ALIVE_TIMEOUT));
        assert_eq!(keep_alive.sweep_at(1_750), Some(0));
        assert_eq!(keep_alive.sweep_at(2_000), Some(0));
    }

    /// A connection kicked for another reason (a takeover) is closing already: no second kick.
    #[test]
    fn a_connection_kicked_otherwise_is_not_kicked_again() {
        let ctl = Arc::new(ConnCtl::default());
        ctl.touch(0);
        let keep_alive = table_with(&ctl);
        assert!(ctl.kick(ReasonCode::SESSION_TAKEN_OVER));
        assert_eq!(keep_alive.sweep_at(1_500), Some(0));
        assert_eq!(ctl.kick_reason(), Some(ReasonCode::SESSION_TAKEN_OVER));
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_entry_frees_its_slot_and_the_sweeper_ends() {
        let keep_alive = Arc::new(KeepAlive::new(Instant::now()));
        let ctl = Arc::new(ConnCtl::default());
        assert!(keep_alive.watch(&ctl, 0).is_none());
        let watched = keep_alive.watch(&ctl, 1_500).unwrap();
        assert_eq!(Arc::strong_count(&ctl), 2);
        drop(watched);
        assert_eq!(Arc::strong_count(&ctl), 1);
        tokio::time::sleep(Duration::from_millis(2 * SWEEP_PERIOD_MS)).await;
        let table = keep_alive.table.lock();
        assert!(!table.sweeping);
        assert_eq!(table.entries.len(), 0);
    }
}
