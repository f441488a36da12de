//! Arbitrary bytes through a whole broker connection (`tern_broker::__internal::run_connection`):
//! no panic (libFuzzer aborts on one, in any thread), no hang, a bounded reply, the broker
//! still serving afterwards.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime")
    })
}

fuzz_target!(|data: &[u8]| {
    if let Err(error) = runtime().block_on(tern_broker::__internal::run_connection(data)) {
        panic!("{error}");
    }
});
