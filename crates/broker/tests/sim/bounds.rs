//! The resource bounds (issue 12, "memory and disk stay within the configured bounds"): in
//! some seeds the plan sets the broker-wide memory cap (`max_queued_bytes_total`) or the
//! store's disk budget (`[store] max_disk_bytes`) low enough that it binds; the controller
//! samples the broker's queued bytes and the store's disk bytes after every step, and the
//! checker compares the largest values seen with the bound plus a slack derived from the
//! documented rule (docs/ARCHITECTURE.md, the limits table).

use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use tern_broker::DurableStore;
use tern_broker::broker::Shared;

use super::client::payload;
use super::plan::Plan;

/// What a QoS 0 push may add past the memory cap: it is dropped only once the total holds
/// the cap, so the last one let through may pass it by one message per session.
const QOS0_PUSHES_PAST_CAP: u64 = 1;

/// How far the whole directory may pass the budget: the state streams' records (PUBREL,
/// PUBCOMP, cursors, sessions, retained values) are still written at the budget by design,
/// and a state stream is compacted a block (1 MiB) at a time: `tern.sessions` holds up to a
/// full block awaiting compaction, its compacted copy and the block being written, and
/// `tern.retained` little (the sim's runs stay under 2.2 MiB). Bounded, not counted.
const STATE_STREAMS_SLACK_BYTES: u64 = 3 * 1024 * 1024;

/// Samples (1 ms steps) without a new acknowledgement, while the broker refuses PUBLISHes
/// for a bound, after which the publishers count as stalled at it: the run ends its workload
/// instead of waiting out the controller's timeouts.
const STALL_SAMPLES: u64 = 2_000;

/// Framing of one message record beyond topic and payload, an upper bound (the store's own
/// estimate, `RECORD_OVERHEAD_ESTIMATE`, is 48 a record, twice for a QoS 2 record).
const RECORD_FRAMING_BYTES: u64 = 2 * 64;

/// One boot's broker and store, weakly: a crash ends them with their host.
#[derive(Default)]
struct Boot {
    shared: Weak<Shared>,
    store: Weak<DurableStore>,
    /// Queued bytes restored at start-up (queues are loaded without the cap's check).
    restored_bytes: u64,
}

/// The gauges the controller reads after every step, and what it saw.
#[derive(Default)]
pub struct Gauges {
    memory_cap: Option<usize>,
    disk_budget: Option<u64>,
    boot: Mutex<Boot>,
    seen: Mutex<Seen>,
}

#[derive(Default, Debug)]
struct Seen {
    samples: u64,
    /// Largest queued bytes over the boot's allowance (max(cap, restored)), and where.
    max_queued_over: i64,
    max_queued: u64,
    /// Samples at or above the memory cap.
    at_cap: u64,
    /// QoS>0 PUBLISHes refused for the memory cap, summed over boots.
    refused_memory: u64,
    boot_refused_memory: u64,
    max_disk: u64,
    /// Largest bytes of the message streams and of the state streams.
    max_message_streams: u64,
    max_state_streams: u64,
    /// QoS>0 messages the sessions' own `max_queued_bytes` dropped (oldest first), summed
    /// over boots.
    dropped_queue_limit: u64,
    boot_dropped_queue_limit: u64,
    /// Samples at or above the disk budget.
    at_budget: u64,
    /// Acknowledgements the publishers got, and samples since that changed.
    acks: u64,
    samples_since_ack: u64,
    /// Refusals (both bounds, this boot) as last sampled, and samples since that changed.
    boot_refused: u64,
    samples_since_refusal: u64,
    refused_disk: u64,
    boot_refused_disk: u64,
}

impl Gauges {
    pub fn new(plan: &Plan) -> Gauges {
        Gauges {
            memory_cap: plan.memory_cap,
            disk_budget: plan.disk_budget,
            ..Gauges::default()
        }
    }

