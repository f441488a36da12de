//! Removals and compaction: what the power-loss checker found where blocks are compacted,
//! deleted or dropped at open.

use super::*;

/// Seed 134 (with unordered metadata). Compaction synced the rewritten block's new index
/// (data) but not the directory before renaming the new block over the old one: if the
/// rename reached the disk and the index replacement did not, the old index (of the longer
/// block) met the shorter block, and recovery quarantined the block as one that lost its
/// tail.
#[test]
fn a_power_loss_during_compaction_never_quarantines() {
    for seed in 0..DISK_SEEDS {
        for nth in 1..=3 {
            let env = Env::new(
                seed,
                SimConfig {
                    metadata_order: MetadataOrder::Unordered,
                    ..Default::default()
                },
            );
            let live: Vec<(u64, Vec<u8>)> = {
                let (_store, s) = env.open("s", cfg(SyncPolicy::Always));
                for seq in 1..=8 {
                    drop(s.append_at(seq, b"t", b"", &big(seq)).unwrap());
                }
                s.flush().unwrap();
                s.delete(&[2]).unwrap();
                let live = all(&s);
                // The power fails at the nth directory fsync of the compaction.
                env.disk.update_config(|c| {
                    c.faults = vec![ScriptedFault {
                        op: OpKind::SyncDir,
                        path_contains: "streams/s".into(),
                        nth,
                        action: FaultAction::PowerLoss,
                    }]
                });
                let _ = s.compact(1);
                if env.disk.power_losses() == 0 {
                    env.disk.power_loss();
                }
                live
            };
            env.disk.update_config(|c| c.faults.clear());
            let (_store, s) = env.open("s", cfg(SyncPolicy::Always));
            assert!(
                s.recovery_report().quarantined.is_empty(),
                "disk seed {seed}, fsync {nth}: {:?}",
                s.recovery_report()
            );
            assert_eq!(all(&s), live, "disk seed {seed}, fsync {nth}");
        }
    }
}

/// Seed 286. Compaction copied records verbatim: when a batch's last record had been
/// deleted, the rewritten block ended with a record still flagged "more of this batch
/// follows". Any scan of the block (`verify`, `verify_on_open`, a lost index) took it for a
/// torn batch and quarantined a healthy block.
#[test]
fn compacting_a_partly_deleted_batch_leaves_a_healthy_block() {
    let dir = tempfile::tempdir().unwrap();
    let c = StreamConfig {
        block_size_bytes: 4096,
        ..Default::default()
    };
    {
        let store = Store::open(dir.path()).unwrap();
        let s = store.stream("s", c.clone()).unwrap();
        s.append(b"t", b"", b"first").unwrap().wait().unwrap();
        let recs: Vec<NewRecord> = (0..3)
            .map(|_| NewRecord {
                topic: b"b",
                payload: b"batch",
                ..Default::default()
            })
            .collect();
        let t = s.append_batch(&recs).unwrap();
        let last = t.wait().unwrap();
        s.delete(&[last]).unwrap();
        s.seal().unwrap();
        s.compact(1).unwrap();
        assert_eq!(
            s.verify().unwrap(),
            vec![],
            "the scrub quarantined the block"
        );
        assert_eq!(all(&s).len(), 3);
    }
    let store = Store::open(dir.path()).unwrap();
    let s = store
        .stream(
            "s",
            StreamConfig {
                verify_on_open: true,
                ..c
            },
        )
        .unwrap();
    assert!(s.recovery_report().quarantined.is_empty());
    assert_eq!(all(&s).len(), 3);
}

/// Seed 5066 (600 steps, unordered metadata). `purge` emptied every sealed block, and the
/// writer renamed them all into `trash/` under one directory fsync. Record 2 had been deleted
/// earlier by a marker stored in a newer block: when the power loss kept that block's rename
/// but not the older one's, record 2 came back although its deletion had been acknowledged.
/// A block holding markers is now renamed only once the renames before it are durable.
#[test]
fn removing_many_blocks_never_undoes_an_acknowledged_delete() {
    for seed in 0..DISK_SEEDS {
        for nth in 1..=3 {
            let env = Env::new(
                seed,
                SimConfig {
                    metadata_order: MetadataOrder::Unordered,
                    ..Default::default()
                },
            );
            {
                let (_store, s) = env.open("s", cfg(SyncPolicy::Always));
                // Blocks 1 (seqs 1-3), 4 (4-6), 7 (7-9), 10 (active).
                for seq in 1..=4 {
                    s.append_at(seq, b"t", b"", &big(seq))
                        .unwrap()
                        .wait()
                        .unwrap();
                }
                // The marker goes to block 4.
                assert_eq!(s.delete(&[2]).unwrap().records, 1);
                for seq in 5..=10 {
                    s.append_at(seq, b"t", b"", &big(seq))
                        .unwrap()
                        .wait()
                        .unwrap();
                }
                env.disk.update_config(|c| {
                    c.faults = vec![ScriptedFault {
                        op: OpKind::SyncDir,
                        path_contains: "streams/s".into(),
                        nth,
                        action: FaultAction::PowerLoss,
                    }]
                });
                let _ = s.purge(&FilterSet::all());
                if env.disk.power_losses() == 0 {
                    env.disk.power_loss();
                }
            }
            env.disk.update_config(|c| c.faults.clear());
            let (_store, s) = env.open("s", cfg(SyncPolicy::Always));
            let got: Vec<u64> = all(&s).into_iter().map(|r| r.0).collect();
            assert!(
                !got.contains(&2),
                "disk seed {seed}, fsync {nth}: deleted record 2 is back: {got:?}"
            );
        }
    }
}

