//! Issue 10, "exactly once and in order under crash": the real `tern` binary killed with
//! SIGKILL again and again on the same data dir, driven by clients that behave differently.
//!
//! Publishers (persistent sessions, each on its own topic, payload `NAME:N`):
//! - `paho-q2-v3`: paho-mqtt 2.x, 3.1.1, QoS 2, 256 in flight. On reconnect paho resends every
//!   unacknowledged PUBLISH with the same packet id and DUP, and PUBREL after PUBREC
//!   (MQTT-4.4.0-1): the broker must find a resent id in the session's received set, also
//!   after a restart, or it delivers twice (MQTT-4.3.3-2 (3.1.1) / MQTT-4.3.3-10 (v5)).
//! - `paho-q1-v5`: paho, 5.0, QoS 1, 256 in flight.
//! - `raw-q2-v5`: raw tern-wire client, 5.0, QoS 2, 256 in flight, with two kill points
//!   (PUBREC received and PUBREL held; PUBREL sent and PUBCOMP not yet received).
//! - `raw-q1-v3`: raw, 3.1.1, QoS 1, 256 in flight.
//!
//! Subscribers (persistent sessions, `RUN/#` at QoS 2):
//! - `paho-sub-v3`, `paho-sub-v5`: paho hands a QoS 2 message to the application at PUBREL
//!   (the spec's Method A, MQTT 3.1.1 Figure 4.3), so the order of the broker's PUBRELs is
//!   the order of delivery (MQTT-4.6.0-4: PUBREL in the order of the PUBRECs).
//! - `raw-sub-v5` (with two kill points: PUBREC sent and PUBREL not yet received; PUBREL
//!   received and PUBCOMP held), `raw-sub-v3`: deliver at the first PUBLISH of a packet id and
//!   drop a repeated one until PUBREL (Method B): the broker must resend an unfinished QoS 2
//!   message with the same packet id (MQTT-4.3.3-*, MQTT-4.4.0-1). They also check the order
//!   of the PUBRELs they get against their PUBRECs (MQTT-4.6.0-4).
//! - `paho-away-v3`, `paho-away-v5` (issue 25): paho subscribers as above that send DISCONNECT
//!   shortly (0-300 ms) before three kills in four, with QoS 2 deliveries in flight, and come
//!   back 0-2 s after the restart (later still if the next kill comes first), to a backlog and
//!   to exchanges the broker restored from disk. `paho-sub-*` stay connected throughout and
//!   reconnect at once after each kill (the second shape). `crash/away.rs` times them.
//!
//! While the broker is down the paho clients keep trying to reconnect (to a port that refuses,
//! as against a fixed port), which is how users run them; see scripts/crash_paho.py for the
//! paho bug this triggers and how its duplicates are told apart from the broker's. With
//! `TERN_CRASH_PUB_WAITS=1` the paho publishers do not dial until the broker is back, so that
//! bug becomes rare (a kill during a reconnect still triggers it).
//! Publishers are paced by the slowest subscriber ([`LAG`]) so that no session queue overflows.
//!
//! Kill moments: random (from the first packets after a restart, when the clients resend, to
//! 1.5 s later), alternating with the four targeted points above. The seed is printed;
//! `TERN_CRASH_SEED=N` replays the schedule, `TERN_CRASH_CYCLES=N` sets the number of kills
//! (default 10; `scripts/crash.sh` runs 100 against a release build).
//!
//! The checker (`crash/check.rs`): every message whose PUBACK (QoS 1) or PUBREC / PUBCOMP
//! (QoS 2) its publisher got reaches every subscriber; QoS 2 exactly once per subscriber
//! (counted by payload), QoS 1 at least once; every first delivery in its publisher's order
//! (MQTT-4.6.0-5 / -6); PUBRELs in PUBREC order (MQTT-4.6.0-4). No session may be lost.
//! Each delivery keeps its packet id, DUP, cycle and time since the last restart, so a
//! duplicate is printed with its shape (e.g. "DUP=1 then DUP=0 under a new id, in the same
//! broker life": a restored exchange resent and the same message delivered again as new).

