//! paho-mqtt 2.x clients as subprocesses (`scripts/crash_paho.py`): they reconnect on their
//! own to the port in the port file, with the same client object, so paho's own session logic
//! (resend with DUP, PUBREL after PUBREC, QoS 2 held until PUBREL) is what the broker meets.
//!
//! The interpreter comes from `scripts/pydeps.sh` (a venv with paho-mqtt 2.x, created when
//! missing). If it cannot provide paho the test fails saying so: it never skips silently.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::Shared;

/// Bound on `scripts/pydeps.sh` (a fresh venv plus `pip install`).
const PYDEPS_TIMEOUT: Duration = Duration::from_secs(420);

pub fn repo_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or(root)
}

/// The python interpreter of the venv with paho-mqtt 2.x (created on first use).
pub fn python() -> PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let script = repo_root().join("scripts/pydeps.sh");
            // coreutils `timeout` bounds it; `output()` drains both pipes while it runs.
            let output = Command::new("timeout")
                .arg(PYDEPS_TIMEOUT.as_secs().to_string())
                .arg("bash")
                .arg(&script)
                .stdin(Stdio::null())
                .output()
                .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
            let stdout = String::from_utf8_lossy(&output.stdout);
            let python = stdout.lines().last().unwrap_or("").trim().to_string();
            assert!(
                output.status.success() && !python.is_empty(),
                "the crash test needs paho-mqtt 2.x in a venv, and {} could not provide it \
                 ({}):\n{}\nFix that (python3 with venv, a reachable package index, or \
                 TERN_INTEROP_VENV naming a venv with paho-mqtt 2.x) and rerun.",
                script.display(),
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
            PathBuf::from(python)
        })
        .clone()
}

/// One `crash_paho.py` subprocess; killed on drop.
pub struct Paho {
    pub name: String,
    child: Child,
    stdin: Commands,
    stderr_path: PathBuf,
}

/// The command line of a paho subprocess, shareable with the pacer thread.
#[derive(Clone)]
pub struct Commands(Arc<Mutex<Option<ChildStdin>>>);

impl Commands {
    /// Sends one command line (`limit N`, `finish`, `stop`); a dead process is noticed by
    /// the checks, not here.
    pub fn send(&self, line: &str) {
        let mut stdin = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(stdin) = stdin.as_mut() {
            let _ = writeln!(stdin, "{line}").and_then(|_| stdin.flush());
        }
    }

    fn close(&self) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}

impl Paho {
    /// `args` are the script's arguments after the role (see its doc); events go to `shared`.
    pub fn spawn(role: &str, name: &str, args: &[String], shared: &Shared, dir: &Path) -> Paho {
        let stderr_path = dir.join(format!("{name}.stderr"));
        let stderr = std::fs::File::create(&stderr_path).expect("paho stderr file");
        let mut command = Command::new(python());
        // The client must not outlive the test process (a killed `cargo test` included).
        // SAFETY: runs in the forked child before exec; prctl(2) is async-signal-safe.
        unsafe {
            use std::os::unix::process::CommandExt;
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = command
            .arg(repo_root().join("scripts/crash_paho.py"))
            .arg(role)
            .args(args)
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .spawn()
            .expect("spawn crash_paho.py");
        let stdout = child.stdout.take().expect("stdout");
        let stdin = Commands(Arc::new(Mutex::new(child.stdin.take())));
        let shared = shared.clone();
        let reader_name = name.to_string();
        std::thread::spawn(move || read_events(&reader_name, stdout, &shared));
        Paho {
            name: name.to_string(),
            child,
            stdin,
            stderr_path,
        }
    }

    pub fn commands(&self) -> Commands {
        self.stdin.clone()
    }

    /// `stop`, then waits (bounded) for the process to exit; kills it otherwise.
    pub fn stop(&mut self, timeout: Duration) {
        self.stdin.send("stop");
        self.stdin.close();
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// `None` while running; the exit status once it has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    pub fn stderr_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.stderr_path).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Paho {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The reader thread: one JSON event per line (see the script's doc) into `shared`.
fn read_events(name: &str, stdout: std::process::ChildStdout, shared: &Shared) {
    let mut connected_once = false;
    for line in BufReader::new(stdout).lines() {
        let Ok(line) = line else { break };
        let event: serde_json::Value = match serde_json::from_str(&line) {
            Ok(v) => v,
            Err(_) => {
                shared.error(name, format!("not an event: {line}"));
                continue;
            }
        };
        let int = |key: &str| event.get(key).and_then(serde_json::Value::as_u64);
        match event.get("ev").and_then(serde_json::Value::as_str) {
            Some("msg") => {
                let payload = event.get("payload").and_then(|p| p.as_str()).unwrap_or("");
                let dup = event.get("dup").and_then(|d| d.as_bool()).unwrap_or(false);
                let qos = int("qos").unwrap_or(0) as u8;
                let mid = int("mid").unwrap_or(0) as u16;
                shared.deliver(name, payload.as_bytes(), qos, dup, mid);
            }
            Some("rec") | Some("ack") => {
                if let (Some(n), Some(qos)) = (int("n"), int("qos")) {
                    shared.acked(name, qos as u8, n);
                }
            }
            Some("resent_after_pubrel") => match int("n") {
                Some(n) => shared.resent_after_pubrel(name, n),
                None => shared.error(
                    name,
                    format!("PUBLISH after PUBREL, unknown number: {line}"),
                ),
            },
            Some("sent_out_of_order") => match int("n") {
                Some(n) => shared.sent_out_of_order(name, n),
                None => shared.error(name, format!("resend order, unknown number: {line}")),
            },
            Some("done") => {
                let qos = int("qos").unwrap_or(0) as u8;
                shared.set_done(name, qos);
            }
            Some("subscribed") => {
                shared.lock().subscribed.insert(name.to_string());
            }
            Some("connected") => {
                let session_present = event.get("sp").and_then(|v| v.as_bool()) == Some(true);
                if connected_once && !session_present {
                    shared.session_lost(name);
                }
                connected_once = true;
            }
            Some("away") => shared.went_away(name, int("held").unwrap_or(0)),
            Some("lost") => {}
            _ => shared.error(name, format!("event: {line}")),
        }
    }
}
