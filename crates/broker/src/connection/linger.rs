//! The socket's last seconds after a close the broker started: its reason (a v5 DISCONNECT, a
//! refusing CONNACK) is written and the writing side shut down, then the connection reads and
//! throws away what the client still sends, until the client's end of stream or
//! [`CLOSE_LINGER_MS`], and only then closes the socket (issue 24 item 1).
//!
//! Why: a socket closed with bytes unread in its receive buffer makes the kernel send RST, not
//! FIN. A client that goes on writing (PUBRELs answering the PUBRECs queued ahead of our
//! DISCONNECT, PINGREQs) then fails its next write with EPIPE or ECONNRESET before it has read
//! the reason, and the reason still unsent or unread may be thrown away with the connection
//! (Eclipse Paho's `test_flow_control2`). Read to the end, the close is a FIN after the reason.
//!
//! # Invariants
//! - A lingering socket is its own small task holding the reading half and nothing of the
//!   connection: the session is detached, the will handled, the connection's place under
//!   `max_connections` given back before it starts (the close path ran to its end). So a
//!   takeover or a will never waits for a linger, and no idle connection's future grows.
//! - At most [`MAX_LINGERING_CLOSES`] sockets linger at once; beyond it a socket is closed at
//!   once and counted (`closes_not_lingered`). Each lingers at most [`CLOSE_LINGER_MS`], so the
//!   memory and file descriptors they hold are bounded, and so is a shutdown's wait for them.

use std::future::poll_fn;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use crate::engine::Shared;
use crate::engine::live_tasks::LiveTask;
use crate::metrics::Metrics;
use crate::transport::TransportRead;

/// How long a socket whose close the broker started reads and discards what the client still
/// sends before it is closed: the client has that long to read the reason and end its side.
pub(crate) const CLOSE_LINGER_MS: u64 = 2_000;

/// Sockets lingering at once, at most; more are closed at once (and may lose their reason to a
/// reset, as before the linger). Each holds a task of a few hundred bytes and a file
/// descriptor for at most [`CLOSE_LINGER_MS`].
pub(crate) const MAX_LINGERING_CLOSES: usize = 1_024;

/// Bytes read and thrown away per read while lingering (a stack buffer, not kept).
const DISCARD_CHUNK_BYTES: usize = 4 * 1024;

/// Reads per turn of the lingering task before it yields: a client that writes as fast as it
/// can must not hold a worker thread (nor keep the linger's timer from firing).
const DISCARD_READS_PER_TURN: usize = 16;

/// Hands the reading half of a socket whose writing side the close shut down to a task that
/// lingers on it (module doc); closes it at once beyond [`MAX_LINGERING_CLOSES`].
pub(crate) fn linger<R: TransportRead>(shared: &Arc<Shared>, reader: R) {
    let Some(held) = LiveTask::within(&shared.lingering, MAX_LINGERING_CLOSES) else {
        let n = Metrics::add_get(&shared.metrics.closes_not_lingered, 1);
        if n.is_power_of_two() {
            tracing::warn!(
                limit = MAX_LINGERING_CLOSES,
                count = n,
                "too many closing sockets lingering; closed at once"
            );
        }
        return;
    };
    Metrics::add(&shared.metrics.closes_lingered, 1);
    tokio::spawn(async move {
        let linger = Duration::from_millis(CLOSE_LINGER_MS);
        let _ = tokio::time::timeout(linger, discard_to_end(&reader)).await;
        // The socket closes here (a FIN was sent already), then the place is given back.
        drop(reader);
        drop(held);
    });
}

/// Reads and discards until the end of stream or an error.
async fn discard_to_end<R: TransportRead>(reader: &R) {
    loop {
        if poll_fn(|cx| reader.poll_readable(cx)).await.is_err() {
            return;
        }
        match discard_available(reader) {
            Discarded::Drained => {}
            Discarded::More => tokio::task::yield_now().await,
            Discarded::Ended => return,
        }
    }
}

