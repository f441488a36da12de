//! Third-party clients run as subprocesses (mosquitto_pub/sub, python with paho-mqtt), each
//! bounded by coreutils `timeout` so a stuck client fails the test instead of hanging it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// Bound on `scripts/pydeps.sh` (a fresh venv plus `pip install`).
const PYDEPS_TIMEOUT: Duration = Duration::from_secs(420);
/// Bound on `scripts/debdeps.sh` (an `apt-get update` and install on a fresh machine).
const DEBDEPS_TIMEOUT: Duration = Duration::from_secs(900);

/// A command for a Debian-packaged tool the tests drive (mosquitto_pub/sub/passwd, chromium):
/// on a fresh machine `scripts/debdeps.sh` installs what is missing first, once per test
/// process, so that the README's `cargo test --workspace` needs nothing installed by hand
/// (issue 24 item 7). Concurrent test processes are serialised by a lock file (apt holds its
/// own lock and would refuse a second install).
pub fn tool(program: &str) -> Command {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let script = repo_root().join("scripts/debdeps.sh");
        let lock = std::env::temp_dir().join("tern-debdeps.lock");
        let output = run(
            Command::new("flock").arg(&lock).arg("bash").arg(&script),
            DEBDEPS_TIMEOUT,
        );
        assert!(
            output.status.success(),
            "Debian packages the tests need could not be installed by {}:\n{}",
            script.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    });
    Command::new(program)
}

pub fn repo_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or(root)
}

/// The python of the venv with paho-mqtt 2.x (`scripts/pydeps.sh` creates it when missing).
pub fn python() -> PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let script = repo_root().join("scripts/pydeps.sh");
            let output = run(Command::new("bash").arg(&script), PYDEPS_TIMEOUT);
            let stdout = String::from_utf8_lossy(&output.stdout);
            let python = stdout.lines().last().unwrap_or("").trim().to_string();
            assert!(
                output.status.success() && !python.is_empty(),
                "paho-mqtt 2.x is needed and {} could not provide it:\n{}",
                script.display(),
                String::from_utf8_lossy(&output.stderr)
            );
            PathBuf::from(python)
        })
        .clone()
}

/// Runs `command` to its end under `timeout`, collecting its output.
pub fn run(command: &mut Command, timeout: Duration) -> Output {
    let program = command.get_program().to_owned();
    let args: Vec<_> = command.get_args().map(|a| a.to_owned()).collect();
    let mut bounded = Command::new("timeout");
    bounded
        .arg(format!("{}", timeout.as_secs().max(1)))
        .arg(&program)
        .args(&args)
        .stdin(Stdio::null());
    for (key, value) in command.get_envs() {
        match value {
            Some(value) => bounded.env(key, value),
            None => bounded.env_remove(key),
        };
    }
    bounded
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program:?}: {e}"))
}

/// Starts `command` in the background (stdout piped), for a subscriber that must be up before
/// the publisher runs.
pub fn spawn(command: &mut Command, timeout: Duration) -> std::process::Child {
    let program = command.get_program().to_owned();
    let args: Vec<_> = command.get_args().map(|a| a.to_owned()).collect();
    Command::new("timeout")
        .arg(format!("{}", timeout.as_secs().max(1)))
        .arg(&program)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {program:?}: {e}"))
}
