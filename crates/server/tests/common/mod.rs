//! Shared harness of the end-to-end suite: start the real `tern` binary on an ephemeral port,
//! talk to it with raw bytes ([`raw`]) or with rumqttc ([`rumq`]).
//!
//! Every wait in the suite is bounded ([`WAIT`] by default): a packet that never arrives fails
//! the test instead of hanging it. Nothing here measures time; short broker timeouts are chosen
//! through the config file so that tests about expiry stay fast.
//!
//! # Invariants
//! - A [`Broker`] kills its child process on drop (also when the test panics), so no test leaks
//!   a broker; if the test process is killed outright, PR_SET_PDEATHSIG kills the broker. So a
//!   `Broker` must be started on the test's own thread (not in a short-lived helper thread).
//!   Its stderr (the broker's logs) goes to a file that is printed when a test fails.
#![allow(dead_code)]

pub mod certs;
pub mod chatty;
pub mod cluster;
pub mod durable;
pub mod http;
pub mod prom;
pub mod raw;
pub mod rumq;
pub mod tools;

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Default bound on every wait for something that should happen.
pub const WAIT: Duration = Duration::from_secs(5);
/// How long a test waits to see that something does NOT happen (used sparingly; most negative
/// checks are ordered behind a marker message instead).
pub const QUIET: Duration = Duration::from_millis(400);
/// Bound on the broker's start-up (the `tern listening on` line).
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// The binary under test. `TERN_E2E_BIN` overrides it, e.g. with
/// `scripts/interop/mosquitto_shim.py` to check the suite itself against a reference broker.
pub fn bin() -> String {
    std::env::var("TERN_E2E_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_tern").to_owned())
}

/// A running `tern serve` child process.
pub struct Broker {
    child: Option<Child>,
    pub addr: SocketAddr,
    /// The admin HTTP listener, when one was asked for (`tern http on ADDR`).
    pub http: Option<SocketAddr>,
    dir: tempfile::TempDir,
    config_toml: String,
    /// Extra arguments after `serve` instead of the default `--bind 127.0.0.1:0`.
    bind_args: Vec<String>,
    /// The `tern listening on` lines after the first (one per further listener).
    more_listeners: Option<mpsc::Receiver<String>>,
}

impl Broker {
    /// Starts a broker with an empty config (every default).
    pub fn start() -> Broker {
        Broker::start_with("")
    }

    /// Starts a broker with `config_toml` as its config file, on `127.0.0.1:0`.
    pub fn start_with(config_toml: &str) -> Broker {
        Broker::start_with_args(config_toml, &["--bind", "127.0.0.1:0"])
    }

    /// Starts `tern serve ARGS --config <file> --data-dir <dir>`; `args` replaces the default
    /// `--bind 127.0.0.1:0` (e.g. to take the address from the config file, or add `--log`).
    pub fn start_with_args(config_toml: &str, args: &[&str]) -> Broker {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut broker = Broker {
            child: None,
            addr: "127.0.0.1:0".parse().expect("addr"),
            http: None,
            dir,
            config_toml: config_toml.to_owned(),
            bind_args: args.iter().map(|a| a.to_string()).collect(),
            more_listeners: None,
        };
        broker.spawn();
        broker
    }

    fn config_path(&self) -> PathBuf {
        self.dir.path().join("tern.toml")
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("tern.stderr.log")
    }

