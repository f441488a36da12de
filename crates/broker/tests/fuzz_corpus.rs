//! Replays every file of the committed whole-connection fuzz corpus (`fuzz/corpus/connection`,
//! made by `fuzz/make_corpus.py`, plus whatever `cargo fuzz run connection` found and was
//! committed) through `tern_broker::__internal::run_connection`: no panic in any broker task, no
//! hang, a bounded reply, the broker still serving afterwards.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

static PANICS: AtomicUsize = AtomicUsize::new(0);

#[test]
fn connection_corpus_replays_cleanly() {
    // Connection tasks are spawned detached, whose panic nobody joins: count them.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICS.fetch_add(1, Ordering::SeqCst);
        default_hook(info);
    }));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/connection");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("corpus directory")
        .map(|entry| entry.expect("entry").path())
        .collect();
    files.sort();
    assert!(files.len() >= 40, "corpus has only {} files", files.len());
    let mut replies = 0;
    for path in &files {
        let input = std::fs::read(path).expect("read");
        match runtime.block_on(tern_broker::__internal::run_connection(&input)) {
            Ok(outcome) => replies += usize::from(outcome.reply_bytes > 0),
            Err(error) => panic!("{}: {error}", path.display()),
        }
        assert_eq!(
            PANICS.load(Ordering::SeqCst),
            0,
            "panic on {}",
            path.display()
        );
    }
    // The corpus reaches past the handshake: the unmutated sessions and many mutants get an
    // answer (a mutant with a broken CONNECT is closed without one).
    assert!(
        replies * 3 > files.len(),
        "{replies} of {} inputs answered",
        files.len()
    );
}
