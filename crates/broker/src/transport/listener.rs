//! A listening socket and what turns its accepted sockets into MQTT byte streams.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::net::{TcpListener, TcpStream};

use super::{ByteStream, ListenerContext, StreamTransport};

/// An accepted connection's bytes, before its listener's [`Upgrade`].
pub enum AcceptedSocket {
    /// A TCP socket this process accepted (or a forwarded client's, over a plain cluster link).
    Tcp(TcpStream),
    /// A client connection another cluster node forwarded over a TLS cluster link: the link's
    /// TLS is undone, and the client's own bytes (TLS or WebSocket of the listener's, if any)
    /// follow.
    Stream(Box<dyn ByteStream>),
}

/// What an [`Upgrade`] made of an accepted socket.
pub struct Upgraded {
    pub stream: StreamTransport,
    /// The CN of the verified client certificate, if the client sent one.
    pub peer_cn: Option<Arc<str>>,
    /// The verified client certificate, if the client sent one.
    pub client_cert: Option<ClientCertificate>,
}

/// A listener's client-certificate verification as it stands now: after a reload of its TLS
/// files (SIGHUP), the revocation lists, client CA and clock of the next handshake.
pub trait CertificateCheck: Send + Sync {
    /// Whether `chain` (DER, the end entity first, then the intermediates the client sent)
    /// would pass a handshake on this listener now. `false` for a chain it cannot parse.
    fn still_valid(&self, chain: &[Bytes]) -> bool;

    /// How many reloads of the listener's TLS files have been applied: a reload bumps it when
    /// it swaps the files in, before the broker walks the connected clients. A certificate
    /// verified under an earlier generation may have missed that walk (its connection was
    /// still in its CONNECT) and is checked again ([`ClientCertificate::valid_now`]).
    fn generation(&self) -> u64;
}

/// A client certificate a TLS handshake verified, kept for the connection's life so that a
/// reload of the listener's TLS files checks it again ([`crate::Broker::after_tls_reload`]):
/// a certificate revoked since is cut off at the reload, not at its next connection.
#[derive(Clone)]
pub struct ClientCertificate {
    /// DER, the end entity first, then the intermediates the client sent.
    pub chain: Arc<[Bytes]>,
    /// The listener's check, which a reload updates in place.
    pub check: Arc<dyn CertificateCheck>,
    /// The check's generation the handshake verified the chain under.
    pub verified_in: u64,
}

impl ClientCertificate {
    /// Whether the listener would accept this certificate now.
    pub(crate) fn still_valid(&self) -> bool {
        self.check.still_valid(&self.chain)
    }

    /// [`ClientCertificate::still_valid`], skipped (true) while no reload came since the
    /// handshake: the CONNECT path's check, costing one load when nothing changed.
    pub(crate) fn valid_now(&self) -> bool {
        self.check.generation() == self.verified_in || self.still_valid()
    }
}

impl std::fmt::Debug for ClientCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCertificate")
            .field("chain_len", &self.chain.len())
            .finish_non_exhaustive()
    }
}

/// The future of one [`Upgrade::upgrade`].
pub type UpgradeFuture = Pin<Box<dyn Future<Output = io::Result<Upgraded>> + Send>>;

/// Turns an accepted socket into the listener's stream: a TLS handshake, a WebSocket
/// upgrade, or both. Runs in the connection's own task, within `connect_timeout_ms`.
pub trait Upgrade: Send + Sync + 'static {
    fn upgrade(&self, socket: AcceptedSocket) -> UpgradeFuture;
}

/// One listening socket served by [`crate::Broker::serve_listeners`].
pub struct Listener {
    pub socket: TcpListener,
    pub context: Arc<ListenerContext>,
    /// `None`: plain TCP, served on the zero-overhead path.
    pub upgrade: Option<Arc<dyn Upgrade>>,
}

impl Listener {
    /// A plain TCP listener.
    pub(crate) fn tcp(socket: TcpListener, context: Arc<ListenerContext>) -> Listener {
        Listener {
            socket,
            context,
            upgrade: None,
        }
    }
}

/// Polls every listener, starting after the one that accepted last (no listener starves the
/// others): `(index, accepted)`.
pub(crate) fn poll_accept_any(
    listeners: &[Listener],
    start: &mut usize,
    cx: &mut Context<'_>,
) -> Poll<(usize, io::Result<(TcpStream, SocketAddr)>)> {
    let n = listeners.len();
    for offset in 0..n {
        let index = (*start + offset) % n;
        if let Poll::Ready(accepted) = listeners[index].socket.poll_accept(cx) {
            *start = (index + 1) % n;
            return Poll::Ready((index, accepted));
        }
    }
    Poll::Pending
}
