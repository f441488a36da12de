//! Timers: session expiry and delayed wills (MQTT 5). Each timer is a task that sleeps, then
//! checks under the locks that nothing changed in the meantime (the session was not resumed:
//! its connection generation is the one the timer was armed for).

use std::sync::Arc;
use std::time::Duration;

use crate::engine::Shared;
use crate::engine::registry;
use crate::model::message::Message;
use crate::state::session::{PendingWill, Session};

/// Ends `session` after `expiry_interval_s` unless a connection re-attached meanwhile.
pub(crate) fn arm(
    shared: Arc<Shared>,
    session: Arc<Session>,
    conn_gen: u64,
    expiry_interval_s: u32,
) {
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(u64::from(expiry_interval_s))).await;
        let still_abandoned = {
            let state = session.state.lock();
            state.conn.is_none() && state.conn_gen == conn_gen && !state.ended
        };
        if still_abandoned {
            tracing::debug!(client_id = %session.client_id, "session expired");
            registry::end(&shared, &session);
        }
    });
}

/// Publishes `will` (named `token` in the store) after `delay` unless the session resumed
/// (which clears the pending will) or ended (which publishes it then). Arms nothing and
/// returns false if connection `conn_gen` no longer owns the session.
pub(crate) fn arm_will(
    shared: Arc<Shared>,
    session: Arc<Session>,
    conn_gen: u64,
    will: Arc<Message>,
    token: u64,
    delay: Duration,
) -> bool {
    {
        let mut state = session.state.lock();
        if state.conn_gen != conn_gen || state.ended {
            return false;
        }
        state.pending_will = Some(Box::new(PendingWill {
            will: will.clone(),
            token,
        }));
    }
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        let due = {
            let mut state = session.state.lock();
            match &state.pending_will {
                Some(pending) if Arc::ptr_eq(&pending.will, &will) => state.pending_will.take(),
                _ => None,
            }
        };
        if let Some(due) = due {
            crate::engine::will::fire(&shared, &session.client_id, due.token, due.will);
        }
    });
    true
}
