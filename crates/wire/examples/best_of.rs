//! Best-of-N timing of PUBLISH decode and encode, a companion to the criterion benches for a
//! shared machine: the fastest of many 1000-packet rounds is the figure least disturbed by
//! other processes (criterion's median is not).
//!
//! Run: `cargo run --release -p tern-wire --example best_of`

use std::hint::black_box;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use tern_wire::{Packet, Properties, Protocol, Publish, QoS, Str, decode, encode};

const PACKETS_PER_ROUND: usize = 1000;
const ROUNDS: usize = 2000;

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

fn main() {
    for protocol in [Protocol::V3_1_1, Protocol::V5] {
        for qos in [QoS::AtMostOnce, QoS::AtLeastOnce] {
            let packet = publish(qos);
            let mut one = BytesMut::new();
            encode(&packet, protocol, &mut one).expect("encodes");
            let batch: Vec<u8> = one
                .iter()
                .copied()
                .cycle()
                .take(one.len() * PACKETS_PER_ROUND)
                .collect();
            let mut best_decode_ns = f64::MAX;
            let mut best_decode_only_ns = f64::MAX;
            let mut kept: Vec<Packet> = Vec::with_capacity(PACKETS_PER_ROUND);
            let mut best_encode_ns = f64::MAX;
            let mut out = BytesMut::with_capacity(4096);
            for _ in 0..ROUNDS {
                let mut buf = BytesMut::from(&batch[..]);
                let start = Instant::now();
                while let Ok(Some(decoded)) = decode(&mut buf, protocol, 1 << 20) {
                    black_box(&decoded);
                }
                let elapsed = start.elapsed().as_nanos() as f64;
                best_decode_ns = best_decode_ns.min(elapsed / PACKETS_PER_ROUND as f64);
                // The same without dropping the packets inside the timed region: what decoding
                // costs the reader, dropping (two atomic decrements) being paid by whoever
                // holds the message last.
                let mut buf = BytesMut::from(&batch[..]);
                kept.clear();
                let start = Instant::now();
                while let Ok(Some(decoded)) = decode(&mut buf, protocol, 1 << 20) {
                    kept.push(decoded);
                }
                let elapsed = start.elapsed().as_nanos() as f64;
                best_decode_only_ns = best_decode_only_ns.min(elapsed / PACKETS_PER_ROUND as f64);
                kept.clear();
                let start = Instant::now();
                for _ in 0..PACKETS_PER_ROUND {
                    out.clear();
                    encode(black_box(&packet), protocol, &mut out).expect("encodes");
                    black_box(&out);
                }
                let elapsed = start.elapsed().as_nanos() as f64;
                best_encode_ns = best_encode_ns.min(elapsed / PACKETS_PER_ROUND as f64);
            }
            println!(
                "{protocol:?} {qos:?} ({} bytes on the wire, 64-byte payload): decode+drop {best_decode_ns:.1} ns, decode (drop outside) {best_decode_only_ns:.1} ns, encode {best_encode_ns:.1} ns",
                one.len()
            );
        }
    }
}
