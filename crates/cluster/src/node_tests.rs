//! The node's limits on client connections, each run small on a real node of one (its Raft
//! node on loopback, the real broker on its replicated disk): at the limit the next
//! connection is closed before its CONNECT is answered, counted, and the ones within the
//! limit are served. The tests hand the node its sockets themselves (as its accept loop and
//! the cluster port do), on a runtime of one thread, so that nothing drains a queue between
//! two of them.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tern_broker::{
    Broker, BrokerConfig, DurableConfig, DurableStore, Listener, ListenerContext, TransportKind,
};
use tern_raft::{Link, NodeConfig, NodeId, RaftNode};
use tern_store::vfs::Vfs;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

use super::{ClusterConfig, ClusterNode, EngineFactory, Limits, NodeParts, lock};
use crate::forward::{self, Preamble};

/// The broker the server opens (`crates/server/src/cluster.rs`), once the test lets it: until
/// then the node leads with no engine, and connections wait for one.
struct GatedEngine {
    opening: mpsc::UnboundedSender<()>,
    /// Opens once the sender is dropped.
    gate: Mutex<std::sync::mpsc::Receiver<()>>,
}

impl EngineFactory for GatedEngine {
    fn open(&self, dir: &Path, vfs: Arc<dyn Vfs>) -> Result<Broker, String> {
        let _ = self.opening.send(());
        let _ = self.gate.lock().map_err(|e| e.to_string())?.recv();
        let store = DurableStore::open_with_vfs(dir, DurableConfig::default(), vfs)
            .map_err(|e| e.to_string())?;
        let config = BrokerConfig {
            deliver_after_durable: true,
            ..BrokerConfig::default()
        };
        let broker = Broker::with_store(config, Arc::new(store)).map_err(|e| e.to_string())?;
        broker.mark_ready();
        Ok(broker)
    }

    fn serving(&self, _broker: Option<Broker>) {}
}

