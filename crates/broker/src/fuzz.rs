//! The core of the whole-connection fuzz target (`crates/broker/fuzz`, cargo-fuzz): arbitrary
//! bytes through a real broker connection (CONNECT handshake, read loop, every handler, acks,
//! routing, the writer), not only the decoder. Also replayed by `cargo test`
//! (`tests/fuzz_corpus.rs`) over the committed corpus.
//!
//! One run: a fresh broker (memory store, small limits, an ACL so that its paths run too)
//! serves one loopback listener; a second client is subscribed to `#` so that routed messages
//! are delivered and written; the input is written on one connection, whatever the broker
//! answers is read, and once it has been quiet for [`QUIET_MS`] the write side is shut (EOF, as
//! from a client that vanished) and the rest is read until the broker closes. Then a fresh client must still get a CONNACK (the broker
//! is not wedged), and the broker must shut down cleanly.
//!
//! What a run checks: it finishes within [`RUN_TIMEOUT_MS`] (no hang), the broker answers
//! afterwards, the bytes sent back stay under [`MAX_REPLY_BYTES`], and what stays queued
//! (persistent sessions keep their queues by design) is within `max_queued_bytes_total`. Panics in the broker's
//! tasks are the caller's to catch: libFuzzer aborts on them; the corpus test installs a panic
//! hook.

use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::auth::{Acl, AuthRules};
use crate::{Broker, BrokerConfig};

/// A run that takes longer than this is a hang.
pub(crate) const RUN_TIMEOUT_MS: u64 = 10_000;
/// Bytes the broker may send back to one input (inputs are at most a few KiB; acks and
/// deliveries of them stay far below this).
pub(crate) const MAX_REPLY_BYTES: usize = 4 * 1024 * 1024;

/// The fuzzed connection gets EOF once the broker sent nothing for this long after the input
/// was written (so that its answers are read, and the writer's paths run, before it closes).
const QUIET_MS: u64 = 20;

/// The ACL the fuzzed broker enforces (anonymous clients may use `a/#`, `$SYS` readable).
const ACL: &str = "topic readwrite a/#\ntopic read $SYS/#\npattern readwrite c/%c/#\n";

/// What one run saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Bytes the broker sent back on the fuzzed connection.
    pub reply_bytes: usize,
    /// Bytes the subscriber on `#` received.
    pub(crate) delivered_bytes: usize,
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("socket: {0}")]
    Io(#[from] io::Error),
    #[error("the run did not finish within {RUN_TIMEOUT_MS} ms")]
    Hung,
    #[error("the broker sent {0} bytes back")]
    TooMuch(usize),
    #[error("the broker no longer answers a CONNECT")]
    Wedged,
    #[error("{0} bytes still queued after every connection closed")]
    Leaked(usize),
}

fn config() -> BrokerConfig {
    BrokerConfig {
        max_packet_size_bytes: 64 * 1024,
        connect_timeout_ms: 2_000,
        receive_maximum: 16,
        max_inflight_messages: 16,
        outbound_queue_max_bytes: 256 * 1024,
        sys_interval_s: 0,
        ..BrokerConfig::default()
    }
}

/// Runs `input` through one broker connection (module doc). Call it inside a tokio runtime.
pub async fn run_connection(input: &[u8]) -> Result<Outcome, RunError> {
    tokio::time::timeout(Duration::from_millis(RUN_TIMEOUT_MS), run_inner(input))
        .await
        .map_err(|_| RunError::Hung)?
}

