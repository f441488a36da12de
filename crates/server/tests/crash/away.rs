//! Subscribers that are offline when the broker dies (issue 25): a paho subscriber sends
//! DISCONNECT shortly before a kill, with QoS 2 deliveries in flight at every stage (PUBLISH
//! sent and PUBREC not yet back; PUBREC received and PUBREL not yet sent or answered), stays
//! away across the restart (and across further kills when its return comes later than the
//! next leave), and comes back to a backlog and to in-flight exchanges the broker restored from
//! its data dir. The session must resend them under their packet ids and deliver the rest once
//! (MQTT-4.3.3-*, MQTT-4.4.0-1).
//!
//! Timing runs on tokio tasks beside the harness. Each client has a generation: a leave bumps
//! it, so a return planned before that leave no longer fires (the client stays away across
//! the kill it left for, and the next one too if the leave comes first). A restart bumps it as
//! well, so a leave that was late for its kill does not fire into the next life.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::Rng;
use super::paho::Commands;

/// Longest time between a subscriber's DISCONNECT and the kill it leaves for.
const LEAD_MAX_MS: u64 = 300;
/// Longest time a subscriber stays away after the restart (its backlog grows meanwhile).
const BACK_MAX_MS: u64 = 2000;
/// One kill in this many finds a given away subscriber connected (as a control).
const STAY_ONE_IN: u64 = 4;

/// One away subscriber's moves in one broker life.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// Leaves this long before the kill; `None`: connected at the kill (unless still away).
    pub lead_ms: Option<u64>,
    /// Comes back this long after the restart (unless it leaves again first).
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
                        lead_ms: (rng.below(STAY_ONE_IN) != 0).then(|| rng.below(LEAD_MAX_MS)),
                        back_ms: rng.below(BACK_MAX_MS),
                    })
                    .collect()
            })
            .collect()
    }
}

struct Client {
    commands: Commands,
    /// Held while a move is decided and its command sent, so that a leave and a return
    /// never cross on the way to the client.
    generation: Arc<Mutex<u64>>,
}

impl Client {
    fn generation(&self) -> u64 {
        *self.generation.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Sends `command` if no move happened since `seen`; a leave (`bump`) counts as one.
fn move_if_current(
    generation: &Mutex<u64>,
    seen: u64,
    bump: bool,
    commands: &Commands,
    command: &str,
) {
    let mut current = generation.lock().unwrap_or_else(|e| e.into_inner());
    if *current == seen {
        if bump {
            *current += 1;
        }
        commands.send(command);
    }
}

/// The away subscribers' command lines and generations.
pub struct Away {
    clients: Vec<Client>,
}

impl Away {
    pub fn new(commands: Vec<Commands>) -> Away {
        let clients = commands.into_iter().map(|commands| Client {
            commands,
            generation: Arc::new(Mutex::new(0)),
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
                let seen = client.generation();
                let generation = client.generation.clone();
                let commands = client.commands.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    move_if_current(&generation, seen, true, &commands, "away");
                });
            }
        }
    }

    /// Right after a restart: each client comes back `back_ms` from now unless it leaves first.
    pub fn plan_returns(&self, plans: &[Plan]) {
        for (client, plan) in self.clients.iter().zip(plans) {
            let seen = {
                let mut g = client.generation.lock().unwrap_or_else(|e| e.into_inner());
                *g += 1;
                *g
            };
            let generation = client.generation.clone();
            let commands = client.commands.clone();
            let delay = Duration::from_millis(plan.back_ms);
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                move_if_current(&generation, seen, false, &commands, "back");
            });
        }
    }

    /// The last life: everyone back now, and no planned move fires any more.
    pub fn all_back(&self) {
        for client in &self.clients {
            let mut g = client.generation.lock().unwrap_or_else(|e| e.into_inner());
            *g += 1;
            client.commands.send("back");
        }
    }
}