/// What one turn of [`discard_available`] found.
enum Discarded {
    /// Nothing more to read for now.
    Drained,
    /// [`DISCARD_READS_PER_TURN`] reads, and maybe more to come.
    More,
    /// End of stream or an error.
    Ended,
}

/// Reads and discards what is there, at most [`DISCARD_READS_PER_TURN`] reads.
fn discard_available<R: TransportRead>(reader: &R) -> Discarded {
    let mut chunk = [0u8; DISCARD_CHUNK_BYTES];
    for _ in 0..DISCARD_READS_PER_TURN {
        match reader.try_read(&mut chunk) {
            Ok(0) => return Discarded::Ended,
            Ok(_) => {}
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => return Discarded::Drained,
            Err(_) => return Discarded::Ended,
        }
    }
    Discarded::More
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    /// How long a test waits for what must happen soon.
    const WAIT: Duration = Duration::from_secs(5);

    /// The broker's end (write side shut down, as the close path leaves it) and the client's.
    async fn closing_pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let client = TcpStream::connect(listener.local_addr().expect("addr"))
            .await
            .expect("connect");
        let (mut server, _) = listener.accept().await.expect("accept");
        server.shutdown().await.expect("shutdown");
        (server, client)
    }

    fn shared() -> Arc<Shared> {
        let broker = crate::Broker::new(crate::BrokerConfig::default()).expect("broker");
        broker.shared().clone()
    }

    async fn wait_until_none_linger(shared: &Shared) {
        let deadline = Instant::now() + WAIT;
        while shared.lingering.alive() > 0 {
            assert!(Instant::now() < deadline, "the linger did not end");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// The linger reads what the client still sends (more than a socket buffer holds) until the
    /// client's end of stream; the client sees our FIN, never a reset.
    #[tokio::test]
    async fn a_lingering_socket_reads_to_the_clients_end_of_stream() {
        let shared = shared();
        let (server, mut client) = closing_pair().await;
        linger(&shared, server);
        assert_eq!(Metrics::get(&shared.metrics.closes_lingered), 1);
        let chunk = [7u8; 64 * 1024];
        for _ in 0..64 {
            client
                .write_all(&chunk)
                .await
                .expect("the linger reads it all");
        }
        let mut buf = [0u8; 16];
        let read = tokio::time::timeout(WAIT, client.read(&mut buf)).await;
        assert!(matches!(read, Ok(Ok(0))), "EOF expected: {read:?}");
        client.shutdown().await.expect("shutdown");
        wait_until_none_linger(&shared).await;
    }

    /// A client that never stops writing (and never ends its side) is cut off after
    /// `CLOSE_LINGER_MS`, however fast it writes: the linger yields between its reads.
    #[tokio::test]
    async fn a_client_that_never_stops_writing_is_closed_after_the_linger() {
        let shared = shared();
        let (server, mut client) = closing_pair().await;
        let started = Instant::now();
        linger(&shared, server);
        let chunk = [7u8; 4 * 1024];
        let flood = async { while client.write_all(&chunk).await.is_ok() {} };
        tokio::time::timeout(Duration::from_millis(CLOSE_LINGER_MS) + WAIT, flood)
            .await
            .expect("the socket was closed");
        let lingered = started.elapsed();
        assert!(
            lingered >= Duration::from_millis(CLOSE_LINGER_MS),
            "{lingered:?}"
        );
        wait_until_none_linger(&shared).await;
    }

    /// Beyond `MAX_LINGERING_CLOSES` a socket is closed at once and counted; the places come
    /// back when the lingering tasks end.
    #[tokio::test]
    async fn beyond_the_limit_a_socket_is_closed_at_once_and_counted() {
        let shared = shared();
        let taken: Vec<LiveTask> = (0..MAX_LINGERING_CLOSES)
            .map(|_| LiveTask::within(&shared.lingering, MAX_LINGERING_CLOSES).expect("room"))
            .collect();
        assert!(LiveTask::within(&shared.lingering, MAX_LINGERING_CLOSES).is_none());
        let (server, mut client) = closing_pair().await;
        linger(&shared, server);
        assert_eq!(Metrics::get(&shared.metrics.closes_not_lingered), 1);
        assert_eq!(Metrics::get(&shared.metrics.closes_lingered), 0);
        let mut buf = [0u8; 16];
        let read = tokio::time::timeout(WAIT, client.read(&mut buf)).await;
        assert!(matches!(read, Ok(Ok(0))), "closed at once: {read:?}");
        // The socket is gone: a write draws a reset, and the next one fails.
        let _ = client.write_all(b"x").await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(client.write_all(b"x").await.is_err());
        drop(taken);
        assert_eq!(shared.lingering.alive(), 0);
    }

    /// The stream transports (TLS, WebSocket: `StreamTransport`) linger too, through the
    /// connection's real close path: a v5 client sends a malformed packet after its CONNACK
    /// and keeps writing PINGREQs; every write succeeds, and it reads DISCONNECT 0x81
    /// (MQTT-4.13.1-1) and the end of stream.
    #[tokio::test]
    async fn a_stream_transport_connection_lingers_after_its_disconnect() {
        let shared = shared();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let mut client = TcpStream::connect(listener.local_addr().expect("addr"))
            .await
            .expect("connect");
        let (server, peer) = listener.accept().await.expect("accept");
        let (_stop, stop) = tokio::sync::watch::channel(false);
        let info = crate::transport::ConnectionInfo::new(
            crate::transport::ListenerContext::plain_tcp("test"),
            peer,
        );
        let transport = crate::transport::StreamTransport::new(server);
        tokio::spawn(crate::connection::run(
            shared.clone(),
            transport,
            info,
            stop,
            (),
        ));
        // CONNECT v5, client id "a", no properties; then a five-byte Remaining Length.
        let connect = [
            0x10, 14, 0x00, 0x04, b'M', b'Q', b'T', b'T', 5, 0x02, 0x00, 0x00, 0x00, 0x00, 0x01,
            b'a',
        ];
        client.write_all(&connect).await.expect("CONNECT");
        let protocol = tern_wire::Protocol::V5;
        let mut buf = bytes::BytesMut::new();
        let connack = loop {
            if let Some(packet) = tern_wire::decode(&mut buf, protocol, u32::MAX).expect("decode") {
                break packet;
            }
            let read = tokio::time::timeout(WAIT, client.read_buf(&mut buf)).await;
            assert!(
                matches!(read, Ok(Ok(n)) if n > 0),
                "CONNACK expected: {read:?}"
            );
        };
        assert!(
            matches!(connack, tern_wire::Packet::ConnAck(_)),
            "{connack:?}"
        );
        client
            .write_all(&[0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F])
            .await
            .expect("malformed");
        let (mut read, mut write) = client.into_split();
        let chatter = tokio::spawn(async move {
            for _ in 0..200 {
                tokio::time::sleep(Duration::from_millis(1)).await;
                write.write_all(&[0xC0, 0x00]).await?;
            }
            Ok::<_, io::Error>(write)
        });
        let mut received = Vec::new();
        let read_all = tokio::time::timeout(WAIT, read.read_to_end(&mut received)).await;
        assert!(matches!(read_all, Ok(Ok(_))), "EOF expected: {read_all:?}");
        buf.extend_from_slice(&received);
        let disconnect = tern_wire::decode(&mut buf, protocol, u32::MAX);
        assert!(
            matches!(&disconnect, Ok(Some(tern_wire::Packet::Disconnect(d)))
                if d.reason == tern_wire::ReasonCode::MALFORMED_PACKET),
            "{disconnect:?}"
        );
        let mut write = chatter
            .await
            .expect("chatter")
            .expect("every write after the close succeeds while the socket lingers");
        write.shutdown().await.expect("shutdown");
        wait_until_none_linger(&shared).await;
        assert_eq!(Metrics::get(&shared.metrics.closes_lingered), 1);
    }
}