mod common;
mod crash;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::Broker;
use crash::away::{Away, Plan};
use crash::paho::{Commands, Paho};
use crash::raw::{Ctl, RawPublisher, RawSubscriber, Trap};
use crash::{KillAt, RefusingPort, Rng, Shared};
use tern_wire::Protocol;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::task::JoinHandle;

const CONFIG: &str = "[sys]\ninterval_s = 0\n";
const DEFAULT_CYCLES: u32 = 10;
/// Longest random kill moment after a cycle's start.
const RANDOM_MAX_MS: u64 = 1500;
/// Longest delay before a targeted kill point is armed.
const ARM_MAX_MS: u64 = 1000;
/// Longest wait for an armed kill point to be reached (then the kill happens anyway).
const TARGET_WAIT: Duration = Duration::from_secs(5);
/// Bound on set-up (subscriptions) and on each raw client's exit after a kill.
const SETUP_WAIT: Duration = Duration::from_secs(30);
/// Bound on the last phase: publishers finish, subscribers catch up.
const FINISH_WAIT: Duration = Duration::from_secs(90);
/// After every subscriber has everything, how long late duplicates may still show up.
const TAIL: Duration = Duration::from_secs(1);
/// How far a publisher may run ahead of its slowest subscriber (messages).
const LAG: u64 = 4000;
/// The same for the away subscribers: their backlog may grow well past [`LAG`] while they
/// are offline, without holding the publishers (and so the kill points) back. Four
/// publishers at this lag stay under the default `max_queued_messages` (100,000).
const AWAY_LAG: u64 = 20_000;
const WINDOW: &str = "256";

const PAHO_SUBS: [(&str, &str); 2] = [("paho-sub-v3", "311"), ("paho-sub-v5", "5")];
/// Subscribers that disconnect shortly before most kills and come back after the restart
/// (`crash/away.rs`, issue 25).
const PAHO_AWAY: [(&str, &str); 2] = [("paho-away-v3", "311"), ("paho-away-v5", "5")];
/// (name, protocol, QoS)
const PAHO_PUBS: [(&str, &str, &str); 2] = [("paho-q2-v3", "311", "2"), ("paho-q1-v5", "5", "1")];

/// The raw clients between broker lives.
struct Raw {
    pubs: Vec<RawPublisher>,
    subs: Vec<RawSubscriber>,
}

struct Running {
    pubs: Vec<JoinHandle<RawPublisher>>,
    subs: Vec<JoinHandle<RawSubscriber>>,
}

impl Raw {
    fn start(self, addr: std::net::SocketAddr, ctl: &Ctl, trap: Option<&Trap>) -> Running {
        // Kill points live on the v5 clients; the trap says which side watches.
        let ctl_for = |on_publisher: bool, name: &str| Ctl {
            trap: trap
                .filter(|t| t.at.on_publisher() == on_publisher && name.ends_with("v5"))
                .cloned(),
            ..ctl.clone()
        };
        let pubs = self.pubs.into_iter().map(|p| {
            let c = ctl_for(true, &p.name);
            tokio::spawn(p.run(addr, c))
        });
        let subs = self.subs.into_iter().map(|s| {
            let c = ctl_for(false, &s.name);
            tokio::spawn(s.run(addr, c))
        });
        Running {
            pubs: pubs.collect(),
            subs: subs.collect(),
        }
    }
}

impl Running {
    /// Waits (bounded) for every run to end: the broker was killed, or `stop` was set.
    async fn join(self) -> Raw {
        let mut raw = Raw {
            pubs: Vec::new(),
            subs: Vec::new(),
        };
        for handle in self.pubs {
            let p = tokio::time::timeout(SETUP_WAIT, handle).await;
            raw.pubs.push(
                p.expect("raw publisher did not stop")
                    .expect("raw publisher"),
            );
        }
        for handle in self.subs {
            let s = tokio::time::timeout(SETUP_WAIT, handle).await;
            raw.subs.push(
                s.expect("raw subscriber did not stop")
                    .expect("raw subscriber"),
            );
        }
        raw
    }
}

