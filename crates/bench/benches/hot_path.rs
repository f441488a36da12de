//! The generator's per-message work outside the kernel: building a PUBLISH from the template
//! (publisher side) and decoding + checking + timing it (subscriber side).
//! Run: `cargo bench -p tern-bench --bench hot_path`.

use bytes::BytesMut;
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use tern_bench::checker::StreamCheck;
use tern_bench::cli::Qos;
use tern_bench::mqtt::{MAX_PACKET_BYTES, PublishTemplate};
use tern_bench::payload::Header;
use tern_bench::stats::Latency;
use tern_wire::{Packet, Protocol};

const MESSAGES: u64 = 1000;

fn build_batch(template: &PublishTemplate, out: &mut BytesMut) {
    for seq in 0..MESSAGES {
        let start = out.len();
        out.extend_from_slice(&template.bytes);
        if let Some(at) = template.packet_id_at {
            let id = (seq % 65_535 + 1) as u16;
            out[start + at..start + at + 2].copy_from_slice(&id.to_be_bytes());
        }
        let header = Header {
            publisher_id: 0,
            seq,
            send_time_ns: seq,
        };
        header
            .write(&mut out[start + template.payload_at..])
            .unwrap();
    }
}

fn hot_path(c: &mut Criterion) {
    let mut group = c.benchmark_group("per_message");
    group.throughput(Throughput::Elements(MESSAGES));
    for (name, protocol, qos) in [
        ("v311_qos0", Protocol::V3_1_1, Qos::AtMostOnce),
        ("v5_qos1", Protocol::V5, Qos::AtLeastOnce),
    ] {
        let template = PublishTemplate::new(protocol, "tern-bench/abc/all", qos, 64).unwrap();
        group.bench_function(format!("publish_build_{name}"), |b| {
            let mut out = BytesMut::with_capacity(128 * MESSAGES as usize);
            b.iter(|| {
                out.clear();
                build_batch(&template, &mut out);
            });
        });
        let mut wire = BytesMut::new();
        build_batch(&template, &mut wire);
        let wire = wire.freeze();
        group.bench_function(format!("receive_decode_check_{name}"), |b| {
            b.iter_batched(
                || {
                    (
                        BytesMut::from(&wire[..]),
                        StreamCheck::new(MESSAGES),
                        Latency::new(),
                    )
                },
                |(mut buf, mut check, mut latency)| {
                    while let Some(Packet::Publish(publish)) =
                        tern_wire::decode(&mut buf, protocol, MAX_PACKET_BYTES).unwrap()
                    {
                        let header = Header::read(&publish.payload).unwrap();
                        if check.record(header.seq) {
                            latency.record_ns(1_000 + header.seq);
                        }
                    }
                    (check, latency)
                },
                BatchSize::LargeInput,
            );
        });
    }
    group.finish();
}

criterion_group!(benches, hot_path);
criterion_main!(benches);
