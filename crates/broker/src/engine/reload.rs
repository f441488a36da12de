//! After a reload of the password file and the ACL (SIGHUP, `Auth::replace`), the new rules
//! reach what the old ones let in (issue 24 item 2):
//! - deliveries already queued for a session are checked against the new ACL and those the
//!   session may no longer read are dropped (counted as ACL delivery denials): before, they
//!   were delivered because the ACL is checked when a message is queued;
//! - a connected client whose username and password the new password file no longer accepts
//!   (its password changed, or its user is gone) is disconnected with 0x87 (Not authorized),
//!   as mosquitto does.
//!
//! After a reload of the listeners' TLS files, a connected client whose certificate its
//! listener would now refuse (revoked by a reloaded CRL, no longer under the client CA, or
//! expired since it connected) is disconnected with 0x87 as well: a revoked key is cut off at
//! the reload, not at its holder's next connection. mosquitto keeps such connections.
//!
//! In-flight deliveries are left to finish (MQTT-4.4.0-1: the client may hold them already).

use std::sync::Arc;

use tern_wire::ReasonCode;

use crate::auth::{Access, Verdict, Who};
use crate::engine::Shared;
use crate::metrics::Metrics;
use crate::state::session::{ConnCtl, Proof, Session};

/// Applies the reloaded rules to queued deliveries and connected clients. Returns how many
/// deliveries were dropped and how many clients were disconnected.
pub(crate) async fn after_auth_reload(shared: Arc<Shared>) -> (usize, usize) {
    let sessions: Vec<Arc<Session>> = shared.sessions.map.lock().values().cloned().collect();
    let dropped = drop_unreadable_queued(&shared, &sessions);
    let kicked = recheck_credentials(&shared, &sessions).await;
    if dropped > 0 || kicked > 0 {
        tracing::info!(
            dropped,
            disconnected = kicked,
            "reloaded rules applied to queued messages and connected clients"
        );
    }
    (dropped, kicked)
}

/// Drops queued deliveries the new ACL keeps from their session (read access on the
/// message's topic, as a delivery is checked when queued, `route::deliver_with`).
fn drop_unreadable_queued(shared: &Shared, sessions: &[Arc<Session>]) -> usize {
    let Some(acl) = shared.auth.acl() else {
        return 0;
    };
    let mut dropped = 0;
    for session in sessions {
        let mut state = session.state.lock();
        let username = state.username.clone();
        let who = Who {
            username: username.as_deref(),
            client_id: &session.client_id,
        };
        dropped += state
            .out
            .drop_queued_where(|item| !acl.allows(who, &item.message.topic, Access::Read));
        shared.changed_sessions.note(session, &state);
    }
    if dropped > 0 {
        Metrics::add(&shared.metrics.acl_denied_deliver, dropped as u64);
    }
    dropped
}

/// Checks the credentials of every connected password-file client against the new file
/// (through the same bounded pool of password checks as a CONNECT); those refused now are
/// kicked with 0x87.
async fn recheck_credentials(shared: &Shared, sessions: &[Arc<Session>]) -> usize {
    if shared.auth.rules().passwords.is_none() {
        return 0;
    }
    let connected: Vec<(Arc<ConnCtl>, Arc<Proof>)> = connected_with_proof(sessions);
    let mut kicked = 0;
    for (ctl, proof) in connected {
        let Some(credentials) = &proof.credentials else {
            continue;
        };
        let verdict = shared
            .auth
            .authenticate(
                Some(&credentials.username),
                Some(credentials.password()),
                None,
            )
            .await;
        if verdict != Verdict::Allowed && ctl.kick(ReasonCode::NOT_AUTHORIZED) {
            kicked += 1;
            tracing::warn!(
                username = &*credentials.username,
                "credentials refused by the reloaded password file; client disconnected"
            );
        }
    }
    kicked
}

/// The connected clients that proved something when they connected (in this process: a
/// client of a previous leader's broker is not here).
fn connected_with_proof(sessions: &[Arc<Session>]) -> Vec<(Arc<ConnCtl>, Arc<Proof>)> {
    sessions
        .iter()
        .filter_map(|session| {
            let ctl = session.state.lock().conn.clone()?;
            let proof = ctl.info()?.proof.clone()?;
            Some((ctl, proof))
        })
        .collect()
}

/// Checks every connected client's certificate against its listener's verification as it
/// stands after a TLS reload; those refused now are kicked with 0x87. Returns how many.
pub(crate) fn after_tls_reload(shared: &Shared) -> usize {
    let sessions: Vec<Arc<Session>> = shared.sessions.map.lock().values().cloned().collect();
    let mut kicked = 0;
    for (ctl, proof) in connected_with_proof(&sessions) {
        let Some(certificate) = &proof.certificate else {
            continue;
        };
        if !certificate.still_valid() && ctl.kick(ReasonCode::NOT_AUTHORIZED) {
            kicked += 1;
            let peer = ctl.info().map(|i| i.peer);
            tracing::warn!(
                ?peer,
                "client certificate refused by the reloaded TLS files; client disconnected"
            );
        }
    }
    if kicked > 0 {
        tracing::info!(
            disconnected = kicked,
            "reloaded TLS files applied to connected clients"
        );
    }
    kicked
}
