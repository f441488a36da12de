//! The scripted probes' runner (`probes*.rs`, `eio.rs`): the broker on a multi-thread runtime
//! of its own over real loopback TCP with the real clock. The seed runner (`run.rs`) runs it
//! in turmoil instead; the probes stay here because each holds a disk write from the test
//! thread (`SimDisk::hold_next_write`) while its clients wait in real time.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tern_broker::{Broker, BrokerConfig, DurableConfig, DurableStore};
use tern_store::sim::SimDisk;
use tokio::net::TcpListener;

use super::client::{Endpoint, Net};

/// A `Net` whose broker listens on loopback TCP.
pub(super) fn net(disk: &SimDisk) -> Arc<Net> {
    Arc::new(Net::new(
        Endpoint::Tcp(parking_lot::Mutex::new(None)),
        disk,
        false,
    ))
}

/// One broker "process": its own runtime, so that killing it drops every task it has
/// (connections, writers, timers, checkpointer) at once.
pub(super) struct Boot {
    rt: tokio::runtime::Runtime,
}

pub(super) fn boot(
    disk: &SimDisk,
    dir: &Path,
    config: &DurableConfig,
    net: &Net,
) -> Result<Boot, String> {
    let Endpoint::Tcp(addr_slot) = &net.endpoint else {
        return Err("not a TCP net".into());
    };
    // The old process's last references may take a moment to go (its store holds the lock).
    let started = Instant::now();
    let store = loop {
        match DurableStore::open_with_vfs(dir, config.clone(), disk.vfs()) {
            Ok(s) => break s,
            Err(e) if started.elapsed() > Duration::from_secs(5) => {
                return Err(format!("store does not open: {e}"));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let broker = {
        let _guard = rt.enter();
        Broker::with_store(BrokerConfig::default(), Arc::new(store)).map_err(|e| e.to_string())?
    };
    let listener = rt
        .block_on(TcpListener::bind("127.0.0.1:0"))
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    rt.spawn(async move {
        let _ = broker.serve(listener, std::future::pending::<()>()).await;
    });
    net.boot.store(disk.boot(), Ordering::Relaxed);
    *addr_slot.lock() = Some(addr);
    Ok(Boot { rt })
}

/// Stops the process abruptly: no clean shutdown, no last checkpoint.
pub(super) fn kill(boot: Boot, net: &Net) {
    if let Endpoint::Tcp(addr) = &net.endpoint {
        *addr.lock() = None;
    }
    boot.rt.shutdown_timeout(Duration::from_secs(5));
}
