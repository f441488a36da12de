//! Shared broker state and the accept loop.
//!
//! # Invariants
//! - Every connection task gets a clone of the shutdown receiver; `serve` returns only after
//!   every connection task ended, or the drain timeout passed (then those left end by their
//!   own close path's bounds, or with the runtime).
//! - Connection tasks are counted, not kept in a `JoinSet`: its entry was 56 B and an
//!   allocation in every idle connection.

use std::future::{Future, poll_fn};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::auth::AuthRules;
use crate::config::{BrokerConfig, ConfigError};
use crate::engine::Shared;
use crate::engine::live_tasks::{LiveTask, LiveTasks};
use crate::metrics::Metrics;
use crate::model::{FullStore, Persistence};
use crate::transport::{
    AcceptedSocket, ConnectionInfo, Listener, ListenerContext, StreamTransport, Transport, Upgrade,
    poll_accept_any,
};

/// How long shutdown waits for connections to send their DISCONNECT and close.
pub(crate) const SHUTDOWN_DRAIN_TIMEOUT_MS: u64 = 3_000;
/// Pause after a failed accept (e.g. out of file descriptors) before trying again.
const ACCEPT_ERROR_BACKOFF_MS: u64 = 100;

/// A socket someone accepted for this broker, with the listener it came in on: its context
/// (limits, transport, authentication rules) and its upgrade (TLS, WebSocket), which the
/// broker runs as for its own listeners.
pub struct Accepted {
    pub socket: AcceptedSocket,
    /// The client's address (for a forwarded connection, the address the forwarding node saw).
    pub peer: SocketAddr,
    pub context: Arc<ListenerContext>,
    pub upgrade: Option<Arc<dyn Upgrade>>,
}

/// The tasks [`Broker::start_background`] started; dropping it aborts them.
pub struct Background {
    sys: tokio::task::JoinHandle<()>,
    checkpoints: tokio::task::JoinHandle<()>,
}

impl Drop for Background {
    fn drop(&mut self) {
        self.sys.abort();
        self.checkpoints.abort();
    }
}

/// The broker: build with [`Broker::new`], run with [`Broker::serve`].
#[derive(Clone)]
pub struct Broker {
    shared: Arc<Shared>,
}

impl Broker {
    /// A broker with the in-memory store.
    pub fn new(config: BrokerConfig) -> Result<Broker, ConfigError> {
        Broker::with_persistence(config, Persistence::memory())
    }

    /// A broker over `store` for every concern of the persistence seam, after recovering what
    /// it kept.
    pub fn with_store<S: FullStore>(
        config: BrokerConfig,
        store: Arc<S>,
    ) -> Result<Broker, ConfigError> {
        Broker::with_persistence(config, Persistence::of(store))
    }

    /// A broker over one store per concern (tests script some concerns and leave the rest
    /// to [`Persistence::memory`]).
    pub fn with_persistence(
        config: BrokerConfig,
        store: Persistence,
    ) -> Result<Broker, ConfigError> {
        config.validate()?;
        let recovered = store.recovery.recover();
        let broker = Broker {
            shared: Shared::new(config, store),
        };
        crate::engine::restore::restore(&broker.shared, recovered);
        Ok(broker)
    }

    /// The broker-wide state: crate-private, and public only to this workspace's tests and
    /// benches (the `__internal` feature).
    #[cfg(not(feature = "__internal"))]
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The broker-wide state, for this workspace's tests and benches (`__internal`).
    #[cfg(feature = "__internal")]
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The limits the broker was built with.
    pub fn config(&self) -> &BrokerConfig {
        &self.shared.config
    }

    /// Puts new passwords and ACL in force at once (start-up, SIGHUP): every CONNECT and
    /// every check from now on uses them. After a reload, run [`Broker::after_auth_reload`].
    pub fn replace_auth(&self, rules: AuthRules) {
        self.shared.auth.replace(rules);
    }

