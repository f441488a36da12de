//! Measures how long opening a stream that holds 1 GiB takes.
//! `cargo run --release -p tern-store --example recovery_1gib [DIR]`

use std::time::{Duration, Instant};

use tern_store::{Store, StreamConfig, SyncPolicy};

fn main() {
    let dir = std::env::args().nth(1).map(std::path::PathBuf::from);
    let tmp = tempfile::tempdir().unwrap();
    let dir = dir.unwrap_or_else(|| tmp.path().to_path_buf());
    let target_bytes: u64 = 1 << 30;
    let cfg = StreamConfig {
        sync: SyncPolicy::Never,
        ..Default::default()
    };
    {
        let store = Store::open(&dir).unwrap();
        let s = store.stream("r", cfg.clone()).unwrap();
        if s.info().bytes < target_bytes {
            let payload = vec![0x5au8; 1024];
            let t0 = Instant::now();
            let mut i = 0u64;
            while s.info().bytes < target_bytes {
                for _ in 0..10_000 {
                    let topic = format!("site/{}/dev/{}", i % 10, i % 1000);
                    drop(s.append(topic.as_bytes(), b"", &payload).unwrap());
                    i += 1;
                }
                s.flush().unwrap();
            }
            println!("wrote {} records in {:?}", i, t0.elapsed());
        }
        s.close().unwrap();
    }
    let mut times = Vec::new();
    for _ in 0..5 {
        let t0 = Instant::now();
        let store = Store::open(&dir).unwrap();
        let s = store.stream("r", cfg.clone()).unwrap();
        let el = t0.elapsed();
        let info = s.info();
        println!(
            "open: {:?} ({} records, {} MiB, {} blocks, {} topics)",
            el,
            info.msgs,
            info.bytes >> 20,
            info.blocks,
            info.topics
        );
        times.push(el);
    }
    times.sort();
    println!("median open time: {:?}", times[times.len() / 2]);
    // Full verification of every checksum, for comparison.
    let t0 = Instant::now();
    let store = Store::open(&dir).unwrap();
    let s = store
        .stream(
            "r",
            StreamConfig {
                verify_on_open: true,
                ..cfg
            },
        )
        .unwrap();
    println!(
        "open with verify_on_open: {:?} ({} records)",
        t0.elapsed(),
        s.info().msgs
    );
    let _ = Duration::ZERO;
}
