//! A keyed stream with many keys, rewritten often (the broker's `tern.sessions`: a session
//! record and a cursor per persistent session), across reopenings and compactions: every key
//! keeps its latest value. (Written while chasing sessions lost across restarts; the cause was
//! two brokers on one directory, now refused at open: `hostile_files.rs`.)

use tern_store::{FilterSet, KvStream, Store, StreamConfig, SyncPolicy};

const KEYS: usize = 20_000;

fn open(dir: &std::path::Path) -> (Store, KvStream) {
    let store = Store::open(dir).unwrap();
    let cfg = StreamConfig {
        sync: SyncPolicy::Never,
        verify_on_open: true,
        block_size_bytes: 1024 * 1024,
        ..StreamConfig::default()
    };
    let kv = store.kv("tern.sessions", cfg).unwrap();
    (store, kv)
}

fn count(kv: &KvStream, prefix: u8) -> usize {
    kv.entries(&FilterSet::all())
        .unwrap()
        .iter()
        .filter(|(k, _)| k.first() == Some(&prefix))
        .count()
}

#[test]
fn every_key_survives_rewrites_compaction_and_reopening() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (_store, kv) = open(dir.path());
        for round in 0..3u8 {
            for i in 0..KEYS {
                drop(
                    kv.put(format!("soff-{i}").as_bytes(), &[round; 60])
                        .unwrap(),
                );
                drop(
                    kv.put(format!("coff-{i}").as_bytes(), &[round; 20])
                        .unwrap(),
                );
            }
        }
        kv.stream().flush().unwrap();
        assert_eq!(count(&kv, b's'), KEYS);
    }
    for reopen in 0..4u8 {
        let (_store, kv) = open(dir.path());
        assert_eq!(count(&kv, b's'), KEYS, "reopen {reopen}");
        assert_eq!(count(&kv, b'c'), KEYS, "reopen {reopen}");
        // Cursor writes while running, as the checkpointer does.
        for i in 0..KEYS / 2 {
            drop(
                kv.put(format!("coff-{i}").as_bytes(), &[reopen; 20])
                    .unwrap(),
            );
        }
        kv.compact(usize::MAX).unwrap();
        kv.stream().flush().unwrap();
        assert_eq!(count(&kv, b's'), KEYS, "after compaction {reopen}");
    }
}
