//! Fault injection through the file abstraction: a failing write and a failing fsync each
//! make the stream refuse writes and lose nothing it acknowledged.

use std::sync::Arc;

use tern_store::vfs::FaultyVfs;
use tern_store::{FilterSet, Store, StoreError, StreamConfig};

fn cfg() -> StreamConfig {
    StreamConfig {
        block_size_bytes: 8192,
        ..Default::default()
    }
}

fn scenario(arm: impl Fn(&FaultyVfs)) {
    let dir = tempfile::tempdir().unwrap();
    let vfs = FaultyVfs::default();
    let mut acked;
    {
        let store = Store::open_with_vfs(dir.path(), Arc::new(vfs.clone())).unwrap();
        let s = store.stream("s", cfg()).unwrap();
        // Enough to roll a few blocks, all acknowledged.
        let tickets: Vec<_> = (0..300u32)
            .map(|i| s.append(b"t", b"", &i.to_le_bytes()).unwrap())
            .collect();
        acked = 0;
        for t in tickets {
            acked = t.wait().unwrap();
        }
        arm(&vfs);
        let mut failures = 0;
        for chunk in 0..20u32 {
            // Waiting per chunk spreads the appends over many group commits.
            let tickets: Vec<_> = (0..20u32)
                .map(|i| s.append(b"t", b"", &(chunk * 20 + i).to_le_bytes()))
                .collect();
            for t in tickets {
                match t {
                    Ok(t) => match t.wait() {
                        // Only possible before the fault hit; tickets complete in order.
                        Ok(seq) => {
                            assert_eq!(failures, 0, "an append completed after a failed one");
                            acked = seq;
                        }
                        Err(e) => {
                            assert!(
                                matches!(e, StoreError::Failed { .. } | StoreError::Io { .. }),
                                "{e}"
                            );
                            failures += 1;
                        }
                    },
                    Err(e) => {
                        assert!(matches!(e, StoreError::Failed { .. }), "{e}");
                        failures += 1;
                    }
                }
            }
        }
        assert!(failures > 0);
        assert!(s.info().failed);
        // Refuses every further write with a clear error.
        let e = s.append(b"t", b"", b"more").unwrap_err();
        assert!(matches!(e, StoreError::Failed { .. }));
        assert!(e.to_string().contains("reopen"), "{e}");
        assert!(matches!(
            s.purge(&FilterSet::all()),
            Err(StoreError::Failed { .. })
        ));
        // Reads of what was acknowledged still work.
        assert!(s.get(acked).unwrap().is_some());
    }
    let store = Store::open(dir.path()).unwrap();
    let s = store.stream("s", cfg()).unwrap();
    for seq in 1..=acked {
        let r = s
            .get(seq)
            .unwrap()
            .unwrap_or_else(|| panic!("acknowledged {seq} lost"));
        let i = if seq <= 300 { seq - 1 } else { seq - 301 };
        assert_eq!(&r.payload[..], &(i as u32).to_le_bytes()[..]);
    }
    let next = s.append(b"t", b"", b"x").unwrap().wait().unwrap();
    assert!(next > acked);
}

#[test]
fn failing_write_refuses_further_writes_and_keeps_acknowledged() {
    scenario(|v| v.fail_write_after(0));
}

#[test]
fn failing_fsync_refuses_further_writes_and_keeps_acknowledged() {
    scenario(|v| v.fail_sync_after(0));
}

#[test]
fn failing_fsync_at_a_later_batch() {
    scenario(|v| v.fail_sync_after(1));
}

#[test]
fn faults_at_various_points_including_block_rolls() {
    for k in 0..8 {
        scenario(|v| v.fail_write_after(k));
        scenario(|v| v.fail_sync_after(k));
    }
}