    /// A boot's broker and store, once the broker restored its sessions.
    pub fn boot(&self, shared: &Arc<Shared>, store: &Arc<DurableStore>) {
        let restored = shared.metrics.queued_bytes.load(Ordering::Relaxed) as u64;
        *self.boot.lock() = Boot {
            shared: Arc::downgrade(shared),
            store: Arc::downgrade(store),
            restored_bytes: restored,
        };
        let mut seen = self.seen.lock();
        seen.refused_memory += std::mem::take(&mut seen.boot_refused_memory);
        seen.refused_disk += std::mem::take(&mut seen.boot_refused_disk);
        seen.dropped_queue_limit += std::mem::take(&mut seen.boot_dropped_queue_limit);
        seen.boot_refused = 0;
    }

    /// Reads the gauges of the running boot (none while the broker is down); `acks`: the
    /// acknowledgements the publishers got so far.
    pub fn sample(&self, acks: u64) {
        let boot = self.boot.lock();
        let (Some(shared), Some(store)) = (boot.shared.upgrade(), boot.store.upgrade()) else {
            return;
        };
        let mut seen = self.seen.lock();
        seen.samples += 1;
        seen.samples_since_ack = if acks == seen.acks {
            seen.samples_since_ack + 1
        } else {
            0
        };
        seen.acks = acks;
        let refused = shared
            .metrics
            .publishes_refused_memory_limit
            .load(Ordering::Relaxed)
            + shared
                .metrics
                .publishes_refused_disk_budget
                .load(Ordering::Relaxed);
        seen.samples_since_refusal = if refused == seen.boot_refused {
            seen.samples_since_refusal + 1
        } else {
            0
        };
        seen.boot_refused = refused;
        if let Some(cap) = self.memory_cap {
            let queued = shared.metrics.queued_bytes.load(Ordering::Relaxed) as u64;
            let allowance = (cap as u64).max(boot.restored_bytes);
            seen.max_queued = seen.max_queued.max(queued);
            seen.max_queued_over = seen.max_queued_over.max(queued as i64 - allowance as i64);
            seen.at_cap += u64::from(queued >= cap as u64);
            seen.boot_dropped_queue_limit = shared
                .metrics
                .messages_dropped_queue_limit
                .load(Ordering::Relaxed);
            seen.boot_refused_memory = shared
                .metrics
                .publishes_refused_memory_limit
                .load(Ordering::Relaxed);
        }
        if let Some(budget) = self.disk_budget {
            let disk = store.disk_bytes();
            let messages: u64 = store.streams().map(|s| s.info().disk_bytes).sum();
            seen.max_message_streams = seen.max_message_streams.max(messages);
            seen.max_state_streams = seen.max_state_streams.max(disk - messages);
            seen.max_disk = seen.max_disk.max(disk);
            seen.at_budget += u64::from(disk >= budget);
            seen.boot_refused_disk = shared
                .metrics
                .publishes_refused_disk_budget
                .load(Ordering::Relaxed);
        }
    }

    /// The violations of the bounds, and a line for the log.
    pub fn check(&self, plan: &Plan, violations: &mut Vec<String>, log: &mut String) {
        let mut seen = self.seen.lock();
        seen.refused_memory += std::mem::take(&mut seen.boot_refused_memory);
        seen.refused_disk += std::mem::take(&mut seen.boot_refused_disk);
        seen.dropped_queue_limit += std::mem::take(&mut seen.boot_dropped_queue_limit);
        if let Some(cap) = plan.memory_cap {
            let slack = memory_slack_bytes(plan);
            let _ = writeln!(
                log,
                "bounds: memory cap {cap} B, slack {slack} B: max queued {} B ({} B over the \
                 allowance), at the cap in {} of {} samples, {} PUBLISHes refused, {} dropped at a session's \
                 max_queued_bytes",
                seen.max_queued,
                seen.max_queued_over,
                seen.at_cap,
                seen.samples,
                seen.refused_memory,
                seen.dropped_queue_limit
            );
            if seen.max_queued_over > slack as i64 {
                violations.push(format!(
                    "memory bound: queued bytes reached {} B, {} B over max(cap {cap} B, restored), \
                     more than the slack {slack} B",
                    seen.max_queued, seen.max_queued_over
                ));
            }
        }
        if let Some(budget) = plan.disk_budget {
            let slack = disk_slack_bytes(plan);
            let _ = writeln!(
                log,
                "bounds: disk budget {budget} B, slack {slack} B: max disk {} B (message streams \
                 {} B, state streams {} B), at the budget in {} of {} samples, {} PUBLISHes refused",
                seen.max_disk,
                seen.max_message_streams,
                seen.max_state_streams,
                seen.at_budget,
                seen.samples,
                seen.refused_disk
            );
            if seen.max_message_streams > budget + slack {
                violations.push(format!(
                    "disk bound: the message streams held {} B, more than the budget {budget} B + \
                     slack {slack} B",
                    seen.max_message_streams
                ));
            }
            if seen.max_disk > budget + STATE_STREAMS_SLACK_BYTES {
                violations.push(format!(
                    "disk bound: the store held {} B, more than the budget {budget} B + the state \
                     streams' slack {STATE_STREAMS_SLACK_BYTES} B",
                    seen.max_disk
                ));
            }
        }
    }

