//! [`ChangedSessions`]: the persistent sessions whose held messages changed since the
//! checkpointer last looked at them, so that a checkpoint pass costs what changed, not what
//! exists (issue 24 item 5).
//!
//! # Invariants
//! - A persistent session's [`Session::checkpoint_changed`] flag is set, and cleared, only
//!   under its state lock: set by [`ChangedSessions::note`] after a change, cleared by the
//!   checkpointer's visit. While it is set the session is in the list, or the list overflowed
//!   since the last [`ChangedSessions::drain`] (the checkpointer then sweeps every session).
//! - The list holds at most [`MAX_CHANGED_SESSIONS`] client ids.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use super::{Session, SessionState};

/// Most client ids the list holds between two checkpoint passes (16 bytes each: 1 MiB). More
/// changed sessions than this in one pass make the checkpointer sweep all of them instead.
pub(crate) const MAX_CHANGED_SESSIONS: usize = 65_536;

/// Client ids of the persistent sessions changed since their last checkpoint visit.
#[derive(Debug)]
pub(crate) struct ChangedSessions {
    list: Mutex<Vec<Arc<str>>>,
    max_sessions: usize,
    /// A session was flagged but found the list full: it is in no list.
    overflowed: AtomicBool,
}

impl Default for ChangedSessions {
    fn default() -> Self {
        ChangedSessions::with_limit(MAX_CHANGED_SESSIONS)
    }
}

impl ChangedSessions {
    /// A list of at most `max_sessions` client ids.
    pub(crate) fn with_limit(max_sessions: usize) -> Self {
        ChangedSessions {
            list: Mutex::new(Vec::new()),
            max_sessions,
            overflowed: AtomicBool::new(false),
        }
    }

    /// The messages `session` holds (queued or in flight) changed: called under its state
    /// lock (`state` is that lock's guard). Its first change since the checkpointer's last
    /// visit puts it in the list; later ones cost one load. Sessions that end with their
    /// connection have no cursor and are not listed.
    #[inline]
    pub(crate) fn note(&self, session: &Session, state: &SessionState) {
        if state.expiry_interval_s == 0 || session.checkpoint_changed.load(Ordering::Relaxed) {
            return;
        }
        session.checkpoint_changed.store(true, Ordering::Relaxed);
        let mut list = self.list.lock();
        if list.len() < self.max_sessions {
            list.push(session.client_id.clone());
        } else {
            self.overflowed.store(true, Ordering::Release);
        }
    }

    /// Moves the listed client ids into `into`; true if the list overflowed since the last
    /// call (some changed session is in no list: sweep them all).
    pub(crate) fn drain(&self, into: &mut Vec<Arc<str>>) -> bool {
        // The flag first: a session that overflows after this is caught by the next call.
        let overflowed = self.overflowed.swap(false, Ordering::AcqRel);
        into.append(&mut self.list.lock());
        overflowed
    }
}

impl Session {
    /// Called by the checkpointer's visit, under the state lock (`_state` proves it): changes
    /// from here on are announced again.
    pub fn checkpoint_visited(&self, _state: &SessionState) {
        self.checkpoint_changed.store(false, Ordering::Relaxed);
    }

    /// Whether a change was announced since the last [`Session::checkpoint_visited`].
    pub fn checkpoint_pending(&self, _state: &SessionState) -> bool {
        self.checkpoint_changed.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use tern_wire::Protocol;

    use super::*;

    #[test]
    fn a_session_is_listed_once_until_visited_and_overflow_is_reported() {
        let changed = ChangedSessions::with_limit(1);
        let a = Session::new("a".into(), Protocol::V5, 60);
        let b = Session::new("b".into(), Protocol::V5, 60);
        let gone = Session::new("gone".into(), Protocol::V5, 0);
        {
            let state = a.state.lock();
            changed.note(&a, &state);
            changed.note(&a, &state);
        }
        changed.note(&gone, &gone.state.lock());
        changed.note(&b, &b.state.lock());
        let mut ids = Vec::new();
        assert!(changed.drain(&mut ids), "b found the list full");
        assert_eq!(ids, vec![Arc::<str>::from("a")]);
        // Not visited yet: a's next change costs nothing and lists nothing.
        changed.note(&a, &a.state.lock());
        ids.clear();
        assert!(!changed.drain(&mut ids));
        assert!(ids.is_empty());
        {
            let state = a.state.lock();
            a.checkpoint_visited(&state);
            changed.note(&a, &state);
        }
        assert!(!changed.drain(&mut ids));
        assert_eq!(ids, vec![Arc::<str>::from("a")]);
    }
}
