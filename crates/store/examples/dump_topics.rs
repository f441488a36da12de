//! Prints every record of a stream whose topic starts with a prefix or whose payload equals a
//! given value: `cargo run -p tern-store --example dump_topics -- DIR STREAM PREFIX [PAYLOAD..]`.
//! A debugging aid for crash investigations (opens the store read-write: stop the broker first).
use tern_store::{FilterSet, Store, StreamConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, dir, stream, prefix, payloads @ ..] = &args[..] else {
        return Err("usage: DIR STREAM PREFIX [PAYLOAD..]".into());
    };
    let store = Store::open(dir)?;
    let s = store.stream(stream, StreamConfig::default())?;
    let mut from = 1;
    loop {
        let batch = s.read_from(from, &FilterSet::all(), 4096, 8 << 20)?;
        for r in &batch.records {
            let hit = r.topic.starts_with(prefix.as_bytes())
                || payloads.iter().any(|p| r.payload == p.as_bytes());
            if hit {
                let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
                println!(
                    "{} {} {} {}",
                    r.seq,
                    hex(&r.topic),
                    hex(&r.payload),
                    r.is_tombstone()
                );
            }
        }
        if batch.records.is_empty() || batch.next_seq <= from {
            break;
        }
        from = batch.next_seq;
    }
    Ok(())
}