    /// Applies the rules [`Broker::replace_auth`] put in force to what the old ones let in:
    /// queued deliveries the session may no longer read are dropped, connected clients whose
    /// credentials no longer pass are disconnected ([`crate::engine::reload`]). Resolves to
    /// (deliveries dropped, clients disconnected).
    pub fn after_auth_reload(&self) -> impl Future<Output = (usize, usize)> + Send + 'static {
        crate::engine::reload::after_auth_reload(self.shared.clone())
    }

    /// After a reload of the listeners' TLS files: disconnects (0x87) every client whose
    /// certificate its listener would now refuse ([`crate::CertificateCheck`]): revoked by a
    /// reloaded CRL, no longer under the client CA, or expired. Returns how many.
    pub fn after_tls_reload(&self) -> usize {
        crate::engine::reload::after_tls_reload(&self.shared)
    }

    /// Marks the broker ready (`/readyz`) before [`Broker::serve_listeners`] runs: recovery is
    /// done when the broker is built, and a bound listener queues connections in the kernel,
    /// so the line that announces the listeners can promise readiness (a probe used to see
    /// 503 for a moment after it).
    pub fn mark_ready(&self) {
        self.shared.set_ready(true);
    }

    /// Accepts connections on one plain TCP listener until `shutdown` resolves; see
    /// [`Broker::serve_listeners`].
    pub async fn serve(
        &self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> io::Result<()> {
        let name = listener
            .local_addr()
            .map(|addr| addr.to_string())
            .unwrap_or_default();
        let listener = Listener::tcp(listener, ListenerContext::plain_tcp(name));
        self.serve_listeners(vec![listener], shutdown).await
    }

    /// Accepts connections on every listener until `shutdown` resolves; then stops accepting,
    /// tells every client the server is shutting down (v5 DISCONNECT 0x8B) and waits for the
    /// connections to close.
    pub async fn serve_listeners(
        &self,
        listeners: Vec<Listener>,
        shutdown: impl Future<Output = ()>,
    ) -> io::Result<()> {
        let mut next_listener = 0;
        // Owns the listeners: `serve_from` drops it, closing them, as soon as it stops
        // accepting.
        let accept = move |cx: &mut Context<'_>| {
            poll_accept_any(&listeners, &mut next_listener, cx).map(|(index, accepted)| {
                Some(accepted.map(|(socket, peer)| Accepted {
                    socket: AcceptedSocket::Tcp(socket),
                    peer,
                    context: listeners[index].context.clone(),
                    upgrade: listeners[index].upgrade.clone(),
                }))
            })
        };
        self.serve_from(accept, shutdown).await
    }

    /// [`Broker::serve_listeners`] for sockets accepted by someone else (a cluster node owns
    /// the listeners and hands this node's engine the connections it accepted or that other
    /// nodes forwarded): serves each socket received until `shutdown` resolves or the sender
    /// is gone, then shuts down the same way.
    pub async fn serve_accepted(
        &self,
        mut accepted: mpsc::Receiver<Accepted>,
        shutdown: impl Future<Output = ()>,
    ) -> io::Result<()> {
        let next = move |cx: &mut Context<'_>| accepted.poll_recv(cx).map(|a| a.map(Ok));
        self.serve_from(next, shutdown).await
    }

    /// The accept loop over `next` (`None`: no more sockets) and the shutdown that follows.
    async fn serve_from(
        &self,
        mut next: impl FnMut(&mut Context<'_>) -> Poll<Option<io::Result<Accepted>>>,
        shutdown: impl Future<Output = ()>,
    ) -> io::Result<()> {
        let (stop_tx, stop_rx) = watch::channel(false);
        let connections = Arc::new(LiveTasks::default());
        let background = self.start_background(stop_rx.clone());
        tokio::pin!(shutdown);
        self.shared.set_ready(true);
        loop {
            let accept = poll_fn(&mut next);
            // `biased` (as every select in this crate): branches are polled in order, not from
            // a random start, so a simulated run is one execution.
            tokio::select! {
                biased;
                _ = &mut shutdown => break,
                accepted = accept => match accepted {
                    None => break,
                    Some(Ok(accepted)) => {
                        let live = LiveTask::new(&connections);
                        self.spawn_connection(live, accepted, &stop_rx);
                    }
                    Some(Err(error)) => {
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(ACCEPT_ERROR_BACKOFF_MS)).await;
                    }
                },
            }
        }
        drop(next);
        self.shared.set_ready(false);
        tracing::info!(connections = connections.alive(), "shutting down");
        let _ = stop_tx.send(true);
        // After the send: a connection that attaches later sees `stop` (`connection::run`).
        self.shared.sessions.shut_down_connections();
        // The sockets the connections' closes leave lingering are waited for too (each for at
        // most `CLOSE_LINGER_MS`), within the same bound: their clients read the 0x8B.
        let drained =
            tokio::time::timeout(Duration::from_millis(SHUTDOWN_DRAIN_TIMEOUT_MS), async {
                connections.all_ended().await;
                self.shared.lingering.all_ended().await;
            })
            .await;
        if drained.is_err() {
            tracing::warn!(
                left = connections.alive(),
                lingering = self.shared.lingering.alive(),
                "connections did not close in time; not waiting for them"
            );
        }
        drop(background);
        // A clean stop leaves exact cursors: nothing is replayed at the next start.
        crate::engine::checkpoint::checkpoint_once(&self.shared);
        Ok(())
    }

    /// Starts what runs beside the connections: the `$SYS` publisher (until `stop` turns
    /// true), session expiry and the wills recovered from the store, and the checkpointer.
    /// [`Broker::serve_listeners`] calls it; a caller that accepts connections itself (the
    /// simulator, through [`Broker::run_socket_connection`]) calls it once before the first one.
    /// Dropping the result stops the `$SYS` publisher and the checkpointer.
    pub fn start_background(&self, stop: watch::Receiver<bool>) -> Background {
        let sys = tokio::spawn(crate::engine::sys::run(self.shared.clone(), stop));
        crate::engine::restore::arm_expiry(&self.shared);
        crate::engine::will::arm_recovered(&self.shared);
        let checkpoints = tokio::spawn(crate::engine::checkpoint::run_checkpoints(
            self.shared.clone(),
        ));
        Background { sys, checkpoints }
    }

    /// Serves one connection on any transport to its end, outside of a listener: the
    /// in-memory [`crate::transport::duplex`] of tests. `stop` turning true closes it as a
    /// shutdown does. A close the broker starts does not linger (no socket to reset).
    pub async fn run_connection<T: Transport>(
        &self,
        transport: T,
        info: ConnectionInfo,
        stop: watch::Receiver<bool>,
    ) {
        let lingers = crate::connection::Lingers::No;
        crate::connection::run_until_stopped(self.shared.clone(), transport, info, stop, lingers)
            .await;
    }

    /// [`Broker::run_connection`] for a socket the caller accepted (the simulator's TCP): a
    /// close the broker starts lingers as a listener's connection does (`connection::linger`),
    /// so that a client still writing, blocked on a full socket, gets to read the reason and
    /// the acks sent before it (docs/simulation.md, finding 16: seeds 640 and 757).
    pub async fn run_socket_connection<T: Transport>(
        &self,
        transport: T,
        info: ConnectionInfo,
        stop: watch::Receiver<bool>,
    ) {
        let lingers = crate::connection::Lingers::Yes;
        crate::connection::run_until_stopped(self.shared.clone(), transport, info, stop, lingers)
            .await;
    }

    /// Starts the task of one accepted socket, counted by `live`, unless its listener is full.
    fn spawn_connection(&self, live: LiveTask, accepted: Accepted, stop: &watch::Receiver<bool>) {
        let Accepted {
            socket,
            peer,
            context,
            upgrade,
        } = accepted;
        let Ok(slot) = context.admit() else {
            let refused = Metrics::add_get(&self.shared.metrics.connections_refused_listener, 1);
            if refused.is_power_of_two() {
                tracing::warn!(
                    listener = %context.name,
                    limit = context.max_connections,
                    %peer,
                    refused,
                    "listener max_connections reached; connection closed"
                );
            }
            return; // dropping the socket closes it
        };
        let shared = self.shared.clone();
        let mut info = ConnectionInfo::new(context, peer);
        let mut stop = stop.clone();
        let (upgrade, socket) = match (upgrade, socket) {
            (Some(upgrade), socket) => (upgrade, socket),
            (None, AcceptedSocket::Tcp(socket)) => {
                match slot {
                    // The plain path: the task is the connection's future, nothing around it
                    // (a wrapper would keep its captures beside it: measured +80 B per
                    // connection).
                    None => tokio::spawn(crate::connection::run(shared, socket, info, stop, live)),
                    Some(slot) => tokio::spawn(crate::connection::run(
                        shared,
                        socket,
                        info,
                        stop,
                        (live, slot),
                    )),
                };
                return;
            }
            (None, AcceptedSocket::Stream(stream)) => {
                // A forwarded client of a plain listener, over a TLS cluster link.
                let stream = StreamTransport::boxed(stream);
                tokio::spawn(crate::connection::run(
                    shared,
                    stream,
                    info,
                    stop,
                    (live, slot),
                ));
                return;
            }
        };
        tokio::spawn(async move {
            let deadline = Instant::now() + shared.config.connect_timeout();
            let upgraded = tokio::select! {
                biased;
                upgraded = tokio::time::timeout_at(deadline, upgrade.upgrade(socket)) => upgraded,
                _ = stop.changed() => return,
            };
            let upgraded = match upgraded {
                Ok(Ok(upgraded)) => upgraded,
                outcome => {
                    let failed = Metrics::add_get(&shared.metrics.transport_handshakes_failed, 1);
                    let error = match outcome {
                        Ok(Err(error)) => error.to_string(),
                        _ => "timed out".to_string(),
                    };
                    tracing::debug!(listener = %info.listener.name, %peer, %error, failed, "handshake failed");
                    return;
                }
            };
            info.peer_cn = upgraded.peer_cn;
            info.client_cert = upgraded.client_cert;
            crate::connection::run(shared, upgraded.stream, info, stop, (live, slot)).await;
        });
    }
}
