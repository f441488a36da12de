//! One session and the control block of the connection attached to it.

pub(crate) mod changed;
mod received;
pub(crate) mod signal;

pub(crate) use changed::ChangedSessions;

pub(crate) use received::ReceivedIds;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use parking_lot::Mutex;
use tern_wire::{Protocol, ReasonCode};
use tokio::sync::Notify;

use crate::hash::Map;
use crate::model::SubRecord;
use crate::model::message::Message;
use crate::state::outbound::Outbound;
use crate::transport::ClientCertificate;
use signal::Signal;

/// What the connection's task and the rest of the broker share about one live connection.
#[derive(Debug, Default)]
pub struct ConnCtl {
    /// Wakes the connection's task: new outbound data, a window opening, a kick, the shutdown.
    pub(crate) wake: Signal,
    /// The first kick's reason as [`KICKED`] | code, 0 before any (an atomic, not a mutex:
    /// a byte less lets the keep-alive clock fit without growing every connection's block).
    kick_reason: AtomicU16,
    /// The server is shutting down (`Close::Shutdown`: the will stays owed, not published).
    shut_down: AtomicBool,
    /// Who is connected (for the admin API), set once the handshake is done.
    info: OnceLock<ConnInfo>,
    /// The connection has handed out every delivery it will ever route (its close path drained
    /// its ack pipeline, or it is gone): a later connection of the same client may start.
    routed: AtomicBool,
    routed_notify: Notify,
    /// When the client last sent a packet, in [`crate::state::keep_alive::KeepAlive::millis`]
    /// (wrapping: 4 bytes fit beside the flags, where 8 would cost every connection 16).
    last_packet_ms: AtomicU32,
}

/// Marks [`ConnCtl`]'s `kick_reason` as set (the code alone may be 0).
const KICKED: u16 = 0x100;

/// What the admin API shows of a live connection.
#[derive(Debug, Clone)]
pub(crate) struct ConnInfo {
    pub(crate) peer: SocketAddr,
    /// The keep alive in force (the Server Keep Alive if we set one), 0 for none.
    pub(crate) keep_alive_s: u16,
    /// When the connection was accepted, in milliseconds since the Unix epoch (8 bytes where a
    /// `SystemTime` takes 16: the credentials below fit in what this saves, and every
    /// connection's control block keeps its size, `idle_connection_state_stays_small`).
    pub(crate) connected_at_unix_ms: u64,
    /// What the client proved when it connected, kept so that a reload (SIGHUP) checks it
    /// again (`engine::reload`); `None` when it proved neither a password nor a certificate.
    pub(crate) proof: Option<Arc<Proof>>,
}

/// What a connected client proved: one allocation behind one pointer, so that every
/// connection's control block keeps its size (`idle_connection_state_stays_small`).
#[derive(Debug)]
pub(crate) struct Proof {
    /// The username and password a password file accepted.
    pub(crate) credentials: Option<Credentials>,
    /// The client certificate the listener's TLS verified.
    pub(crate) certificate: Option<ClientCertificate>,
}

impl Proof {
    /// `None` when there is nothing to check again.
    pub(crate) fn new(
        credentials: Option<Credentials>,
        certificate: Option<ClientCertificate>,
    ) -> Option<Arc<Proof>> {
        (credentials.is_some() || certificate.is_some()).then(|| {
            Arc::new(Proof {
                credentials,
                certificate,
            })
        })
    }
}

/// A client's username and password as the password file accepted them at CONNECT. Kept for
/// the life of the connection, as mosquitto keeps them, so that a reload (SIGHUP) can
/// disconnect a client whose password no longer matches or whose user is gone (issue 24 item
/// 2). Only clients checked against a password file have one. `Debug` never shows the
/// password.
#[derive(Clone)]
pub(crate) struct Credentials {
    pub(crate) username: Arc<str>,
    password: Box<[u8]>,
}

impl Credentials {
    pub(crate) fn new(username: Arc<str>, password: &[u8]) -> Credentials {
        Credentials {
            username,
            password: password.into(),
        }
    }

    pub(crate) fn password(&self) -> &[u8] {
        &self.password
    }
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

impl ConnInfo {
    /// When the connection was accepted.
    pub(crate) fn connected_at(&self) -> SystemTime {
        SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(self.connected_at_unix_ms)
    }

