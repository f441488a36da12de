//! A connection between two nodes ([`Link`]) and, for a TLS one, the watch that lets a
//! reload of the cluster's TLS files cut it ([`super::ClusterTls::reload`]).
//!
//! A TLS link keeps its peer's certificate chain and registers a [`LinkWatch`] with the
//! [`Links`] of the `ClusterTls` that made it. A reload checks every live link's peer chain
//! with the new verifiers; a link they refuse is marked cut and its reader and writer woken:
//! from then on every read and write of it fails, so whoever holds it (a Raft connection, a
//! forwarded client's pipe) closes it as on any I/O error, and reconnecting meets the new
//! handshake rules.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};

use futures_util::task::AtomicWaker;
use rustls::pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A connection between two nodes: plain TCP (no `[cluster] tls_*`), or TLS over it.
pub enum Link {
    Tcp(TcpStream),
    /// Boxed: a TLS stream holds its buffers inline (kilobytes), a TCP stream a handle.
    Tls(Box<TlsLink>),
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Link::Tcp(_) => "Link::Tcp",
            Link::Tls(_) => "Link::Tls",
        })
    }
}

/// A TLS connection between two nodes, with the watch a reload cuts it by.
pub struct TlsLink {
    stream: tokio_rustls::TlsStream<TcpStream>,
    watch: Arc<LinkWatch>,
}

impl TlsLink {
    /// `stream` after its handshake, registered in `links` under its peer's chain.
    pub(super) fn new(
        stream: tokio_rustls::TlsStream<TcpStream>,
        side: Side,
        links: &Links,
    ) -> io::Result<TlsLink> {
        let (tcp, session) = stream.get_ref();
        let peer = tcp.peer_addr()?;
        // Mutual TLS: a handshake that succeeded has the peer's chain, on both sides.
        let chain = session
            .peer_certificates()
            .filter(|c| !c.is_empty())
            .ok_or_else(|| io::Error::other("cluster TLS: the peer presented no certificate"))?
            .to_vec();
        let watch = Arc::new(LinkWatch {
            peer,
            side,
            chain,
            cut: AtomicBool::new(false),
            reader: AtomicWaker::new(),
            writer: AtomicWaker::new(),
        });
        links.register(&watch);
        Ok(TlsLink { stream, watch })
    }
}

/// Which end of the handshake this node was: what the peer's certificate was checked as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    /// The peer connected: its certificate is a client's (`clientAuth`).
    Accepted,
    /// This node connected: the peer's certificate is a server's (`serverAuth`).
    Connected,
}

/// What a reload needs of a live TLS link: who the peer is, and how to cut it.
pub(super) struct LinkWatch {
    pub(super) peer: SocketAddr,
    pub(super) side: Side,
    /// The peer's chain, end certificate first (as the handshake received it).
    pub(super) chain: Vec<CertificateDer<'static>>,
    cut: AtomicBool,
    /// The tasks to wake when the link is cut while they wait on it (reads and writes may be
    /// polled by different tasks once the link is split).
    reader: AtomicWaker,
    writer: AtomicWaker,
}

impl LinkWatch {
    /// Every later read and write of the link fails; waiting ones are woken to see it.
    pub(super) fn cut(&self) {
        self.cut.store(true, Ordering::Release);
        self.reader.wake();
        self.writer.wake();
    }

    fn is_cut(&self) -> bool {
        self.cut.load(Ordering::Acquire)
    }
}

fn cut_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "cluster TLS: the peer's certificate is refused since the TLS files were reloaded",
    )
}

/// The live TLS links of one `ClusterTls` (and its clones), as weak references: a link
/// dropped by its holder leaves only a dead entry, swept by the next registration once the
/// list has doubled since the last sweep. So the list holds at most twice the links alive at
/// a sweep, and those are bounded by the cluster port's own limits (inbound connections,
/// forwarded clients, one Raft connection per peer).
#[derive(Default)]
pub(super) struct Links {
    inner: Mutex<LinksInner>,
}

#[derive(Default)]
struct LinksInner {
    watches: Vec<Weak<LinkWatch>>,
    /// Length after the last sweep: the next sweep runs at twice this (at least 64).
    swept_len: usize,
}

impl Links {
    fn register(&self, watch: &Arc<LinkWatch>) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.watches.len() >= (2 * inner.swept_len).max(64) {
            inner.watches.retain(|w| w.strong_count() > 0);
            inner.swept_len = inner.watches.len();
        }
        inner.watches.push(Arc::downgrade(watch));
    }

    /// The links alive now (dead entries are swept on the way).
    pub(super) fn live(&self) -> Vec<Arc<LinkWatch>> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.watches.retain(|w| w.strong_count() > 0);
        inner.swept_len = inner.watches.len();
        inner.watches.iter().filter_map(Weak::upgrade).collect()
    }
}

/// `poll` on a TLS link's stream, unless the link is cut; if it waits, `waiter` is woken by
/// a cut too.
fn guarded<T>(
    watch: &LinkWatch,
    waiter: &AtomicWaker,
    cx: &mut Context<'_>,
    poll: impl FnOnce(&mut Context<'_>) -> Poll<io::Result<T>>,
) -> Poll<io::Result<T>> {
    if watch.is_cut() {
        return Poll::Ready(Err(cut_error()));
    }
    let polled = poll(cx);
    if polled.is_pending() {
        waiter.register(cx.waker());
        // A cut between the check above and the registration woke nobody.
        if watch.is_cut() {
            return Poll::Ready(Err(cut_error()));
        }
    }
    polled
}

impl AsyncRead for Link {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Link::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Link::Tls(link) => {
                let TlsLink { stream, watch } = link.as_mut();
                guarded(watch, &watch.reader, cx, |cx| {
                    Pin::new(stream).poll_read(cx, buf)
                })
            }
        }
    }
}

impl AsyncWrite for Link {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Link::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Link::Tls(link) => {
                let TlsLink { stream, watch } = link.as_mut();
                guarded(watch, &watch.writer, cx, |cx| {
                    Pin::new(stream).poll_write(cx, buf)
                })
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Link::Tcp(s) => Pin::new(s).poll_flush(cx),
            Link::Tls(link) => {
                let TlsLink { stream, watch } = link.as_mut();
                guarded(watch, &watch.writer, cx, |cx| {
                    Pin::new(stream).poll_flush(cx)
                })
            }
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Link::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            // A cut link may still say goodbye: closing is what its holder does next.
            Link::Tls(link) => Pin::new(&mut link.stream).poll_shutdown(cx),
        }
    }
}
