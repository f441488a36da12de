//! The replicated disk with a replica behind it: the store running on the disk, and the
//! replica's files equal to the live ones once synced (renames and links as copies, retired
//! blocks as removals).

use std::sync::Arc;

use tern_store::vfs::Vfs;

use super::ReplicatedDisk;
use super::tests::{Fake, runtime, start};
use crate::ops::Op;
use crate::replica::Replica;
use crate::replica::tests::tree;

/// A disk in `live/` over a consensus that commits at once and applies to a replica in
/// `replica/`.
struct WithReplica {
    fake: Arc<Fake>,
    disk: ReplicatedDisk,
    live: std::path::PathBuf,
    copy: std::path::PathBuf,
    _dir: tempfile::TempDir,
    /// Last: the proposer's and committer's runtime outlives the disk. (Bound by name where
    /// the struct is taken apart: `..` dropped it, and the temporary directory, at once.)
    _rt: tokio::runtime::Runtime,
}

fn with_replica() -> WithReplica {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let (live, copy) = (dir.path().join("live"), dir.path().join("replica"));
    let replica = Replica::open(copy.clone(), true).unwrap();
    let fake = Arc::new(Fake::default());
    *fake.applier.lock().unwrap() = Some(replica.applier());
    let disk = start(&fake, &live, &rt);
    WithReplica {
        fake,
        disk,
        live,
        copy,
        _dir: dir,
        _rt: rt,
    }
}

#[test]
fn the_replica_holds_the_live_files_once_the_store_has_synced() {
    let WithReplica {
        fake: _fake,
        disk,
        live,
        copy,
        _dir,
        _rt,
    } = with_replica();
    {
        let store = tern_store::Store::open_with_vfs(&live, Arc::new(disk.clone())).unwrap();
        let stream = store
            .stream("m", tern_store::StreamConfig::default())
            .unwrap();
        let kv = store.kv("k", tern_store::StreamConfig::default()).unwrap();
        for i in 0..2_000u32 {
            let t = stream.append(b"t/x", b"", &i.to_be_bytes()).unwrap();
            if i % 100 == 0 {
                kv.put(b"cursor", &i.to_be_bytes()).unwrap().wait().unwrap();
                t.wait().unwrap();
            }
        }
        stream.append(b"t/x", b"", b"last").unwrap().wait().unwrap();
    }
    // Renames and links are replicated as copies, whatever the source became afterwards.
    let vfs: &dyn Vfs = &disk;
    let f = vfs.open_rw(&live.join("tmp"), true).unwrap();
    f.write_all_at(b"rewritten block", 0).unwrap();
    vfs.rename(&live.join("tmp"), &live.join("renamed"))
        .unwrap();
    vfs.hard_link(&live.join("renamed"), &live.join("linked"))
        .unwrap();
    let g = vfs.open_rw(&live.join("tmp"), true).unwrap();
    g.write_all_at(b"a new tmp", 0).unwrap();
    vfs.sync_dir(&live).unwrap();
    let (l, r) = (tree(&live), tree(&copy));
    let lock_files: Vec<&String> = l.keys().filter(|k| !r.contains_key(*k)).collect();
    assert!(
        lock_files.len() <= 1,
        "only the lock file is local: {lock_files:?}"
    );
    for (k, v) in &r {
        assert_eq!(l.get(k), Some(v), "{k} differs between live and replica");
    }
}

/// Blocks that retention empties are thrown away through `Vfs::discard`: the replica learns
/// that they are gone, and their data is not copied through consensus into `trash/` (it was,
/// as a rename: 4 MiB proposals on every retired block, the cluster's longest stalls).
#[test]
fn retired_blocks_are_replicated_as_removals_not_as_copies() {
    let WithReplica {
        fake,
        disk,
        live,
        copy,
        _dir,
        _rt,
    } = with_replica();
    let config = tern_store::StreamConfig {
        block_size_bytes: 64 * 1024,
        limits: tern_store::Limits {
            max_msgs: Some(100),
            ..Default::default()
        },
        ..Default::default()
    };
    {
        let store = tern_store::Store::open_with_vfs(&live, Arc::new(disk.clone())).unwrap();
        let stream = store.stream("m", config).unwrap();
        let payload = [7u8; 1024];
        for _ in 0..1_000 {
            stream
                .append(b"t/x", b"", &payload)
                .unwrap()
                .wait()
                .unwrap();
        }
    }
    let ops = fake.ops();
    let in_trash = |p: &crate::ops::RelPath| p.as_str().contains("/trash/");
    let retired = ops
        .iter()
        .filter(|op| matches!(op, Op::Remove(p) if p.as_str().ends_with(".blk") && !in_trash(p)))
        .count();
    assert!(
        retired >= 5,
        "premise: retention retired blocks ({retired})"
    );
    let copied: usize = ops
        .iter()
        .map(|op| match op {
            Op::Write { path, data, .. } | Op::WriteFile { path, data } if in_trash(path) => {
                data.len()
            }
            _ => 0,
        })
        .sum();
    assert_eq!(copied, 0, "bytes copied into trash/ through consensus");
    // The replica has the stream's live blocks and nothing of the retired ones.
    let (l, r) = (tree(&live), tree(&copy));
    for (k, v) in &r {
        let in_trash = k
            .split_once("/trash/")
            .is_some_and(|(_, name)| !name.is_empty());
        assert!(!in_trash, "{k}: a retired block in the replica");
        assert_eq!(l.get(k), Some(v), "{k} differs between live and replica");
    }
}
