//! Raft RPCs over TCP: length-prefixed postcard frames (a 4-byte big-endian length, then the
//! message), one request and its response at a time per connection.
//!
//! The client side is openraft's `RaftNetworkFactory`; a peer that is down, slow or speaks
//! garbage is an `Unreachable` error, which openraft retries after [`RETRY_BACKOFF`]. The
//! server side ([`serve`]) hands requests to [`handle`], which knows nothing of TCP: a
//! simulated network (turmoil) can call it with its own transport.
//!
//! With `[cluster] tls_*` ([`ClusterTls`]) every connection, both ways, is mutual TLS, and
//! nothing a peer sends reaches openraft (or the forwarding) before its handshake succeeded.

use std::sync::Arc;
use std::time::Duration;

use openraft::BasicNode;
use openraft::error::{InstallSnapshotError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{Backoff, RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::error::ConsensusError;
use crate::tls::{ClusterTls, Link};
use crate::types::{NodeId, Raft, TypeConfig, decode, encode};

/// Largest frame either side accepts: a batch of entries (openraft's `max_payload_entries`
/// of them) or a snapshot chunk. A bigger length prefix is a broken or hostile peer.
pub const MAX_FRAME_BYTES: usize = 128 << 20;
const _: () = assert!(
    crate::log_store::MAX_APPEND_BYTES + 2 * crate::types::MAX_PROPOSAL_BYTES < MAX_FRAME_BYTES
);
/// Most inbound peer connections served at once; further ones wait for a slot.
pub const MAX_INBOUND_CONNECTIONS: usize = 64;
/// How long a peer may take to accept a connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// Upper bound of one request and its response (openraft's own deadline may be shorter),
/// but for snapshot chunks ([`SNAPSHOT_CHUNK_TIMEOUT`]).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Upper bound of one snapshot chunk, with, for the last, the install of the whole state on
/// the follower (the broker's files written and synced); openraft's `install_snapshot_timeout`.
/// Its default, 200 ms, is shorter than a long link's round trip, and than a 3 MiB chunk's
/// encoding and decoding in a debug build (165 ms measured on an idle machine): every
/// attempt timed out, and a follower behind a purged log never caught up. A peer that stops
/// answering mid-snapshot holds its replication stream (only its own) this long.
pub const SNAPSHOT_CHUNK_TIMEOUT: Duration = Duration::from_secs(30);
/// The first four bytes of a connection on the cluster port that is not Raft traffic but a
/// client connection forwarded by another node (the cluster layer reads the rest). A Raft
/// frame starts with its length, big-endian, and this prefix read as a length is far above
/// [`MAX_FRAME_BYTES`], so the two cannot be confused.
pub const FORWARD_MAGIC: [u8; 4] = *b"TMQT";
const _: () = assert!(u32::from_be_bytes(FORWARD_MAGIC) as usize > MAX_FRAME_BYTES);
/// How long a new connection on the cluster port may take to send its first four bytes
/// (after its TLS handshake, if any).
pub const FIRST_BYTES_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a new connection on the cluster port may take over its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Where [`serve`] hands connections that start with [`FORWARD_MAGIC`] (read: the
/// preamble's next field comes next).
pub type Forwarded = tokio::sync::mpsc::Sender<(Link, std::net::SocketAddr)>;

/// How long openraft waits before retrying an unreachable peer (its default is 500 ms, longer
/// than an election timeout: a peer that comes back would start an election first).
pub const RETRY_BACKOFF: Duration = Duration::from_millis(100);

type Err = RaftError<NodeId>;
type SnapErr = RaftError<NodeId, InstallSnapshotError>;

/// A request between nodes.
#[derive(Debug, Serialize, Deserialize)]
pub enum Request {
    Append(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    Snapshot(InstallSnapshotRequest<TypeConfig>),
    /// From a leader handing its leadership over (`RaftNode::transfer_leader`): do not start
    /// an election for `for_ms` (at most [`MAX_HOLD_MS`]) from now, so that only the chosen
    /// node does; 0 lifts a hold (the chosen node's, left by an earlier transfer). Voting is
    /// not held.
    HoldElections {
        for_ms: u64,
    },
    /// From a leader handing its leadership to this node: start an election once `after_ms`
    /// (at most [`MAX_HOLD_MS`]) have passed, the time the voters' leader leases need to run
    /// out after the leader's last heartbeat. Without it the node campaigns on its own timer,
    /// which openraft 0.9 lengthens by twice the election timeout after a campaign of this
    /// node lost to a longer log: a transfer then took ~2.4 s and timed out. An election
    /// that comes too early loses (the leases reject it) and the timer path remains.
    Campaign {
        after_ms: u64,
    },
    /// A starting node says who it is (`crate::incarnation`): the peer records the first
    /// incarnation it hears for `node` and answers how this one compares.
    Introduce {
        node: NodeId,
        incarnation: u64,
    },
}

/// A peer's answer to [`Request::Introduce`] (`crate::incarnation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Introduced {
    /// The peer had no incarnation for this node id: it has recorded this one.
    New,
    /// The peer knows this very incarnation.
    Known,
    /// The peer knows another incarnation for this node id: this node lost its disk.
    Different { known: u64 },
    /// The peer cannot record incarnations (a transport without them, or its table is full).
    Unsupported,
}

/// What the listener answers introductions with: the node's record of its peers'
/// incarnations (`crate::incarnation::Incarnations`).
///
/// Contract: `introduce` records the first incarnation heard for `node` durably (synced)
/// before it returns [`Introduced::New`]; it may block on that write (the listener calls it
/// off the async threads).
pub trait Introductions: Send + Sync {
    fn introduce(&self, node: NodeId, incarnation: u64) -> Result<Introduced, ConsensusError>;
}

/// The answer to a [`Request`], of the same kind.
#[derive(Debug, Serialize, Deserialize)]
pub enum Response {
    Append(Result<AppendEntriesResponse<NodeId>, Err>),
    Vote(Result<VoteResponse<NodeId>, Err>),
    Snapshot(Result<InstallSnapshotResponse<NodeId>, SnapErr>),
    /// [`Request::HoldElections`] or [`Request::Campaign`] taken in hand.
    Done,
    Introduced(Introduced),
}

/// Runs `req` on the local Raft node.
pub async fn handle(raft: &Raft, req: Request) -> Response {
    match req {
        Request::Append(r) => Response::Append(raft.append_entries(r).await),
        Request::Vote(r) => Response::Vote(raft.vote(r).await),
        Request::Snapshot(r) => Response::Snapshot(raft.install_snapshot(r).await),
        Request::HoldElections { for_ms } => {
            hold_elections(raft, for_ms);
            Response::Done
        }
        // Answered by the TCP listener, which holds the incarnations (`serve`); a transport
        // without them cannot vouch for anyone.
        Request::Introduce { .. } => Response::Introduced(Introduced::Unsupported),
        Request::Campaign { after_ms } => {
            let raft = raft.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(after_ms.min(MAX_HOLD_MS))).await;
                if let Err(e) = raft.trigger().elect().await {
                    tracing::warn!(error = %e, "raft: could not start the election a transfer asked for");
                }
            });
            Response::Done
        }
    }
}