    fn spawn(&mut self) {
        std::fs::write(self.config_path(), &self.config_toml).expect("write config");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("open log");
        let mut command = Command::new(bin());
        // If the test process dies without unwinding (SIGKILL, a timeout), the broker must
        // not outlive it: the kernel sends it SIGKILL when the spawning thread exits.
        // SAFETY: runs in the forked child before exec; prctl(2) is async-signal-safe and
        // touches no memory of the parent.
        unsafe {
            use std::os::unix::process::CommandExt;
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = command
            .arg("serve")
            .args(&self.bind_args)
            .arg("--config")
            .arg(self.config_path())
            .arg("--data-dir")
            .arg(self.data_dir())
            .env(
                "RUST_LOG",
                std::env::var("TERN_TEST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn tern");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel::<String>();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            // Keep draining so the broker never blocks on a full pipe.
            while reader.read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
                // `tern http on ADDR` comes before the listeners when there is an HTTP
                // listener; then one `tern listening on ADDR` per listener.
                if let Some(rest) = line.trim().strip_prefix("tern http on ") {
                    let _ = tx.send(format!("http {rest}"));
                }
                if let Some(rest) = line.trim().strip_prefix("tern listening on ") {
                    let _ = tx.send(rest.to_owned());
                }
                line.clear();
            }
        });
        self.child = Some(child);
        let mut first = rx.recv_timeout(START_TIMEOUT);
        if let Ok(Some(http)) = first.as_deref().map(|l| l.strip_prefix("http ")) {
            self.http = Some(http.parse().expect("`tern http on ADDR`: an address"));
            first = rx.recv_timeout(START_TIMEOUT);
        }
        match first {
            Ok(addr) => {
                self.addr = addr.parse().unwrap_or_else(|e| {
                    panic!("`tern listening on {addr}`: not a socket address: {e}")
                });
                self.more_listeners = Some(rx);
            }
            Err(_) => {
                let status = self
                    .child
                    .as_mut()
                    .and_then(|c| c.try_wait().ok().flatten());
                panic!(
                    "tern did not print `tern listening on ADDR` within {START_TIMEOUT:?} (exit: {status:?})\n--- stderr ---\n{}",
                    self.log_tail(60)
                );
            }
        }
    }

    /// The addresses of the first `n` listeners, in config order (one `tern listening on`
    /// line each; the first is [`Broker::addr`]).
    pub fn listener_addrs(&mut self, n: usize) -> Vec<SocketAddr> {
        let mut addrs = vec![self.addr];
        let rx = self.more_listeners.as_ref().expect("started");
        while addrs.len() < n {
            let line = rx
                .recv_timeout(START_TIMEOUT)
                .unwrap_or_else(|_| panic!("only {} listener line(s)", addrs.len()));
            addrs.push(line.parse().expect("a socket address"));
        }
        addrs
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("running").id() as i32
    }

    /// Sends `signal` (e.g. `libc::SIGTERM`) to the broker.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on the pid of our own child; no memory is involved.
        let rc = unsafe { libc::kill(self.pid(), signal) };
        assert_eq!(rc, 0, "kill({}, {signal}) failed", self.pid());
    }

    /// Waits (bounded) for the broker to exit and returns its status.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let child = self.child.as_mut().expect("running");
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                return status;
            }
            if Instant::now() > deadline {
                panic!(
                    "tern did not exit within {timeout:?}\n{}",
                    self.log_tail(40)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Replaces the config file used from the next (re)start on.
    pub fn set_config(&mut self, config_toml: &str) {
        self.config_toml = config_toml.to_owned();
    }

    /// Kills the broker (SIGKILL) and starts it again with the same config and data dir.
    /// The new process listens on a new ephemeral port (`self.addr` is updated).
    pub fn restart_after_kill(&mut self) {
        self.kill();
        self.spawn();
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The last `lines` lines of the broker's stderr (its logs).
    pub fn log_tail(&self, lines: usize) -> String {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(self.log_path()) {
            let _ = f.read_to_string(&mut text);
        }
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.kill();
        let panicking = std::thread::panicking();
        if panicking {
            eprintln!("--- tern stderr (tail) ---\n{}", self.log_tail(60));
        }
        // For a post-mortem of the data dir and the log (e.g. a crash test's store).
        let keep = std::env::var_os("TERN_E2E_KEEP_ALWAYS").is_some()
            || (panicking && std::env::var_os("TERN_E2E_KEEP_FAILED").is_some());
        if keep {
            self.dir.disable_cleanup(true);
            eprintln!("data dir kept: {}", self.dir.path().display());
        }
    }
}

/// Result of running the binary to completion.
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `tern ARGS` (cwd `cwd`) and waits for it to exit, killing it after `timeout`.
pub fn run_to_exit(args: &[&str], cwd: &Path, timeout: Duration) -> Finished {
    let mut child = Command::new(bin())
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tern");
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let out_thread = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("`tern {}` did not exit within {timeout:?}", args.join(" "));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Finished {
        status,
        stdout: out_thread.join().unwrap_or_default(),
        stderr: err_thread.join().unwrap_or_default(),
    }
}

/// A unique-enough client id / topic suffix for one test.
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A loopback port nothing listens on now: for a config that must name its port before the
/// process starts (a cluster's `peers`).
///
/// Taken below the kernel's ephemeral range (32768-60999 on Linux), which every other test
/// binds through port 0: a port bound and released from that range was taken by a concurrent
/// test's broker in CI ("Address already in use"). Below it only this function hands ports
/// out, each at most once per process (a counter), starting at a per-process offset; cargo runs
/// test binaries one after another.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST_PORT: u32 = 20_000;
    const PORTS: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(7919) % PORTS,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    for _ in 0..PORTS {
        let offset = NEXT.fetch_add(1, Ordering::Relaxed) % PORTS;
        let port = u16::try_from(FIRST_PORT + offset).expect("below 32000");
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!(
        "no free port between {FIRST_PORT} and {}",
        FIRST_PORT + PORTS
    )
}
