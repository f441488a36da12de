//! Sizes of what an idle connection holds (ARCHITECTURE §6.2).
use std::sync::Arc;

/// What every idle connection keeps besides its socket: the one task's future (`Conn`, the
/// outbound half, the socket and the read loop's state inline, 400 B), its `ConnCtl` (136 B) and its
/// session. With a reader and a writer task the futures were 1,624 + 488 B and `ConnCtl`
/// 240 B (BENCHMARKS.md "Session 4: idle memory"); with a keep-alive `Sleep` in the future
/// 776 B ("Session 6: idle memory"); 640 B before the in-flight state and the batch buffers
/// were boxed only while used ("Session 7"). The task's cell is the future plus 104 B (32 B
/// header, 16 B core, 8 B stage tag, 48 B trailer) rounded up to 128 B: up to 408 B it is
/// 512 B, one more byte and it is 640 B.
const IDLE_CONNECTION_FUTURE_MAX_BYTES: usize = 408;
/// Up to 136 B its `Arc` block is a 160 B malloc chunk (144 B: 176 B).
const CONN_CTL_MAX_BYTES: usize = 136;
/// Up to 240 B its `Arc` block (16 B of counts more) is a 256 B malloc chunk; 248 B would take
/// the 320 B class (issue 15: 64 B per connection).
const SESSION_MAX_BYTES: usize = 240;

/// Guards against a large state (e.g. an unboxed `Will` or handshake, a second task's
/// worth of waiting futures) creeping back into what idle connections keep.
#[tokio::test]
async fn idle_connection_state_stays_small() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (server, peer) = listener.accept().await.unwrap();
    let broker = crate::Broker::new(crate::BrokerConfig::default()).unwrap();
    let (_tx, rx) = tokio::sync::watch::channel(false);
    let info = crate::transport::ConnectionInfo::new(
        crate::transport::ListenerContext::plain_tcp("test"),
        peer,
    );
    // Held as the accept loop's `LiveTask` is (one pointer).
    let task = super::run(broker.shared().clone(), server, info, rx, Arc::new(()));
    let task_bytes = std::mem::size_of_val(&task);
    eprintln!(
        "SIZES task={task_bytes} conn={} outflow={} session={} ctl={}",
        std::mem::size_of::<super::Conn>(),
        std::mem::size_of::<super::outflow::Outflow<crate::transport::TcpWrite>>(),
        std::mem::size_of::<crate::state::session::Session>(),
        std::mem::size_of::<crate::state::session::ConnCtl>()
    );
    assert!(
        task_bytes <= IDLE_CONNECTION_FUTURE_MAX_BYTES,
        "{task_bytes}"
    );
    assert!(std::mem::size_of::<crate::state::session::ConnCtl>() <= CONN_CTL_MAX_BYTES);
    assert!(std::mem::size_of::<crate::state::session::Session>() <= SESSION_MAX_BYTES);
    // Both alias maps live in every connection's future; empty they are a pointer.
    assert!(std::mem::size_of::<crate::state::topic_alias::InboundAliases>() <= 16);
    assert!(std::mem::size_of::<crate::state::topic_alias::OutboundAliases>() <= 16);
}
