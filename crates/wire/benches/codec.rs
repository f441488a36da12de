//! Decode and encode costs of the packets on the hot path.
//!
//! `decode/*` decodes one packet from a buffer that holds a batch of identical packets (as a
//! read buffer would) and drops it, so the figure per packet includes the zero-copy slicing
//! and the reference count traffic. `decode_without_drop/*` keeps the packets (one push of a
//! `Packet` each) and drops them after the timed region. `encode/*` writes into a reused buffer.
//!
//! Run: `cargo bench -p tern-wire --bench codec`.

use std::hint::black_box;

use bytes::{Bytes, BytesMut};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use tern_wire::*;

const MAX: u32 = 1 << 20;
const BATCH: usize = 1000;

fn publish(qos: QoS) -> Packet {
    Packet::Publish(Publish {
        dup: false,
        qos,
        retain: false,
        topic: Str::from_static("sensors/room1/temp"),
        packet_id: if qos == QoS::AtMostOnce { 0 } else { 4242 },
        properties: Properties::default(),
        payload: Bytes::from(vec![0x5Au8; 64]),
    })
}

/// A v5 PUBLISH carrying the properties a request/response client typically sets.
fn publish_with_properties(qos: QoS) -> Packet {
    let Packet::Publish(mut publish) = publish(qos) else {
        unreachable!("publish() builds a PUBLISH")
    };
    publish.properties = PropertyValues {
        message_expiry_interval_s: Some(60),
        content_type: Some(Str::from_static("application/json")),
        user: vec![(
            Str::from_static("trace"),
            Str::from_static("0af7651916cd43dd"),
        )],
        ..PropertyValues::default()
    }
    .into();
    Packet::Publish(publish)
}

fn puback() -> Packet {
    Packet::PubAck(Ack {
        packet_id: 4242,
        reason: ReasonCode::SUCCESS,
        properties: Properties::default(),
    })
}

fn connect(protocol: Protocol) -> Packet {
    Packet::Connect(Box::new(Connect {
        protocol,
        clean_start: true,
        keep_alive_s: 60,
        properties: if protocol.is_v5() {
            PropertyValues {
                session_expiry_interval_s: Some(3600),
                receive_maximum: Some(100),
                ..PropertyValues::default()
            }
            .into()
        } else {
            Properties::default()
        },
        client_id: Str::from_static("bench-client-0001"),
        will: None,
        username: Some(Str::from_static("user")),
        password: Some(Bytes::from_static(b"password")),
    }))
}

fn subscribe() -> Packet {
    Packet::Subscribe(Subscribe {
        packet_id: 7,
        properties: Properties::default(),
        filters: vec![
            (
                Str::from_static("sensors/+/temp"),
                SubscriptionOptions::default(),
            ),
            (
                Str::from_static("alerts/#"),
                SubscriptionOptions {
                    qos: QoS::AtLeastOnce,
                    ..SubscriptionOptions::default()
                },
            ),
        ],
    })
}

fn cases() -> Vec<(&'static str, Protocol, Packet)> {
    vec![
        (
            "publish64_qos0_v311",
            Protocol::V3_1_1,
            publish(QoS::AtMostOnce),
        ),
        (
            "publish64_qos1_v311",
            Protocol::V3_1_1,
            publish(QoS::AtLeastOnce),
        ),
        ("publish64_qos0_v5", Protocol::V5, publish(QoS::AtMostOnce)),
        ("publish64_qos1_v5", Protocol::V5, publish(QoS::AtLeastOnce)),
        (
            "publish64_qos1_v5_props",
            Protocol::V5,
            publish_with_properties(QoS::AtLeastOnce),
        ),
        ("puback_v311", Protocol::V3_1_1, puback()),
        ("puback_v5", Protocol::V5, puback()),
        ("connect_v311", Protocol::V3_1_1, connect(Protocol::V3_1_1)),
        ("connect_v5", Protocol::V5, connect(Protocol::V5)),
        ("subscribe_v311", Protocol::V3_1_1, subscribe()),
        ("subscribe_v5", Protocol::V5, subscribe()),
    ]
}

fn bench_decode(c: &mut Criterion) {
    let mut group = c.benchmark_group("decode");
    group.throughput(Throughput::Elements(BATCH as u64));
    for (name, protocol, packet) in cases() {
        let mut one = BytesMut::new();
        encode(&packet, protocol, &mut one).unwrap();
        let batch: Vec<u8> = one
            .iter()
            .copied()
            .cycle()
            .take(one.len() * BATCH)
            .collect();
        group.bench_function(name, |b| {
            b.iter_batched_ref(
                || BytesMut::from(&batch[..]),
                |buf| {
                    // Borrowing the packet (rather than moving it into black_box) keeps the
                    // harness from adding a memcpy of the packet per packet.
                    while let Ok(Some(packet)) = decode(buf, protocol, MAX) {
                        black_box(&packet);
                    }
                    assert!(buf.is_empty());
                },
                BatchSize::LargeInput,
            )
        });
    }
    group.finish();
}