/// Longest a node holds its elections at a peer's request (a peer that asks again extends it).
pub const MAX_HOLD_MS: u64 = 10_000;

/// One election hold: whose (the Raft core's metrics channel names the core: several nodes of
/// one id may live in one process, as in tests, and must not lift each other's holds) and
/// which call made it (only that call's timer lifts it).
struct Hold {
    core: tokio::sync::watch::Receiver<openraft::RaftMetrics<NodeId, BasicNode>>,
    token: u64,
}

/// The holds in force in this process: at most one per Raft core, each gone by
/// [`MAX_HOLD_MS`] after it was made.
static HOLDS: std::sync::Mutex<Vec<Hold>> = std::sync::Mutex::new(Vec::new());
static NEXT_HOLD: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Stops this node from starting elections for `for_ms` from now (at most [`MAX_HOLD_MS`];
/// it replaces an earlier hold, and 0 lifts it); they start again by themselves once the
/// hold has run out.
pub(crate) fn hold_elections(raft: &Raft, for_ms: u64) {
    let core = raft.metrics();
    let until = tokio::time::Instant::now() + Duration::from_millis(for_ms.min(MAX_HOLD_MS));
    let token = NEXT_HOLD.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    {
        let mut holds = HOLDS.lock().unwrap_or_else(|e| e.into_inner());
        holds.retain(|h| !h.core.same_channel(&core));
        if for_ms == 0 {
            raft.runtime_config().elect(true);
            return;
        }
        holds.push(Hold { core, token });
    }
    raft.runtime_config().elect(false);
    let raft = raft.clone();
    tokio::spawn(async move {
        tokio::time::sleep_until(until).await;
        let mut holds = HOLDS.lock().unwrap_or_else(|e| e.into_inner());
        // Replaced by a later hold or lifted: that one decides.
        if let Some(at) = holds.iter().position(|h| h.token == token) {
            holds.swap_remove(at);
            raft.runtime_config().elect(true);
        }
    });
}

/// One request to the peer at `addr` on a connection of its own (what is not openraft's
/// traffic: [`Request::HoldElections`]), over TLS if `tls` is given.
pub async fn call(
    addr: std::net::SocketAddr,
    req: &Request,
    tls: Option<&ClusterTls>,
) -> std::io::Result<Response> {
    let exchange = async {
        let mut s = connect(addr, tls).await?;
        round_trip(&mut s, req).await
    };
    tokio::time::timeout(REQUEST_TIMEOUT, exchange)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "request timed out"))?
}

