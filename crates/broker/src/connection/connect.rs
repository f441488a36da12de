//! The CONNECT handshake: read the first packet within `connect_timeout_ms`, validate it,
//! answer with CONNACK (both versions), attach the session.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::BytesMut;
use tern_wire::{
    ConnAck, Connect, DecodeError, Packet, Properties, Protocol, ReasonCode, Str, decode,
};
use tokio::sync::watch;
use tokio::time::Instant;

use super::peek::{connect_is_v5_shaped, peek_connect_level};
use super::strict::{self, TopicRefusal};
use super::terms::{Terms, negotiate};
use super::{Conn, read::read_some};
use crate::auth::{Access, AclView, Verdict, Who};
use crate::engine::Shared;
use crate::engine::registry::{self, AttachRequest, Attached};
use crate::metrics::Metrics;
use crate::model::Ticket;
use crate::read_order::ReadSlot;
use crate::state::outbound::{WriterState, encode_packet};
use crate::state::session::{ConnCtl, ConnInfo, Credentials, Proof};
use crate::state::topic_alias::InboundAliases;
use crate::transport::{
    ClientCertificate, ConnectionInfo, ListenerContext, TransportRead, TransportWrite,
};

pub(super) async fn handshake<R: TransportRead, W: TransportWrite<Io = R>>(
    shared: &Arc<Shared>,
    reader: &mut R,
    mut writer: W,
    buf: &mut BytesMut,
    stop: &mut watch::Receiver<bool>,
    mut info: ConnectionInfo,
) -> Result<Accepted<W>, Refused> {
    let config = &shared.config;
    // Only what the CONNECT needs of `info` is kept across the reads below.
    let info_peer = info.peer;
    let allow_anonymous = info.listener.allow_anonymous;
    let listener = info.listener.clone();
    let certificate = info.client_cert.take();
    let identity = identity_username(info);
    let deadline = Instant::now() + config.connect_timeout();
    let mut connect = loop {
        match decode(buf, Protocol::V3_1_1, config.max_packet_size_bytes) {
            Ok(Some(Packet::Connect(connect))) => break connect,
            // MQTT-3.1.0-1: the first packet must be CONNECT.
            Ok(Some(_)) => return Err(Refused::Dropped),
            Ok(None) => {}
            Err(error) => {
                tracing::debug!(%error, "bad CONNECT");
                if error == DecodeError::InvalidProtocolName {
                    // MQTT-3.1.2-1: not MQTT at all: closed without a CONNACK.
                    return Err(Refused::Dropped);
                } else if let DecodeError::UnsupportedProtocolVersion { level } = error {
                    // MQTT-3.1.2-2: return code 1 in the 3.1.1 format, then close; a CONNECT
                    // laid out as a v5 one (of a later level) gets the v5 form, 0x84.
                    let form = if level > Protocol::V5.level() && connect_is_v5_shaped(buf) {
                        Protocol::V5
                    } else {
                        Protocol::V3_1_1
                    };
                    return Err(
                        Box::pin(reject(&mut writer, reader, form, error.reason_code())).await,
                    );
                } else if peek_connect_level(buf) == Some(Protocol::V5.level()) {
                    // MQTT 5 §3.2.2.2: a bad v5 CONNECT may get a CONNACK with the reason.
                    let reason = error.reason_code();
                    return Err(Box::pin(reject(&mut writer, reader, Protocol::V5, reason)).await);
                }
                return Err(Refused::Dropped);
            }
        }
        tokio::select! {
            biased;
            read = tokio::time::timeout_at(deadline, read_some(reader, buf)) => match read {
                Ok(Ok(n)) if n > 0 => Metrics::add(&shared.metrics.bytes_received, n as u64),
                _ => return Err(Refused::Dropped),
            },
            _ = stop.changed() => return Err(Refused::Dropped),
        }
    };
    // The CONNECT stays boxed until `accept` takes it: inline it would grow this future, which
    // every connection allocates (measured in release: +1.1 KiB).
    let by_certificate = identity.is_some();
    if let Some(username) = identity {
        if let Err(reason) = use_identity(username, &mut connect) {
            let protocol = connect.protocol;
            drop(connect);
            return Err(Box::pin(reject(&mut writer, reader, protocol, reason)).await);
        }
    }
    let client = Client {
        peer: info_peer,
        allow_anonymous,
        by_certificate,
        listener,
        certificate,
    };
    accept(shared, *connect, writer, reader, client).await
}

