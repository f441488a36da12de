//! The disk half of a deterministic simulator (issue 12): [`SimDisk`], an in-memory file
//! system behind the store's [`Vfs`](crate::vfs::Vfs) trait that models what a power loss
//! does to a page cache, plus the store's test-only bug switches ([`Bugs`]).
//!
//! Compiled only with the `sim` cargo feature, which adds this module and nothing else to
//! the store's behaviour: the store keeps one code path and reaches the disk only through
//! the `Vfs` trait. The feature lives in tern-store rather than in a crate of its own
//! because the bug switches must sit inside the writer (a separate crate could not reach
//! them without a public hook in every build), and because the store's own tests need the
//! disk: a `sim-disk` crate depending on tern-store would have to be a dev-dependency cycle.
//! A broker-level simulator (crates/broker or a new crate, both dependents of tern-store)
//! enables the feature in its dev-dependencies; the store stays a leaf.
//!
//! # The model: what is durable when
//! - **File data.** A write lands in the page cache: reads see it at once. It is durable
//!   only once an `fdatasync` of that file succeeds (which also makes the file's length
//!   durable). The cache is tracked in pages (`SimConfig::page_size`). A reservation
//!   (`VFile::allocate`) is a length change of zeros: durable with the next `fdatasync`;
//!   pages whose durable image still holds bytes of an unsynced truncation are dirtied, so
//!   that the sync writes the zeros over them.
//! - **Names.** Creating a file or directory, renaming and unlinking change the directory
//!   in the cache at once, and are durable only once that directory is fsynced. A rename
//!   between two directories is two changes, each made durable by its own directory's
//!   fsync. A file whose data was synced but whose name was not is gone after a power loss.
//! - **Power loss** ([`SimDisk::power_loss`], or at a random mutating call with probability
//!   `SimConfig::power_loss`, or scripted) keeps everything durable and, per file with
//!   unsynced pages, one of (from the seeded RNG): nothing more; the dirty pages written
//!   back in order up to a random byte, so the last unsynced write is torn; a random subset
//!   of whole dirty pages (write-back is not ordered: later data may survive while earlier
//!   data does not, and gaps read as zeros); or the new length without the data (zeros).
//!   Per directory, unsynced name changes survive as a random prefix (journaling file
//!   systems keep metadata operations in order), or with `MetadataOrder::Unordered` as any
//!   subset. A power loss that strikes inside a call first applies part of it (a prefix of
//!   a write, part of a sync's write-back). Names whose directory did not survive go too.
//! - **Process crash** ([`SimDisk::crash`], `kill -9`): nothing is lost; the page cache,
//!   dirty pages and unsynced names stay as they are.
//! - Either way the old "process" is dead: every handle and every `Vfs` obtained before
//!   fails with EIO from then on, so the old store's threads stop without touching the
//!   disk. [`SimDisk::vfs`] hands out the next boot's `Vfs`.
//! - **I/O errors.** Writes (of block files and whole files), `fdatasync` and directory
//!   fsyncs fail with EIO by probability or by a scripted schedule ([`ScriptedFault`]). A
//!   failed write leaves a random prefix of its data in the cache. A failed `fdatasync`
//!   writes back a random prefix of the dirty pages; the rest stays dirty
//!   (`SyncErrorModel::KeepDirty`) or, as Linux does, is marked clean without reaching the
//!   disk (`SyncErrorModel::DropDirty`): the cache then shows data a later successful sync
//!   will not persist. A failed directory fsync leaves its changes pending. Reads,
//!   unlinks, `set_len`, `allocate` and renames never fail by probability (renames and creates can by
//!   script).
//! - **Latency**: optionally every call sleeps up to `SimConfig::latency` (real time; it
//!   changes no outcome).
//!
//! # Determinism
//! Every random choice comes from a [`SimRng`] keyed by the seed and by what it decides (the
//! boot, the path, the how-many-th call of its kind on that path; for a power loss, its
//! number and the file or directory): the disk's behaviour depends only on the sequence of
//! calls made on each path, never on how threads interleave across paths. A caller that
//! keeps each path's calls in a fixed order (one step at a time, see [`SimDisk::hold_next_write`]
//! for deterministic group commit) replays a seed exactly; [`SimDisk::trace_digest`] checks it.
//! Unlinks are exempt from faults and from the trace when their directory is listed in
//! `SimConfig::untraced_dirs`, because the store's reaper thread issues them on its own time.
//!
//! With `SimConfig::stepped_writers` the store runs no thread of its own: writer turns (and
//! the reaper's unlinks, inline) run when the caller steps the store (`Store::step`) or
//! blocks on it, and [`SimDisk::set_clock`] gives it virtual time. A single-threaded
//! simulation then makes every call in an order of its own choosing, and a seed replays
//! exactly whatever its workload does across streams.
//!
//! The store's lock file is not part of the model: `Store::open_with_vfs` takes a real
//! `flock` in the (real) directory the disk is mounted at.

mod disk;

/// Defined beside the `Vfs` that carries them to the store (below this module).
pub use crate::vfs::Bugs;
pub use disk::{
    FaultAction, MetadataOrder, OpKind, ScriptedFault, SimClock, SimConfig, SimDisk, SimStats,
    SimVfs, SyncErrorModel,
};

/// SplitMix64: small, fast, and good enough to drive a simulation. Deterministic from its
/// seed on every platform.
#[derive(Debug, Clone)]
pub struct SimRng(u64);

impl SimRng {
    pub fn new(seed: u64) -> SimRng {
        SimRng(seed)
    }

    /// A generator keyed by several values (e.g. seed, boot, path hash, call number).
    pub fn keyed(parts: &[u64]) -> SimRng {
        SimRng(parts.iter().fold(0x243f_6a88_85a3_08d3, |h, &p| mix(h, p)))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`; returns 0 for `n == 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    /// Picks one element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

/// Combines two values into a well-mixed hash.
pub fn mix(h: u64, v: u64) -> u64 {
    let mut r = SimRng(h ^ v.rotate_left(17));
    r.next_u64() ^ v
}

/// FNV-1a of bytes (path hashing).
pub fn hash_bytes(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_deterministic_and_spread() {
        let a: Vec<u64> = (0..4).map(|_| SimRng::new(7).next_u64()).collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]));
        let mut r = SimRng::keyed(&[1, 2, 3]);
        let mut counts = [0u32; 4];
        for _ in 0..4000 {
            counts[r.below(4) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (800..1200).contains(&c)),
            "{counts:?}"
        );
        assert_ne!(
            SimRng::keyed(&[1, 2]).next_u64(),
            SimRng::keyed(&[2, 1]).next_u64()
        );
    }
}