/// A connection to the peer at `addr` within [`CONNECT_TIMEOUT`]: [`connect_within`].
pub async fn connect(
    addr: std::net::SocketAddr,
    tls: Option<&ClusterTls>,
) -> std::io::Result<Link> {
    connect_within(addr, tls, CONNECT_TIMEOUT).await
}

/// A connection to the cluster port at `addr`, TCP without Nagle's delay, and its TLS
/// handshake if `tls` is given, both within `timeout` (the forwarding of clients has its own).
pub async fn connect_within(
    addr: std::net::SocketAddr,
    tls: Option<&ClusterTls>,
    timeout: Duration,
) -> std::io::Result<Link> {
    let open = async {
        let s = TcpStream::connect(addr).await?;
        s.set_nodelay(true)?;
        match tls {
            None => Ok(Link::Tcp(s)),
            Some(tls) => tls.connect(addr, s).await,
        }
    };
    tokio::time::timeout(timeout, open)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect"))?
}

/// Sends `req` and reads its answer.
async fn round_trip<S>(s: &mut S, req: &Request) -> std::io::Result<Response>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    write_frame(s, &encode(req).map_err(invalid)?).await?;
    let frame = read_frame(s).await?;
    decode(&frame).map_err(invalid)
}

async fn read_frame<S: AsyncRead + Unpin>(s: &mut S) -> std::io::Result<Vec<u8>> {
    let len = s.read_u32().await?;
    read_frame_body(s, len).await
}

/// The rest of a frame whose length prefix `len` was read.
async fn read_frame_body<S: AsyncRead + Unpin>(s: &mut S, len: u32) -> std::io::Result<Vec<u8>> {
    let len = len as usize;
    if len > MAX_FRAME_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("frame of {len} bytes above MAX_FRAME_BYTES"),
        ));
    }
    // Grown as bytes arrive, not allocated from the prefix: a peer that announces a large
    // frame and sends nothing costs nothing.
    let mut buf = Vec::new();
    (&mut *s).take(len as u64).read_to_end(&mut buf).await?;
    if buf.len() != len {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(buf)
}

async fn write_frame<S: AsyncWrite + Unpin>(s: &mut S, body: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(body.len())
        .ok()
        .filter(|&l| l as usize <= MAX_FRAME_BYTES)
        .ok_or_else(|| std::io::Error::other("frame above MAX_FRAME_BYTES"))?;
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(body);
    s.write_all(&frame).await?;
    // TLS holds what it encrypted until flushed; TCP's flush does nothing.
    s.flush().await
}

fn invalid(e: postcard::Error) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, e)
}

