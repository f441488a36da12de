//! The harness of `crash_exactly_once.rs`: clients that keep their MQTT session across
//! `kill -9` of the broker ([`paho`]: paho-mqtt subprocesses, [`raw`]: tern-wire clients with
//! kill points), the record of what they saw ([`Record`]) and the checker ([`check`]).
//!
//! Payloads are `PUBLISHER:N` (N counts up from 0 per publisher, one topic per publisher), so
//! every delivery names its publisher and place in that publisher's order.

pub mod away;
pub mod check;
pub mod paho;
pub mod raw;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

/// Milliseconds since the first call in this process: the clock of [`Delivery::at_ms`].
pub fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// One message handed to a subscriber's application.
#[derive(Clone, Debug)]
pub struct Delivery {
    pub publisher: String,
    pub n: u64,
    pub qos: u8,
    pub dup: bool,
    pub packet_id: u16,
    /// The kill/restart cycle it arrived in (0 = before the first kill). For a paho client,
    /// the cycle its event was read in, which can lag a little.
    pub cycle: u32,
    /// When it was recorded ([`now_ms`]; for paho, when its event was read).
    pub at_ms: u64,
    /// How long after the broker's last (re)start it was recorded: with `cycle`, the shape of
    /// a duplicate (a resend at reconnect, a replay, the live path long after a restart).
    pub since_restart_ms: u64,
}

/// What a publisher was told by the broker.
#[derive(Clone, Debug, Default)]
pub struct Published {
    pub qos: u8,
    /// Numbers whose PUBACK (QoS 1) or PUBREC / PUBCOMP (QoS 2) arrived: the broker owes them
    /// to every subscriber (MQTT-4.3.2-*, MQTT-4.3.3-*).
    pub acked: BTreeSet<u64>,
    /// Set once the publisher was told to finish and has nothing in flight.
    pub done: bool,
}

/// Everything every client saw, shared by client tasks and the paho reader threads.
#[derive(Default)]
pub struct Record {
    /// Subscriber name → its deliveries in arrival order.
    pub deliveries: BTreeMap<String, Vec<Delivery>>,
    /// (subscriber, publisher) → the distinct numbers delivered (for pacing and catch-up).
    pub distinct: BTreeMap<(String, String), HashSet<u64>>,
    pub published: BTreeMap<String, Published>,
    /// Publisher → numbers it may publish up to (exclusive), set by the pacer.
    pub limits: BTreeMap<String, u64>,
    /// Publisher → numbers it re-sent as a PUBLISH after sending their PUBREL (a client
    /// violation of MQTT-4.3.3-1 (3.1.1) / MQTT-4.3.3-6 (v5): paho after a failed reconnect),
    /// with how often: each such PUBLISH is a new message to the broker, one more copy.
    pub resent_after_pubrel: BTreeMap<String, BTreeMap<u64, usize>>,
    /// Publisher → numbers whose PUBLISH left after a higher number's on the same connection
    /// (a client violation of MQTT-4.6.0-1: paho after a reconnect).
    pub sent_out_of_order: BTreeMap<String, BTreeSet<u64>>,
    /// Subscriber → PUBRELs that arrived out of the order of its PUBRECs (MQTT-4.6.0-4),
    /// described.
    pub pubrel_order: BTreeMap<String, Vec<String>>,
    /// Subscriber → QoS 2 messages the broker sent again under a packet id after sending its
    /// PUBREL (MQTT-4.3.3-1 (3.1.1) / MQTT-4.3.3-6 (v5), the server as sender): (payload,
    /// description).
    pub resent_by_broker: BTreeMap<String, Vec<(String, String)>>,
    /// Client → CONNACKs with Session Present 0 after its first connection (a lost session).
    pub sessions_lost: BTreeMap<String, u32>,
    /// Subscriber → what its "away" moments left open: (cycle, ms since the restart, QoS 2
    /// messages it held awaiting PUBREL when it sent DISCONNECT).
    pub away: BTreeMap<String, Vec<(u32, u64, u64)>>,
    /// Subscribers whose SUBACK arrived.
    pub subscribed: BTreeSet<String>,
    /// Client → lines it reported as errors (paho exceptions, unexpected packets).
    pub errors: BTreeMap<String, Vec<String>>,
}

