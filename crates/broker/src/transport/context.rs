//! What a connection knows of the listener that accepted it and of its peer.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The protocol a listener speaks under MQTT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportKind {
    /// MQTT straight on the byte stream (mqtt:// or, with TLS, mqtts://).
    Tcp,
    /// MQTT over WebSocket (ws:// or wss://), path `/mqtt`, subprotocol `mqtt`.
    WebSocket,
    /// In memory ([`super::duplex`]): tests and the simulator.
    Memory,
}

/// One listener's settings that matter to its connections. Shared by them (`Arc`).
#[derive(Debug)]
pub struct ListenerContext {
    /// Position in the config's `[[listener]]` list (0: the first).
    pub index: usize,
    /// A name for logs: the bound address, or what the embedder chose.
    pub name: String,
    pub transport: TransportKind,
    pub tls: bool,
    /// The listener's `allow_anonymous`, overriding `[auth] allow_anonymous` when set. The
    /// `[auth]` layer consumes it; the connection only carries it.
    pub allow_anonymous: Option<bool>,
    /// The client certificate's CN replaces the CONNECT's username (TLS listeners only, as in
    /// mosquitto): a TLS client without a certificate, or whose certificate has no CN, is
    /// refused as a bad username or password (3.1.1 rc 4, v5 0x86).
    pub use_identity_as_username: bool,
    /// Connections this listener holds at most (accepted sockets, handshakes included).
    pub max_connections: Option<usize>,
    open: AtomicUsize,
    /// Connections of this listener past CONNECT (the `tern_connections` gauge's sample).
    connected: AtomicUsize,
}

impl ListenerContext {
    pub fn new(index: usize, name: impl Into<String>, transport: TransportKind) -> Self {
        ListenerContext {
            index,
            name: name.into(),
            transport,
            tls: false,
            allow_anonymous: None,
            use_identity_as_username: false,
            max_connections: None,
            open: AtomicUsize::new(0),
            connected: AtomicUsize::new(0),
        }
    }

    /// A plain TCP listener without options (the `--bind` listener, and tests).
    pub(crate) fn plain_tcp(name: impl Into<String>) -> Arc<Self> {
        Arc::new(ListenerContext::new(0, name, TransportKind::Tcp))
    }

    /// Connections open on this listener now (counted only when it has `max_connections`).
    pub fn open_connections(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Connections of this listener past CONNECT now (always counted).
    pub(crate) fn connected(&self) -> usize {
        self.connected.load(Ordering::Relaxed)
    }

    /// One more (`true`) or one fewer connection past CONNECT.
    pub(crate) fn count_connected(&self, more: bool) {
        if more {
            self.connected.fetch_add(1, Ordering::Relaxed);
        } else {
            self.connected.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Takes one of the listener's places: `Err` when `max_connections` are open, `Ok(None)`
    /// when the listener has no limit (nothing is counted, and the connection's task carries
    /// no slot: an idle plain TCP connection stays as small as it was before listeners had
    /// limits).
    pub(crate) fn admit(self: &Arc<Self>) -> Result<Option<ListenerSlot>, Full> {
        let Some(max) = self.max_connections else {
            return Ok(None);
        };
        let n = self.open.fetch_add(1, Ordering::Relaxed) + 1;
        let slot = ListenerSlot(self.clone());
        if n > max {
            return Err(Full); // the slot's drop gives the place back
        }
        Ok(Some(slot))
    }
}

/// The listener holds its `max_connections`.
#[derive(Debug)]
pub(crate) struct Full;

/// A place on a listener, held from accept until the connection ends.
pub(crate) struct ListenerSlot(Arc<ListenerContext>);

impl Drop for ListenerSlot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One connection's origin: its listener, its peer and what TLS proved about the peer.
#[derive(Debug, Clone)]
pub struct ConnectionInfo {
    pub(crate) listener: Arc<ListenerContext>,
    pub(crate) peer: SocketAddr,
    /// The CN of the client certificate (TLS with a verified client certificate only).
    pub(crate) peer_cn: Option<Arc<str>>,
    /// The verified client certificate (TLS with a client certificate only).
    pub(crate) client_cert: Option<super::ClientCertificate>,
}

impl ConnectionInfo {
    pub fn new(listener: Arc<ListenerContext>, peer: SocketAddr) -> Self {
        ConnectionInfo {
            listener,
            peer,
            peer_cn: None,
            client_cert: None,
        }
    }
}
