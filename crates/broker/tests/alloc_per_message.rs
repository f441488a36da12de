//! Issue 15 item 4 (BENCHMARKS.md, "Session 6: QoS 0 per-message cost"): a QoS 0 message routed
//! to one subscriber and written to its connection allocates nothing beyond the message itself
//! (the `Arc<Message>` its publisher's connection makes, before routing). Before session 6 it
//! was four more: the router's target list, the template, the whole QoS 0 packet and its shared
//! handle. Also: taking from an idle session's empty queues allocates nothing (they are
//! allocated by pushes only, `outbound::LazyQueues`). Alone in its test binary: it installs
//! a counting global allocator (counting per thread).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;

use bytes::Bytes;
use tern_broker::__internal::Metrics;
use tern_broker::__internal::Session;
use tern_broker::__internal::{BatchBufs, BatchEnv, Outbound, WriterState};
use tern_broker::__internal::{Router, Targets};
use tern_broker::Message;
use tern_broker::SubRecord;
use tern_broker::{BrokerConfig, MemoryStore};
use tern_topic::FilterKind;
use tern_wire::{Properties, Protocol, QoS, Str, SubscriptionOptions};
use tokio::time::Instant;

/// Counts the allocations (and reallocations) made by the current thread.
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count_one() {
    // `try_with`: an allocation while the thread's locals are torn down is not counted.
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so
// `System`'s guarantees are this allocator's; counting touches no allocated memory.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: forwarded as received (see the impl).
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as received (see the impl).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_one();
        // SAFETY: forwarded as received (see the impl).
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// Messages per writer batch: the subscriber's writer is woken while the publisher routes.
const MESSAGES_PER_BATCH: usize = 32;
const BATCHES: usize = 64;

/// Routes `messages` to the single subscriber in batches and writes each batch (the parts are
/// dropped as a completed write drops them). Returns the allocations it made.
fn route_and_write(
    router: &Router,
    out: &mut Outbound,
    writer: &mut WriterState,
    bufs: &mut BatchBufs,
    messages: &[Arc<Message>],
) -> u64 {
    let config = BrokerConfig::default();
    let metrics = Metrics::default();
    let now = Instant::now();
    let env = BatchEnv {
        config: &config,
        metrics: &metrics,
        store: &MemoryStore,
        client_id: "sub",
        persistent: false,
        now,
    };
    let mut targets = Targets::new();
    let mut to_groups = Vec::new();
    let before = allocations();
    for batch in messages.chunks(MESSAGES_PER_BATCH) {
        for message in batch {
            router.targets(message, &mut targets, &mut to_groups);
            for (_, item) in targets.drain(..) {
                out.push(item, true, &config, now);
            }
        }
        out.fill_batch(writer, &env, bufs);
        assert!(!bufs.parts().is_empty());
        bufs.clear();
    }
    allocations() - before
}

#[test]
fn a_qos0_message_to_one_subscriber_allocates_nothing_on_its_way() {
    let subscriber = Session::new("sub".into(), Protocol::V3_1_1, 0);
    let mut router = Router::default();
    let record = SubRecord {
        options: SubscriptionOptions::default(),
        subscription_id: None,
    };
    router
        .subscribe(FilterKind::Normal("bench/+"), &subscriber, record)
        .expect("valid filter");
    // As the publisher's read buffer holds them: 64-byte payloads, the q0 cell's.
    let frame = Bytes::from(vec![b'x'; 64 * MESSAGES_PER_BATCH * BATCHES]);
    let messages: Vec<Arc<Message>> = (0..MESSAGES_PER_BATCH * BATCHES)
        .map(|i| {
            Arc::new(Message::new(
                Str::from_static("bench/t"),
                frame.slice(i * 64..(i + 1) * 64),
                QoS::AtMostOnce,
                false,
                Properties::default(),
                Some("pub".into()),
                Instant::now(),
            ))
        })
        .collect();
    let mut out = Outbound::default();
    out.attach(16);
    let mut writer = WriterState::new(Protocol::V3_1_1, u32::MAX, 0);
    // The connection's writer keeps its batch buffers while busy.
    let mut bufs = BatchBufs::default();
    // Warm-up: the queue and the batch buffers reach their working size.
    route_and_write(
        &router,
        &mut out,
        &mut writer,
        &mut bufs,
        &messages[..MESSAGES_PER_BATCH],
    );
    let made = route_and_write(&router, &mut out, &mut writer, &mut bufs, &messages);
    assert_eq!(
        made,
        0,
        "{made} allocations for {} messages routed and written",
        messages.len()
    );
}

/// `LazyQueues` has no `DerefMut`: taking from an idle session's empty queues (a pop, acks of
/// unknown ids, a detach, an attach, the share take, a drop of removed records, a poll of the
/// gate) allocates nothing. Through `DerefMut` a detach allocated the queues it then freed.
#[test]
fn taking_from_empty_queues_allocates_nothing() {
    let mut out = Outbound::default();
    out.attach(16);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let before = allocations();
    assert!(out.pop_front().is_none());
    assert!(out.on_puback(1).is_none());
    assert!(!out.on_pubrec(1, true));
    assert!(out.on_pubcomp(1).is_none());
    assert!(out.take_shared().is_empty());
    assert_eq!(out.drop_removed(&[(0, 1..=10)]).dropped, 0);
    assert!(out.poll_gate(&mut cx).is_pending());
    out.detach();
    out.attach(16);
    let made = allocations() - before;
    assert_eq!(made, 0, "{made} allocations taking from empty queues");
}
