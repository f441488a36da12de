//! [`SimVfs`]: the store's `Vfs` over a [`SimDisk`], and its file handles.

use super::*;

/// The [`Vfs`] of one boot of a [`SimDisk`].
#[derive(Clone)]
pub struct SimVfs {
    pub(super) disk: SimDisk,
    pub(super) boot: u64,
}

impl fmt::Debug for SimVfs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimVfs").field("boot", &self.boot).finish()
    }
}

impl SimVfs {
    pub fn disk(&self) -> &SimDisk {
        &self.disk
    }
}

impl Vfs for SimVfs {
    fn open_rw(&self, path: &Path, create_new: bool) -> io::Result<Arc<dyn VFile>> {
        self.disk.open_rw(self.boot, path, create_new)
    }
    fn read_file(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.disk.read_file(self.boot, path)
    }
    fn write_file(&self, path: &Path, data: &[u8]) -> io::Result<()> {
        self.disk.write_file(self.boot, path, data)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.disk.remove_file(self.boot, path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.disk.rename(self.boot, from, to)
    }
    /// A rename, with a rename's crash behaviour: the strictest reading of the contract.
    fn discard(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.disk.rename(self.boot, from, to)
    }
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        self.disk.create_dir_all(self.boot, dir)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.disk.sync_dir(self.boot, dir)
    }
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.disk.list_dir(self.boot, dir)
    }
    fn stepped_writers(&self) -> bool {
        self.disk.lock().cfg.stepped_writers
    }
    fn now_ns(&self) -> u64 {
        self.disk.clock_ns(crate::vfs::system_now_ns)
    }
    fn monotonic_ns(&self) -> u64 {
        self.disk.clock_ns(crate::vfs::process_monotonic_ns)
    }
    fn injected_bugs(&self) -> Bugs {
        self.disk.lock().cfg.bugs
    }
}

pub(super) struct SimFile {
    pub(super) disk: SimDisk,
    pub(super) ino: u64,
    pub(super) path: PathBuf,
    pub(super) boot: u64,
}

impl fmt::Debug for SimFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimFile")
            .field("path", &self.path)
            .field("boot", &self.boot)
            .finish()
    }
}

impl VFile for SimFile {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.disk.file_write(self, buf, offset)
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.disk.file_read(self, buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.disk.file_sync(self)
    }
    fn start_sync(&self, _done: crate::vfs::SyncDone) -> Option<Box<dyn crate::vfs::SyncInFlight>> {
        // The simulated disk's syncs are steps of the simulation, one at a time.
        None
    }
    fn file_len(&self) -> io::Result<u64> {
        self.disk.file_len(self)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.disk.file_set_len(self, len)
    }
    fn allocate(&self, len_bytes: u64) -> io::Result<()> {
        self.disk.file_allocate(self, len_bytes)
    }
}
