//! The broker host's software in a seed: the store opened on the simulated disk (recovery
//! at each boot), the broker started on it, every turmoil connection served through the
//! stream transport, the disk task stepping the store's writers.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tern_broker::{Broker, BrokerConfig, DurableConfig, DurableStore};
use tern_broker::{ConnectionInfo, ListenerContext, StreamTransport, TransportKind};
use tern_store::sim::SimDisk;

use super::bounds::Gauges;
use super::client::{BROKER_PORT, Endpoint, Net};

/// The broker host's software: opens the store on the disk (recovery), starts the broker,
/// and serves every turmoil connection through the stream transport. Called again by
/// turmoil on every restart (bounce).
/// `disk_tick`: how often the disk task steps the store's writers (a commit takes that
/// long in virtual time).
pub(super) fn broker_software(
    disk: SimDisk,
    dir: PathBuf,
    config: DurableConfig,
    net: Arc<Net>,
    disk_tick: Duration,
    (broker_config, gauges): (BrokerConfig, Arc<Gauges>),
) -> impl Fn() -> Pin<Box<dyn Future<Output = turmoil::Result>>> {
    move || {
        let (disk, dir, config, net) = (disk.clone(), dir.clone(), config.clone(), net.clone());
        let (broker_config, gauges) = (broker_config.clone(), gauges.clone());
        Box::pin(async move {
            let store = Arc::new(open_store(&disk, &dir, &config)?);
            // The disk task: one writer turn per stream with work, every disk tick. It runs
            // on the broker host, so a crash stops it with everything else. With writer
            // threads it flushes every stream instead: the threads complete tickets while the
            // tasks run, but virtual time cannot run ahead of them (a thread the machine left
            // unscheduled for a few real milliseconds would otherwise let whole seconds of
            // virtual time pass, and an interval sync's timer runs in real time). Without the
            // flush (`--writer-threads-raw`) subscribers fall behind in virtual time, which is
            // how finding 9 (docs/simulation.md, the checker's stop) showed.
            let writers = store.clone();
            let threads = writer_threads() && !writer_threads_raw();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(disk_tick).await;
                    if threads {
                        let streams = writers.streams().chain(writers.state_streams());
                        streams.for_each(|s| drop(s.flush()));
                    } else {
                        writers.step_writers();
                    }
                }
            });
            let broker =
                Broker::with_store(broker_config, store.clone()).map_err(|e| e.to_string())?;
            gauges.boot(broker.shared(), &store);
            let listener = turmoil::net::TcpListener::bind(("0.0.0.0", BROKER_PORT)).await?;
            // The sender stays alive as long as the host: a crash, not a shutdown, ends it.
            let (_stop_tx, stop) = tokio::sync::watch::channel(false);
            let _background = broker.start_background(stop.clone());
            let context = Arc::new(ListenerContext::new(0, "sim", TransportKind::Memory));
            net.boot.store(disk.boot(), Ordering::Relaxed);
            if let Endpoint::Sim(up) = &net.endpoint {
                up.store(true, Ordering::Relaxed);
            }
            loop {
                let (stream, peer) = listener.accept().await?;
                let broker = broker.clone();
                let info = ConnectionInfo::new(context.clone(), peer);
                let stop = stop.clone();
                tokio::spawn(async move {
                    let transport = StreamTransport::new(stream);
                    broker.run_socket_connection(transport, info, stop).await;
                });
            }
        })
    }
}

fn open_store(disk: &SimDisk, dir: &Path, config: &DurableConfig) -> Result<DurableStore, String> {
    // With stepped writers the old process's store is gone once its host crashed: no thread
    // of it holds the lock. With writer threads (`writer_threads`) they may take a moment.
    let started = Instant::now();
    loop {
        match DurableStore::open_with_vfs(dir, config.clone(), disk.vfs()) {
            Ok(s) => return Ok(s),
            Err(e) if !writer_threads() || started.elapsed() > Duration::from_secs(5) => {
                return Err(format!("store does not open: {e}"));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// `TERN_SIM_WRITER_THREADS` (`scripts/sim.sh --writer-threads`): the store runs its writer
/// threads instead of stepped writers, as the first turmoil runner did (the disk task
/// flushes every stream each tick, see `broker_software`). A seed is then no longer one
/// execution (the threads' timing decides group commits and when a ticket completes), but
/// tickets complete while the tasks run, as in production (finding 9).
pub(super) fn writer_threads() -> bool {
    super::super::env_flag("TERN_SIM_WRITER_THREADS")
}

/// `TERN_SIM_WRITER_THREADS=raw` (`scripts/sim.sh --writer-threads-raw`): writer threads
/// without the flush at each disk tick, as the runner where finding 9 showed. Virtual time
/// can then run ahead of the threads (interval-sync seeds stall: the harness's); seed 718
/// failed in 14 of 20 runs there until finding 9's fix (a subscriber stopped mid-exchange).
fn writer_threads_raw() -> bool {
    std::env::var("TERN_SIM_WRITER_THREADS").is_ok_and(|v| v == "raw")
}
