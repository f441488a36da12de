//! Subscribers that are offline when the broker dies (issue 25): a paho subscriber sends
//! DISCONNECT shortly before a kill, with QoS 2 deliveries in flight at every stage (PUBLISH
//! sent and PUBREC not yet back; PUBREC received and PUBREL not yet sent or answered), stays
//! away across the restart (sometimes across the next kill too), and comes back to a backlog
//! and to in-flight exchanges the broker restored from its data dir. The session must resend
//! them under their packet ids and deliver the rest once (MQTT-4.3.3-*, MQTT-4.4.0-1).
//!
//! Timing runs on tokio tasks beside the harness. Each client has a generation: a return is
//! planned at a restart for its generation and fires only if nothing moved since. A leave that
//! finds the client still away either lets the planned return stand (it comes back after
//! this kill's restart at once) or, with [`Plan::stay_across`], cancels it (it stays away
//! across one more kill). Absences stay short, so the publishers (paced by the away
//! subscribers too) never stall for long and the kill points are still reached.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::Rng;
use super::paho::Commands;

/// Longest time between a subscriber's DISCONNECT and the kill it leaves for.
const LEAD_MAX_MS: u64 = 300;
/// Longest time a subscriber stays away after the restart (its backlog grows meanwhile).
const BACK_MAX_MS: u64 = 2000;
/// One kill in this many finds a given away subscriber connected (as a control).
const CONNECTED_ONE_IN: u64 = 4;
/// One leave in this many that finds the subscriber still away keeps it away across this
/// kill and its restart too.
const STAY_ACROSS_ONE_IN: u64 = 4;

/// One away subscriber's moves in one broker life.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// Leaves this long before the kill; `None`: connected at the kill (unless still away).
    pub lead_ms: Option<u64>,
    /// If still away at the leave: stay away across this kill too (else come back as planned).
    pub stay_across: bool,
    /// Comes back this long after the restart (unless it stays away across the next kill).
    pub back_ms: u64,
}

impl Plan {
    /// One plan per cycle and away subscriber, from its own generator: the kill schedule of a
    /// seed stays what it was before away subscribers existed.
    pub fn schedule(seed: u64, cycles: u32, subscribers: usize) -> Vec<Vec<Plan>> {
        let mut rng = Rng((seed.rotate_left(17) ^ 0x9e37_79b9_7f4a_7c15) | 1);
        (0..cycles)
            .map(|_| {
                (0..subscribers)
                    .map(|_| Plan {
                        lead_ms: (rng.below(CONNECTED_ONE_IN) != 0).then(|| rng.below(LEAD_MAX_MS)),
                        stay_across: rng.below(STAY_ACROSS_ONE_IN) == 0,
                        back_ms: rng.below(BACK_MAX_MS),
                    })
                    .collect()
            })
            .collect()
    }

    /// One cycle's plans of the subscribers `names`, for the log.
    pub fn describe(names: &[&str], plans: &[Plan]) -> String {
        let moves = names.iter().zip(plans).map(|(name, p)| {
            let stay = if p.stay_across {
                " (stays if away)"
            } else {
                ""
            };
            match p.lead_ms {
                Some(lead) => format!(
                    "{name} leaves {lead} ms before{stay}, back {} ms after",
                    p.back_ms
                ),
                None => format!("{name} stays (if back), back {} ms after", p.back_ms),
            }
        });
        moves.collect::<Vec<_>>().join("; ")
    }
}

#[derive(Default)]
struct State {
    /// Bumped by every restart and by a leave that cancels a planned return.
    generation: u64,
    away: bool,
}

/// One away subscriber; its state is held while a move is decided and its command sent, so
/// that a leave and a return never cross on the way to the client.
#[derive(Clone)]
struct Client {
    commands: Commands,
    state: Arc<Mutex<State>>,
}

impl Client {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A leave planned in `generation`: late (after a restart) it does nothing.
    fn leave(&self, generation: u64, stay_across: bool) {
        let mut s = self.state();
        if s.generation != generation {
            return;
        }
        if !s.away {
            s.away = true;
            self.commands.send("away");
        } else if stay_across {
            s.generation += 1;
        }
    }

    fn come_back(&self, generation: u64) {
        let mut s = self.state();
        if s.generation == generation && s.away {
            s.away = false;
            self.commands.send("back");
        }
    }
}

/// The away subscribers' command lines and states.
pub struct Away {
    clients: Vec<Client>,
}

impl Away {
    pub fn new(commands: Vec<Commands>) -> Away {
        let clients = commands.into_iter().map(|commands| Client {
            commands,
            state: Arc::default(),
        });
        Away {
            clients: clients.collect(),
        }
    }

    /// At a cycle's start: each client with a lead leaves `lead_ms` before `kill_in_ms` from
    /// now (at once if that is already past).
    pub fn plan_leaves(&self, plans: &[Plan], kill_in_ms: u64) {
        for (client, plan) in self.clients.iter().zip(plans) {
            if let Some(lead_ms) = plan.lead_ms {
                let delay = Duration::from_millis(kill_in_ms.saturating_sub(lead_ms));
                let generation = client.state().generation;
                let client = client.clone();
                let stay_across = plan.stay_across;
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    client.leave(generation, stay_across);
                });
            }
        }
    }

    /// Right after a restart: each client comes back `back_ms` from now, unless a leave
    /// keeps it away across the next kill first. A leave planned for the life just ended
    /// that has not fired yet is late and no longer fires.
    pub fn plan_returns(&self, plans: &[Plan]) {
        for (client, plan) in self.clients.iter().zip(plans) {
            let generation = {
                let mut s = client.state();
                s.generation += 1;
                s.generation
            };
            let client = client.clone();
            let delay = Duration::from_millis(plan.back_ms);
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                client.come_back(generation);
            });
        }
    }

    /// The last life: everyone back now, and no planned move fires any more.
    pub fn all_back(&self) {
        for client in &self.clients {
            let mut s = client.state();
            s.generation += 1;
            s.away = false;
            client.commands.send("back");
        }
    }
}