/// The shared [`Record`] plus the current cycle number and the broker's last (re)start
/// ([`now_ms`]), both stamped on each delivery.
#[derive(Clone, Default)]
pub struct Shared {
    record: Arc<Mutex<Record>>,
    cycle: Arc<AtomicU32>,
    restarted_ms: Arc<AtomicU64>,
}

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, Record> {
        // A client thread that panicked must not hide the record from the checker.
        self.record.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set_cycle(&self, cycle: u32) {
        self.cycle.store(cycle, Ordering::Relaxed);
    }

    pub fn cycle(&self) -> u32 {
        self.cycle.load(Ordering::Relaxed)
    }

    /// The broker was (re)started just now.
    pub fn set_restarted(&self) {
        self.restarted_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// Milliseconds since the broker's last (re)start.
    pub fn since_restart_ms(&self) -> u64 {
        now_ms().saturating_sub(self.restarted_ms.load(Ordering::Relaxed))
    }

    /// Records a delivery of `payload` to `subscriber`; an undecodable payload is an error.
    pub fn deliver(&self, subscriber: &str, payload: &[u8], qos: u8, dup: bool, packet_id: u16) {
        let cycle = self.cycle();
        let at_ms = now_ms();
        let since_restart_ms = at_ms.saturating_sub(self.restarted_ms.load(Ordering::Relaxed));
        let mut r = self.lock();
        match parse_payload(payload) {
            Some((publisher, n)) => {
                r.distinct
                    .entry((subscriber.to_string(), publisher.clone()))
                    .or_default()
                    .insert(n);
                r.deliveries
                    .entry(subscriber.to_string())
                    .or_default()
                    .push(Delivery {
                        publisher,
                        n,
                        qos,
                        dup,
                        packet_id,
                        cycle,
                        at_ms,
                        since_restart_ms,
                    })
            }
            None => r
                .errors
                .entry(subscriber.to_string())
                .or_default()
                .push(format!("undecodable payload {payload:?}")),
        }
    }

    pub fn acked(&self, publisher: &str, qos: u8, n: u64) {
        let mut r = self.lock();
        let p = r.published.entry(publisher.to_string()).or_default();
        p.qos = qos;
        p.acked.insert(n);
    }

    pub fn set_done(&self, publisher: &str, qos: u8) {
        let mut r = self.lock();
        let p = r.published.entry(publisher.to_string()).or_default();
        p.qos = qos;
        p.done = true;
    }

    pub fn resent_after_pubrel(&self, publisher: &str, n: u64) {
        self.lock()
            .resent_after_pubrel
            .entry(publisher.to_string())
            .or_default()
            .entry(n)
            .and_modify(|times| *times += 1)
            .or_insert(1);
    }

    pub fn sent_out_of_order(&self, publisher: &str, n: u64) {
        self.lock()
            .sent_out_of_order
            .entry(publisher.to_string())
            .or_default()
            .insert(n);
    }

    pub fn resent_by_broker(&self, subscriber: &str, payload: &str, what: String) {
        self.lock()
            .resent_by_broker
            .entry(subscriber.to_string())
            .or_default()
            .push((payload.to_string(), what));
    }

    pub fn pubrel_out_of_order(&self, subscriber: &str, what: String) {
        self.lock()
            .pubrel_order
            .entry(subscriber.to_string())
            .or_default()
            .push(what);
    }

    pub fn session_lost(&self, client: &str) {
        *self
            .lock()
            .sessions_lost
            .entry(client.to_string())
            .or_default() += 1;
    }

    pub fn went_away(&self, subscriber: &str, held: u64) {
        let at = (self.cycle(), self.since_restart_ms(), held);
        let mut r = self.lock();
        r.away.entry(subscriber.to_string()).or_default().push(at);
    }

    pub fn error(&self, client: &str, what: String) {
        self.lock()
            .errors
            .entry(client.to_string())
            .or_default()
            .push(what);
    }

    /// Subscribers (of `names`) that have not yet received every acknowledged message.
    pub fn incomplete(&self, names: &[String]) -> Vec<String> {
        let r = self.lock();
        let empty = HashSet::new();
        names
            .iter()
            .filter(|sub| {
                r.published.iter().any(|(publ, p)| {
                    let got = r
                        .distinct
                        .get(&((*sub).clone(), publ.clone()))
                        .unwrap_or(&empty);
                    p.acked.iter().any(|n| !got.contains(n))
                })
            })
            .cloned()
            .collect()
    }

    /// How far `publisher` may publish (exclusive); 0 until the pacer has run.
    pub fn limit(&self, publisher: &str) -> u64 {
        self.lock().limits.get(publisher).copied().unwrap_or(0)
    }

    /// Sets every publisher's limit to the least, over `subscribers` (name, lag), of what the
    /// subscriber has plus its lag, so that no session queue overflows (a dropped message
    /// would read as lost); returns the limits.
    pub fn pace(&self, publishers: &[String], subscribers: &[(String, u64)]) -> Vec<u64> {
        let mut r = self.lock();
        let limits: Vec<u64> = publishers
            .iter()
            .map(|publ| {
                subscribers
                    .iter()
                    .map(|(sub, lag)| {
                        let got = r.distinct.get(&(sub.clone(), publ.clone()));
                        got.map_or(0, |d| d.len() as u64) + lag
                    })
                    .min()
                    .unwrap_or(0)
            })
            .collect();
        for (publ, &limit) in publishers.iter().zip(&limits) {
            r.limits.insert(publ.clone(), limit);
        }
        limits
    }
}

/// `PUBLISHER:N` → (publisher, N).
pub fn parse_payload(payload: &[u8]) -> Option<(String, u64)> {
    let text = std::str::from_utf8(payload).ok()?;
    let (publisher, n) = text.rsplit_once(':')?;
    Some((publisher.to_string(), n.parse().ok()?))
}

/// Where in an exchange the broker is killed. The targeted points are observed by a raw
/// client ([`raw`]); the two "holds" keep the client from sending its next packet, so the kill
/// lands exactly there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KillAt {
    /// At a random moment this many ms after the cycle's clients were started.
    Random(u64),
    /// The QoS 2 publisher got PUBREC and holds its PUBREL (MQTT-4.3.3-3 resend on reconnect).
    PubRecBeforePubRel,
    /// The QoS 2 publisher sent PUBREL; the broker's PUBCOMP has not arrived yet.
    PubRelBeforePubComp,
    /// The subscriber sent PUBREC; the broker's PUBREL has not arrived yet.
    SubPubRecBeforePubRel,
    /// The subscriber got PUBREL and holds its PUBCOMP.
    SubPubRelBeforePubComp,
}

