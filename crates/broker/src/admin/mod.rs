//! What an operator sees and does (the HTTP admin API of the `tern` binary): narrow queries
//! over the broker's state, each returning owned snapshots, and three actions. Nothing here
//! is on a client's path.
//!
//! - [`lists`]: clients, sessions, subscriptions and retained messages, paged.
//! - [`Broker::disconnect_client`], [`Broker::remove_session`], [`Broker::purge_stream`].
//!
//! # Invariants
//! - A query holds the registry lock only to clone the `Arc`s of the sessions (O(n), no
//!   allocation per session beyond the clone), then each session's lock only to read it: a
//!   page never holds two locks at once, so it cannot stall routing for long.
//! - Pages are ordered by their key (client id, then filter; topic for retained messages),
//!   and `after` is the last key of the previous page: paging never skips an entry that
//!   existed through the whole walk.

pub(crate) mod lists;

use std::sync::Arc;

use tern_wire::ReasonCode;

use crate::broker::Broker;
use crate::engine::registry;
use crate::model::Ticket;
use crate::transport::ListenerContext;

use crate::model::{ActionError, StreamStats};
pub use lists::{ClientInfo, RetainedInfo, SessionInfo, SubscriptionInfo};

/// Largest page a list returns, whatever `limit` asks for.
pub const MAX_PAGE_LIMIT: usize = 1_000;

/// One page of a list, and the key to pass as `after` for the next one (`None`: the last).
#[derive(Debug, Clone)]
pub struct Page<T> {
    items: Vec<T>,
    next_after: Option<String>,
}

impl<T> Page<T> {
    /// The entries, in key order.
    pub fn items(&self) -> &[T] {
        &self.items
    }

    /// The key of the last entry when more follow (pass it as `after`); `None` on the last
    /// page.
    pub fn next_after(&self) -> Option<&str> {
        self.next_after.as_deref()
    }
}

impl Broker {
    /// True once the broker serves: recovery is done (it happens in
    /// [`Broker::with_store`]) and [`Broker::serve`] is accepting on its listener.
    pub fn is_ready(&self) -> bool {
        self.shared().ready()
    }

    /// Closes the connection of `client_id` (v5: DISCONNECT 0x98 Administrative action;
    /// 3.1.1: the socket is closed). Its session stays as its expiry says; its will is
    /// published as for any close without DISCONNECT. False if the client is not connected.
    pub fn disconnect_client(&self, client_id: &str) -> bool {
        let Some(session) = self.shared().sessions.get(client_id) else {
            return false;
        };
        let conn = session.state.lock().conn.clone();
        match conn {
            Some(ctl) => {
                ctl.kick(ReasonCode::ADMINISTRATIVE_ACTION);
                tracing::info!(client_id, "client disconnected by an administrator");
                true
            }
            None => false,
        }
    }

    /// Removes the session of `client_id`: its connection, if any, is closed as by
    /// [`Broker::disconnect_client`], its subscriptions and queue go, and its records are
    /// deleted from the store. The returned ticket completes once those deletions are durable
    /// (then the session is gone after a restart too).
    pub fn remove_session(&self, client_id: &str) -> Result<Option<Ticket>, ActionError> {
        let shared = self.shared();
        let Some(session) = shared.sessions.get(client_id) else {
            return Err(ActionError::NotFound {
                what: "session",
                name: client_id.to_string(),
            });
        };
        let conn = session.state.lock().conn.clone();
        if let Some(ctl) = conn {
            ctl.kick(ReasonCode::ADMINISTRATIVE_ACTION);
        }
        // Ended here, not by the closing connection: its detach sees `ended` and keeps away.
        registry::end(shared, &session);
        tracing::info!(client_id, "session removed by an administrator");
        Ok(shared.store.sessions.state_barrier())
    }

    /// Removes every message of the message stream `name` (topics starting with `$` are kept:
    /// they hold the broker's own QoS 2 control records). Sessions whose queues held copies
    /// in memory still deliver them; offline sessions skip what is gone. Returns the number
    /// of records removed.
    pub fn purge_stream(&self, name: &str) -> Result<u64, ActionError> {
        let removed = self.shared().store.admin.purge_stream(name)?;
        tracing::info!(stream = name, removed, "stream purged by an administrator");
        Ok(removed)
    }