/// `Some` when the listener has `use_identity_as_username` and TLS: the client certificate's
/// CN, if it sent one.
fn identity_username(info: ConnectionInfo) -> Option<Option<Arc<str>>> {
    (info.listener.use_identity_as_username && info.listener.tls).then_some(info.peer_cn)
}

/// `use_identity_as_username`: the client certificate's CN replaces the CONNECT's username and
/// its password is dropped, as mosquitto does. No certificate (or no CN) is a bad username or
/// password (3.1.1 rc 4, v5 0x86).
fn use_identity(cn: Option<Arc<str>>, connect: &mut Connect) -> Result<(), ReasonCode> {
    let cn = cn.ok_or(ReasonCode::BAD_USER_NAME_OR_PASSWORD)?;
    let username = Str::copy_from(&cn).map_err(|_| ReasonCode::BAD_USER_NAME_OR_PASSWORD)?;
    connect.username = Some(username);
    connect.password = None;
    Ok(())
}

/// One of the `max_connections` places, held by a connection from its accepted CONNECT until
/// it is dropped (with the connection).
pub(crate) struct ConnectionSlot {
    shared: Arc<Shared>,
    /// Its listener, whose connected count it holds one of too.
    listener: Arc<ListenerContext>,
}

impl ConnectionSlot {
    /// Takes a place, unless `max_connections` are taken and `client_id` is not connected:
    /// a takeover replaces a connection (the old one leaves as the new one arrives), so it
    /// is never refused by the limit.
    fn take(
        shared: &Arc<Shared>,
        listener: Arc<ListenerContext>,
        client_id: &str,
    ) -> Option<ConnectionSlot> {
        let live = &shared.metrics.connections;
        let n = live.fetch_add(1, Ordering::Relaxed) + 1;
        listener.count_connected(true);
        let slot = ConnectionSlot {
            shared: shared.clone(),
            listener,
        };
        if n <= shared.config.max_connections {
            return Some(slot);
        }
        let takeover = !client_id.is_empty()
            && shared
                .sessions
                .get(client_id)
                .is_some_and(|s| s.is_online());
        takeover.then_some(slot)
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.shared
            .metrics
            .connections
            .fetch_sub(1, Ordering::Relaxed);
        self.listener.count_connected(false);
    }
}

/// What a successful handshake hands the connection: the writing half, the writer's state and
/// the records the CONNACK waits for.
pub(super) type Accepted<W> = (Conn, (W, WriterState, Option<Ticket>));

/// How a handshake that accepted no connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refused {
    /// Nothing was said (not MQTT, no CONNECT in time, the server stopping): the socket is
    /// dropped.
    Dropped,
    /// A refusing CONNACK was written (or, for a malformed 3.1.1 CONNECT, the writing side shut
    /// down): the socket lingers so that the client reads it (`linger`).
    Answered,
}

/// Writes the refusing CONNACK and shuts the writing side down. Boxed by its callers: rare, and
/// inline it would grow the handshake every connection makes.
async fn reject<W: TransportWrite>(
    writer: &mut W,
    io: &mut W::Io,
    protocol: Protocol,
    reason: ReasonCode,
) -> Refused {
    let connack = Packet::ConnAck(ConnAck {
        session_present: false,
        reason,
        properties: Properties::default(),
    });
    let mut scratch = BytesMut::new();
    if let Some(bytes) = encode_packet(&connack, protocol, &mut scratch) {
        if writer.write_parts(io, &mut vec![bytes]).await.is_err() {
            return Refused::Dropped;
        }
    }
    match writer.shutdown(io).await {
        Ok(()) => Refused::Answered,
        Err(_) => Refused::Dropped,
    }
}

