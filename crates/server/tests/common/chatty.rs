//! A client that keeps writing while the broker closes its connection: the case where closing
//! a socket with unread bytes makes the kernel send RST, and the peer's kernel may throw away
//! the reason (DISCONNECT, refusing CONNACK) still in flight (issue 24 item 1; Eclipse Paho's
//! `test_flow_control2`).
//!
//! The reader answers every PUBREC with a PUBREL at once, before it decodes the next packet, as
//! Paho's client does; a writer task sends a PINGREQ every [`CHATTER_INTERVAL`] besides, until
//! the reader has read the reason or a write fails. The reader collects every packet until the
//! stream ends and says how it ended, and whether a write failed (EPIPE, ECONNRESET: the
//! broker's RST) while the reason was still unread: Paho gives up there and never reads it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::Mutex;
use tokio::time::Instant;

use super::WAIT;
use super::raw::{Packet, Protocol, ReasonCode, ack, brief};

/// Pause between two PINGREQs of the writer: often enough that bytes are always unread in the
/// broker's receive buffer when it decides to close.
pub const CHATTER_INTERVAL: Duration = Duration::from_millis(1);

/// The reader's pause before its first PUBREL, as a slow client (Paho in Python) takes: the
/// broker has decided to close by then, and its PUBRECs and DISCONNECT wait unread here.
const FIRST_REPLY_PAUSE: Duration = Duration::from_millis(100);

/// The reader's pause once it has decoded the reason, before it tells the writer to stop: the
/// reason arrives while the client is busy writing (a client's writes do not wait for its
/// reads). Without a linger the broker has closed by then, and the writer's next write fails.
const REASON_PAUSE: Duration = Duration::from_millis(100);

/// How the stream ended, from the client's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// An orderly end of stream (FIN).
    Eof,
    /// A read failed (RST: ECONNRESET).
    Reset,
    /// Neither within [`WAIT`].
    Timeout,
    /// The broker sent bytes tern-wire rejects.
    Undecodable,
}

/// What the client read before the end, and how it ended.
#[derive(Debug)]
pub struct Ending {
    pub packets: Vec<Packet>,
    pub end: End,
    /// A write failed before the reason was read (a client like Paho stops there).
    pub early_write_error: Option<std::io::ErrorKind>,
}

impl Ending {
    /// The reason of the last packet, if it is a DISCONNECT or a CONNACK.
    pub fn reason(&self) -> Option<ReasonCode> {
        match self.packets.last() {
            Some(Packet::Disconnect(d)) => Some(d.reason),
            Some(Packet::ConnAck(ca)) => Some(ca.reason),
            _ => None,
        }
    }

    /// Asserts the stream ended after a packet with `reason` (DISCONNECT or CONNACK), read by
    /// the client, then an orderly end of stream.
    pub fn assert_reason(&self, reason: ReasonCode, what: &str) {
        if let Err(failure) = self.check(reason, what) {
            panic!("{failure}");
        }
    }

    /// [`Ending::assert_reason`]'s check, for tests that go through every case first.
    pub fn check(&self, reason: ReasonCode, what: &str) -> Result<(), String> {
        if self.reason() != Some(reason) {
            let briefs: Vec<String> = self.packets.iter().rev().take(4).map(brief).collect();
            return Err(format!(
                "{what}: expected reason 0x{:02x} read before the close; ended {:?} after {} packets, the last (newest first): {briefs:?}",
                reason.0,
                self.end,
                self.packets.len()
            ));
        }
        if let Some(error) = self.early_write_error {
            return Err(format!(
                "{what}: a write failed ({error:?}) before the reason was read (Paho gives up there)"
            ));
        }
        if self.end != End::Eof {
            return Err(format!(
                "{what}: the reason was read, but the stream then ended with {:?}, not EOF",
                self.end
            ));
        }
        Ok(())
    }
}

/// Fails the test with every failed case of `checks` (each case runs, so that a test of many
/// reasons says which of them fail).
pub fn assert_all(checks: &[Result<(), String>]) {
    let failures: Vec<&String> = checks.iter().filter_map(|c| c.as_ref().err()).collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases failed: {failures:#?}",
        failures.len(),
        checks.len()
    );
}

/// What the reader and the writer task share.
struct Shared {
    write: Mutex<OwnedWriteHalf>,
    /// The reader read a DISCONNECT or a refusing CONNACK: the writer stops.
    reason_read: AtomicBool,
    early_write_error: std::sync::Mutex<Option<std::io::ErrorKind>>,
}

impl Shared {
    /// Writes `bytes`; false if the write failed (recorded if the reason was still unread).
    async fn write(&self, bytes: &[u8]) -> bool {
        let Err(error) = self.write.lock().await.write_all(bytes).await else {
            return true;
        };
        if !self.reason_read.load(Ordering::Acquire) {
            let mut early = self.early_write_error.lock().expect("not poisoned");
            early.get_or_insert(error.kind());
        }
        false
    }
}

