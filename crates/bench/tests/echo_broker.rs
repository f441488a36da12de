//! End to end: the bench tool against a tiny in-test MQTT broker built on tern-wire (QoS 0 and 1,
//! exact topic match), including brokers that lose or duplicate on purpose.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::BytesMut;
use clap::Parser;
use tern_bench::{Cli, Report};
use tern_wire::{
    Ack, ConnAck, Packet, Properties, Protocol, Publish, QoS, ReasonCode, SubAck, decode, encode,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

#[derive(Clone, Copy, Debug)]
enum Fault {
    None,
    /// Drop the n-th forwarded message (1-based, over the whole broker).
    Drop(u64),
    /// Forward the n-th message twice.
    Duplicate(u64),
    /// Hold the n-th message back and send it after the next one.
    Swap(u64),
}

type Subscribers = Arc<Mutex<Vec<(String, QoS, mpsc::UnboundedSender<Publish>)>>>;

struct Broker {
    subscribers: Subscribers,
    forwarded: AtomicU64,
    fault: Fault,
    held: Mutex<Option<Publish>>,
}

async fn start_broker(fault: Fault) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let broker = Arc::new(Broker {
        subscribers: Arc::default(),
        forwarded: AtomicU64::new(0),
        fault,
        held: Mutex::new(None),
    });
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve(stream, broker.clone()));
        }
    });
    addr
}

fn push(packet: &Packet, protocol: Protocol, out: &mut BytesMut) {
    encode(packet, protocol, out).unwrap();
}

impl Broker {
    /// Every message, in order, with the fault applied.
    fn route(&self, publish: Publish) {
        let n = self.forwarded.fetch_add(1, Ordering::SeqCst) + 1;
        let mut batch = Vec::new();
        match self.fault {
            Fault::Drop(k) if k == n => {}
            Fault::Duplicate(k) if k == n => {
                batch.push(publish.clone());
                batch.push(publish);
            }
            Fault::Swap(k) if k == n => *self.held.lock().unwrap() = Some(publish),
            _ => {
                batch.push(publish);
                if let Some(held) = self.held.lock().unwrap().take() {
                    batch.push(held);
                }
            }
        }
        let subscribers = self.subscribers.lock().unwrap();
        for message in batch {
            for (filter, _, tx) in subscribers.iter() {
                if *filter == *message.topic {
                    let _ = tx.send(message.clone());
                }
            }
        }
    }
}

async fn serve(mut stream: TcpStream, broker: Arc<Broker>) {
    let mut inbuf = BytesMut::new();
    let mut protocol = Protocol::V3_1_1;
    let (tx, mut rx) = mpsc::unbounded_channel::<Publish>();
    let mut next_id: u16 = 0;
    loop {
        let mut out = BytesMut::new();
        tokio::select! {
            read = stream.read_buf(&mut inbuf) => {
                if !matches!(read, Ok(n) if n > 0) { return; }
                while let Ok(Some(packet)) = decode(&mut inbuf, protocol, 1 << 20) {
                    match packet {
                        Packet::Connect(connect) => {
                            protocol = connect.protocol;
                            let ack = ConnAck { session_present: false, reason: ReasonCode::SUCCESS, properties: Properties::default() };
                            push(&Packet::ConnAck(ack), protocol, &mut out);
                        }
                        Packet::Subscribe(subscribe) => {
                            let mut reasons = Vec::new();
                            for (filter, options) in subscribe.filters {
                                let granted = options.qos.min(QoS::AtLeastOnce);
                                reasons.push(ReasonCode(granted as u8));
                                broker.subscribers.lock().unwrap().push((filter.to_string(), granted, tx.clone()));
                            }
                            let ack = SubAck { packet_id: subscribe.packet_id, properties: Properties::default(), reasons };
                            push(&Packet::SubAck(ack), protocol, &mut out);
                        }
                        Packet::Publish(publish) => {
                            if publish.qos == QoS::AtLeastOnce {
                                let ack = Ack { packet_id: publish.packet_id, reason: ReasonCode::SUCCESS, properties: Properties::default() };
                                push(&Packet::PubAck(ack), protocol, &mut out);
                            }
                            broker.route(publish);
                        }
                        Packet::Disconnect(_) => return,
                        _ => {}
                    }
                }
            }
            Some(mut message) = rx.recv() => {
                loop {
                    if message.qos != QoS::AtMostOnce {
                        next_id = next_id % 65_535 + 1;
                        message.packet_id = next_id;
                    }
                    message.dup = false;
                    push(&Packet::Publish(message), protocol, &mut out);
                    match rx.try_recv() {
                        Ok(more) => message = more,
                        Err(_) => break,
                    }
                }
            }
        }
        if !out.is_empty() && stream.write_all(&out).await.is_err() {
            return;
        }
    }
}

async fn bench(addr: SocketAddr, extra: &[&str]) -> Report {
    let port = addr.port().to_string();
    let mut argv = vec!["tern-bench"];
    argv.extend_from_slice(extra);
    argv.extend_from_slice(&[
        "--port",
        &port,
        "--quiet",
        "--drain-ms",
        "300",
        "--timeout-s",
        "60",
    ]);
    let cli = Cli::try_parse_from(argv).unwrap();
    tern_bench::run_async(&cli.args).await.unwrap()
}