/// Seed 40242 (1000 steps). Compaction found a block whose records were all deleted and
/// queued it for removal, then rewrote a newer block without the marker that deleted them
/// (moot once the dead block is gone), and removed the dead block only at the end. A failed
/// directory fsync in between (or a power loss) left the dead block in place and the marker
/// gone: deleted records came back. Dead blocks are now removed before a later rewrite.
#[test]
fn compaction_never_drops_a_marker_before_its_block_is_gone() {
    for seed in 0..DISK_SEEDS {
        for nth in 1..=4 {
            let env = Env::new(seed, SimConfig::default());
            {
                let (_store, s) = env.open("s", cfg(SyncPolicy::Always));
                // Blocks 1 (seqs 1-3), 4 (4-6, all deleted: dead, but not at the front),
                // 7 (7-9 and the marker deleting 4-6), 10 (active).
                for seq in 1..=10 {
                    s.append_at(seq, b"t", b"", &big(seq))
                        .unwrap()
                        .wait()
                        .unwrap();
                    if seq == 7 {
                        assert_eq!(s.delete(&[4, 5, 6]).unwrap().records, 3);
                    }
                }
                env.disk.update_config(|c| {
                    c.faults = vec![ScriptedFault {
                        op: OpKind::SyncDir,
                        path_contains: "streams/s".into(),
                        nth,
                        action: FaultAction::PowerLoss,
                    }]
                });
                let _ = s.compact(4);
                if env.disk.power_losses() == 0 {
                    env.disk.power_loss();
                }
            }
            env.disk.update_config(|c| c.faults.clear());
            let (_store, s) = env.open("s", cfg(SyncPolicy::Always));
            let got: Vec<u64> = all(&s).into_iter().map(|r| r.0).collect();
            assert_eq!(
                got,
                vec![1, 2, 3, 7, 8, 9, 10],
                "disk seed {seed}, fsync {nth}"
            );
        }
    }
}

/// Seed 40939 (1000 steps, unordered metadata). A roll's directory fsync failed, so the
/// new active block's name was not durable. Reopened, recovery removed the dead block before
/// it, the only durable trace of the sequences so far; a power loss kept that removal but
/// not the new block's name, no block was left, and sequences started again at 1. Recovery
/// now makes the directory durable before it removes dead blocks.
#[test]
fn removing_dead_blocks_at_open_never_lets_sequences_restart() {
    for seed in 0..DISK_SEEDS {
        for nth in 1..=3 {
            let env = Env::new(
                seed,
                SimConfig {
                    metadata_order: MetadataOrder::Unordered,
                    ..Default::default()
                },
            );
            {
                let (store, s) = env.open("s", cfg(SyncPolicy::Always));
                for seq in 1..=3 {
                    s.append_at(seq, b"t", b"", &big(seq))
                        .unwrap()
                        .wait()
                        .unwrap();
                }
                // Block 1 is all deleted, and the roll to block 4 fails at its dir fsync.
                assert_eq!(s.delete(&[1, 2, 3]).unwrap().records, 3);
                env.disk.update_config(|c| {
                    c.faults = vec![ScriptedFault {
                        op: OpKind::SyncDir,
                        path_contains: "streams/s".into(),
                        nth: 1,
                        action: FaultAction::Eio,
                    }]
                });
                let _ = s.append_at(4, b"t", b"", &big(4)).unwrap().wait();
                assert!(s.flush().is_err());
                drop(s);
                // Reopened, recovery removes block 1; the power fails at a dir fsync.
                env.disk.update_config(|c| {
                    c.faults = vec![ScriptedFault {
                        op: OpKind::SyncDir,
                        path_contains: "streams/s".into(),
                        nth,
                        action: FaultAction::PowerLoss,
                    }]
                });
                let _ = store.stream("s", cfg(SyncPolicy::Always));
                if env.disk.power_losses() == 0 {
                    env.disk.power_loss();
                }
            }
            env.disk.update_config(|c| c.faults.clear());
            let (_store, s) = env.open("s", cfg(SyncPolicy::Always));
            assert!(
                s.next_seq() > 3,
                "disk seed {seed}, fsync {nth}: next sequence {}",
                s.next_seq()
            );
        }
    }
}