/// Serves peers' requests from `listener` until the task is aborted. The connections' tasks
/// belong to it: aborting it closes them (a stopped node must not keep answering for its old
/// core on connections peers still hold).
///
/// With `tls`, each connection's handshake comes first (a peer without a certificate from the
/// cluster CA is closed before anything it sends is read). A connection whose first bytes are
/// [`FORWARD_MAGIC`] then goes to `forward` if given (and is closed otherwise, or when the
/// receiver is full or gone).
pub async fn serve(
    listener: TcpListener,
    raft: Raft,
    forward: Option<Forwarded>,
    tls: Option<ClusterTls>,
    incarnations: Arc<dyn Introductions>,
) {
    serve_peers(&listener, Some(raft), forward, tls, incarnations).await;
}

/// While a new node waits for its peers to confirm it ([`crate::incarnation::confirm_new`]):
/// [`serve`] without a Raft core, answering introductions only and closing every other
/// connection (it votes for nobody before it may). Runs until dropped.
pub async fn answer_introductions(
    listener: &TcpListener,
    incarnations: Arc<dyn Introductions>,
    tls: Option<ClusterTls>,
) {
    serve_peers(listener, None, None, tls, incarnations).await;
}

/// The accept loop of [`serve`] and [`answer_introductions`].
async fn serve_peers(
    listener: &TcpListener,
    raft: Option<Raft>,
    forward: Option<Forwarded>,
    tls: Option<ClusterTls>,
    incarnations: Arc<dyn Introductions>,
) {
    let slots = Arc::new(Semaphore::new(MAX_INBOUND_CONNECTIONS));
    let mut connections = JoinSet::new();
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        // Reap finished connections so the set stays bounded by the permits.
        while connections.try_join_next().is_some() {}
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "raft: accept failed");
                tokio::time::sleep(RETRY_BACKOFF).await;
                continue;
            }
        };
        let raft = raft.clone();
        let forward = forward.clone();
        let tls = tls.clone();
        let incarnations = incarnations.clone();
        connections.spawn(async move {
            let _permit = permit;
            let _ = stream.set_nodelay(true);
            let Some(mut link) = open_inbound(stream, peer, tls.as_ref()).await else {
                return;
            };
            let first = match tokio::time::timeout(FIRST_BYTES_TIMEOUT, link.read_u32()).await {
                Ok(Ok(first)) => first,
                _ => return,
            };
            if first.to_be_bytes() == FORWARD_MAGIC {
                // The slot is given back at once: the forwarded connection lives elsewhere.
                // Full only if the cluster's hand-off loop (which drains it at once, and
                // counts its own refusals) is stuck: say so, the connection is dropped.
                if let Some(forward) = forward
                    && forward.try_send((link, peer)).is_err()
                {
                    tracing::warn!(%peer, "cluster: forwarded connection dropped: the hand-off queue is full or closed");
                }
                return;
            }
            if let Err(e) = serve_connection(&mut link, raft.as_ref(), &incarnations, first).await {
                tracing::debug!(%peer, error = %e, "raft: peer connection closed");
            }
        });
    }
}

/// Handshakes refused on the cluster port since the start (for the log's rate limit).
static REFUSED_HANDSHAKES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The inbound connection as a [`Link`]: its TLS handshake done (within
/// [`HANDSHAKE_TIMEOUT`]) if `tls` is given; `None` if that failed (logged).
async fn open_inbound(
    stream: TcpStream,
    peer: std::net::SocketAddr,
    tls: Option<&ClusterTls>,
) -> Option<Link> {
    let Some(tls) = tls else {
        return Some(Link::Tcp(stream));
    };
    let error = match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(stream)).await {
        Ok(Ok(link)) => return Some(link),
        Ok(Err(e)) => e.to_string(),
        Err(_) => "timed out".to_string(),
    };
    let refused = REFUSED_HANDSHAKES.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
    // A misconfigured peer retries every RETRY_BACKOFF: the 1st, 2nd, 4th, ... are logged.
    if refused.is_power_of_two() {
        tracing::warn!(%peer, %error, refused, "raft: cluster TLS handshake refused");
    }
    None
}

