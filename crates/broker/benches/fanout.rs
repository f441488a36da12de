//! The broker's share of a fan-out, without sockets: route one PUBLISH to N subscribers
//! (trie lookup, per-session queue push, writer wake-up) and let every subscriber's writer
//! encode its packet (`fill_batch`). Reported per message; divide by N for per-subscriber cost.
//! Queues count into the broker-wide queued-bytes total as in the broker;
//! `TERN_BENCH_NO_TOTAL=1` leaves that out, to see its cost.

use std::sync::Arc;

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tern_broker::__internal::WriterState;
use tern_broker::__internal::route;
use tern_broker::__internal::{ConnCtl, Session};
use tern_broker::Message;
use tern_broker::SubRecord;
use tern_broker::{Broker, BrokerConfig};
use tern_topic::FilterKind;
use tern_wire::{Properties, Protocol, QoS, Str, SubscriptionOptions};
use tokio::time::Instant;

struct Setup {
    broker: Broker,
    sessions: Vec<(Arc<Session>, WriterState)>,
}

fn setup(subscribers: usize, qos: QoS) -> Setup {
    let broker = Broker::new(BrokerConfig::default()).unwrap();
    let shared = broker.shared().clone();
    let mut sessions = Vec::new();
    for i in 0..subscribers {
        let session = Session::new(format!("sub-{i}").into(), Protocol::V5, 0);
        {
            let mut state = session.state.lock();
            // As the registry does: the queue counts into `max_queued_bytes_total`.
            if std::env::var_os("TERN_BENCH_NO_TOTAL").is_none() {
                state.out.count_into(shared.metrics().queued_totals());
            }
            state.out.attach(1024);
        }
        session.connect_detached(Arc::new(ConnCtl::default()));
        let record = SubRecord {
            options: SubscriptionOptions {
                qos,
                ..SubscriptionOptions::default()
            },
            subscription_id: None,
        };
        shared
            .router()
            .write()
            .subscribe(FilterKind::Normal("bench/+/t"), &session, record)
            .unwrap();
        sessions.push((session, WriterState::new(Protocol::V5, u32::MAX, 0)));
    }
    Setup { broker, sessions }
}

fn fanout(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = runtime.enter();
    let mut group = c.benchmark_group("fanout");
    for qos in [QoS::AtMostOnce, QoS::AtLeastOnce] {
        for subscribers in [1usize, 100, 1000] {
            let mut s = setup(subscribers, qos);
            let shared = s.broker.shared().clone();
            let payload = Bytes::from(vec![b'x'; 64]);
            group.throughput(Throughput::Elements(subscribers as u64));
            group.bench_with_input(
                BenchmarkId::new(format!("qos{}", qos as u8), subscribers),
                &subscribers,
                |b, _| {
                    let mut bufs = tern_broker::__internal::BatchBufs::default();
                    b.iter(|| {
                        let message = Arc::new(Message::new(
                            Str::from_static("bench/1/t"),
                            payload.clone(),
                            qos,
                            false,
                            Properties::default(),
                            None,
                            Instant::now(),
                        ));
                        route::publish(&shared, message);
                        for (session, writer) in &mut s.sessions {
                            let mut state = session.state.lock();
                            let env = tern_broker::__internal::BatchEnv {
                                config: shared.config(),
                                metrics: shared.metrics(),
                                store: &*shared.store().exchanges,
                                client_id: &session.client_id,
                                persistent: state.expiry_interval_s > 0,
                                now: Instant::now(),
                            };
                            state.out.fill_batch(writer, &env, &mut bufs);
                            // Acknowledge at once so the window never fills.
                            let front = state.out.inflight().next().map(|e| e.packet_id);
                            if let Some(id) = front {
                                state.out.on_puback(id);
                            }
                            bufs.clear();
                        }
                    });
                },
            );
        }
    }
    group.finish();
}

criterion_group!(benches, fanout);
criterion_main!(benches);