async fn run_inner(input: &[u8]) -> Result<Outcome, RunError> {
    let broker = Broker::new(config()).map_err(|e| io::Error::other(e.to_string()))?;
    let acl = Acl::parse(ACL).map_err(|e| io::Error::other(e.to_string()))?;
    broker.shared().auth.replace(AuthRules {
        acl: Some(Arc::new(acl)),
        ..AuthRules::default()
    });
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = broker.clone();
    let serving = tokio::spawn(async move {
        server
            .serve(listener, async {
                let _ = stop_rx.await;
            })
            .await
    });

    let mut watcher = connect_v5(addr, "fuzz-watcher").await?;
    // SUBSCRIBE id 1, `#` at QoS 0 (v5: empty properties); wait for the SUBACK.
    watcher
        .write_all(&[0x82, 0x07, 0x00, 0x01, 0x00, 0x00, 0x01, b'#', 0x00])
        .await?;
    let mut suback = [0u8; 6];
    watcher.read_exact(&mut suback).await?;

    let stream = TcpStream::connect(addr).await?;
    let (mut reader, mut writer) = stream.into_split();
    let data = input.to_vec();
    let (written_tx, written_rx) = tokio::sync::oneshot::channel::<()>();
    let (eof_tx, eof_rx) = tokio::sync::oneshot::channel::<()>();
    let writing = tokio::spawn(async move {
        // The broker may close early: a failed write is an outcome, not an error.
        let _ = writer.write_all(&data).await;
        let _ = written_tx.send(());
        // EOF once the reader saw the broker go quiet: a client that vanished.
        let _ = eof_rx.await;
        let _ = writer.shutdown().await;
        writer
    });
    let reply = read_reply(&mut reader, written_rx, eof_tx).await?;
    drop(writing.await);

    // Not wedged: a new client is served.
    let probe = connect_v5(addr, "fuzz-probe")
        .await
        .map_err(|_| RunError::Wedged)?;
    drop(probe);
    // What the watcher got (it is disconnected by the shutdown below).
    let _ = watcher.shutdown().await;
    let mut delivered = Vec::new();
    let _ = tokio::time::timeout(
        Duration::from_millis(RUN_TIMEOUT_MS / 2),
        watcher.read_to_end(&mut delivered),
    )
    .await;
    let _ = stop_tx.send(());
    serving
        .await
        .map_err(|e| io::Error::other(e.to_string()))??;
    let queued = broker.shared().metrics.queued.bytes.load(Ordering::Relaxed);
    // Persistent sessions (clean start 0) keep their QoS>0 queues by design; the memory store
    // keeps nothing else. Everything queued must be within the broker's own bound.
    if queued > broker.shared().config.max_queued_bytes_total {
        return Err(RunError::Leaked(queued));
    }
    Ok(Outcome {
        reply_bytes: reply.len(),
        delivered_bytes: delivered.len(),
    })
}

/// Reads what the broker answers the input with: until it goes quiet after the input was
/// written (then EOF is sent, a client that vanished) and on to the end of the stream.
async fn read_reply(
    reader: &mut tokio::net::tcp::OwnedReadHalf,
    written_rx: tokio::sync::oneshot::Receiver<()>,
    eof_tx: tokio::sync::oneshot::Sender<()>,
) -> Result<Vec<u8>, RunError> {
    let mut written = Some(written_rx);
    let mut eof = Some(eof_tx);
    let mut reply = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let quiet = Duration::from_millis(QUIET_MS);
        let read = if eof.is_some() {
            tokio::time::timeout(quiet, reader.read(&mut chunk)).await
        } else {
            Ok(reader.read(&mut chunk).await)
        };
        match read {
            // Quiet after the input was written: send EOF and read to the end.
            Err(_) => {
                if let Some(written) = written.take() {
                    let _ = written.await;
                }
                if let Some(eof) = eof.take() {
                    let _ = eof.send(());
                }
            }
            Ok(Ok(0) | Err(_)) => break,
            Ok(Ok(n)) => {
                reply.extend_from_slice(&chunk[..n]);
                if reply.len() > MAX_REPLY_BYTES {
                    return Err(RunError::TooMuch(reply.len()));
                }
            }
        }
    }
    drop(eof);
    Ok(reply)
}

/// A v5 client with clean start, after its CONNACK.
async fn connect_v5(addr: std::net::SocketAddr, client_id: &str) -> io::Result<TcpStream> {
    let mut stream = TcpStream::connect(addr).await?;
    let id = client_id.as_bytes();
    let mut body = vec![
        0x00, 0x04, b'M', b'Q', b'T', b'T', 0x05, 0x02, 0x00, 0x00, 0x00,
    ];
    body.extend_from_slice(&(id.len() as u16).to_be_bytes());
    body.extend_from_slice(id);
    let mut packet = vec![0x10, body.len() as u8];
    packet.extend_from_slice(&body);
    stream.write_all(&packet).await?;
    // CONNACK: type, remaining length (< 128 here), then that many bytes.
    let mut head = [0u8; 2];
    stream.read_exact(&mut head).await?;
    let mut rest = vec![0u8; usize::from(head[1])];
    stream.read_exact(&mut rest).await?;
    if head[0] != 0x20 || rest.get(1) != Some(&0) {
        return Err(io::Error::other("CONNACK refused"));
    }
    Ok(stream)
}
