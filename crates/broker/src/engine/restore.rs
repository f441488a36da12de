//! Rebuilds sessions, share-group queues and retained messages from what the store recovered.
//! Restored sessions are offline; their in-flight messages are resent when the client
//! reconnects, and a group's queue goes to its members as they connect. Recovered wills are
//! kept for [`crate::engine::will::arm_recovered`] (which needs a runtime).

use std::sync::Arc;

use tern_wire::QoS;
use tokio::time::Instant;

use crate::engine::Shared;
use crate::engine::registry::{Subscribed, subscribe};
use crate::model::SubRecord;
use crate::model::{Recovered, StoredSession};
use crate::state::outbound::{Inflight, Outgoing, Phase};
use crate::state::session::Session;

pub(crate) fn restore(shared: &Shared, recovered: Recovered) {
    for message in recovered.retained {
        shared
            .retained
            .write()
            .set(&Arc::new(message), shared.config.max_retained_messages);
    }
    for stored in recovered.sessions {
        restore_session(shared, stored);
    }
    // After the sessions: a group's queue lives while its members' subscriptions do.
    for group in recovered.groups {
        crate::engine::groups::restore(shared, &group.share, group.queued);
    }
    *shared.recovered_wills.lock() = recovered.wills;
}

fn restore_session(shared: &Shared, stored: StoredSession) {
    let client_id: Arc<str> = stored.client_id.as_str().into();
    let session = Session::new(client_id.clone(), stored.protocol, stored.expiry_interval_s);
    for (filter, options, subscription_id) in stored.subscriptions {
        let Ok(kind) = tern_topic::classify_filter(&filter) else {
            tracing::warn!(%client_id, %filter, "stored subscription has an invalid filter; skipped");
            continue;
        };
        let record = SubRecord {
            options,
            subscription_id,
        };
        if let Subscribed::Refused(error) = subscribe(shared, &session, kind, &filter, record) {
            tracing::warn!(%client_id, %filter, %error, "stored subscription refused; skipped");
        }
    }
    let now = Instant::now();
    let mut state = session.state.lock();
    state.out.count_into(shared.metrics.queued.clone());
    if !crate::inject::on(crate::inject::Bug::IgnoreReceivedSetAfterRestart) {
        state.qos2_received.extend(stored.qos2_received);
    }
    for inflight in stored.inflight {
        state.out.restore_inflight(Inflight {
            packet_id: inflight.packet_id,
            item: Outgoing {
                message: inflight.message,
                qos: inflight.qos,
                retain: false,
                subscription_ids: Vec::new(),
                share: None,
            },
            phase: if inflight.pubrel_pending {
                Phase::PubRelPending
            } else {
                Phase::AwaitingAck
            },
            needs_send: true,
            held: false,
        });
    }
    for (message, qos) in stored.queued {
        if qos == QoS::AtMostOnce {
            continue; // never kept for an offline session
        }
        let item = Outgoing {
            message,
            qos,
            retain: false,
            subscription_ids: Vec::new(),
            share: None,
        };
        // The same limits as at run time: over `max_queued_messages` / `max_queued_bytes` (or
        // the broker-wide total, which only drops QoS 0) the oldest are dropped, counted.
        state.out.push(item, false, &shared.config, now);
    }
    shared.changed_sessions.note(&session, &state);
    let dropped = state.out.dropped_oldest + stored.dropped_queue_limit;
    drop(state);
    if dropped > 0 {
        shared.metrics.dropped_at_queue_limit(dropped);
        tracing::warn!(
            %client_id,
            dropped,
            "session queue limit (max_queued_messages / max_queued_bytes) at start-up; oldest stored messages dropped"
        );
    }
    shared.sessions.map.lock().insert(client_id, session);
}

/// Arms the expiry timer of every restored (offline) session with a finite expiry. Called from
/// `serve`, where a runtime exists.
pub(crate) fn arm_expiry(shared: &Arc<Shared>) {
    let sessions: Vec<Arc<Session>> = shared.sessions.map.lock().values().cloned().collect();
    for session in sessions {
        let (offline, conn_gen, expiry_s) = {
            let state = session.state.lock();
            (
                state.conn.is_none(),
                state.conn_gen,
                state.expiry_interval_s,
            )
        };
        if offline && expiry_s != u32::MAX {
            crate::engine::expiry::arm(shared.clone(), session, conn_gen, expiry_s);
        }
    }
}
