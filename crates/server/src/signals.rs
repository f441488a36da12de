//! SIGINT/SIGTERM (stop) and SIGHUP (reload). Handlers are installed before the listener is
//! announced, so a signal sent right after `tern listening on ...` is never lost to the default
//! action (for SIGHUP: termination).
//!
//! Reload: every SIGHUP runs each registered [`Reload`] in turn (passwords and ACL today; the
//! listeners' certificates register theirs the same way). Each either applies its new state
//! whole or fails and leaves the old one in force; both are logged. Connections are not
//! touched: the new rules apply to what they do next.

use std::future::Future;

/// One thing SIGHUP re-reads: a name for the log, and a function that re-reads it and applies
/// it, or fails keeping the old state (the error says why).
pub struct Reload {
    pub name: &'static str,
    pub apply: Box<dyn Fn() -> Result<(), String> + Send + Sync>,
}

/// Installs the handlers now; the returned future resolves on the first SIGINT or SIGTERM.
pub fn install() -> std::io::Result<impl Future<Output = ()>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        Ok(async move {
            tokio::select! {
                _ = int.recv() => tracing::info!("SIGINT received"),
                _ = term.recv() => tracing::info!("SIGTERM received"),
            }
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async {
            let _ = tokio::signal::ctrl_c().await;
        })
    }
}

/// Installs the SIGHUP handler now (inside the runtime) and runs `reloads` on every SIGHUP,
/// on the blocking pool (they read files).
pub fn on_hangup(reloads: Vec<Reload>) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::sync::Arc;
        use tokio::signal::unix::{SignalKind, signal};
        let mut hup = signal(SignalKind::hangup())?;
        let reloads = Arc::new(reloads);
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                tracing::info!("SIGHUP received: reloading");
                let reloads = reloads.clone();
                let done = tokio::task::spawn_blocking(move || run_reloads(&reloads)).await;
                if done.is_err() {
                    tracing::error!("reload panicked; the old state stays in force");
                }
            }
        });
    }
    #[cfg(not(unix))]
    drop(reloads);
    Ok(())
}

fn run_reloads(reloads: &[Reload]) {
    for reload in reloads {
        match (reload.apply)() {
            Ok(()) => tracing::info!(what = reload.name, "reloaded"),
            Err(error) => {
                tracing::error!(what = reload.name, %error, "reload failed; the old state stays in force")
            }
        }
    }
}
