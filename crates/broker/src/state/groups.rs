//! Share-group queues (MQTT 5 §4.8.2): messages waiting for a member of a group to come
//! online. What moves messages in and out of them is the engine's ([`crate::engine::groups`]).

use std::sync::Arc;

use parking_lot::Mutex;

use crate::hash::Map;
use crate::state::outbound::Outbound;

/// The queues of share groups that have messages waiting for a member, by
/// `$share/{group}/{filter}`.
#[derive(Debug, Default)]
pub(crate) struct Groups {
    pub(crate) map: Mutex<Map<Arc<str>, Outbound>>,
}

impl Groups {
    /// Messages waiting in `share`'s queue.
    #[cfg(test)]
    pub(crate) fn queued(&self, share: &str) -> usize {
        self.map.lock().get(share).map_or(0, |q| q.queued_len())
    }
}