/// Decode only: the packets are kept and dropped after the timed region, as a reader hands
/// them on and the last holder pays for the drop (two atomic decrements for a PUBLISH).
fn bench_decode_without_drop(c: &mut Criterion) {
    let mut group = c.benchmark_group("decode_without_drop");
    group.throughput(Throughput::Elements(BATCH as u64));
    for (name, protocol, packet) in cases().into_iter().take(7) {
        let mut one = BytesMut::new();
        encode(&packet, protocol, &mut one).unwrap();
        let batch: Vec<u8> = one
            .iter()
            .copied()
            .cycle()
            .take(one.len() * BATCH)
            .collect();
        group.bench_function(name, |b| {
            b.iter_batched_ref(
                || (BytesMut::from(&batch[..]), Vec::with_capacity(BATCH)),
                |(buf, kept)| {
                    while let Ok(Some(packet)) = decode(buf, protocol, MAX) {
                        kept.push(packet);
                    }
                    assert_eq!(kept.len(), BATCH);
                },
                BatchSize::LargeInput,
            )
        });
    }
    group.finish();
}

fn bench_encode(c: &mut Criterion) {
    let mut group = c.benchmark_group("encode");
    for (name, protocol, packet) in cases() {
        let mut out = BytesMut::with_capacity(4096);
        group.bench_function(name, |b| {
            b.iter(|| {
                out.clear();
                encode(black_box(&packet), protocol, &mut out).unwrap();
                black_box(&out);
            })
        });
    }
    group.finish();
}

fn bench_fanout(c: &mut Criterion) {
    let mut group = c.benchmark_group("fanout");
    let payload = Bytes::from(vec![0x5Au8; 64]);
    let topic = Str::from_static("sensors/room1/temp");
    for protocol in [Protocol::V3_1_1, Protocol::V5] {
        let template =
            PublishTemplate::new(protocol, &topic, &Properties::default(), &payload).unwrap();
        let ids = [12u32];
        let delivery = Delivery {
            qos: QoS::AtLeastOnce,
            dup: false,
            retain: false,
            packet_id: 99,
            topic_alias: None,
            send_topic: true,
            subscription_identifiers: &ids,
        };
        let mut out = BytesMut::with_capacity(4096);
        let label = if protocol.is_v5() { "v5" } else { "v311" };
        group.bench_function(format!("write_head_qos1_{label}"), |b| {
            b.iter(|| {
                out.clear();
                template.write_head(black_box(&delivery), &mut out);
                black_box(&out);
            })
        });
        // A message for one subscriber, QoS 0, as the writer handles it now (head and payload
        // into the batch buffer, no template) and as it did before (a template and its whole
        // QoS 0 packet built per message).
        let qos0 = Delivery::qos0(false);
        group.bench_function(format!("single_qos0_64_{label}"), |b| {
            b.iter(|| {
                out.clear();
                let shape = PublishShape::plain(protocol, &topic, black_box(&payload)).unwrap();
                shape.write_head(&qos0, &mut out);
                out.extend_from_slice(shape.body());
                black_box(&out);
            })
        });
        group.bench_function(format!("template_qos0_packet_64_{label}"), |b| {
            b.iter(|| {
                PublishTemplate::new(
                    protocol,
                    &topic,
                    &Properties::default(),
                    black_box(&payload),
                )
                .unwrap()
                .qos0_packet(false)
            })
        });
        group.bench_function(format!("template_new_64_{label}"), |b| {
            b.iter(|| {
                PublishTemplate::new(
                    protocol,
                    &topic,
                    &Properties::default(),
                    black_box(&payload),
                )
                .unwrap()
            })
        });
    }
    group.finish();
}

/// `Str::as_str` (every `&str` view of a topic: trie walk, ACL, aliases).
fn bench_str(c: &mut Criterion) {
    let mut group = c.benchmark_group("str");
    for (label, text) in [
        ("18B", "sensors/room1/temp"),
        (
            "64B",
            "tern-bench/0123456789/0123456789/0123456789/0123456789/abcdefgh",
        ),
    ] {
        let s = Str::from_bytes(Bytes::from(text.as_bytes().to_vec())).unwrap();
        group.bench_function(format!("str_as_str_{label}"), |b| {
            b.iter(|| black_box(&s).as_str().len())
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(2))
        .sample_size(30);
    targets = bench_decode, bench_decode_without_drop, bench_encode, bench_fanout, bench_str
}
criterion_main!(benches);
