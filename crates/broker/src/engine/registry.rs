//! Sessions by client id: attach a connection (creating, resuming or replacing the session,
//! taking over a live connection), detach it, end a session.
//!
//! # Invariants
//! - The registry lock is held for the whole of attach and end, so a takeover, an expiry timer
//!   and a reconnect are serialised per broker.
//! - A session's subscriptions are removed from the router only by the party that removed the
//!   same session (pointer-equal) from the registry, so a newer session under the same client
//!   id never loses its subscriptions.

use std::sync::Arc;

use tern_wire::{ConnAck, Packet, Protocol, ReasonCode};

use crate::engine::Shared;
use crate::engine::groups;
use crate::metrics::Metrics;
use crate::state::outbound::encode_packet;
use crate::state::session::{ConnCtl, Session};

/// A connection attached to its session.
pub(crate) struct Attached {
    pub(crate) session: Arc<Session>,
    pub(crate) conn_gen: u64,
    pub(crate) ctl: Arc<ConnCtl>,
    /// The persistent session's record: the CONNACK leaves once it is durable.
    pub(crate) durable: Option<crate::model::Ticket>,
}

/// What the new connection asks for.
pub(crate) struct AttachRequest<'a> {
    pub(crate) client_id: &'a Arc<str>,
    /// The connection's username (the ACL's `user` and `%u` for deliveries).
    pub(crate) username: Option<Arc<str>>,
    pub(crate) protocol: Protocol,
    pub(crate) clean_start: bool,
    pub(crate) expiry_interval_s: u32,
    /// min(client Receive Maximum, max_inflight_messages).
    pub(crate) window: u16,
    /// Sent first on the new connection, before anything the session holds; its
    /// `session_present` is filled in here.
    pub(crate) connack: ConnAck,
}

pub(crate) fn attach(shared: &Arc<Shared>, request: AttachRequest<'_>) -> Attached {
    let mut sessions = shared.sessions.map.lock();
    let existing = sessions.get(request.client_id).cloned();
    let mut replaced = None;
    let (session, session_present) = match existing {
        Some(old) => {
            let old_conn = old.state.lock().conn.clone();
            if let Some(conn) = old_conn {
                // MQTT-3.1.4-3: the existing connection is closed (v5: DISCONNECT 0x8E).
                conn.kick(ReasonCode::SESSION_TAKEN_OVER);
            }
            // A session with expiry 0 ends with its connection (MQTT-3.1.2-23), even when
            // that connection has not finished closing yet.
            let ends_with_connection = old.state.lock().expiry_interval_s == 0;
            if request.clean_start || ends_with_connection {
                replaced = Some(old);
                (
                    Session::new(
                        request.client_id.clone(),
                        request.protocol,
                        request.expiry_interval_s,
                    ),
                    false,
                )
            } else {
                (old, true)
            }
        }
        None => (
            Session::new(
                request.client_id.clone(),
                request.protocol,
                request.expiry_interval_s,
            ),
            false,
        ),
    };
    if let Some(old) = replaced {
        sessions.remove(request.client_id);
        end_removed(shared, &old);
    }
    sessions.insert(request.client_id.clone(), session.clone());
    let ctl = Arc::new(ConnCtl::default());
    let (client_id, protocol, expiry_interval_s) = (
        request.client_id,
        request.protocol,
        request.expiry_interval_s,
    );
    let conn_gen = take_over(shared, &session, &ctl, request, session_present);
    session.set_online(true);
    drop(sessions);
    let durable = if expiry_interval_s > 0 {
        // Persistent: the CONNACK leaves once the session record is durable.
        shared.store.sessions.session_opened(
            client_id,
            protocol,
            expiry_interval_s,
            !session_present,
        )
    } else {
        None
    };
    // Messages that waited for a member of its share groups (behind the CONNACK and what the
    // session holds).
    groups::flush_member(shared, &session);
    Attached {
        session,
        conn_gen,
        ctl,
        durable,
    }
}

/// The new connection takes the session's state: the next connection generation (returned),
/// its terms, its window, and the CONNACK queued ahead of anything the session holds.
fn take_over(
    shared: &Shared,
    session: &Session,
    ctl: &Arc<ConnCtl>,
    request: AttachRequest<'_>,
    session_present: bool,
) -> u64 {
    let mut state = session.state.lock();
    state.conn_gen += 1;
    state.conn = Some(ctl.clone());
    state.protocol = request.protocol;
    state.username = request.username;
    state.expiry_interval_s = request.expiry_interval_s;
    // A reconnect within the will delay cancels the will (MQTT-3.1.3-9).
    state.pending_will = None;
    state.out.count_into(shared.metrics.queued.clone());
    state.out.attach(request.window);
    shared.changed_sessions.note(session, &state);
    let mut connack = request.connack;
    connack.session_present = session_present;
    let mut scratch = bytes::BytesMut::new();
    if let Some(bytes) = encode_packet(&Packet::ConnAck(connack), request.protocol, &mut scratch) {
        state.out.push_control_first(bytes);
    }
    state.conn_gen
}

