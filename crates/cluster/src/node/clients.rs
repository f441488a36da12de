//! A node's client connections (part of `node`): accepted on its listeners, handed to this
//! node's engine when it leads, otherwise forwarded to the leader's cluster port; and the
//! connections other nodes forward here, handed to the engine. The limits on them are
//! `crate::limits`.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tern_broker::{Accepted, AcceptedSocket};
use tern_raft::{Link, NodeId};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use super::{ClusterNode, LEADER_WAIT_MS, LEADERLESS_WAIT_ELECTION_TIMEOUTS, lock};
use crate::forward::{self, Preamble};
use crate::limits::Refusal;

impl ClusterNode {
    /// Counts a connection closed at `limit` and logs it: the 1st, 2nd, 4th, 8th... of each
    /// limit (a flood would otherwise be a line per connection).
    fn refuse(&self, limit: Refusal, peer: SocketAddr) {
        let refused = self.shared.refused[limit as usize].fetch_add(1, Ordering::Relaxed) + 1;
        if refused.is_power_of_two() {
            let name = match limit {
                Refusal::ForwardedConnections => "MAX_FORWARDED_CONNECTIONS",
                Refusal::ForwardQueue => "MAX_FORWARD_QUEUE",
                Refusal::AcceptQueue => "MAX_ACCEPT_QUEUE",
            };
            tracing::warn!(%peer, limit = name, refused, "cluster: at a limit; connection closed");
        }
    }

    pub(super) async fn accept_loop(self, index: usize, socket: TcpListener) {
        loop {
            match socket.accept().await {
                Ok((stream, peer)) => self.route(index, stream, peer),
                Err(error) => {
                    tracing::warn!(%error, "cluster: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// Hands a socket to this node's engine if it runs; otherwise forwards it to the leader.
    pub(super) fn route(&self, index: usize, stream: TcpStream, peer: SocketAddr) {
        let Some(AcceptedSocket::Tcp(stream)) =
            self.to_engine(index, AcceptedSocket::Tcp(stream), peer)
        else {
            return;
        };
        let Ok(permit) = self.shared.forwards.clone().try_acquire_owned() else {
            return self.refuse(Refusal::ForwardedConnections, peer);
        };
        let node = self.clone();
        tokio::spawn(async move {
            node.forward(index, stream, peer).await;
            drop(permit);
        });
    }

    /// Gives the socket to the running engine; hands it back if there is none.
    fn to_engine(
        &self,
        index: usize,
        stream: AcceptedSocket,
        peer: SocketAddr,
    ) -> Option<AcceptedSocket> {
        let Some(door) = self.shared.doors.get(index) else {
            return None; // a forwarded connection naming a listener this node lacks
        };
        let engine = lock(&self.shared.engine);
        let Some(engine) = engine.as_ref() else {
            return Some(stream);
        };
        let accepted = Accepted {
            socket: stream,
            peer,
            context: door.context.clone(),
            upgrade: door.upgrade.clone(),
        };
        match engine.accept.try_send(accepted) {
            Ok(()) => None,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.refuse(Refusal::AcceptQueue, peer);
                None
            }
            Err(mpsc::error::TrySendError::Closed(a)) => Some(a.socket),
        }
    }

    /// Waits for a leader, then pipes the connection to it (or to this node's engine, if
    /// this node became the leader meanwhile).
    async fn forward(&self, index: usize, mut stream: TcpStream, peer: SocketAddr) {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(LEADER_WAIT_MS);
        let mut leaderless_since = None;
        loop {
            let status = self.status();
            if status.serving_nobody() {
                let since = *leaderless_since.get_or_insert_with(tokio::time::Instant::now);
                let wait_ms = LEADERLESS_WAIT_ELECTION_TIMEOUTS * status.quorum_ack_max_age_ms;
                if since.elapsed() >= Duration::from_millis(wait_ms) {
                    tracing::info!(%peer, wait_ms, "cluster: this node serves nobody (no leader, or no quorum); client closed");
                    return;
                }
            } else {
                leaderless_since = None;
            }
            match status.leader {
                Some(leader) if leader == status.node_id => {
                    match self.to_engine(index, AcceptedSocket::Tcp(stream), peer) {
                        Some(AcceptedSocket::Tcp(s)) => stream = s,
                        _ => return,
                    }
                }
                Some(leader) => {
                    if let Some(addr) = self.shared.raft.member_addr(leader) {
                        let listener = u16::try_from(index).unwrap_or(u16::MAX);
                        let pre = Preamble { listener, peer };
                        match forward::connect(addr, &pre, self.shared.tls.as_ref()).await {
                            Ok(upstream) => {
                                self.shared.forwarded_total.fetch_add(1, Ordering::Relaxed);
                                // Closed when the leader changes: a partition may keep the
                                // old leader's close from ever arriving, and the client would
                                // wait out its keep-alive instead of reconnecting.
                                tokio::select! {
                                    _ = forward::pipe(stream, upstream) => {}
                                    _ = self.leader_moves_from(leader) => {}
                                }
                                return;
                            }
                            Err(error) => {
                                tracing::debug!(%leader, %error, "cluster: leader unreachable");
                            }
                        }
                    }
                }
                None => {}
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::info!(%peer, "cluster: no leader to serve the client; connection closed");
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Resolves once this node sees a leader other than `leader` (or none), or stops.
    async fn leader_moves_from(&self, leader: NodeId) {
        let mut changes = self.shared.raft.status_changes();
        while self.status().leader == Some(leader) {
            if !changes.changed().await {
                return;
            }
        }
    }

    /// Connections other nodes forwarded here.
    pub(super) async fn forwarded_loop(self, mut rx: mpsc::Receiver<(Link, SocketAddr)>) {
        while let Some((mut stream, from)) = rx.recv().await {
            let Ok(waiting) = self.shared.forwards_waiting.clone().try_acquire_owned() else {
                self.refuse(Refusal::ForwardQueue, from);
                continue; // dropped: closed
            };
            let node = self.clone();
            tokio::spawn(async move {
                let _waiting = waiting;
                let pre = match forward::read_preamble(&mut stream).await {
                    Ok(p) => p,
                    Err(error) => {
                        tracing::debug!(%from, %error, "cluster: bad forwarded connection");
                        return;
                    }
                };
                let mut socket = match stream {
                    Link::Tcp(s) => AcceptedSocket::Tcp(s),
                    tls => AcceptedSocket::Stream(Box::new(tls)),
                };
                // A node that has just become the leader opens its engine after the barrier
                // (seconds with a large state): the connection waits for it, as a local
                // client's does in `forward`. Not the leader (any more): closing makes the
                // client reconnect, and its node forwards it to whoever leads now.
                let deadline = tokio::time::Instant::now() + Duration::from_millis(LEADER_WAIT_MS);
                loop {
                    match node.to_engine(usize::from(pre.listener), socket, pre.peer) {
                        None => return,
                        Some(back) => socket = back,
                    }
                    let st = node.status();
                    if st.leader != Some(st.node_id) || tokio::time::Instant::now() >= deadline {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            });
        }
    }
}