struct TestNode {
    node: ClusterNode,
    /// What the cluster port hands the node: forwarded connections, past the magic.
    forwarded: mpsc::Sender<(Link, SocketAddr)>,
    /// Dropped: the engine opens.
    gate: Option<std::sync::mpsc::Sender<()>>,
    stop: Option<oneshot::Sender<()>>,
    running: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl TestNode {
    /// A node of one with `limits`, returned once it leads and is opening its engine.
    async fn start(limits: Limits) -> TestNode {
        let dir = tempfile::tempdir().unwrap();
        let cluster = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = cluster.local_addr().unwrap();
        let raft = NodeConfig::new(NodeId(1), addr, vec![(NodeId(1), addr)], dir.path().into());
        let mut config = ClusterConfig::new(raft, dir.path().into());
        config.limits = limits;
        let replica = ClusterNode::open_replica(&config).unwrap();
        let raft =
            RaftNode::start_forwarding(config.raft.clone(), cluster, replica.applier(), None, None)
                .await
                .unwrap();
        let (forwarded, forwarded_rx) = mpsc::channel(limits.forward_queue);
        let parts = NodeParts {
            raft,
            replica,
            forwarded: forwarded_rx,
        };
        // Nobody connects to it: the tests route their sockets themselves.
        let clients = Listener {
            socket: TcpListener::bind("127.0.0.1:0").await.unwrap(),
            context: Arc::new(ListenerContext::new(0, "test", TransportKind::Tcp)),
            upgrade: None,
        };
        let (opening, mut opened) = mpsc::unbounded_channel();
        let (gate, gate_rx) = std::sync::mpsc::channel();
        let factory = Arc::new(GatedEngine {
            opening,
            gate: Mutex::new(gate_rx),
        });
        let (stop, stop_rx) = oneshot::channel::<()>();
        let (node_tx, node_rx) = oneshot::channel();
        let running = tokio::spawn(async move {
            let shutdown = async move {
                let _ = stop_rx.await;
            };
            let started = move |node| {
                let _ = node_tx.send(node);
            };
            ClusterNode::run_on(config, parts, vec![clients], factory, shutdown, started)
                .await
                .unwrap();
        });
        let node = node_rx.await.unwrap();
        within("the node to lead and open its engine", opened.recv()).await;
        TestNode {
            node,
            forwarded,
            gate: Some(gate),
            stop: Some(stop),
            running,
            _dir: dir,
        }
    }

    /// Lets the engine open and waits until it serves.
    async fn open_engine(&mut self) {
        self.gate = None;
        let shared = self.node.shared.clone();
        within("the engine to serve", async move {
            while lock(&shared.engine).is_none() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
    }

    async fn stop(mut self) {
        self.gate = None;
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        within("the node to stop", self.running).await.unwrap();
    }
}

/// `what`, which the test waits for; 30 s only keep a broken build from hanging.
async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(30), f).await {
        Ok(out) => out,
        Err(_) => panic!("waited 30 s for {what}"),
    }
}

/// A connected pair on loopback: the client's end, and the accepted end with its peer.
async fn pair(listener: &TcpListener) -> (TcpStream, TcpStream, SocketAddr) {
    let client = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (accepted, peer) = listener.accept().await.unwrap();
    (client, accepted, peer)
}

/// An MQTT 3.1.1 CONNECT with a clean session and `client_id`.
fn connect_packet(client_id: &str) -> Vec<u8> {
    let id = client_id.as_bytes();
    let mut packet = vec![0x10, (12 + id.len()) as u8];
    packet.extend_from_slice(&[0, 4, b'M', b'Q', b'T', b'T', 4, 0x02, 0, 60]);
    packet.extend_from_slice(&(id.len() as u16).to_be_bytes());
    packet.extend_from_slice(id);
    packet
}

#[derive(Debug, PartialEq, Eq)]
enum Answer {
    Connack,
    Closed,
}

/// Sends a CONNECT on `stream` and reads what the node answers.
async fn connect(stream: &mut (impl AsyncRead + AsyncWrite + Unpin), client_id: &str) -> Answer {
    // Writing to a socket the node closed may fail; the read says what happened.
    let _ = stream.write_all(&connect_packet(client_id)).await;
    let mut head = [0u8; 4];
    match within("an answer to CONNECT", stream.read_exact(&mut head)).await {
        Ok(_) => {
            assert_eq!(head, [0x20, 2, 0, 0], "a CONNACK accepting the client");
            Answer::Connack
        }
        Err(_) => Answer::Closed,
    }
}

/// Each test's end: with its limit at 2, the first two clients get a CONNACK, the third was
/// closed.
async fn assert_two_served_third_closed(ends: &mut [impl AsyncRead + AsyncWrite + Unpin]) {
    let mut answers = Vec::new();
    for (i, client) in ends.iter_mut().enumerate() {
        answers.push(connect(client, &format!("c{i}")).await);
    }
    use Answer::{Closed, Connack};
    assert_eq!(answers, vec![Connack, Connack, Closed]);
}

fn small(limits: Limits) -> Limits {
    debug_assert!(limits != Limits::default());
    limits
}

/// `MAX_FORWARDED_CONNECTIONS` (2 here): while client connections wait for a leader's engine
/// (here, this new leader's, still opening), a third is closed at once; the two are served
/// once the engine runs.
#[tokio::test]
async fn a_client_beyond_max_forwarded_connections_is_closed() {
    let limits = small(Limits {
        forwarded_connections: 2,
        ..Limits::default()
    });
    let mut t = TestNode::start(limits).await;
    let clients = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut ends = Vec::new();
    for _ in 0..3 {
        let (client, accepted, peer) = pair(&clients).await;
        t.node.route(0, accepted, peer);
        ends.push(client);
    }
    assert_eq!(t.node.refused_connections().forwarded_connections, 1);
    t.open_engine().await;
    assert_two_served_third_closed(&mut ends).await;
    t.stop().await;
}

/// `MAX_ACCEPT_QUEUE` (2 here): three sockets handed to the engine before its accept loop
/// runs: the third is closed, the two are served.
#[tokio::test]
async fn a_socket_beyond_max_accept_queue_is_closed() {
    let limits = small(Limits {
        accept_queue: 2,
        ..Limits::default()
    });
    let mut t = TestNode::start(limits).await;
    t.open_engine().await;
    let clients = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut pairs = Vec::new();
    for _ in 0..3 {
        pairs.push(pair(&clients).await);
    }
    // No await from here to the last: the engine's accept loop (this thread's) cannot run.
    let mut ends = Vec::new();
    for (client, accepted, peer) in pairs {
        t.node.route(0, accepted, peer);
        ends.push(client);
    }
    assert_eq!(t.node.refused_connections().accept_queue, 1);
    assert_two_served_third_closed(&mut ends).await;
    t.stop().await;
}

/// `MAX_FORWARD_QUEUE` (2 here): connections other nodes forward to this new leader while
/// its engine opens wait for it; a third is closed at once (its node then closes its
/// client); the two are served once the engine runs.
#[tokio::test]
async fn a_forwarded_connection_beyond_max_forward_queue_is_closed() {
    let limits = small(Limits {
        forward_queue: 2,
        ..Limits::default()
    });
    let mut t = TestNode::start(limits).await;
    let port = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut ends = Vec::new();
    for i in 0..3u16 {
        // What a forwarding node sends, and what the cluster port hands over past the magic.
        let peer: SocketAddr = format!("10.0.0.1:{}", 1000 + i).parse().unwrap();
        let pre = Preamble { listener: 0, peer };
        let (client, accepted) = tokio::join!(
            forward::connect(port.local_addr().unwrap(), &pre, None),
            port.accept()
        );
        let (mut accepted, from) = accepted.unwrap();
        let mut magic = [0u8; 4];
        accepted.read_exact(&mut magic).await.unwrap();
        t.forwarded.send((Link::Tcp(accepted), from)).await.unwrap();
        ends.push(client.unwrap());
    }
    // Drained: the node has taken (or closed) all three.
    let forwarded = t.forwarded.clone();
    within("the node to take the forwarded connections", async move {
        while forwarded.capacity() < forwarded.max_capacity() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert_eq!(t.node.refused_connections().forward_queue, 1);
    t.open_engine().await;
    assert_two_served_third_closed(&mut ends).await;
    t.stop().await;
}