/// The connection `conn_gen` of `session` closed. Ends the session if its expiry is 0,
/// otherwise arms its expiry timer. Messages it held through share groups go to other online
/// members, or back to their group ([`groups::redistribute`]).
pub(crate) fn detach(shared: &Arc<Shared>, session: &Arc<Session>, conn_gen: u64) {
    let expiry_interval_s = {
        let mut state = session.state.lock();
        if state.conn_gen != conn_gen || state.ended {
            return; // taken over: the session belongs to a newer connection
        }
        state.conn = None;
        session.set_online(false);
        state.out.detach();
        shared.changed_sessions.note(session, &state);
        state.expiry_interval_s
    };
    groups::redistribute(shared, session);
    if expiry_interval_s == 0 {
        end(shared, session);
    } else if expiry_interval_s != u32::MAX {
        // The expiry (as set by CONNECT or DISCONNECT) counts from now, across restarts too.
        shared
            .store
            .sessions
            .session_closed(&session.client_id, expiry_interval_s);
        crate::engine::expiry::arm(shared.clone(), session.clone(), conn_gen, expiry_interval_s);
    }
}

/// Ends `session` if it is still the registered one for its client id.
pub(crate) fn end(shared: &Arc<Shared>, session: &Arc<Session>) {
    let mut sessions = shared.sessions.map.lock();
    let registered = sessions
        .get(&session.client_id)
        .is_some_and(|s| Arc::ptr_eq(s, session));
    if !registered {
        return;
    }
    sessions.remove(&session.client_id);
    end_removed(shared, session);
}

/// Ends a session already removed from the registry (registry lock held by the caller).
fn end_removed(shared: &Arc<Shared>, session: &Arc<Session>) {
    // `ended` first: a SUBSCRIBE racing with this checks it under the router lock, so either
    // it sees `ended` and backs off, or its entry is in the trie before we sweep it below.
    let (will, shares) = {
        let mut state = session.state.lock();
        state.ended = true;
        let shares: Vec<Arc<str>> = state
            .subscriptions
            .keys()
            .filter(|f| f.starts_with(tern_topic::SHARE_PREFIX))
            .map(|f| Arc::from(&**f))
            .collect();
        state.subscriptions.clear();
        state.out = Default::default();
        (state.pending_will.take(), shares)
    };
    let removed = shared.router.write().remove_session(&session.client_id);
    Metrics::sub(&shared.metrics.subscriptions, removed as u64);
    shared.store.sessions.session_ended(&session.client_id);
    groups::forget_if_orphaned(shared, &shares);
    // MQTT-3.1.3-9: a delayed will is sent when the session ends, if not sent before.
    if let Some(will) = will {
        crate::engine::will::fire(shared, &session.client_id, will.token, will.will);
    }
}

/// What [`subscribe`] did.
#[derive(Debug)]
pub(crate) enum Subscribed {
    /// A new subscription of the session.
    New,
    /// It replaced the session's subscription to the same filter.
    Replaced,
    /// The session ended meanwhile (a clean-start takeover replaced it): nothing was done.
    Ended,
    /// The trie refused it (a limit).
    Refused(tern_topic::SubscribeError),
}

/// Routes `session`'s subscription to `filter` and records it in the session's table: the
/// one bookkeeping of a subscription, for a SUBSCRIBE and for a session restored at start-up
/// (the subscriptions gauge, the table, the per-session count). The router's lock is taken
/// first (the lock order), and an ended session is never routed to again.
pub(crate) fn subscribe(
    shared: &Shared,
    session: &Arc<Session>,
    kind: tern_topic::FilterKind<'_>,
    filter: &str,
    record: crate::model::SubRecord,
) -> Subscribed {
    let result = {
        let mut router = shared.router.write();
        if session.state.lock().ended {
            return Subscribed::Ended;
        }
        router.subscribe(kind, session, record)
    };
    let replaced = match result {
        Ok(replaced) => replaced,
        Err(error) => return Subscribed::Refused(error),
    };
    if !replaced {
        Metrics::add(&shared.metrics.subscriptions, 1);
    }
    let mut state = session.state.lock();
    state.subscriptions.insert(filter.into(), record);
    session.recount_subscriptions(&state);
    if replaced {
        Subscribed::Replaced
    } else {
        Subscribed::New
    }
}