fn traffic(report: &Report) -> &tern_bench::report::TrafficReport {
    match report {
        Report::Pubsub(r) | Report::Fanout(r) | Report::Latency(r) => r,
        Report::Conns(_) => panic!("not a traffic report"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_qos1_run_passes_with_every_message_once() {
    let addr = start_broker(Fault::None).await;
    let report = bench(
        addr,
        &[
            "pubsub",
            "--qos",
            "1",
            "-n",
            "2000",
            "--publishers",
            "2",
            "--subscribers",
            "2",
            "--window",
            "32",
        ],
    )
    .await;
    let r = traffic(&report);
    assert!(report.ok(), "{}", report.to_text());
    assert_eq!(r.counts.expected, 8000);
    assert_eq!(r.counts.received, 8000);
    assert_eq!(r.acked, 4000);
    assert_eq!(r.e2e_latency.unwrap().count, 8000);
    assert_eq!(r.ack_latency.unwrap().count, 4000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_v5_qos0_per_publisher_topics_pass() {
    let addr = start_broker(Fault::None).await;
    let report = bench(
        addr,
        &[
            "pubsub",
            "--mqtt",
            "5",
            "-n",
            "1000",
            "--publishers",
            "3",
            "--topics",
            "per-publisher",
            "--payload-bytes",
            "100",
        ],
    )
    .await;
    assert!(report.ok(), "{}", report.to_text());
    assert_eq!(traffic(&report).counts.received, 3000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanout_reaches_every_subscriber() {
    let addr = start_broker(Fault::None).await;
    let report = bench(
        addr,
        &["fanout", "--subscribers", "20", "-n", "200", "--qos", "1"],
    )
    .await;
    assert!(report.ok(), "{}", report.to_text());
    assert_eq!(traffic(&report).counts.received, 4000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qos1_loss_fails_the_run() {
    let addr = start_broker(Fault::Drop(500)).await;
    let report = bench(addr, &["pubsub", "--qos", "1", "-n", "1000"]).await;
    assert!(!report.ok());
    assert_eq!(traffic(&report).counts.lost, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qos0_loss_is_reported_but_allowed() {
    let addr = start_broker(Fault::Drop(500)).await;
    let report = bench(addr, &["pubsub", "-n", "1000"]).await;
    assert!(report.ok(), "{}", report.to_text());
    assert_eq!(traffic(&report).counts.lost, 1);
    assert_eq!(traffic(&report).verdict.notes.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qos0_duplicate_fails_and_qos1_duplicate_is_allowed() {
    let addr = start_broker(Fault::Duplicate(10)).await;
    let report = bench(addr, &["pubsub", "-n", "100"]).await;
    assert!(!report.ok());
    assert_eq!(traffic(&report).counts.duplicates, 1);

    let addr = start_broker(Fault::Duplicate(10)).await;
    let report = bench(addr, &["pubsub", "--qos", "1", "-n", "100"]).await;
    assert!(report.ok(), "{}", report.to_text());
    assert_eq!(traffic(&report).counts.duplicates, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reordering_fails_the_run() {
    let addr = start_broker(Fault::Swap(50)).await;
    let report = bench(addr, &["pubsub", "--qos", "1", "-n", "100"]).await;
    assert!(!report.ok());
    assert_eq!(traffic(&report).counts.out_of_order, 1);
    assert_eq!(traffic(&report).counts.lost, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_latency_run_sends_the_offered_count() {
    let addr = start_broker(Fault::None).await;
    let report = bench(
        addr,
        &[
            "latency",
            "--rate",
            "2000",
            "--duration-s",
            "1",
            "--qos",
            "1",
        ],
    )
    .await;
    assert!(report.ok(), "{}", report.to_text());
    assert_eq!(traffic(&report).sent, 2000);
    assert_eq!(traffic(&report).offered_rate_per_s, Some(2000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_counted() {
    let addr = start_broker(Fault::None).await;
    let pid = std::process::id().to_string();
    let report = bench(
        addr,
        &[
            "conns",
            "-n",
            "50",
            "--per-source",
            "20",
            "--hold-s",
            "0",
            "--broker-pid",
            &pid,
        ],
    )
    .await;
    let Report::Conns(r) = &report else {
        panic!("not a conns report")
    };
    assert!(report.ok(), "{}", report.to_text());
    assert_eq!(r.established, 50);
    assert_eq!(r.source_addresses, 3);
    assert!(r.broker_rss_after_bytes.is_some());
    let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
    assert_eq!(json["kind"], "conns");
}

/// The binary's exit code: 1 when a check fails, 0 when it passes, and JSON on stdout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_exits_non_zero_on_forbidden_loss() {
    let lossy = start_broker(Fault::Drop(7)).await;
    let clean = start_broker(Fault::None).await;
    let run = |addr: SocketAddr| {
        let port = addr.port().to_string();
        std::process::Command::new(env!("CARGO_BIN_EXE_tern-bench"))
            .args([
                "pubsub",
                "--qos",
                "1",
                "-n",
                "50",
                "--json",
                "--drain-ms",
                "300",
                "--port",
                &port,
            ])
            .output()
            .unwrap()
    };
    let (lossy, clean) = tokio::task::spawn_blocking(move || (run(lossy), run(clean)))
        .await
        .unwrap();
    assert_eq!(lossy.status.code(), Some(1));
    assert_eq!(clean.status.code(), Some(0));
    let json: serde_json::Value = serde_json::from_slice(&clean.stdout).unwrap();
    assert_eq!(json["kind"], "pubsub");
    assert_eq!(json["counts"]["received"], 50);
}
