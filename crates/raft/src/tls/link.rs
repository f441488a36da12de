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
            .ok_or_else(|| io::Error::other("cluster TLS: the peer presented no certificate"))?;
        let chain = links.intern(chain);
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

    pub(super) fn watch(&self) -> &LinkWatch {
        &self.watch
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
    /// The peer's chain, end certificate first (as the handshake received it); shared with
    /// the other links of the same peer ([`Links::intern`]).
    pub(super) chain: Arc<[CertificateDer<'static>]>,
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
    /// The peers' chains, one copy each: every forwarded client has a link of its own, and
    /// all of a peer's links present the same chain (a copy per link was 621 B per forwarded
    /// connection on each of the two nodes it crosses). At most [`MAX_INTERNED_CHAINS`].
    chains: Mutex<Vec<Arc<[CertificateDer<'static>]>>>,
}

/// Most distinct peer chains kept for sharing: a cluster's members, with room for renewed
/// certificates. A chain beyond them still works, with a copy of its own per link.
pub(super) const MAX_INTERNED_CHAINS: usize = 32;

#[derive(Default)]
struct LinksInner {
    watches: Vec<Weak<LinkWatch>>,
    /// Length after the last sweep: the next sweep runs at twice this (at least 64).
    swept_len: usize,
}

impl Links {
    /// `chain` as one shared copy: the one kept if an equal chain is, else a new one, kept
    /// if there is room (or a kept chain no link holds any more gives its place).
    fn intern(&self, chain: &[CertificateDer<'_>]) -> Arc<[CertificateDer<'static>]> {
        let mut chains = self.chains.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(kept) = chains.iter().find(|c| c[..] == chain[..]) {
            return kept.clone();
        }
        let new: Arc<[CertificateDer<'static>]> =
            chain.iter().map(|c| c.clone().into_owned()).collect();
        if chains.len() >= MAX_INTERNED_CHAINS {
            // Held by the list alone: no live link shares it.
            chains.retain(|c| Arc::strong_count(c) > 1);
        }
        if chains.len() < MAX_INTERNED_CHAINS {
            chains.push(new.clone());
        }
        new
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(n: u8) -> Vec<CertificateDer<'static>> {
        vec![
            CertificateDer::from(vec![n; 300]),
            CertificateDer::from(vec![7; 10]),
        ]
    }

    fn watch() -> Arc<LinkWatch> {
        Arc::new(LinkWatch {
            peer: "127.0.0.1:1".parse().unwrap(),
            side: Side::Accepted,
            chain: chain(1).into(),
            cut: AtomicBool::new(false),
            reader: AtomicWaker::new(),
            writer: AtomicWaker::new(),
        })
    }

    /// The registry's bound: dropped links leave dead entries that a registration sweeps once
    /// the list has doubled since the last sweep, so it never holds more than twice the links
    /// alive at that sweep (or 64), however many came and went.
    #[test]
    fn the_registry_holds_at_most_twice_the_live_links() {
        let links = Links::default();
        let len = || links.inner.lock().unwrap().watches.len();
        for _ in 0..10_000 {
            let w = watch();
            links.register(&w);
        }
        assert!(len() <= 64, "{} entries for 0 live links", len());
        let kept: Vec<_> = (0..100).map(|_| watch()).collect();
        for w in &kept {
            links.register(w);
        }
        for _ in 0..10_000 {
            let w = watch();
            links.register(&w);
            assert!(
                len() <= 2 * 100 + 64,
                "{} entries for 100 live links",
                len()
            );
        }
        assert_eq!(links.live().len(), 100);
        assert_eq!(len(), 100, "live() sweeps the dead");
    }

    /// Equal chains share one copy; a full list takes a new chain only in the place of one
    /// that no link holds; beyond that a chain gets a copy of its own.
    #[test]
    fn equal_chains_share_one_copy_and_the_list_stays_bounded() {
        let links = Links::default();
        let a = links.intern(&chain(1));
        let again = links.intern(&chain(1));
        assert!(Arc::ptr_eq(&a, &again));
        assert_eq!(a[..], chain(1)[..]);
        let b = links.intern(&chain(2));
        assert!(!Arc::ptr_eq(&a, &b));

        // Fill the list with chains held by "links".
        let held: Vec<_> = (10..10 + MAX_INTERNED_CHAINS as u8 - 2)
            .map(|n| links.intern(&chain(n)))
            .collect();
        assert_eq!(links.chains.lock().unwrap().len(), MAX_INTERNED_CHAINS);
        let over = links.intern(&chain(200));
        let over_again = links.intern(&chain(200));
        assert!(!Arc::ptr_eq(&over, &over_again), "no room: not kept");
        assert_eq!(over[..], chain(200)[..]);
        // A kept chain no link holds gives its place.
        drop(b);
        let new = links.intern(&chain(201));
        assert!(Arc::ptr_eq(&new, &links.intern(&chain(201))));
        assert!(links.chains.lock().unwrap().len() <= MAX_INTERNED_CHAINS);
        drop(held);
    }
}