    /// Writes a consistent copy of the data directory of the running broker into
    /// `<data dir>/backups/<label>`, a directory that `tern serve --data-dir` opens as the
    /// broker's state at that moment (as after a `kill -9` then). Each stream is copied by its
    /// writer between two group commits (sealed blocks hard-linked, the active block copied:
    /// milliseconds per stream, during which its appends wait); the state streams go first, so
    /// no copied session cursor or QoS 2 record names a message its stream's copy lacks.
    /// Blocking: call it off the async runtime.
    pub fn backup(&self, label: &str) -> Result<std::path::PathBuf, ActionError> {
        let path = self.shared().store.admin.backup(label)?;
        tracing::info!(path = %path.display(), "backup written");
        Ok(path)
    }

    /// Every stream of the store with its numbers (empty for the in-memory store).
    pub fn streams(&self) -> Vec<StreamStats> {
        self.shared().store.admin.stream_stats()
    }

    /// The Prometheus text exposition of the broker's metrics (`listeners`: one sample each of
    /// the connections gauge, labelled with the listener's name, its bind address).
    pub fn metrics_text(&self, listeners: &[Arc<ListenerContext>]) -> String {
        crate::exposition::render(self.shared(), listeners)
    }
}

/// Clamps a requested page size to `1..=MAX_PAGE_LIMIT`.
pub fn page_limit(requested: Option<usize>, default: usize) -> usize {
    requested.unwrap_or(default).clamp(1, MAX_PAGE_LIMIT)
}

/// Sorted page of `items` (by `key`) after `after`, at most `limit` long.
pub fn page<T>(
    mut items: Vec<T>,
    key: impl Fn(&T) -> &str,
    after: Option<&str>,
    limit: usize,
) -> Page<T> {
    if let Some(after) = after {
        items.retain(|item| key(item) > after);
    }
    items.sort_unstable_by(|a, b| key(a).cmp(key(b)));
    let more = items.len() > limit;
    items.truncate(limit);
    let next_after = more
        .then(|| items.last().map(|item| key(item).to_string()))
        .flatten();
    Page { items, next_after }
}

/// Sessions in the registry, cloned out under its lock.
pub(crate) fn all_sessions(broker: &Broker) -> Vec<Arc<crate::state::session::Session>> {
    broker
        .shared()
        .sessions
        .map
        .lock()
        .values()
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_walk_every_key_once_in_order() {
        let keys: Vec<String> = (0..25).rev().map(|i| format!("k{i:02}")).collect();
        let mut after: Option<String> = None;
        let mut seen = Vec::new();
        loop {
            let p = page(keys.clone(), |k| k.as_str(), after.as_deref(), 10);
            seen.extend(p.items);
            match p.next_after {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        let mut expected = keys.clone();
        expected.sort();
        assert_eq!(seen, expected);
    }

    /// `/readyz` is this flag: false before `serve` accepts and again once it stopped.
    #[tokio::test]
    async fn ready_only_while_serving() {
        let broker = Broker::new(crate::BrokerConfig::default()).unwrap();
        assert!(!broker.is_ready(), "recovered but not accepting yet");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let serving = broker.clone();
        let task = tokio::spawn(async move {
            serving
                .serve(listener, async {
                    let _ = stop_rx.await;
                })
                .await
        });
        let mut ready = false;
        for _ in 0..500 {
            ready = broker.is_ready();
            if ready {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(ready, "serving but not ready");
        let _ = stop_tx.send(());
        task.await.unwrap().unwrap();
        assert!(!broker.is_ready(), "stopped but still ready");
    }

    #[test]
    fn limits_are_clamped() {
        assert_eq!(page_limit(Some(0), 100), 1);
        assert_eq!(page_limit(Some(1_000_000), 100), MAX_PAGE_LIMIT);
        assert_eq!(page_limit(None, 100), 100);
    }
}
