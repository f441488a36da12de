//! What a CONNECT is granted: the client id (assigned when empty), keep alive, session expiry
//! and flow limits within the broker's limits, and the CONNACK properties that say so.

use std::sync::Arc;

use tern_wire::{Connect, Properties, Str};

use crate::engine::Shared;

/// Receive Maximum assumed when a v5 client sends none, and for 3.x clients.
const DEFAULT_CLIENT_RECEIVE_MAXIMUM: u16 = u16::MAX;

/// What the broker and the client agree on at CONNECT, and the CONNACK properties that say so.
pub(super) struct Terms {
    pub(super) properties: Properties,
    pub(super) client_id: Arc<str>,
    pub(super) keep_alive_s: u16,
    pub(super) requested_expiry_s: u32,
    pub(super) expiry_interval_s: u32,
    pub(super) window: u16,
    pub(super) client_max_packet_size: u32,
    pub(super) client_alias_maximum: u16,
}

/// The client id (assigned when empty), keep alive, session expiry and flow limits of an
/// admitted CONNECT, within the broker's limits.
pub(super) fn negotiate(shared: &Shared, connect: &Connect) -> Terms {
    let config = &shared.config;
    let v5 = connect.protocol.is_v5();
    let mut properties = Properties::default();
    let client_id: Arc<str> = if connect.client_id.is_empty() {
        let id = assigned_client_id(shared);
        if v5 {
            properties.assigned_client_identifier = Str::copy_from(&id).ok();
        }
        id.into()
    } else {
        connect.client_id.as_str().into()
    };
    // Keep alive: a v5 client asking for more than the maximum, or for none, is told the
    // maximum (MQTT-3.2.2-21: it must then use the Server Keep Alive).
    let mut keep_alive_s = connect.keep_alive_s;
    if v5 && (keep_alive_s == 0 || keep_alive_s > config.max_keep_alive_s) {
        keep_alive_s = config.max_keep_alive_s;
        properties.server_keep_alive_s = Some(keep_alive_s);
    }
    let requested_expiry_s = if v5 {
        connect.properties.session_expiry_interval_s.unwrap_or(0)
    } else if connect.clean_start {
        0
    } else {
        u32::MAX // a 3.1.1 persistent session never expires
    };
    let expiry_interval_s = requested_expiry_s.min(config.max_session_expiry_interval_s);
    if v5 && expiry_interval_s != requested_expiry_s {
        properties.session_expiry_interval_s = Some(expiry_interval_s);
    }
    let client_receive_maximum = connect
        .properties
        .receive_maximum
        .unwrap_or(DEFAULT_CLIENT_RECEIVE_MAXIMUM);
    let (client_max_packet_size, client_alias_maximum) = if v5 {
        (
            connect.properties.maximum_packet_size.unwrap_or(u32::MAX),
            connect.properties.topic_alias_maximum.unwrap_or(0),
        )
    } else {
        (u32::MAX, 0)
    };
    if v5 {
        properties.receive_maximum = Some(config.receive_maximum);
        properties.topic_alias_maximum =
            (config.topic_alias_maximum > 0).then_some(config.topic_alias_maximum);
        properties.maximum_packet_size = Some(config.max_packet_size_bytes);
        properties.retain_available = Some(1);
        properties.wildcard_subscription_available = Some(1);
        properties.subscription_identifier_available = Some(1);
        properties.shared_subscription_available = Some(1);
    }
    Terms {
        properties,
        client_id,
        keep_alive_s,
        requested_expiry_s,
        expiry_interval_s,
        window: client_receive_maximum.min(config.max_inflight_messages),
        client_max_packet_size,
        client_alias_maximum,
    }
}

fn assigned_client_id(shared: &Shared) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("tern-{:x}-{:08x}", shared.next_connection_id(), nanos)
}