impl KillAt {
    pub const TARGETED: [KillAt; 4] = [
        KillAt::PubRecBeforePubRel,
        KillAt::PubRelBeforePubComp,
        KillAt::SubPubRecBeforePubRel,
        KillAt::SubPubRelBeforePubComp,
    ];

    /// Whether the raw publisher (else the raw subscriber) observes this point.
    pub fn on_publisher(self) -> bool {
        matches!(
            self,
            KillAt::PubRecBeforePubRel | KillAt::PubRelBeforePubComp
        )
    }
}

/// A local port that refuses connections: bound, never listening, held until drop. The port
/// file points at it while the broker is down, so the paho clients fail to reconnect (as they
/// do against a fixed port) and no other process can take the port in between.
pub struct RefusingPort {
    fd: i32,
    pub port: u16,
}

impl RefusingPort {
    pub fn new() -> RefusingPort {
        // SAFETY: plain socket calls on a descriptor this function owns; `addr`, `bound` and
        // the lengths outlive the calls that read or write them.
        unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
            assert!(fd >= 0, "socket() failed");
            let mut addr: libc::sockaddr_in = std::mem::zeroed();
            addr.sin_family = libc::AF_INET as libc::sa_family_t;
            addr.sin_addr.s_addr = u32::from_ne_bytes([127, 0, 0, 1]);
            let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            let rc = libc::bind(fd, &addr as *const _ as *const libc::sockaddr, len);
            assert_eq!(rc, 0, "bind(127.0.0.1:0) failed");
            let mut bound: libc::sockaddr_in = std::mem::zeroed();
            let mut bound_len = len;
            let rc = libc::getsockname(
                fd,
                &mut bound as *mut _ as *mut libc::sockaddr,
                &mut bound_len,
            );
            assert_eq!(rc, 0, "getsockname failed");
            RefusingPort {
                fd,
                port: u16::from_be(bound.sin_port),
            }
        }
    }
}

impl Drop for RefusingPort {
    fn drop(&mut self) {
        // SAFETY: closes the descriptor this value owns, once.
        unsafe {
            libc::close(self.fd);
        }
    }
}

/// A small xorshift: the kill schedule is random, the seed printed for a rerun.
pub struct Rng(pub u64);

impl Rng {
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}