/// Requests and answers on one connection; `first` is the first frame's length, read.
/// Introductions are answered with `incarnations`, everything else with `raft` (without a
/// Raft core yet, a starting node answers introductions only and closes the connection on
/// anything else: it votes for nobody before it may).
async fn serve_connection(
    link: &mut Link,
    raft: Option<&Raft>,
    incarnations: &Arc<dyn Introductions>,
    first: u32,
) -> std::io::Result<()> {
    let mut len = first;
    loop {
        let frame = read_frame_body(link, len).await?;
        let req: Request = decode(&frame).map_err(invalid)?;
        let resp = match (req, raft) {
            (Request::Introduce { node, incarnation }, _) => {
                let inc = incarnations.clone();
                let answer =
                    tokio::task::spawn_blocking(move || inc.introduce(node, incarnation)).await;
                match answer {
                    Ok(Ok(a)) => Response::Introduced(a),
                    Ok(Err(e)) => {
                        tracing::error!(%node, error = %e, "raft: cannot record a peer's incarnation");
                        Response::Introduced(Introduced::Unsupported)
                    }
                    Err(e) => return Err(std::io::Error::other(e.to_string())),
                }
            }
            (req, Some(raft)) => handle(raft, req).await,
            (_, None) => return Ok(()),
        };
        write_frame(link, &encode(&resp).map_err(invalid)?).await?;
        len = link.read_u32().await?;
    }
}

/// openraft's network factory over TCP (TLS if `tls` is given): a client per peer,
/// connecting on first use.
#[derive(Debug, Clone, Default)]
pub struct TcpNetwork {
    pub tls: Option<ClusterTls>,
}

impl RaftNetworkFactory<TypeConfig> for TcpNetwork {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> PeerClient {
        PeerClient {
            target,
            addr: node.addr.parse().ok(),
            tls: self.tls.clone(),
            conn: None,
        }
    }
}

/// The connection to one peer; dropped (and reopened by the next call) on any error.
#[derive(Debug)]
pub struct PeerClient {
    target: NodeId,
    /// `None` if the membership's address does not parse (it was added by this code: never).
    addr: Option<std::net::SocketAddr>,
    tls: Option<ClusterTls>,
    conn: Option<Link>,
}

impl PeerClient {
    async fn exchange(&mut self, req: &Request) -> std::io::Result<Response> {
        if self.conn.is_none() {
            let addr = self.addr.ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::InvalidInput, "peer address")
            })?;
            self.conn = Some(connect(addr, self.tls.as_ref()).await?);
        }
        let Some(s) = self.conn.as_mut() else {
            return Err(std::io::Error::other("no connection"));
        };
        round_trip(s, req).await
    }

    /// One request with a deadline; any failure drops the connection and is `Unreachable`.
    async fn call(&mut self, req: Request, option: &RPCOption) -> Result<Response, Unreachable> {
        let cap = match req {
            Request::Snapshot(_) => SNAPSHOT_CHUNK_TIMEOUT,
            _ => REQUEST_TIMEOUT,
        };
        let deadline = option.hard_ttl().min(cap);
        let r = match tokio::time::timeout(deadline, self.exchange(&req)).await {
            Ok(r) => r,
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "request timed out",
            )),
        };
        r.map_err(|e| {
            self.conn = None;
            Unreachable::new(&e)
        })
    }
}

fn wrong_kind() -> Unreachable {
    Unreachable::new(&std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        "response of the wrong kind",
    ))
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, Err>> {
        match self.call(Request::Append(rpc), &option).await? {
            Response::Append(r) => r.map_err(|e| RemoteError::new(self.target, e).into()),
            _ => Err(wrong_kind().into()),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, Err>> {
        match self.call(Request::Vote(rpc), &option).await? {
            Response::Vote(r) => r.map_err(|e| RemoteError::new(self.target, e).into()),
            _ => Err(wrong_kind().into()),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RPCError<NodeId, BasicNode, SnapErr>> {
        match self.call(Request::Snapshot(rpc), &option).await? {
            Response::Snapshot(r) => r.map_err(|e| RemoteError::new(self.target, e).into()),
            _ => Err(wrong_kind().into()),
        }
    }

    fn backoff(&self) -> Backoff {
        Backoff::new(std::iter::repeat(RETRY_BACKOFF))
    }
}
