//! Runs pubsub, fan-out and latency benchmarks: sets up every connection first, starts the
//! publishers together, drains the subscribers, and builds the report.
//!
//! Every subscriber subscribes to every publisher's topic, so it expects
//! `publishers * messages` messages. The run ends when every subscriber has all of them, or when
//! deliveries stop making progress for `--drain-ms` after the publishers finished (the only way
//! a QoS 0 loss can show).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

use crate::checker::{Counts, judge};
use crate::cli::{Common, Qos, TopicMode};
use crate::load::{
    Clock, Pace, PublisherPlan, PublisherResult, Shared, SubscriberPlan, SubscriberResult,
    run_publisher, run_subscriber,
};
use crate::mqtt::{Conn, ConnectOptions, PublishTemplate, connect};
use crate::payload::HEADER_BYTES;
use crate::procfs::{CpuMark, Target, rss_bytes};
use crate::progress::Progress;
use crate::report::{TrafficReport, protocol_name};
use crate::stats::{Latency, rate_per_s};

/// Keep alive announced by traffic clients. They never send PINGREQ (a QoS 0 subscriber sends
/// nothing at all), so this must outlast any run: an hour, which is also Tern's default cap.
pub const TRAFFIC_KEEP_ALIVE_S: u16 = 3600;

/// What to run (pubsub, fan-out and latency all reduce to this).
#[derive(Debug, Clone)]
pub struct TrafficPlan {
    pub publishers: u32,
    pub subscribers: u32,
    pub messages_per_publisher: u64,
    pub payload_bytes: usize,
    pub qos: Qos,
    pub window: u32,
    pub topics: TopicMode,
    /// Open loop: messages per second over all publishers.
    pub offered_rate_per_s: Option<u64>,
}

impl TrafficPlan {
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.payload_bytes < HEADER_BYTES {
            bail!("--payload-bytes must be at least {HEADER_BYTES} (the bench header)");
        }
        if self.payload_bytes > crate::cli::MAX_PAYLOAD_BYTES {
            bail!(
                "--payload-bytes must be at most {}",
                crate::cli::MAX_PAYLOAD_BYTES
            );
        }
        if self.window == 0 || self.window > crate::cli::MAX_WINDOW {
            bail!("--window must be in 1..={}", crate::cli::MAX_WINDOW);
        }
        if self.publishers == 0 {
            bail!("at least one publisher is needed");
        }
        if self.offered_rate_per_s == Some(0) {
            bail!("--rate must be positive");
        }
        Ok(())
    }
}

/// Resolves `--host`/`--port` to one address.
pub async fn resolve(common: &Common) -> anyhow::Result<SocketAddr> {
    let mut addrs = tokio::net::lookup_host((common.host.as_str(), common.port))
        .await
        .with_context(|| format!("cannot resolve {}", common.host))?;
    addrs
        .next()
        .with_context(|| format!("{} resolves to no address", common.host))
}

/// A short tag unique enough to keep concurrent and consecutive runs apart on one broker.
pub fn run_tag() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{:x}{:x}",
        std::process::id() & 0xffff,
        (nanos as u64) & 0xff_ffff
    )
}

/// The subscribers' addresses: `--sub-ports` on `--host`, or the one `--port` address.
async fn subscriber_addrs(common: &Common, addr: SocketAddr) -> anyhow::Result<Vec<SocketAddr>> {
    let mut addrs = Vec::with_capacity(common.sub_ports.len().max(1));
    for &port in &common.sub_ports {
        let mut one = common.clone();
        one.port = port;
        addrs.push(resolve(&one).await?);
    }
    if addrs.is_empty() {
        addrs.push(addr);
    }
    Ok(addrs)
}

