//! [`Shared`]: the broker-wide state every connection task holds, and the one place the
//! engine's operations find the registry, the router, the retained tree, the share-group
//! queues, the store and the counters.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};
use tokio::time::Instant;

use crate::config::BrokerConfig;
use crate::engine::live_tasks::LiveTasks;
use crate::metrics::Metrics;
use crate::model::{Message, Persistence, StoredWill};
use crate::read_order::ReadOrder;
use crate::state::ack_pipeline::ReleaseHook;
use crate::state::groups::Groups;
use crate::state::keep_alive::KeepAlive;
use crate::state::registry::Registry;
use crate::state::retained::Retained;
use crate::state::router::Router;
use crate::state::session::ChangedSessions;

/// State every connection task shares.
pub struct Shared {
    pub(crate) config: BrokerConfig,
    pub(crate) sessions: Registry,
    pub(crate) router: RwLock<Router>,
    pub(crate) retained: RwLock<Retained>,
    /// Share-group queues (messages waiting for a member to come online).
    pub(crate) groups: Groups,
    /// Persistent sessions changed since the checkpointer last looked at them.
    pub(crate) changed_sessions: ChangedSessions,
    /// Wills recovered from the store, armed when the broker starts serving.
    pub(crate) recovered_wills: Mutex<Vec<StoredWill>>,
    pub(crate) metrics: Metrics,
    /// Passwords and ACL in force; a reload replaces them ([`crate::auth`]).
    pub(crate) auth: crate::auth::Auth,
    /// CONNECTs per source address (`max_connect_rate_per_ip`).
    pub(crate) connect_rate: crate::connect_rate::ConnectRate,
    /// The persistence seam, one handle per concern.
    pub(crate) store: Persistence,
    pub(crate) started_at: Instant,
    /// Read tickets: packets take effect in the order they were read (ARCHITECTURE §2.1).
    pub(crate) read_order: Arc<ReadOrder>,
    /// Connections with a keep alive, for the sweeper that closes the silent ones.
    pub(crate) keep_alive: Arc<KeepAlive>,
    /// Every connection's ack pipeline hook (`retained::release_hook`).
    pub(crate) release_hook: ReleaseHook<Arc<Message>>,
    /// Sockets lingering after a close the broker started (`connection::linger`), counted so
    /// that their number is bounded and a shutdown waits for them.
    pub(crate) lingering: Arc<LiveTasks>,
    next_connection_id: AtomicU64,
    /// Set while [`Broker::serve`] accepts connections (recovery is done by then).
    ready: AtomicBool,
}

/// Read-only views for the tests and benches (`__internal`); the broker itself uses the fields.
#[cfg(feature = "__internal")]
impl Shared {
    pub fn config(&self) -> &BrokerConfig {
        &self.config
    }

    pub fn sessions(&self) -> &Registry {
        &self.sessions
    }

    pub fn router(&self) -> &RwLock<Router> {
        &self.router
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn store(&self) -> &Persistence {
        &self.store
    }
}

impl Shared {
    pub(crate) fn next_connection_id(&self) -> u64 {
        self.next_connection_id.fetch_add(1, Ordering::Relaxed)
    }

    /// True while the broker accepts connections (recovery done, listener open).
    pub(crate) fn ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Set by the accept loop once it accepts (and cleared when it stops).
    pub(crate) fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }

    /// The state of a broker over `store`, its retained tree, sessions and groups still empty
    /// (recovery fills them, [`crate::engine::restore`]).
    pub(crate) fn new(config: BrokerConfig, store: Persistence) -> Arc<Shared> {
        let started_at = Instant::now();
        Arc::new_cyclic(|weak| Shared {
            config,
            sessions: Registry::default(),
            router: RwLock::new(Router::default()),
            retained: RwLock::new(Retained::default()),
            groups: Groups::default(),
            changed_sessions: ChangedSessions::default(),
            recovered_wills: Mutex::new(Vec::new()),
            metrics: Metrics::default(),
            auth: crate::auth::Auth::default(),
            connect_rate: Default::default(),
            store,
            started_at,
            read_order: Arc::default(),
            keep_alive: Arc::new(KeepAlive::new(started_at)),
            release_hook: crate::engine::retain::release_hook(weak.clone()),
            lingering: Arc::default(),
            next_connection_id: AtomicU64::new(1),
            ready: AtomicBool::new(false),
        })
    }
}