    /// Whether the publishers are stalled at a bound: no acknowledgement for [`STALL_SAMPLES`]
    /// steps while the broker keeps refusing PUBLISHes for a bound. Documented behavior (no
    /// message is accepted while the bound holds), not a violation; see docs/simulation.md,
    /// findings 11 and 12, for why it can last.
    pub fn stalled_at_bound(&self) -> bool {
        let seen = self.seen.lock();
        seen.samples_since_ack >= STALL_SAMPLES && seen.samples_since_refusal < STALL_SAMPLES
    }

    /// Whether a session's own `max_queued_bytes` (the memory cap, in seeds that set one:
    /// `BrokerConfig::validate` wants it no larger) dropped QoS>0 messages, oldest first: a
    /// documented loss, so losses are not counted in such a seed.
    pub fn queue_limit_dropped(&self) -> bool {
        let seen = self.seen.lock();
        seen.dropped_queue_limit + seen.boot_dropped_queue_limit > 0
    }

    /// (seeds' bound reached: memory, disk) as 0 or 1, for the campaign's summary.
    pub fn reached(&self) -> (bool, bool) {
        let seen = self.seen.lock();
        (seen.at_cap > 0, seen.at_budget > 0)
    }
}

/// The largest queued measure of one of the plan's messages: topic + payload + the broker's
/// fixed overhead per message (`MESSAGE_OVERHEAD_BYTES`, 64; 128 here, an upper bound).
fn largest_message_bytes(plan: &Plan) -> u64 {
    plan.publishers
        .iter()
        .map(|p| (p.topic.len() + payload(p.index, p.limit, p.pad).len() + 128) as u64)
        .max()
        .unwrap_or(0)
}

/// The documented rule: QoS>0 PUBLISHes already accepted when the cap is reached are still
/// queued, "so the cap is soft by at most what was in flight". In flight: each publisher's
/// window (accepted, not yet routed), each copied into every session that may receive it
/// (the plan's subscribers and the side parts' few, [`SIDE_SESSIONS`]); plus one QoS 0 push
/// per session ([`QOS0_PUSHES_PAST_CAP`]). A publisher's resends after a reconnect are the
/// same messages (its window).
fn memory_slack_bytes(plan: &Plan) -> u64 {
    let in_flight: u64 = plan.publishers.iter().map(|p| p.window as u64).sum();
    let sessions = plan.subscribers.len() as u64 + SIDE_SESSIONS;
    (in_flight + QOS0_PUSHES_PAST_CAP) * largest_message_bytes(plan) * sessions
}

/// Sessions of the side parts (clean sessions, timers) that may subscribe to the plan's
/// topics: an upper bound.
const SIDE_SESSIONS: u64 = 4;

/// The documented rule: a new message is refused once the measure (every stream's blocks as
/// last measured plus an estimate of each append since) holds the budget, so the message
/// streams pass it by at most the messages accepted before the measure caught up: each
/// publisher's window, framed ([`RECORD_FRAMING_BYTES`]). Control and state records are
/// still written: the whole directory has [`STATE_STREAMS_SLACK_BYTES`].
fn disk_slack_bytes(plan: &Plan) -> u64 {
    let in_flight: u64 = plan.publishers.iter().map(|p| p.window as u64).sum();
    in_flight * (largest_message_bytes(plan) + RECORD_FRAMING_BYTES)
}
