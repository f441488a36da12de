//! SIGTERM / SIGINT: v5 clients receive DISCONNECT 0x8B (Server shutting down), every
//! connection is closed, the process exits 0.

mod common;

use common::raw::*;
use common::{Broker, WAIT};

async fn signal_shutdown(signal: i32) {
    let mut b = Broker::start();
    let mut c5 = RawClient::v5(b.addr, "sd-5").await;
    let mut c4 = RawClient::v4(b.addr, "sd-4").await;
    c5.sub("sd/#", 1).await;
    b.signal(signal);
    assert_eq!(
        c5.expect_disconnect().await,
        ReasonCode::SERVER_SHUTTING_DOWN
    );
    c4.expect_closed_silently().await;
    let status = b.wait_exit(WAIT);
    assert_eq!(status.code(), Some(0), "exit status {status:?}");
}

/// (v5) §4.13 / reason 0x8B: SIGTERM sends DISCONNECT 0x8B to v5 clients, closes 3.1.1 clients
/// (no DISCONNECT exists server→client in 3.1.1), and exits 0.
#[tokio::test]
async fn sigterm_disconnects_clients_0x8b_and_exits_0() {
    signal_shutdown(libc::SIGTERM).await;
}

/// SIGINT behaves like SIGTERM.
#[tokio::test]
async fn sigint_disconnects_clients_0x8b_and_exits_0() {
    signal_shutdown(libc::SIGINT).await;
}

/// A rumqttc v5 client sees the 0x8B DISCONNECT.
#[tokio::test]
async fn sigterm_seen_by_rumqttc_v5() {
    use common::rumq::v5;
    let mut b = Broker::start();
    let mut c = v5::connect(v5::options(b.addr, "sd-rumq")).await;
    b.signal(libc::SIGTERM);
    assert_eq!(
        c.expect_closed().await,
        Some(v5::DisconnectReasonCode::ServerShuttingDown)
    );
    assert_eq!(b.wait_exit(WAIT).code(), Some(0));
}

/// An idle broker (no clients) also exits 0 on SIGTERM.
#[tokio::test]
async fn sigterm_idle_broker_exits_0() {
    let mut b = Broker::start();
    b.signal(libc::SIGTERM);
    assert_eq!(b.wait_exit(WAIT).code(), Some(0));
}