/// The reason a CONNECT is refused, if it is.
fn check(shared: &Shared, connect: &Connect) -> Result<(), ReasonCode> {
    let v5 = connect.protocol.is_v5();
    if v5 && connect.properties.authentication_method.is_some() {
        // No enhanced authentication methods are supported.
        return Err(ReasonCode::BAD_AUTHENTICATION_METHOD);
    }
    if connect.client_id.is_empty() && !connect.clean_start && !v5 {
        // MQTT-3.1.3-8: empty id with clean session 0 → identifier rejected (code 2).
        return Err(ReasonCode::CLIENT_IDENTIFIER_NOT_VALID);
    }
    if connect.client_id.len() > shared.config.max_client_id_len {
        return Err(ReasonCode::CLIENT_IDENTIFIER_NOT_VALID);
    }
    if connect.protocol == Protocol::V3_1 && !(1..=23).contains(&connect.client_id.chars().count())
    {
        // MQTT 3.1 §3.1: a client identifier of 1 to 23 characters, else return code 2.
        return Err(ReasonCode::CLIENT_IDENTIFIER_NOT_VALID);
    }
    let config = &shared.config;
    let username_ok = connect
        .username
        .as_deref()
        .is_none_or(|u| strict::string_ok(config, u));
    if !strict::string_ok(config, &connect.client_id) || !username_ok {
        Metrics::add(&shared.metrics.control_chars_refused, 1);
        return Err(ReasonCode::MALFORMED_PACKET);
    }
    if let Some(will) = &connect.will {
        if tern_topic::validate_topic_name(&will.topic).is_err() {
            return Err(ReasonCode::TOPIC_NAME_INVALID);
        }
        match strict::check_topic(config, &will.topic) {
            Ok(()) => {}
            Err(TopicRefusal::ControlChar) => {
                Metrics::add(&shared.metrics.control_chars_refused, 1);
                return Err(ReasonCode::MALFORMED_PACKET);
            }
            Err(TopicRefusal::Limit) => {
                Metrics::add(&shared.metrics.topics_refused_limit, 1);
                return Err(ReasonCode::TOPIC_NAME_INVALID);
            }
        }
        if let Some(response) = &will.properties.response_topic
            && tern_topic::validate_topic_name(response).is_err()
        {
            // v5 §3.1.3.2: the will's Response Topic is a Topic Name (no wildcards).
            return Err(ReasonCode::PROTOCOL_ERROR);
        }
        if v5
            && will.properties.payload_format_indicator == Some(1)
            && std::str::from_utf8(&will.payload).is_err()
        {
            return Err(ReasonCode::PAYLOAD_FORMAT_INVALID);
        }
    }
    Ok(())
}

/// Who is connecting, as far as the checks before the session need it.
struct Client {
    peer: std::net::SocketAddr,
    /// The listener's `allow_anonymous`; `None` = the `[auth]` setting.
    allow_anonymous: Option<bool>,
    /// The username is the client certificate's CN (`use_identity_as_username`).
    by_certificate: bool,
    listener: Arc<ListenerContext>,
    /// The client certificate the listener's TLS verified, if one was sent.
    certificate: Option<ClientCertificate>,
}

/// `max_connect_rate_per_ip`: takes a token of `peer`'s bucket, or counts and logs the refusal.
fn admit_rate(shared: &Shared, peer: IpAddr, client_id: &str) -> bool {
    let config = &shared.config;
    let now = Instant::now();
    let rate = config.max_connect_rate_per_ip;
    if shared
        .connect_rate
        .admit(peer, rate, config.connect_rate_burst, now)
    {
        return true;
    }
    let n = Metrics::add_get(&shared.metrics.connections_refused_rate, 1);
    if n.is_power_of_two() {
        tracing::warn!(%peer, client_id, limit = rate, count = n, "max_connect_rate_per_ip: CONNECT refused");
    }
    false
}

/// The credentials a password file accepted, kept with the connection so that a reload of
/// the file checks them again (`engine::reload`); `None` where no file decided (no file, no
/// username, or the username is the client certificate's).
fn checked_credentials(
    shared: &Shared,
    client: &Client,
    username: Option<&Arc<str>>,
    password: Option<&bytes::Bytes>,
) -> Option<Credentials> {
    let username = username?;
    if client.by_certificate || shared.auth.rules().passwords.is_none() {
        return None;
    }
    let password = password.map_or(&[][..], |p| &p[..]);
    Some(Credentials::new(username.clone(), password))
}

