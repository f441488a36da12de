//! The broker-wide totals every queue counts into: queued bytes (the `max_queued_bytes_total`
//! limit) and queued messages (a gauge), and the sent-by-QoS counters of a batch.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tern_wire::QoS;
use tokio::time::Instant;

use super::PushResult;
use super::tests::{Fixture, item};
use crate::metrics::{Metrics, QueuedTotals};

/// Issue 11 item 9: every queue counts its bytes into one broker-wide total (pushes, batches
/// taken by the writer, detach, the queue's drop), and at `max_queued_bytes_total` QoS 0 is
/// dropped while QoS>0 is still queued (it was accepted; new QoS>0 is refused at the
/// publisher).
#[tokio::test]
async fn queues_count_into_the_broker_wide_total_and_qos0_is_dropped_at_the_cap() {
    let totals = Arc::new(QueuedTotals::default());
    let total = &totals.bytes;
    let mut a = Fixture::new(10);
    let mut b = Fixture::new(10);
    a.out.count_into(totals.clone());
    b.out.count_into(totals.clone());
    let len = item(b"1", QoS::AtMostOnce).message.approx_len();
    a.push(item(b"1", QoS::AtMostOnce));
    a.push(item(b"2", QoS::AtLeastOnce));
    b.push(item(b"3", QoS::AtLeastOnce));
    assert_eq!(total.load(Ordering::Relaxed), 3 * len);
    a.config.max_queued_bytes_total = 3 * len;
    assert_eq!(
        a.push(item(b"4", QoS::AtMostOnce)),
        PushResult::DroppedMemoryLimit
    );
    assert_eq!(a.push(item(b"5", QoS::AtLeastOnce)), PushResult::Queued);
    assert_eq!(total.load(Ordering::Relaxed), 4 * len);
    assert_eq!(a.drain().len(), 3);
    assert_eq!(total.load(Ordering::Relaxed), len, "b's message only");
    assert_eq!(
        a.push(item(b"6", QoS::AtMostOnce)),
        PushResult::Queued,
        "under the cap again"
    );
    a.out.detach();
    assert_eq!(
        total.load(Ordering::Relaxed),
        len,
        "QoS 0 left with the connection"
    );
    drop(b);
    assert_eq!(total.load(Ordering::Relaxed), 0);
}

/// The queued-messages gauge: an offline session's pushes count at once; an online one's at
/// its writer's next batch (no second broker-wide atomic per delivery); dropping the queue
/// takes its share back. Deliveries taken by a batch count as sent, by QoS.
#[tokio::test]
async fn queued_messages_are_counted_broker_wide_and_sent_by_qos() {
    let totals = Arc::new(QueuedTotals::default());
    let total = &totals.messages;
    let mut online = Fixture::new(10);
    online.out.count_into(totals.clone());
    let mut offline = Fixture::new(10);
    offline.out.count_into(totals.clone());
    offline.out.detach();
    let now = Instant::now();
    let config = offline.config.clone();
    offline
        .out
        .push(item(b"1", QoS::AtLeastOnce), false, &config, now);
    assert_eq!(total.load(Ordering::Relaxed), 1, "offline: at once");
    online.push(item(b"2", QoS::AtMostOnce));
    online.push(item(b"3", QoS::AtLeastOnce));
    online.out.sync_total();
    assert_eq!(
        total.load(Ordering::Relaxed),
        3,
        "online: at the writer's sync"
    );
    assert_eq!(online.drain().len(), 2);
    assert_eq!(total.load(Ordering::Relaxed), 1, "the batch took both");
    let sent: Vec<u64> = online
        .metrics
        .messages_sent_by_qos
        .iter()
        .map(Metrics::get)
        .collect();
    assert_eq!(sent, vec![1, 1, 0]);
    drop(offline);
    assert_eq!(total.load(Ordering::Relaxed), 0);
}
