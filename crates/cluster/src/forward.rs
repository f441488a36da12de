//! Client connections forwarded between nodes. Only the leader runs the MQTT engine; a node
//! that is not the leader passes each client connection it accepts to the leader's cluster
//! port, byte for byte, so a client may connect to any node. The leader serves it as if it
//! had accepted it on the same listener (TLS and WebSocket are the leader's to undo, with the
//! same listener configuration on every node).
//!
//! The preamble a forwarding node writes first: [`FORWARD_MAGIC`] (what the leader's
//! cluster port tells forwarded connections from Raft traffic by, and reads), the listener's
//! index (u16, big-endian), the client address's length (u16) and the address as text.
//!
//! With `[cluster] tls_*` the connection to the leader is the same mutual TLS as Raft's
//! (`tern_raft::tls`): the preamble and the client's bytes travel inside it.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tern_raft::network::FORWARD_MAGIC;
use tern_raft::{ClusterTls, Link};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod pipe;
pub use pipe::{MAX_PIPE_BUFFER_BYTES, MIN_PIPE_BUFFER_BYTES};

/// Longest client address text a preamble may carry.
pub const MAX_PEER_TEXT_BYTES: usize = 128;
/// How long a forwarding node may take to send its preamble.
pub const PREAMBLE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long connecting to the leader's cluster port may take (its TLS handshake included).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// What a forwarded connection says of itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preamble {
    pub listener: u16,
    pub peer: SocketAddr,
}

/// Opens a forwarded connection for `preamble` to the cluster port at `leader`, over TLS
/// if `tls` is given.
pub async fn connect(
    leader: SocketAddr,
    preamble: &Preamble,
    tls: Option<&ClusterTls>,
) -> io::Result<Link> {
    let mut stream = tern_raft::network::connect_within(leader, tls, CONNECT_TIMEOUT).await?;
    let peer = preamble.peer.to_string();
    let mut head = Vec::with_capacity(8 + peer.len());
    head.extend_from_slice(&FORWARD_MAGIC);
    head.extend_from_slice(&preamble.listener.to_be_bytes());
    head.extend_from_slice(&u16::try_from(peer.len()).unwrap_or(0).to_be_bytes());
    head.extend_from_slice(peer.as_bytes());
    stream.write_all(&head).await?;
    stream.flush().await?;
    Ok(stream)
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("forward preamble: {what}"),
    )
}

/// Reads the preamble of a connection the cluster port recognised as forwarded (it read the
/// [`FORWARD_MAGIC`]: the listener's index comes next).
pub async fn read_preamble(stream: &mut Link) -> io::Result<Preamble> {
    tokio::time::timeout(PREAMBLE_TIMEOUT, async {
        let listener = stream.read_u16().await?;
        let len = usize::from(stream.read_u16().await?);
        if len > MAX_PEER_TEXT_BYTES {
            return Err(invalid("address too long"));
        }
        let mut text = vec![0u8; len];
        stream.read_exact(&mut text).await?;
        let peer = std::str::from_utf8(&text)
            .ok()
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| invalid("bad address"))?;
        Ok(Preamble { listener, peer })
    })
    .await
    .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "forward preamble"))?
}

/// Copies bytes both ways until either side closes.
pub async fn pipe(client: TcpStream, leader: Link) {
    let _ = client.set_nodelay(true);
    let _ = pipe::copy_both_ways(client, leader).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the cluster port does before `read_preamble`: reads the magic.
    async fn accept_past_magic(listener: &tokio::net::TcpListener) -> Link {
        let (s, _) = listener.accept().await.unwrap();
        let mut link = Link::Tcp(s);
        let mut magic = [0u8; 4];
        link.read_exact(&mut magic).await.unwrap();
        assert_eq!(magic, FORWARD_MAGIC);
        link
    }

    #[tokio::test]
    async fn a_preamble_round_trips_and_garbage_is_refused() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let pre = Preamble {
            listener: 3,
            peer: "10.1.2.3:4567".parse().unwrap(),
        };
        let sent = pre.clone();
        let client = tokio::spawn(async move { connect(addr, &sent, None).await.unwrap() });
        let mut s = accept_past_magic(&listener).await;
        assert_eq!(read_preamble(&mut s).await.unwrap(), pre);
        drop(client.await.unwrap());

        let garbage = tokio::spawn(async move {
            let mut c = TcpStream::connect(addr).await.unwrap();
            c.write_all(b"TMQT\x00\x01\xff\xffxx").await.unwrap();
            c
        });
        let mut s = accept_past_magic(&listener).await;
        assert!(read_preamble(&mut s).await.is_err());
        drop(garbage.await.unwrap());
    }
}