/// The credentials (password file) and the will's topic (ACL, write access), checked before
/// anything else is taken for the connection. Refusals are counted and logged (rate-limited).
async fn authorize(
    shared: &Shared,
    connect: &Connect,
    username: Option<&str>,
    client: &Client,
) -> Result<(), ReasonCode> {
    // A username taken from the client certificate (`use_identity_as_username`) is the
    // authentication: the password file is not consulted, as in mosquitto.
    let verdict = if client.by_certificate {
        Verdict::Allowed
    } else {
        shared
            .auth
            .authenticate(
                username,
                connect.password.as_deref(),
                client.allow_anonymous,
            )
            .await
    };
    let reason = match verdict {
        Verdict::Allowed => None,
        // MQTT-3.1.4-2 / §3.2.2.2: v5 0x86, 3.1.1 return code 4.
        Verdict::BadCredentials => Some(ReasonCode::BAD_USER_NAME_OR_PASSWORD),
        // v5 0x87, 3.1.1 return code 5.
        Verdict::NotAuthorized => Some(ReasonCode::NOT_AUTHORIZED),
    };
    if let Some(reason) = reason {
        let n = Metrics::add_get(&shared.metrics.auth_failures, 1);
        if n.is_power_of_two() {
            tracing::warn!(client_id = %connect.client_id, username, ?verdict, count = n, "CONNECT refused");
        }
        return Err(reason);
    }
    if let (Some(will), Some(acl)) = (&connect.will, shared.auth.acl()) {
        let who = Who {
            username,
            client_id: &connect.client_id,
        };
        if !acl.allows(who, &will.topic, Access::Write) {
            // mosquitto refuses the CONNECT of a will it would not let the client publish.
            Metrics::add(&shared.metrics.acl_denied_publish, 1);
            return Err(ReasonCode::NOT_AUTHORIZED);
        }
    }
    Ok(())
}

async fn accept<W: TransportWrite>(
    shared: &Arc<Shared>,
    connect: Connect,
    mut writer: W,
    reader: &mut W::Io,
    client: Client,
) -> Result<Accepted<W>, Refused> {
    let protocol = connect.protocol;
    let (username, slot) = match admit(shared, &connect, &client).await {
        Ok(admitted) => admitted,
        Err(reason) => return Err(refuse(&mut writer, reader, protocol, reason).await),
    };
    let mut terms = negotiate(shared, &connect);
    // Before the read slot takes its ticket: no ticket may be held across this wait.
    super::close::await_predecessor(shared, &terms.client_id).await;
    // Before the CONNACK is queued: what the client sends once it has it is ordered from here.
    let read_slot = ReadSlot::new(shared.read_order.clone());
    let attached = attach(shared, &connect, &mut terms, username.clone());
    let will = connect.will.map(crate::engine::will::keep);
    // Replaces (or, without a will, deletes) the stored will of an earlier connection.
    let (will_token, will_written) =
        crate::engine::will::record(shared, &terms.client_id, will.as_deref());
    // The CONNACK (queued first) leaves once the session's and the will's records are durable
    // (`connection::outflow::Outflow`), as a SUBACK waits for its subscription's.
    let connack_after = Ticket::join(attached.durable, will_written);
    attached.ctl.set_info(ConnInfo {
        peer: client.peer,
        keep_alive_s: terms.keep_alive_s,
        connected_at_unix_ms: ConnInfo::unix_ms(std::time::SystemTime::now()),
        proof: Proof::new(
            checked_credentials(
                shared,
                &client,
                username.as_ref(),
                connect.password.as_ref(),
            ),
            client.certificate,
        ),
    });
    recheck_certificate(&attached.ctl);
    // At most 65,535 s × 1.5: fits a u32 of milliseconds.
    let keep_alive_ms = u32::from(terms.keep_alive_s) * 1500;
    let keep_alive = shared.keep_alive.watch(&attached.ctl, keep_alive_ms);
    let v5 = protocol.is_v5();
    let conn = Conn {
        shared: shared.clone(),
        session: attached.session,
        ctl: attached.ctl,
        conn_gen: attached.conn_gen,
        username,
        acl: AclView::default(),
        protocol,
        keep_alive_s: terms.keep_alive_s,
        will,
        will_token,
        aliases: InboundAliases::new(if v5 {
            shared.config.topic_alias_maximum
        } else {
            0
        }),
        read_slot,
        inflight: Default::default(),
        connect_expiry_zero: terms.requested_expiry_s == 0,
        client_max_packet_size_bytes: terms.client_max_packet_size,
        now: Instant::now(),
        _slot: slot,
        _keep_alive: keep_alive,
    };
    let writer_state = WriterState::new(
        protocol,
        terms.client_max_packet_size,
        terms.client_alias_maximum,
    );
    Ok((conn, (writer, writer_state, connack_after)))
}

