//! The paged lists of the admin API: clients, sessions, subscriptions, retained messages.

use std::net::SocketAddr;
use std::time::SystemTime;

use tern_wire::Protocol;
use tokio::time::Instant;

use super::{Page, all_sessions, page};
use crate::broker::Broker;

/// A connected client.
#[derive(Debug, Clone)]
pub struct ClientInfo {
    pub client_id: String,
    pub peer: Option<SocketAddr>,
    pub protocol: &'static str,
    /// The keep alive in force, 0 for none.
    pub keep_alive_s: u16,
    /// Outbound QoS>0 deliveries sent and not yet acknowledged.
    pub inflight: usize,
    /// Outbound deliveries waiting beyond the in-flight window.
    pub queued: usize,
    pub connected_since: Option<SystemTime>,
}

/// A session, online or not.
#[derive(Debug, Clone)]
pub struct SessionInfo {
    pub client_id: String,
    pub online: bool,
    pub protocol: &'static str,
    /// Session Expiry Interval (`u32::MAX`: never; 3.1.1 persistent sessions).
    pub expiry_interval_s: u32,
    pub subscriptions: usize,
    pub inflight: usize,
    pub queued: usize,
}

/// One subscription of one session.
#[derive(Debug, Clone)]
pub struct SubscriptionInfo {
    pub client_id: String,
    pub filter: String,
    pub qos: u8,
    pub subscription_id: Option<u32>,
    /// `client_id` and `filter` joined by a NUL: the page key.
    key: String,
}

impl SubscriptionInfo {
    /// The cursor of this entry (pass it as `after`).
    pub fn key(&self) -> &str {
        &self.key
    }
}

/// A retained message (its payload is not shown, only its size).
#[derive(Debug, Clone)]
pub struct RetainedInfo {
    pub topic: String,
    pub payload_bytes: usize,
    pub qos: u8,
}

pub(crate) fn protocol_name(protocol: Protocol) -> &'static str {
    match protocol {
        Protocol::V3_1 => "3.1",
        Protocol::V3_1_1 => "3.1.1",
        Protocol::V5 => "5.0",
    }
}

impl Broker {
    /// Connected clients, by client id.
    pub fn clients(&self, after: Option<&str>, limit: usize) -> Page<ClientInfo> {
        let mut items = Vec::new();
        for session in all_sessions(self) {
            if !session.is_online() {
                continue;
            }
            let state = session.state.lock();
            let Some(ctl) = state.conn.as_ref() else {
                continue;
            };
            let info = ctl.info();
            items.push(ClientInfo {
                client_id: session.client_id.to_string(),
                peer: info.map(|i| i.peer),
                protocol: protocol_name(state.protocol),
                keep_alive_s: info.map_or(0, |i| i.keep_alive_s),
                inflight: state.out.inflight_len(),
                queued: state.out.queued_len(),
                connected_since: info.map(|i| i.connected_at()),
            });
        }
        page(items, |c| c.client_id.as_str(), after, limit)
    }

    /// Sessions (online and offline), by client id.
    pub fn sessions(&self, after: Option<&str>, limit: usize) -> Page<SessionInfo> {
        let items = all_sessions(self)
            .into_iter()
            .map(|session| {
                let state = session.state.lock();
                SessionInfo {
                    client_id: session.client_id.to_string(),
                    online: state.conn.is_some(),
                    protocol: protocol_name(state.protocol),
                    expiry_interval_s: state.expiry_interval_s,
                    subscriptions: state.subscriptions.len(),
                    inflight: state.out.inflight_len(),
                    queued: state.out.queued_len(),
                }
            })
            .collect();
        page(items, |s| s.client_id.as_str(), after, limit)
    }

    /// Subscriptions of every session, by client id then filter.
    pub fn subscriptions(&self, after: Option<&str>, limit: usize) -> Page<SubscriptionInfo> {
        let mut items = Vec::new();
        for session in all_sessions(self) {
            let state = session.state.lock();
            for (filter, record) in &state.subscriptions {
                items.push(SubscriptionInfo {
                    client_id: session.client_id.to_string(),
                    filter: filter.to_string(),
                    qos: record.options.qos as u8,
                    subscription_id: record.subscription_id,
                    key: format!("{}\0{}", session.client_id, filter),
                });
            }
        }
        page(items, |s| s.key.as_str(), after, limit)
    }

    /// Retained messages matching `filter` (`#` when `None`; `$` topics only through a
    /// filter that names them), by topic; and how many are retained in all.
    pub fn retained(
        &self,
        filter: Option<&str>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(usize, Page<RetainedInfo>), tern_topic::TopicFilterError> {
        let filter = filter.unwrap_or("#");
        tern_topic::validate_topic_filter(filter)?;
        let retained = self.shared().retained.read();
        let total = retained.len();
        let items = retained
            .matching(filter, Instant::now())
            .into_iter()
            .map(|m| RetainedInfo {
                topic: m.topic.to_string(),
                payload_bytes: m.payload.len(),
                qos: m.qos as u8,
            })
            .collect();
        drop(retained);
        Ok((total, page(items, |r| r.topic.as_str(), after, limit)))
    }
}
