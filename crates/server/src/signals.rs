//! SIGINT/SIGTERM. Handlers are installed before the listener is announced, so a signal sent
//! right after `tern listening on ...` is never lost to the default action.

use std::future::Future;

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
