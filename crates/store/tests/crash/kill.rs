//! `kill -9` in the middle of group commits: every ticket completed before the kill survives
//! (a child process appends; the parent kills it and reopens the store). Part of `crash.rs`'s
//! test binary: the child is this binary run again with `--exact kill::NAME`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use tern_store::sim::Bugs;
use tern_store::vfs::{RealVfs, VFile, Vfs};
use tern_store::{NewRecord, Store, StreamConfig};

use super::payload;

const CHILD_ENV: &str = "TERN_STORE_CRASH_CHILD_DIR";
/// Set in the child: the store completes tickets before their fdatasync (see below).
const CHILD_BUG_ENV: &str = "TERN_STORE_CRASH_CHILD_ACK_BEFORE_FSYNC";

/// In the child: append forever with up to 64 tickets outstanding, printing each completed
/// sequence. In the parent: kill the child mid-run and verify every printed sequence.
#[test]
fn kill_during_group_commit_keeps_every_completed_ticket() {
    kill_scenario(
        "kill::kill_during_group_commit_keeps_every_completed_ticket",
        false,
    );
}

/// Why `tests/power_loss/` simulates power loss: with the store told to complete tickets
/// before their fdatasync (`tern_store::sim::Bugs::ack_before_fsync`), the `kill -9` test
/// above still passes. SIGKILL keeps the page cache, so a record written but never synced
/// survives it; only a power loss (or a failed fsync) tells the two apart.
#[test]
fn kill_9_cannot_see_acks_before_fsync() {
    kill_scenario("kill::kill_9_cannot_see_acks_before_fsync", true);
}

/// `RealVfs` with the ack-before-fsync bug switched on in the store.
#[derive(Debug)]
struct AckBeforeFsync;

impl Vfs for AckBeforeFsync {
    fn open_rw(&self, path: &Path, create_new: bool) -> std::io::Result<Arc<dyn VFile>> {
        RealVfs.open_rw(path, create_new)
    }
    fn read_file(&self, path: &Path) -> std::io::Result<Vec<u8>> {
        RealVfs.read_file(path)
    }
    fn write_file(&self, path: &Path, data: &[u8]) -> std::io::Result<()> {
        RealVfs.write_file(path, data)
    }
    fn remove_file(&self, path: &Path) -> std::io::Result<()> {
        RealVfs.remove_file(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        RealVfs.rename(from, to)
    }
    fn discard(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        RealVfs.discard(from, to)
    }
    fn create_dir_all(&self, dir: &Path) -> std::io::Result<()> {
        RealVfs.create_dir_all(dir)
    }
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        RealVfs.sync_dir(dir)
    }
    fn list_dir(&self, dir: &Path) -> std::io::Result<Vec<String>> {
        RealVfs.list_dir(dir)
    }
    fn injected_bugs(&self) -> Bugs {
        Bugs {
            ack_before_fsync: true,
            ..Bugs::NONE
        }
    }
}

fn kill_scenario(test: &str, bug: bool) {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        child(Path::new(&dir), std::env::var(CHILD_BUG_ENV).is_ok());
    }
    let dir = tempfile::tempdir().unwrap();
    // Kills the child even if an assertion below fails, so no process is left behind.
    struct KillOnDrop(std::process::Child);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if bug {
        cmd.env(CHILD_BUG_ENV, "1");
    }
    let mut child = cmd.spawn().unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    let mut child = KillOnDrop(child);
    let mut acked = Vec::new();
    for line in out.lines() {
        let line = line.unwrap();
        if let Some(s) = line.strip_prefix("ack ") {
            acked.push(s.parse::<u64>().unwrap());
            if acked.len() >= 20_000 {
                break;
            }
        }
    }
    // The child holds the store's lock while it runs...
    assert!(matches!(
        Store::open(dir.path()),
        Err(tern_store::StoreError::Locked(_))
    ));
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    // ...and SIGKILL leaves no stale lock behind (flock dies with the process).
    assert!(acked.len() >= 20_000, "child stopped early");
    let store = Store::open(dir.path()).unwrap();
    let s = store
        .stream(
            "s",
            StreamConfig {
                block_size_bytes: 64 * 1024,
                ..Default::default()
            },
        )
        .unwrap();
    for seq in acked {
        let r = s
            .get(seq)
            .unwrap()
            .unwrap_or_else(|| panic!("acknowledged seq {seq} lost"));
        assert_eq!(r.payload.to_vec(), payload(seq));
    }
}

fn child(dir: &Path, bug: bool) -> ! {
    use std::io::Write;
    let store = if bug {
        Store::open_with_vfs(dir, Arc::new(AckBeforeFsync)).unwrap()
    } else {
        Store::open(dir).unwrap()
    };
    let s = store
        .stream(
            "s",
            StreamConfig {
                block_size_bytes: 64 * 1024,
                ..Default::default()
            },
        )
        .unwrap();
    let mut pending = std::collections::VecDeque::new();
    let mut next = 1u64;
    let stdout = std::io::stdout();
    // A bound of its own, should the parent never kill it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        if std::time::Instant::now() > deadline {
            std::process::exit(0);
        }
        while pending.len() < 64 {
            let t = if next % 5 == 0 {
                let (a, b) = (payload(next), payload(next + 1));
                let recs = [
                    NewRecord {
                        topic: b"b",
                        payload: &a,
                        ..Default::default()
                    },
                    NewRecord {
                        topic: b"b",
                        payload: &b,
                        ..Default::default()
                    },
                ];
                s.append_batch(&recs).unwrap()
            } else {
                s.append(b"a", b"", &payload(next)).unwrap()
            };
            next = t.seq() + 1;
            pending.push_back(t);
        }
        let t = pending.pop_front().unwrap();
        let (first, last) = (t.first_seq(), t.seq());
        t.wait().unwrap();
        let mut o = stdout.lock();
        for seq in first..=last {
            writeln!(o, "ack {seq}").unwrap();
        }
        o.flush().unwrap();
    }
}
