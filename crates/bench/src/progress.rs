//! The live progress line on stderr (only when stderr is a terminal and not `--quiet`).

use std::io::{IsTerminal, Write};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::load::Shared;

/// How often the progress line is redrawn.
pub const REDRAW_INTERVAL: Duration = Duration::from_millis(500);

pub struct Progress {
    enabled: bool,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Progress {
    pub fn new(quiet: bool) -> Progress {
        Progress {
            enabled: !quiet && std::io::stderr().is_terminal(),
            task: Mutex::new(None),
        }
    }

    pub fn disabled() -> Progress {
        Progress {
            enabled: false,
            task: Mutex::new(None),
        }
    }

    /// A one-off status line (setup phases).
    pub fn phase(&self, text: &str) {
        if self.enabled {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K{text}...");
            let _ = err.flush();
        }
    }

    /// A free-form line redrawn from a counter closure (connection setup).
    pub fn counter(
        &self,
        label: &'static str,
        total: u64,
        count: Arc<std::sync::atomic::AtomicU64>,
    ) {
        if !self.enabled {
            return;
        }
        let started = Instant::now();
        let handle = tokio::spawn(async move {
            loop {
                tokio::time::sleep(REDRAW_INTERVAL).await;
                let done = count.load(Ordering::Relaxed);
                let mut err = std::io::stderr().lock();
                let _ = write!(
                    err,
                    "\r\x1b[2K[{:6.1}s] {label} {done}/{total}",
                    started.elapsed().as_secs_f64()
                );
                let _ = err.flush();
            }
        });
        self.replace(handle);
    }

    /// Redraws sent/acked/delivered counts until [`Progress::finish`].
    pub fn start(&self, shared: Arc<Shared>, to_send: u64, to_deliver: u64) {
        if !self.enabled {
            return;
        }
        let started = Instant::now();
        let handle = tokio::spawn(async move {
            let mut last_delivered = 0;
            let mut last_at = Instant::now();
            loop {
                tokio::time::sleep(REDRAW_INTERVAL).await;
                let sent = shared.sent.load(Ordering::Relaxed);
                let acked = shared.acked.load(Ordering::Relaxed);
                let delivered = shared.delivered.load(Ordering::Relaxed);
                let rate = (delivered - last_delivered) as f64 / last_at.elapsed().as_secs_f64();
                last_delivered = delivered;
                last_at = Instant::now();
                let mut err = std::io::stderr().lock();
                let _ = write!(
                    err,
                    "\r\x1b[2K[{:6.1}s] sent {sent}/{to_send} acked {acked} delivered {delivered}/{to_deliver} ({rate:.0} msg/s)",
                    started.elapsed().as_secs_f64()
                );
                let _ = err.flush();
            }
        });
        self.replace(handle);
    }

    fn replace(&self, handle: tokio::task::JoinHandle<()>) {
        if let Ok(mut slot) = self.task.lock()
            && let Some(old) = slot.replace(handle)
        {
            old.abort();
        }
    }

    /// Stops redrawing and clears the line.
    pub fn finish(&self) {
        if let Ok(mut slot) = self.task.lock()
            && let Some(task) = slot.take()
        {
            task.abort();
        }
        if self.enabled {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
    }
}
