//! A keyed-state stream whose keys are rewritten forever stays bounded on disk (the broker's
//! `tern.sessions` with clients reconnecting for months: every connection rewrites its
//! session's records). `[store] max_disk_bytes` does not count the state streams (retention
//! cannot free them, docs/simulation.md finding 12), so their own compaction must bound
//! them: a sealed block is rewritten once the garbage of the sealed blocks passes the larger
//! of the live bytes and a block (`writer/drive.rs`, `due_expiry`), on the writer's timer.
//! Stepped writers on the simulated disk and its clock: the run is deterministic.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tern_store::sim::{SimConfig, SimDisk};
use tern_store::{Store, StreamConfig};

const T0_NS: u64 = 1_700_000_000_000_000_000;
const BLOCK_BYTES: u64 = 64 * 1024;
/// Clients whose session record is rewritten at each of their reconnects.
const CLIENTS: usize = 200;
const VALUE_BYTES: usize = 150;
/// Virtual time between two reconnects (100 a second: a quarter of a block of records a
/// second, well within the 4 blocks one timed compaction rewrites).
const RECONNECT_EVERY: Duration = Duration::from_millis(10);
/// Reconnects: 10 minutes of virtual time, 10 MB of records written (about 150 blocks).
const RECONNECTS: usize = 60_000;

#[test]
fn a_kv_stream_rewritten_forever_stays_bounded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let disk = SimDisk::new(
        dir.path(),
        11,
        SimConfig {
            stepped_writers: true,
            ..SimConfig::default()
        },
    );
    let clock = Arc::new(AtomicU64::new(T0_NS));
    let c = clock.clone();
    disk.set_clock(Arc::new(move || c.load(Ordering::SeqCst)));
    let store = Store::open_with_vfs(dir.path(), disk.vfs()).expect("open");
    let kv = store
        .kv(
            "tern.sessions",
            StreamConfig {
                block_size_bytes: BLOCK_BYTES,
                ..StreamConfig::default()
            },
        )
        .expect("kv");
    let value = vec![b's'; VALUE_BYTES];
    let (mut max_disk, mut max_live, mut written) = (0u64, 0u64, 0u64);
    for i in 0..RECONNECTS {
        clock.fetch_add(RECONNECT_EVERY.as_nanos() as u64, Ordering::SeqCst);
        let key = format!("s/client-{}", i % CLIENTS);
        let put = kv.put(key.as_bytes(), &value).expect("put");
        while store.step() {}
        assert!(put.is_done(), "reconnect {i}: the put completed");
        let info = kv.stream().info();
        max_disk = max_disk.max(info.disk_bytes);
        max_live = max_live.max(info.bytes);
        written += (key.len() + VALUE_BYTES) as u64;
    }
    assert_eq!(kv.len(), CLIENTS);
    assert!(written > 100 * BLOCK_BYTES, "{written}");
    // The active block, garbage up to the larger of the live bytes and a block before the
    // timer compacts, what one timer period writes (a quarter block) and the live records.
    let bound = 4 * BLOCK_BYTES + 2 * max_live;
    assert!(
        max_disk <= bound,
        "the stream held {max_disk} B (live at most {max_live} B, bound {bound} B) after \
         {written} B written"
    );
}
