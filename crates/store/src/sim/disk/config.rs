//! What a [`SimDisk`](super::SimDisk) is configured with, the faults it injects, and what it
//! counts.

use super::*;

/// Kinds of calls, for scripted faults and per-path call counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// `VFile::write_all_at` and `Vfs::write_file`.
    Write,
    /// `VFile::sync_data`.
    Sync,
    /// `Vfs::sync_dir`.
    SyncDir,
    /// Creating a file (`open_rw` with `create_new`).
    Create,
    CreateDir,
    Rename,
    Remove,
    SetLen,
    /// `VFile::allocate`.
    Allocate,
}

/// What a failed `fdatasync` does to the dirty pages it did not write back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncErrorModel {
    /// They stay dirty: a later successful sync persists them.
    KeepDirty,
    /// Linux: they are marked clean without reaching the disk. Reads still return them
    /// until the power fails; no later sync writes them unless they are written again.
    DropDirty,
}

/// How unsynced name changes of one directory survive a power loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetadataOrder {
    /// A prefix of them, in order (journaling file systems).
    Ordered,
    /// Any subset (all POSIX promises).
    Unordered,
}

/// What a scripted fault does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultAction {
    /// The call fails with EIO (a write leaves a prefix of its data, a sync a partial
    /// write-back, as with probabilistic errors).
    Eio,
    /// The power fails during the call.
    PowerLoss,
}

/// A fault at a fixed point: the `nth` call of kind `op` whose path contains
/// `path_contains`, counted over the disk's whole life (all boots).
#[derive(Debug, Clone)]
pub struct ScriptedFault {
    pub op: OpKind,
    pub path_contains: String,
    pub nth: u64,
    pub action: FaultAction,
}

/// How the disk behaves. Every probability is per call.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Granularity of dirty tracking and of write-back at a power loss.
    pub page_size: usize,
    /// A write fails with EIO.
    pub write_error: f64,
    /// An `fdatasync` fails with EIO.
    pub sync_error: f64,
    /// A directory fsync fails with EIO.
    pub dir_sync_error: f64,
    /// The power fails during a mutating call (any but unlinks).
    pub power_loss: f64,
    pub sync_error_model: SyncErrorModel,
    pub metadata_order: MetadataOrder,
    /// Every call sleeps up to this long (real time).
    pub latency: Option<Duration>,
    pub faults: Vec<ScriptedFault>,
    /// Bugs the store is asked to have (see [`Bugs`]).
    pub bugs: Bugs,
    /// Directory names (not paths) whose unlinks are neither faulted nor traced: the
    /// store's `trash`, emptied by a thread of its own at times of its own.
    pub untraced_dirs: Vec<String>,
    /// Keep a line per traced call (see [`SimDisk::op_log`]), to diff two runs of a seed.
    pub record_ops: bool,
    /// Stores on this disk get stepped writers (`Vfs::stepped_writers`): no writer or
    /// reaper threads; turns run when the simulator calls `Store::step` (or blocks on a
    /// ticket, a flush, a removal, a full queue), so a single-threaded simulation decides
    /// their order and replays a seed call for call.
    pub stepped_writers: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            page_size: 4096,
            write_error: 0.0,
            sync_error: 0.0,
            dir_sync_error: 0.0,
            power_loss: 0.0,
            sync_error_model: SyncErrorModel::KeepDirty,
            metadata_order: MetadataOrder::Ordered,
            latency: None,
            faults: Vec::new(),
            bugs: Bugs::NONE,
            untraced_dirs: Vec::new(),
            record_ops: false,
            stepped_writers: false,
        }
    }
}

/// Counters of what the disk did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SimStats {
    pub writes: u64,
    pub syncs: u64,
    pub dir_syncs: u64,
    pub write_errors: u64,
    pub sync_errors: u64,
    pub dir_sync_errors: u64,
    pub power_losses: u64,
    pub crashes: u64,
    /// Files that lost unsynced data in a power loss, by what survived.
    pub files_lost_all: u64,
    pub files_torn_in_order: u64,
    pub files_random_pages: u64,
    pub files_length_only: u64,
    /// Unsynced name changes dropped by power losses.
    pub names_lost: u64,
}