/// A connection whose writer never stops on its own.
pub struct Chatty {
    read: OwnedReadHalf,
    buf: BytesMut,
    protocol: Protocol,
    shared: Arc<Shared>,
    writer: tokio::task::JoinHandle<()>,
}

impl Chatty {
    /// Opens a connection, writes `first` (a CONNECT, maybe more) and starts the writer.
    pub async fn open(addr: std::net::SocketAddr, protocol: Protocol, first: &[u8]) -> Chatty {
        let stream = tokio::time::timeout(WAIT, TcpStream::connect(addr))
            .await
            .expect("tcp connect timed out")
            .expect("tcp connect");
        stream.set_nodelay(true).expect("nodelay");
        let (read, mut write) = stream.into_split();
        write.write_all(first).await.expect("first write");
        let shared = Arc::new(Shared {
            write: Mutex::new(write),
            reason_read: AtomicBool::new(false),
            early_write_error: std::sync::Mutex::new(None),
        });
        let writer = tokio::spawn(chatter(shared.clone(), protocol));
        Chatty {
            read,
            buf: BytesMut::with_capacity(16 * 1024),
            protocol,
            shared,
            writer,
        }
    }

    /// A write failed (while the reason was unread): the broker's socket is gone.
    pub fn write_failed(&self) -> bool {
        self.shared
            .early_write_error
            .lock()
            .expect("not poisoned")
            .is_some()
    }

    /// The next packet within [`WAIT`], for a client that must be connected before the broker
    /// closes it (a takeover, an administrative kick).
    pub async fn expect_packet(&mut self) -> Packet {
        let deadline = Instant::now() + WAIT;
        match self.next(deadline).await {
            Ok(packet) => packet,
            Err(end) => panic!("expected a packet, the stream ended: {end:?}"),
        }
    }

    /// Reads until the stream ends, answering every PUBREC with a PUBREL before it decodes the
    /// next packet (as Paho does); the writer stops once a DISCONNECT or a CONNACK refusing the
    /// connection was read.
    pub async fn read_to_end(mut self) -> Ending {
        let deadline = Instant::now() + WAIT;
        let mut packets = Vec::new();
        let mut replied = false;
        let end = loop {
            let packet = match self.next(deadline).await {
                Ok(packet) => packet,
                Err(end) => break end,
            };
            match &packet {
                Packet::PubRec(a) => {
                    if !std::mem::replace(&mut replied, true) {
                        tokio::time::sleep(FIRST_REPLY_PAUSE).await;
                    }
                    let mut out = BytesMut::new();
                    let pubrel = Packet::PubRel(ack(a.packet_id));
                    tern_wire::encode(&pubrel, self.protocol, &mut out).expect("encode PUBREL");
                    self.shared.write(&out).await;
                }
                Packet::Disconnect(_) => self.reason_read().await,
                Packet::ConnAck(ca) if !ca.reason.is_success() => self.reason_read().await,
                _ => {}
            }
            packets.push(packet);
        };
        self.shared.reason_read.store(true, Ordering::Release);
        let _ = tokio::time::timeout(WAIT, self.writer).await;
        let early_write_error = *self.shared.early_write_error.lock().expect("not poisoned");
        Ending {
            packets,
            end,
            early_write_error,
        }
    }

    /// The reason was decoded: after [`REASON_PAUSE`] the writer stops.
    async fn reason_read(&self) {
        tokio::time::sleep(REASON_PAUSE).await;
        self.shared.reason_read.store(true, Ordering::Release);
    }

    /// The next packet, or how the stream ended.
    async fn next(&mut self, deadline: Instant) -> Result<Packet, End> {
        loop {
            match tern_wire::decode(&mut self.buf, self.protocol, u32::MAX) {
                Ok(Some(packet)) => return Ok(packet),
                Ok(None) => {}
                Err(_) => return Err(End::Undecodable),
            }
            match tokio::time::timeout_at(deadline, self.read.read_buf(&mut self.buf)).await {
                Err(_) => return Err(End::Timeout),
                Ok(Ok(0)) => return Err(End::Eof),
                Ok(Err(_)) => return Err(End::Reset),
                Ok(Ok(_)) => {}
            }
        }
    }
}

/// The writer task: a PINGREQ every [`CHATTER_INTERVAL`] until the reason was read or a write
/// failed (the broker's RST, or its close once the linger is over).
async fn chatter(shared: Arc<Shared>, protocol: Protocol) {
    let mut ping = BytesMut::new();
    tern_wire::encode(&Packet::PingReq, protocol, &mut ping).expect("encode PINGREQ");
    while !shared.reason_read.load(Ordering::Acquire) {
        tokio::time::sleep(CHATTER_INTERVAL).await;
        if !shared.write(&ping).await {
            return;
        }
    }
}