/// The port file the paho clients dial, rewritten atomically.
fn set_port(path: &Path, port: u16) {
    write_atomically(path, &port.to_string());
}

/// `text` into `path`, atomically (an empty port file: the client does not dial).
fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write port file");
    std::fs::rename(&tmp, path).expect("rename port file");
}

/// Odd cycles kill at a targeted point (each in turn), even ones at a random moment; the
/// second number is the delay before a targeted point is armed.
fn schedule(rng: &mut Rng, cycles: u32) -> Vec<(KillAt, u64)> {
    (0..cycles)
        .map(|cycle| {
            if cycle % 2 == 1 {
                let at = KillAt::TARGETED[(cycle as usize / 2) % KillAt::TARGETED.len()];
                (at, rng.below(ARM_MAX_MS))
            } else {
                (KillAt::Random(rng.below(RANDOM_MAX_MS)), 0)
            }
        })
        .collect()
}

fn env_or<T: std::str::FromStr>(name: &str, default: impl FnOnce() -> T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(default)
}

fn time_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64 | 1)
}

/// Waits until `done()` holds, polling; false after `bound`.
async fn wait_until(bound: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + bound;
    while !done() {
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    true
}

/// Keeps every publisher within [`LAG`] of its slowest subscriber ([`AWAY_LAG`] for the away
/// ones) until `stop`.
fn start_pacer(
    shared: Shared,
    paho: Vec<(String, Commands)>,
    pubs: Vec<String>,
    subs: Vec<String>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    let lags: Vec<(String, u64)> = (subs.into_iter())
        .map(|s| {
            let away = PAHO_AWAY.iter().any(|a| a.0 == s);
            (s, if away { AWAY_LAG } else { LAG })
        })
        .collect();
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            let limits = shared.pace(&pubs, &lags);
            for (name, commands) in &paho {
                if let Some(i) = pubs.iter().position(|p| p == name) {
                    commands.send(&format!("limit {}", limits[i]));
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    })
}

struct Harness {
    b: Broker,
    dir: tempfile::TempDir,
    port_file: PathBuf,
    /// The paho publishers' port file: as `port_file`, or empty while the broker is down
    /// with `pub_waits`.
    pub_port_file: PathBuf,
    /// `TERN_CRASH_PUB_WAITS=1`: the paho publishers make no connection attempt while the
    /// broker is down. A failed attempt is what makes paho re-send a PUBLISH after its PUBREL
    /// (scripts/crash_paho.py); then only a kill during a reconnect still does.
    pub_waits: bool,
    /// Where the port file points while the broker is down.
    refusing: RefusingPort,
    shared: Shared,
    ctl: Ctl,
    paho: Vec<Paho>,
    away: Away,
    raw: Option<Raw>,
    subs: Vec<String>,
    pubs: Vec<String>,
    armed: Arc<AtomicBool>,
    hit_tx: UnboundedSender<String>,
    hits: UnboundedReceiver<String>,
}

impl Harness {
    fn start(pub_waits: bool) -> Harness {
        let b = Broker::start_with(CONFIG);
        let shared = Shared::default();
        shared.set_restarted();
        let dir = tempfile::tempdir().expect("tempdir");
        let port_file = dir.path().join("port");
        set_port(&port_file, b.port());
        let pub_port_file = dir.path().join("port-pub");
        set_port(&pub_port_file, b.port());
        let ctl = Ctl {
            shared: shared.clone(),
            stop: Arc::new(AtomicBool::new(false)),
            trap: None,
        };
        let run = common::unique("crash");
        let filter = format!("{run}/#");
        let topic = |name: &str| format!("{run}/{name}");
        let raw = Raw {
            pubs: vec![
                RawPublisher::new("raw-q2-v5", Protocol::V5, 2, &topic("raw-q2-v5")),
                RawPublisher::new("raw-q1-v3", Protocol::V3_1_1, 1, &topic("raw-q1-v3")),
            ],
            subs: vec![
                RawSubscriber::new("raw-sub-v5", Protocol::V5, &filter),
                RawSubscriber::new("raw-sub-v3", Protocol::V3_1_1, &filter),
            ],
        };
        let (hit_tx, hits) = unbounded_channel();
        let mut h = Harness {
            b,
            dir,
            port_file,
            pub_port_file,
            pub_waits,
            refusing: RefusingPort::new(),
            shared,
            ctl,
            paho: Vec::new(),
            away: Away::new(Vec::new()),
            raw: Some(raw),
            subs: Vec::new(),
            pubs: Vec::new(),
            armed: Arc::new(AtomicBool::new(false)),
            hit_tx,
            hits,
        };
        h.subs = (PAHO_SUBS.iter().chain(&PAHO_AWAY))
            .map(|s| s.0.to_string())
            .collect();
        h.subs
            .extend(["raw-sub-v5".to_string(), "raw-sub-v3".to_string()]);
        h.pubs = PAHO_PUBS.iter().map(|p| p.0.to_string()).collect();
        h.pubs
            .extend(["raw-q2-v5".to_string(), "raw-q1-v3".to_string()]);
        h.spawn_paho(&filter, topic);
        h
    }

    /// The paho subscribers (the away ones under [`Away`]'s control) and publishers.
    fn spawn_paho(&mut self, filter: &str, topic: impl Fn(&str) -> String) {
        for (name, protocol) in PAHO_SUBS.into_iter().chain(PAHO_AWAY) {
            let args = [self.port(), name.into(), protocol.into(), filter.into()];
            (self.paho).push(Paho::spawn(
                "sub",
                name,
                &args,
                &self.shared,
                self.dir.path(),
            ));
        }
        let away = (self.paho.iter())
            .filter(|p| PAHO_AWAY.iter().any(|a| a.0 == p.name))
            .map(Paho::commands);
        self.away = Away::new(away.collect());
        for (name, protocol, qos) in PAHO_PUBS {
            let args = [
                self.pub_port_file.display().to_string(),
                name.into(),
                protocol.into(),
                topic(name),
                qos.into(),
                WINDOW.into(),
            ];
            (self.paho).push(Paho::spawn(
                "pub",
                name,
                &args,
                &self.shared,
                self.dir.path(),
            ));
        }
    }

    fn port(&self) -> String {
        self.port_file.display().to_string()
    }

    /// Runs the raw subscribers until every subscriber has its SUBACK.
    async fn subscribe_all(&mut self) {
        let raw = self.raw.take().expect("raw clients");
        let subs_only = Raw {
            pubs: Vec::new(),
            subs: raw.subs,
        };
        let running = subs_only.start(self.b.addr, &self.ctl, None);
        let n = self.subs.len();
        let shared = self.shared.clone();
        let subscribed = wait_until(SETUP_WAIT, || shared.lock().subscribed.len() == n).await;
        self.ctl.stop.store(true, Ordering::SeqCst);
        let subs = running.join().await.subs;
        self.ctl.stop.store(false, Ordering::SeqCst);
        self.raw = Some(Raw {
            pubs: raw.pubs,
            subs,
        });
        assert!(
            subscribed,
            "subscribers not subscribed within {SETUP_WAIT:?}: have {:?}; errors {:?}\n{}",
            self.shared.lock().subscribed,
            self.shared.lock().errors,
            self.paho
                .iter()
                .map(|p| p.stderr_tail(10))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }

    /// One broker life that ends with a kill at `kill`, the away subscribers moving as
    /// `away` says; describes the kill moment.
    async fn cycle(&mut self, cycle: u32, kill: KillAt, arm_ms: u64, away: &[Plan]) -> String {
        self.shared.set_cycle(cycle);
        let kill_in_ms = match kill {
            KillAt::Random(ms) => ms,
            _ => arm_ms,
        };
        self.away.plan_leaves(away, kill_in_ms);
        let trap = Trap {
            at: kill,
            armed: self.armed.clone(),
            hit: self.hit_tx.clone(),
        };
        let raw = self.raw.take().expect("raw clients");
        let running = raw.start(self.b.addr, &self.ctl, Some(&trap));
        let how = self.reach(kill, arm_ms).await;
        set_port(&self.port_file, self.refusing.port);
        match self.pub_waits {
            true => write_atomically(&self.pub_port_file, ""),
            false => set_port(&self.pub_port_file, self.refusing.port),
        }
        tokio::task::block_in_place(|| self.b.restart_after_kill());
        self.shared.set_restarted();
        self.away.plan_returns(away);
        set_port(&self.port_file, self.b.port());
        set_port(&self.pub_port_file, self.b.port());
        self.raw = Some(running.join().await);
        how
    }

    /// Waits for the armed trap (or a random moment) and describes it.
    async fn reach(&mut self, kill: KillAt, arm_ms: u64) -> String {
        while self.hits.try_recv().is_ok() {}
        if let KillAt::Random(ms) = kill {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            return format!("at random, {ms} ms in");
        }
        tokio::time::sleep(Duration::from_millis(arm_ms)).await;
        self.armed.store(true, Ordering::SeqCst);
        let hit = tokio::time::timeout(TARGET_WAIT, self.hits.recv()).await;
        self.armed.store(false, Ordering::SeqCst);
        match hit {
            Ok(Some(what)) => format!("{kill:?} (armed {arm_ms} ms in): {what}"),
            _ => format!("{kill:?}: NOT reached within {TARGET_WAIT:?}, killed anyway"),
        }
    }

    /// Last broker life, no kill: publishers finish what they have in flight, subscribers
    /// catch up. Returns (publishers finished, subscribers caught up).
    async fn finish(&mut self, cycles: u32) -> (bool, bool) {
        self.shared.set_cycle(cycles);
        let mut raw = self.raw.take().expect("raw clients");
        for p in &mut raw.pubs {
            p.finishing = true;
        }
        for p in self.paho.iter().filter(|p| self.pubs.contains(&p.name)) {
            p.commands().send("finish");
        }
        self.away.all_back();
        let running = raw.start(self.b.addr, &self.ctl, None);
        let shared = self.shared.clone();
        let pubs = self.pubs.clone();
        let finished = wait_until(FINISH_WAIT, || {
            let r = shared.lock();
            pubs.iter()
                .all(|p| r.published.get(p).is_some_and(|p| p.done))
        })
        .await;
        let subs = self.subs.clone();
        let caught_up =
            finished && wait_until(FINISH_WAIT, || shared.incomplete(&subs).is_empty()).await;
        tokio::time::sleep(TAIL).await;
        self.ctl.stop.store(true, Ordering::SeqCst);
        self.raw = Some(running.join().await);
        for p in &mut self.paho {
            p.stop(Duration::from_secs(5));
        }
        (finished, caught_up)
    }

    fn progress(&self) -> String {
        let r = self.shared.lock();
        let acked: Vec<String> = (r.published.iter())
            .map(|(n, p)| format!("{n} {}", p.acked.len()))
            .collect();
        let got: Vec<String> = (r.deliveries.iter())
            .map(|(n, d)| format!("{n} {}", d.len()))
            .collect();
        format!(
            "acked [{}]; delivered [{}]",
            acked.join(", "),
            got.join(", ")
        )
    }

    /// Everything besides the checker's report that makes the run fail or explains it.
    fn other_findings(&mut self, finished: bool, caught_up: bool) -> (String, bool) {
        let mut out = String::new();
        let record = self.shared.lock();
        let raw = self.raw.as_ref().expect("raw clients");
        let notes = raw.pubs.iter().flat_map(|p| &p.notes);
        for note in notes.chain(raw.subs.iter().flat_map(|s| &s.notes)) {
            out.push_str(&format!("kill point: {note}\n"));
        }
        for (sub, moves) in &record.away {
            let held: u64 = moves.iter().map(|m| m.2).sum();
            out.push_str(&format!(
                "{sub} left {} times before a kill, holding {held} QoS 2 messages awaiting \
                 PUBREL in all\n",
                moves.len()
            ));
        }
        let mut ok = record.sessions_lost.is_empty() && record.errors.is_empty();
        if !finished {
            let stuck: Vec<&String> = (self.pubs.iter())
                .filter(|p| !record.published.get(*p).is_some_and(|p| p.done))
                .collect();
            out.push_str(&format!(
                "PUBLISHERS NOT FINISHED within {FINISH_WAIT:?}: {stuck:?}\n"
            ));
        } else if !caught_up {
            out.push_str(&format!(
                "SUBSCRIBERS NOT CAUGHT UP within {FINISH_WAIT:?} (see LOST)\n"
            ));
        }
        if !record.sessions_lost.is_empty() {
            let lost = &record.sessions_lost;
            out.push_str(&format!(
                "SESSIONS LOST (Session Present 0 on reconnect): {lost:?}\n"
            ));
        }
        for (client, errors) in &record.errors {
            let e = &errors[..errors.len().min(3)];
            out.push_str(&format!(
                "ERRORS of {client}: {} e.g. {e:?}\n",
                errors.len()
            ));
        }
        drop(record);
        for p in &mut self.paho {
            if !matches!(p.exited(), Some(s) if s.success()) {
                ok = false;
                let tail = p.stderr_tail(20);
                out.push_str(&format!("{} did not exit cleanly:\n{tail}\n", p.name));
            }
        }
        (out, ok && finished && caught_up)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qos2_exactly_once_and_in_order_across_sigkill() {
    let started = Instant::now();
    let seed = env_or("TERN_CRASH_SEED", time_seed);
    let cycles: u32 = env_or("TERN_CRASH_CYCLES", || DEFAULT_CYCLES);
    let pub_waits = env_or("TERN_CRASH_PUB_WAITS", || 0u8) == 1;
    eprintln!(
        "TERN_CRASH_SEED={seed} TERN_CRASH_CYCLES={cycles} TERN_CRASH_PUB_WAITS={}",
        u8::from(pub_waits)
    );
    let plan = schedule(&mut Rng(seed), cycles);
    let away = Plan::schedule(seed, cycles, PAHO_AWAY.len());
    // Fails here, naming the reason, if paho cannot be had.
    eprintln!("paho from {}", crash::paho::python().display());

    let mut h = Harness::start(pub_waits);
    h.subscribe_all().await;
    let pacing = Arc::new(AtomicBool::new(false));
    let paho_pubs = (h.paho.iter())
        .filter(|p| h.pubs.contains(&p.name))
        .map(|p| (p.name.clone(), p.commands()))
        .collect();
    let pacer = start_pacer(
        h.shared.clone(),
        paho_pubs,
        h.pubs.clone(),
        h.subs.clone(),
        pacing.clone(),
    );
    for (cycle, &(kill, arm_ms)) in plan.iter().enumerate() {
        let moves = &away[cycle];
        let how = h.cycle(cycle as u32, kill, arm_ms, moves).await;
        eprintln!(
            "cycle {cycle}: killed {how}\n  away {}\n  {}",
            Plan::describe(&PAHO_AWAY.map(|a| a.0), moves),
            h.progress()
        );
    }
    pacing.store(true, Ordering::Relaxed);
    let _ = pacer.join();
    let (finished, caught_up) = h.finish(cycles).await;

    let report = crash::check::check(&h.shared.lock());
    let (others, others_ok) = h.other_findings(finished, caught_up);
    let summary = format!(
        "{cycles} kills (TERN_CRASH_SEED={seed}, TERN_CRASH_PUB_WAITS={}), {:.1} s: {}\n{}{others}",
        u8::from(pub_waits),
        started.elapsed().as_secs_f64(),
        report.totals(),
        report.describe()
    );
    assert!(
        report.ok() && others_ok,
        "exactly once and in order under crash failed:\n{summary}"
    );
    eprintln!("{summary}");
}