/// Connects client `ids[i]` to `addrs[i % addrs.len()]` (`addrs` is never empty).
async fn connect_many(
    common: &Common,
    addrs: &[SocketAddr],
    ids: Vec<String>,
    subscribe_to: Option<(Vec<String>, Qos)>,
) -> anyhow::Result<Vec<Conn>> {
    let tls = crate::tls::TlsClient::from_args(common)?;
    let limit = Arc::new(Semaphore::new(common.connect_concurrency.max(1)));
    let protocol = common.protocol.wire();
    let persistent = common.persistent;
    let subscribe_to = Arc::new(subscribe_to);
    let mut tasks = JoinSet::new();
    for (index, client_id) in ids.into_iter().enumerate() {
        let limit = limit.clone();
        let tls = tls.clone();
        let subscribe_to = subscribe_to.clone();
        let addr = addrs[index % addrs.len()];
        tasks.spawn(async move {
            let _permit = limit.acquire_owned().await;
            let options = ConnectOptions {
                addr,
                source: None,
                protocol,
                client_id: &client_id,
                keep_alive_s: TRAFFIC_KEEP_ALIVE_S,
                persistent,
                tls,
            };
            let mut conn = connect(&options)
                .await
                .with_context(|| format!("connecting {client_id}"))?;
            if let Some((filters, qos)) = subscribe_to.as_ref() {
                conn.subscribe(filters, *qos)
                    .await
                    .with_context(|| format!("subscribing {client_id}"))?;
            }
            anyhow::Ok((index, conn))
        });
    }
    let mut conns: Vec<Option<Conn>> = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        let (index, conn) = joined.context("connect task panicked")??;
        if conns.len() <= index {
            conns.resize_with(index + 1, || None);
        }
        conns[index] = Some(conn);
    }
    Ok(conns.into_iter().flatten().collect())
}

