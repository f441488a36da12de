//! Store bugs the power-loss checker (`tests/power_loss.rs`) found, each as a scenario of its
//! own on the simulated disk, with the seed that found it. Where the outcome of a power loss
//! matters, a scenario runs over many disk seeds (each decides differently what of the
//! unsynced state survives).

use std::path::PathBuf;
use std::time::Duration;

use tern_store::sim::{SimConfig, SimDisk};
use tern_store::{FilterSet, Store, Stream, StreamConfig, SyncPolicy};

const DISK_SEEDS: u64 = 48;

fn cfg(sync: SyncPolicy) -> StreamConfig {
    StreamConfig {
        block_size_bytes: 4096,
        sync,
        expire_interval: Duration::from_secs(3600),
        ..Default::default()
    }
}

fn interval() -> SyncPolicy {
    SyncPolicy::Interval(Duration::from_secs(3600))
}

/// A 1000-byte payload: four records fill a 4096-byte block, so block 1 holds seqs 1..=3
/// and the fourth record starts block 4.
fn big(seq: u64) -> Vec<u8> {
    vec![seq as u8; 1000]
}

struct Env {
    _dir: tempfile::TempDir,
    root: PathBuf,
    disk: SimDisk,
}

impl Env {
    fn new(seed: u64, cfg: SimConfig) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let disk = SimDisk::new(&root, seed, cfg);
        Env {
            _dir: dir,
            root,
            disk,
        }
    }

    fn open(&self, name: &str, c: StreamConfig) -> (Store, Stream) {
        let store = Store::open_with_vfs(&self.root, self.disk.vfs()).unwrap();
        let s = store.stream(name, c).unwrap();
        (store, s)
    }
}

/// Releases a held write when dropped.
struct Release(SimDisk);

impl Drop for Release {
    fn drop(&mut self) {
        self.0.release();
    }
}

fn all(s: &Stream) -> Vec<(u64, Vec<u8>)> {
    s.read_from(0, &FilterSet::all(), 10_000, usize::MAX)
        .unwrap()
        .records
        .into_iter()
        .map(|r| (r.seq, r.payload.to_vec()))
        .collect()
}

/// Seed 3. A roll wrote the new block's header without syncing it (the first commit's sync
/// was to cover it). Write-back that persisted a later page of the new block but not its
/// first made recovery read a zero header on a block longer than one, and quarantine it as
/// corrupt: an alarm, and a quarantined block, for an ordinary power loss.
#[test]
fn a_power_loss_after_a_roll_never_quarantines_the_new_block() {
    for seed in 0..DISK_SEEDS {
        let env = Env::new(
            seed,
            SimConfig {
                page_size: 512,
                ..Default::default()
            },
        );
        {
            let (_store, s) = env.open("s", cfg(interval()));
            for seq in 1..=6 {
                drop(s.append_at(seq, b"t", b"", &big(seq)).unwrap());
            }
            s.flush().unwrap();
            // Written to block 4, not synced.
            for seq in 7..=9 {
                drop(s.append_at(seq, b"t", b"", &big(seq)).unwrap());
            }
            while s.info().written_seq < 9 {
                std::thread::sleep(Duration::from_millis(1));
            }
            env.disk.power_loss();
        }
        let (_store, s) = env.open("s", cfg(interval()));
        assert!(
            s.recovery_report().quarantined.is_empty(),
            "disk seed {seed}: {:?}",
            s.recovery_report()
        );
        let got = all(&s);
        assert_eq!(
            got[..6],
            (1..=6).map(|q| (q, big(q))).collect::<Vec<_>>()[..]
        );
    }
}

/// Seed 34. Under `sync = never` a block was sealed without a sync, but its index was
/// written: write-back could persist the index whole and the block's length without its
/// data. Recovery trusted the index, and the first read quarantined the whole block, with
/// records that had survived an earlier power loss (durable for good) in it.
#[test]
fn never_syncing_streams_do_not_lose_durable_records_in_a_later_power_loss() {
    for seed in 0..DISK_SEEDS {
        let env = Env::new(seed, SimConfig::default());
        {
            let (_store, s) = env.open("s", cfg(SyncPolicy::Never));
            for seq in 1..=2 {
                s.append_at(seq, b"t", b"", &big(seq))
                    .unwrap()
                    .wait()
                    .unwrap();
            }
        }
        // Whatever survives this power loss is durable from now on.
        env.disk.power_loss();
        let durable = {
            let (_store, s) = env.open("s", cfg(SyncPolicy::Never));
            let durable = all(&s);
            let next = s.next_seq();
            // Fill the block, seal it, and write on into the next one.
            for seq in next..next + 6 {
                s.append_at(seq, b"t", b"", &big(seq))
                    .unwrap()
                    .wait()
                    .unwrap();
            }
            env.disk.power_loss();
            durable
        };
        let (_store, s) = env.open("s", cfg(SyncPolicy::Never));
        assert!(
            s.recovery_report().quarantined.is_empty(),
            "disk seed {seed}"
        );
        let got = s
            .read_from(0, &FilterSet::all(), 10_000, usize::MAX)
            .unwrap_or_else(|e| panic!("disk seed {seed}: {e}"));
        let got: Vec<(u64, Vec<u8>)> = got
            .records
            .into_iter()
            .map(|r| (r.seq, r.payload.to_vec()))
            .collect();
        assert_eq!(got[..durable.len()], durable[..], "disk seed {seed}");
    }
}
