//! What `KvStream::get` answers while a newer value of the key is written but not yet
//! durable: the durable value, never "absent".

use std::time::{Duration, Instant};

use tern_store::{KvStream, Store, StreamConfig, SyncPolicy};

/// A keyed stream whose syncs happen only on `flush`: nothing else syncs within the test.
fn rarely_synced_kv(store: &Store, name: &str) -> KvStream {
    let cfg = StreamConfig {
        sync: SyncPolicy::Interval(Duration::from_secs(3600)),
        ..Default::default()
    };
    store.kv(name, cfg).unwrap()
}

/// Waits until the writer has written (not synced) something after `writes` writes.
fn wait_written_after(kv: &KvStream, writes: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while kv.stream().metrics().writes == writes {
        assert!(Instant::now() < deadline, "the writer never wrote");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn get_returns_the_durable_value_while_a_newer_put_is_not_durable() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let kv = rarely_synced_kv(&store, "sessions");
    let first = kv.put(b"client-a", b"v1").unwrap();
    kv.stream().flush().unwrap();
    assert!(first.is_done());
    assert_eq!(kv.get(b"client-a").unwrap().as_deref(), Some(&b"v1"[..]));

    let writes = kv.stream().metrics().writes;
    let second = kv.put(b"client-a", b"v2").unwrap();
    wait_written_after(&kv, writes);
    assert!(!second.is_done());
    assert_eq!(kv.get(b"client-a").unwrap().as_deref(), Some(&b"v1"[..]));

    kv.stream().flush().unwrap();
    assert_eq!(kv.get(b"client-a").unwrap().as_deref(), Some(&b"v2"[..]));
}

#[test]
fn get_returns_the_durable_value_while_a_delete_is_not_durable() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let kv = rarely_synced_kv(&store, "retained");
    let _v1 = kv.put(b"a/b", b"v1").unwrap();
    kv.stream().flush().unwrap();
    let writes = kv.stream().metrics().writes;
    let tombstone = kv.delete(b"a/b").unwrap();
    wait_written_after(&kv, writes);
    assert!(!tombstone.is_done());
    assert_eq!(kv.get(b"a/b").unwrap().as_deref(), Some(&b"v1"[..]));
    kv.stream().flush().unwrap();
    assert_eq!(kv.get(b"a/b").unwrap(), None);
    // A durable removal stays removed while an unrelated newer put is pending.
    let _pending = kv.put(b"x", b"1").unwrap();
    assert_eq!(kv.get(b"a/b").unwrap(), None);
}
