//! Sessions by client id. Attaching, detaching and ending sessions take several locks and are
//! the engine's ([`crate::engine::registry`]).

use std::sync::Arc;

use parking_lot::Mutex;

use crate::hash::Map;
use crate::state::session::Session;

#[derive(Debug, Default)]
pub struct Registry {
    pub(crate) map: Mutex<Map<Arc<str>, Arc<Session>>>,
}

impl Registry {
    pub(crate) fn len(&self) -> usize {
        self.map.lock().len()
    }

    /// Tells every connected session's connection that the server shuts down.
    pub(crate) fn shut_down_connections(&self) {
        for session in self.map.lock().values() {
            if let Some(ctl) = &session.state.lock().conn {
                ctl.shut_down();
            }
        }
    }

    pub fn get(&self, client_id: &str) -> Option<Arc<Session>> {
        self.map.lock().get(client_id).cloned()
    }

    /// True if a connection with `client_id` would need a new session and `max_sessions`
    /// (`[limits]`, a backstop against unbounded growth from ever-new client ids) are taken.
    pub(crate) fn is_full_for(&self, client_id: &str, max_sessions: usize) -> bool {
        let map = self.map.lock();
        map.len() >= max_sessions && !map.contains_key(client_id)
    }
}