    /// Milliseconds since the Unix epoch of `at` (0 before it).
    pub(crate) fn unix_ms(at: SystemTime) -> u64 {
        at.duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

impl ConnCtl {
    /// Asks the connection to close with `reason` (takeover 0x8E, slow subscriber 0x97, ...).
    /// The first reason wins; true for that first call (counters count each kick once).
    pub(crate) fn kick(&self, reason: ReasonCode) -> bool {
        let first = self
            .kick_reason
            .compare_exchange(
                0,
                KICKED | u16::from(reason.0),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok();
        self.wake.notify();
        first
    }

    /// Closes the connection because the server shuts down.
    pub(crate) fn shut_down(&self) {
        self.shut_down.store(true, Ordering::Release);
        self.wake.notify();
    }

    pub(crate) fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::Acquire)
    }

    /// The reason of the first [`ConnCtl::kick`], if there was one.
    pub(crate) fn kick_reason(&self) -> Option<ReasonCode> {
        let kicked = self.kick_reason.load(Ordering::Acquire);
        // The low byte is the code (set with `KICKED` above it).
        (kicked & KICKED != 0).then_some(ReasonCode(kicked as u8))
    }

    /// Records that a packet came from the client at `at_ms` (the keep alive's clock).
    pub(crate) fn touch(&self, at_ms: u32) {
        self.last_packet_ms.store(at_ms, Ordering::Relaxed);
    }

    pub(crate) fn last_packet_ms(&self) -> u32 {
        self.last_packet_ms.load(Ordering::Relaxed)
    }

    /// Records who is connected; the first call wins.
    pub(crate) fn set_info(&self, info: ConnInfo) {
        let _ = self.info.set(info);
    }

    pub(crate) fn info(&self) -> Option<&ConnInfo> {
        self.info.get()
    }

    /// Called once the connection routes nothing more (see [`ConnCtl::routed`]).
    pub(crate) fn set_routed(&self) {
        self.routed.store(true, Ordering::Release);
        self.routed_notify.notify_waiters();
    }

    /// Resolves once [`ConnCtl::set_routed`] was called. A new connection of the same client
    /// waits for this before it reads anything, so that the old connection's deliveries (QoS 2
    /// messages whose writes were pending when it died, released by its close path) keep their
    /// place before the new connection's (MQTT-4.6.0-6; docs/simulation.md finding 3).
    pub(crate) async fn routed(&self) {
        loop {
            let notified = self.routed_notify.notified();
            tokio::pin!(notified);
            // Registered before the check: a `set_routed` in between is not missed.
            notified.as_mut().enable();
            if self.routed.load(Ordering::Acquire) {
                return;
            }
            notified.await;
        }
    }
}

#[derive(Debug)]
pub struct Session {
    pub client_id: Arc<str>,
    /// Mirrors `state.conn.is_some()` for lock-free checks (shared-group member choice).
    pub(crate) online: AtomicBool,
    /// Subscriptions other than `$share/...` ones: above 1, one message can match this
    /// session twice and routing must merge the copies. Saturates at `u32::MAX` (only "above
    /// 1" matters); 4 bytes beside `online` where 8 would cost every session's block 8.
    pub(crate) plain_subscriptions: AtomicU32,
    /// A change since the checkpointer's last visit was announced ([`ChangedSessions`]); in
    /// the padding beside `online`, so no session grows.
    checkpoint_changed: AtomicBool,
    pub state: Mutex<SessionState>,
}

#[derive(Debug)]
pub struct SessionState {
    /// The live connection, if any, and its generation (bumped on every attach).
    pub(crate) conn: Option<Arc<ConnCtl>>,
    pub(crate) conn_gen: u64,
    pub(crate) protocol: Protocol,
    /// The username of the last connection (ACL checks on delivery).
    pub(crate) username: Option<Arc<str>>,
    /// By the filter as subscribed (with any `$share/{group}/` prefix).
    pub(crate) subscriptions: Map<Box<str>, SubRecord>,
    /// QoS 2 packet ids received and not yet released (ARCHITECTURE §3). Bounded by our
    /// Receive Maximum: a client exceeding it is disconnected (0x93).
    pub(crate) qos2_received: ReceivedIds,
    pub expiry_interval_s: u32,
    /// Set once the session is removed from the registry; nothing is queued after that.
    pub(crate) ended: bool,
    /// A will waiting for its delay (v5), with its store token; cancelled by a reconnect.
    /// Boxed: rarely set, and inline it would cost every session 8 bytes more (issue 15).
    pub(crate) pending_will: Option<Box<PendingWill>>,
    pub out: Outbound,
}

/// A will waiting for its delay: the message and its store token.
#[derive(Debug)]
pub(crate) struct PendingWill {
    pub(crate) will: Arc<Message>,
    pub(crate) token: u64,
}

impl Session {
    pub fn new(client_id: Arc<str>, protocol: Protocol, expiry_interval_s: u32) -> Arc<Session> {
        Arc::new(Session {
            client_id,
            online: AtomicBool::new(false),
            plain_subscriptions: AtomicU32::new(0),
            checkpoint_changed: AtomicBool::new(false),
            state: Mutex::new(SessionState {
                conn: None,
                conn_gen: 0,
                protocol,
                username: None,
                subscriptions: Map::default(),
                qos2_received: ReceivedIds::default(),
                expiry_interval_s,
                ended: false,
                pending_will: None,
                out: Outbound::default(),
            }),
        })
    }

    /// Gives the session a live connection outside the registry (benches, `__internal`):
    /// `state.conn` and its mirror `online` together, as `engine::registry` sets them.
    #[cfg(feature = "__internal")]
    pub fn connect_detached(&self, ctl: Arc<ConnCtl>) {
        self.state.lock().conn = Some(ctl);
        self.set_online(true);
    }

    pub(crate) fn is_online(&self) -> bool {
        self.online.load(Ordering::Relaxed)
    }

    pub(crate) fn set_online(&self, online: bool) {
        self.online.store(online, Ordering::Relaxed);
    }

    /// Recounts [`Session::plain_subscriptions`] from the subscription table.
    pub(crate) fn recount_subscriptions(&self, state: &SessionState) {
        let plain = state
            .subscriptions
            .keys()
            .filter(|f| !f.starts_with(tern_topic::SHARE_PREFIX))
            .count();
        let plain = u32::try_from(plain).unwrap_or(u32::MAX);
        self.plain_subscriptions.store(plain, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_kick_reason_wins() {
        let ctl = ConnCtl::default();
        ctl.kick(ReasonCode::SESSION_TAKEN_OVER);
        ctl.kick(ReasonCode::SERVER_SHUTTING_DOWN);
        assert_eq!(ctl.kick_reason(), Some(ReasonCode::SESSION_TAKEN_OVER));
    }
}