/// Runs one traffic benchmark.
pub async fn run(
    common: &Common,
    plan: &TrafficPlan,
    progress: &Progress,
) -> anyhow::Result<TrafficReport> {
    plan.validate()?;
    let addr = resolve(common).await?;
    let tag = run_tag();
    let topics = topics_of(plan, &format!("{}/{tag}", common.prefix));
    let clients = connect_clients(common, plan, addr, &tag, &topics, progress).await?;
    let clock = Clock::new();
    let shared = Arc::new(Shared::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    let cpu = CpuMark::now(common.broker_pid);
    let mut sub_tasks = JoinSet::new();
    for conn in clients.subscribers {
        let sub_plan = SubscriberPlan {
            publishers: plan.publishers,
            messages_per_publisher: plan.messages_per_publisher,
        };
        sub_tasks.spawn(run_subscriber(
            conn,
            sub_plan,
            plan.qos,
            clock,
            shared.clone(),
            stop_rx.clone(),
        ));
    }
    let mut pub_tasks =
        spawn_publishers(common, plan, clients.publishers, &topics, clock, &shared)?;
    let total_expected = u64::from(plan.publishers) * plan.messages_per_publisher;
    progress.start(
        shared.clone(),
        total_expected,
        u64::from(plan.subscribers) * total_expected,
    );
    let mut pub_results: Vec<PublisherResult> = Vec::new();
    while let Some(joined) = pub_tasks.join_next().await {
        pub_results.push(
            joined
                .context("publisher task panicked")?
                .context("publisher")?,
        );
    }
    let drain = Duration::from_millis(common.drain_ms);
    let sub_results = drain_subscribers(&mut sub_tasks, &shared, drain, &stop_tx).await?;
    let cpu = cpu.usage();
    progress.finish();
    let broker_rss_bytes = common
        .broker_pid
        .and_then(|pid| rss_bytes(Target::Pid(pid)));
    let ended = Ended {
        pub_results,
        sub_results,
        shared,
        clock,
        cpu,
        broker_rss_bytes,
        effective_window: clients.effective_window,
    };
    Ok(report(common, plan, ended))
}

/// Every topic the run publishes to under `topic_base`: one shared, or one per publisher.
fn topics_of(plan: &TrafficPlan, topic_base: &str) -> Vec<String> {
    match plan.topics {
        TopicMode::Shared => vec![format!("{topic_base}/all")],
        TopicMode::PerPublisher => (0..plan.publishers)
            .map(|p| format!("{topic_base}/{p}"))
            .collect(),
    }
}

/// The run's connections, subscribed, and the window the publishers may use.
struct Clients {
    subscribers: Vec<Conn>,
    publishers: Vec<Conn>,
    /// `--window`, capped by the smallest receive maximum a publisher was granted.
    effective_window: u32,
}

async fn connect_clients(
    common: &Common,
    plan: &TrafficPlan,
    addr: SocketAddr,
    tag: &str,
    topics: &[String],
    progress: &Progress,
) -> anyhow::Result<Clients> {
    progress.phase(&format!("connecting {} subscribers", plan.subscribers));
    let sub_ids = (0..plan.subscribers)
        .map(|i| format!("{}-{tag}-s{i}", common.prefix))
        .collect();
    let sub_addrs = subscriber_addrs(common, addr).await?;
    let subscribers = connect_many(
        common,
        &sub_addrs,
        sub_ids,
        Some((topics.to_vec(), plan.qos)),
    )
    .await?;
    progress.phase(&format!("connecting {} publishers", plan.publishers));
    let pub_ids = (0..plan.publishers)
        .map(|i| format!("{}-{tag}-p{i}", common.prefix))
        .collect();
    let publishers = connect_many(common, &[addr], pub_ids, None).await?;
    let effective_window = publishers
        .iter()
        .map(|conn| {
            conn.limits
                .receive_maximum
                .map_or(plan.window, |max| plan.window.min(u32::from(max)))
        })
        .min()
        .unwrap_or(plan.window);
    Ok(Clients {
        subscribers,
        publishers,
        effective_window,
    })
}

/// Starts every publisher; an open loop's start a little in the future, so that every
/// publisher is scheduled before its first due time.
fn spawn_publishers(
    common: &Common,
    plan: &TrafficPlan,
    publishers: Vec<Conn>,
    topics: &[String],
    clock: Clock,
    shared: &Arc<Shared>,
) -> anyhow::Result<JoinSet<Result<PublisherResult, crate::mqtt::MqttError>>> {
    let protocol = common.protocol.wire();
    let start_ns = clock.now_ns() + 10_000_000;
    let mut pub_tasks = JoinSet::new();
    for (id, conn) in publishers.into_iter().enumerate() {
        let id = id as u32;
        let topic = match plan.topics {
            TopicMode::Shared => &topics[0],
            TopicMode::PerPublisher => &topics[id as usize],
        };
        let template = PublishTemplate::new(protocol, topic, plan.qos, plan.payload_bytes)?;
        let pace = plan.offered_rate_per_s.map(|rate| {
            let interval_ns = 1e9 * f64::from(plan.publishers) / rate as f64;
            Pace {
                start_ns: start_ns
                    + (interval_ns * f64::from(id) / f64::from(plan.publishers)) as u64,
                interval_ns,
            }
        });
        let pub_plan = PublisherPlan {
            id,
            qos: plan.qos,
            messages: plan.messages_per_publisher,
            window: plan.window,
            template,
            pace,
        };
        pub_tasks.spawn(run_publisher(conn, pub_plan, clock, shared.clone()));
    }
    Ok(pub_tasks)
}

/// Collects the subscribers' results, telling them to stop once deliveries made no progress
/// for `drain`.
async fn drain_subscribers(
    sub_tasks: &mut JoinSet<Result<SubscriberResult, crate::mqtt::MqttError>>,
    shared: &Shared,
    drain: Duration,
    stop_tx: &watch::Sender<bool>,
) -> anyhow::Result<Vec<SubscriberResult>> {
    let mut sub_results: Vec<SubscriberResult> = Vec::new();
    let mut last_delivered = shared.delivered.load(Ordering::Relaxed);
    loop {
        tokio::select! {
            joined = sub_tasks.join_next() => match joined {
                Some(joined) => sub_results.push(joined.context("subscriber task panicked")?.context("subscriber")?),
                None => break,
            },
            _ = tokio::time::sleep(drain) => {
                let delivered = shared.delivered.load(Ordering::Relaxed);
                if delivered == last_delivered {
                    let _ = stop_tx.send(true);
                }
                last_delivered = delivered;
            }
        }
    }
    Ok(sub_results)
}

/// What a finished run hands to its report.
struct Ended {
    pub_results: Vec<PublisherResult>,
    sub_results: Vec<SubscriberResult>,
    shared: Arc<Shared>,
    clock: Clock,
    cpu: crate::procfs::CpuUsage,
    broker_rss_bytes: Option<u64>,
    effective_window: u32,
}

fn report(common: &Common, plan: &TrafficPlan, ended: Ended) -> TrafficReport {
    let mut counts = Counts::default();
    let mut deliveries = 0;
    let mut qos_mismatches = 0;
    let mut last_delivery_ns = 0;
    for result in &ended.sub_results {
        counts.add(&result.counts);
        deliveries += result.deliveries;
        qos_mismatches += result.qos_mismatches;
        last_delivery_ns = last_delivery_ns.max(result.last_delivery_ns);
    }
    // One pass over the publishers (the earliest send, the latest ack, the totals).
    let (mut first_send_ns, mut last_ack_ns) = (None::<u64>, 0);
    let (mut sent, mut acked, mut delayed_by_backpressure) = (0u64, 0u64, 0);
    for r in &ended.pub_results {
        first_send_ns = match (first_send_ns, r.first_send_ns) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        last_ack_ns = last_ack_ns.max(r.last_ack_ns);
        sent += r.sent;
        acked += r.acked;
        delayed_by_backpressure += r.delayed_by_backpressure;
    }
    let first_send_ns = first_send_ns.unwrap_or(0);
    let summary = |histogram: &std::sync::Mutex<Latency>| {
        histogram
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .summary()
    };
    let end_ns = if plan.subscribers > 0 {
        last_delivery_ns.max(last_ack_ns)
    } else {
        last_ack_ns.max(ended.clock.now_ns())
    };
    let elapsed_ns = end_ns.saturating_sub(first_send_ns);
    let publish_end_ns = if plan.qos == Qos::AtMostOnce {
        end_ns
    } else {
        last_ack_ns
    };
    let mut verdict = judge(plan.qos, &counts);
    if qos_mismatches > 0 {
        verdict.notes.push(format!(
            "{qos_mismatches} deliveries at a QoS other than subscribed"
        ));
    }
    TrafficReport {
        protocol: protocol_name(common.protocol),
        qos: plan.qos.level(),
        publishers: plan.publishers,
        subscribers: plan.subscribers,
        messages_per_publisher: plan.messages_per_publisher,
        payload_bytes: plan.payload_bytes,
        window: (plan.qos != Qos::AtMostOnce).then_some(ended.effective_window),
        topics: plan.topics,
        offered_rate_per_s: plan.offered_rate_per_s,
        sent,
        acked,
        deliveries,
        elapsed_ms: elapsed_ns as f64 / 1e6,
        delivered_per_s: rate_per_s(counts.received, elapsed_ns),
        published_per_s: rate_per_s(sent, publish_end_ns.saturating_sub(first_send_ns)),
        delivered_bytes_per_s: rate_per_s(counts.received, elapsed_ns) * plan.payload_bytes as f64,
        e2e_latency: summary(&ended.shared.e2e_latency),
        ack_latency: summary(&ended.shared.ack_latency),
        delayed_by_backpressure,
        qos_mismatches,
        counts,
        verdict,
        // The drain after the last delivery is idle time; cores are over the active part.
        cpu: ended.cpu.over_active_ms(elapsed_ns as f64 / 1e6),
        broker_rss_bytes: ended.broker_rss_bytes,
    }
}