/// A TLS reload between `admit`'s certificate check and `set_info` walked the connected
/// clients without this one: its certificate is checked again now that a later walk would see
/// it, and a refused one kicked (0x87), as the walk would have.
fn recheck_certificate(ctl: &ConnCtl) {
    let proof = ctl.info().and_then(|i| i.proof.as_ref());
    if let Some(certificate) = proof.and_then(|p| p.certificate.as_ref())
        && !certificate.valid_now()
    {
        ctl.kick(ReasonCode::NOT_AUTHORIZED);
    }
}

/// Takes the session over (or makes it) with the negotiated terms; the CONNACK's properties
/// go with the request.
fn attach(
    shared: &Arc<Shared>,
    connect: &Connect,
    terms: &mut Terms,
    username: Option<Arc<str>>,
) -> Attached {
    registry::attach(
        shared,
        AttachRequest {
            client_id: &terms.client_id,
            username,
            protocol: connect.protocol,
            clean_start: connect.clean_start,
            expiry_interval_s: terms.expiry_interval_s,
            window: terms.window,
            connack: ConnAck {
                session_present: false,
                reason: ReasonCode::SUCCESS,
                properties: std::mem::take(&mut terms.properties),
            },
        },
    )
}

/// Answers a CONNECT that `admit` refused: a refusing CONNACK, or (`None`: a malformed 3.1.1
/// CONNECT, for which 3.1.1 has no return code) a close without one.
async fn refuse<W: TransportWrite>(
    writer: &mut W,
    reader: &mut W::Io,
    protocol: Protocol,
    reason: Option<ReasonCode>,
) -> Refused {
    match reason {
        Some(reason) => Box::pin(reject(writer, reader, protocol, reason)).await,
        None => match writer.shutdown(reader).await {
            Ok(()) => Refused::Answered,
            Err(_) => Refused::Dropped,
        },
    }
}

/// The CONNECT's admission: its fields, the connect rate, its credentials, a connection place
/// (`max_connections`) and a session place (`max_sessions`). `Err(Some(reason))` is answered
/// with a refusing CONNACK, `Err(None)` (a malformed 3.1.1 CONNECT) closes without one.
async fn admit(
    shared: &Arc<Shared>,
    connect: &Connect,
    client: &Client,
) -> Result<(Option<Arc<str>>, ConnectionSlot), Option<ReasonCode>> {
    let config = &shared.config;
    if let Err(reason) = check(shared, connect) {
        if reason == ReasonCode::MALFORMED_PACKET && !connect.protocol.is_v5() {
            return Err(None);
        }
        return Err(Some(reason));
    }
    if !admit_rate(shared, client.peer.ip(), &connect.client_id) {
        // 0x9F Connection rate exceeded; 3.1.1: return code 3, Server unavailable.
        return Err(Some(ReasonCode::CONNECTION_RATE_EXCEEDED));
    }
    if let Some(certificate) = &client.certificate
        && !certificate.valid_now()
    {
        // Revoked (or the client CA changed) by a TLS reload after this client's handshake:
        // refused as that reload would have disconnected it.
        return Err(Some(ReasonCode::NOT_AUTHORIZED));
    }
    let username: Option<Arc<str>> = connect.username.as_deref().map(Arc::from);
    authorize(shared, connect, username.as_deref(), client)
        .await
        .map_err(Some)?;
    let Some(slot) = ConnectionSlot::take(shared, client.listener.clone(), &connect.client_id)
    else {
        let refused = Metrics::add_get(&shared.metrics.connections_refused, 1);
        if refused.is_power_of_two() {
            tracing::warn!(
                limit = config.max_connections,
                client_id = %connect.client_id,
                refused,
                "max_connections reached; CONNECT refused"
            );
        }
        // 0x97 Quota exceeded (an administrative limit; 0x9F names a connection *rate*);
        // 3.1.1 gets return code 3, Server unavailable.
        return Err(Some(ReasonCode::QUOTA_EXCEEDED));
    };
    if shared
        .sessions
        .is_full_for(&connect.client_id, config.max_sessions)
    {
        tracing::warn!(limit = config.max_sessions, "session limit reached");
        return Err(Some(ReasonCode::SERVER_BUSY));
    }
    Ok((username, slot))
}
