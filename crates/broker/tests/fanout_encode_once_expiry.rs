//! Issue "fan-out at scale": a message is encoded once per (message, protocol version, the
//! properties that differ), and for a message with a Message Expiry Interval the remaining
//! interval is such a property. Deliveries made within the same second share one encoding;
//! only a later second re-encodes. Alone in its test binary: the template counter is
//! process-wide.

use std::time::Duration;

use bytes::Bytes;
use tern_broker::Message;
use tern_wire::{Properties, PropertyValues, Protocol, QoS, Str, publish_templates_built};
use tokio::time::Instant;

#[test]
fn an_expiring_message_is_encoded_once_per_remaining_second_not_per_subscriber() {
    let arrived = Instant::now();
    let properties: Properties = PropertyValues {
        message_expiry_interval_s: Some(60),
        ..PropertyValues::default()
    }
    .into();
    let message = Message::new(
        Str::from_static("fan/expiring"),
        Bytes::from_static(b"hello"),
        QoS::AtLeastOnce,
        false,
        properties,
        None,
        arrived,
    );
    let before = publish_templates_built();
    let first_second = arrived + Duration::from_millis(300);
    let templates: Vec<_> = (0..100)
        .map(|_| {
            message
                .template(Protocol::V5, first_second)
                .expect("not expired")
        })
        .collect();
    assert_eq!(
        publish_templates_built() - before,
        1,
        "100 deliveries in the same second share one encoding"
    );
    assert!(
        templates
            .iter()
            .all(|t| t.body().as_ptr() == templates[0].body().as_ptr()),
        "every delivery shares the same body bytes"
    );
    let later = arrived + Duration::from_millis(2_300);
    for _ in 0..100 {
        message.template(Protocol::V5, later).expect("not expired");
    }
    assert_eq!(
        publish_templates_built() - before,
        2,
        "a later second carries a smaller remaining interval: one more encoding, not 100"
    );
    assert!(
        message
            .template(Protocol::V5, arrived + Duration::from_secs(61))
            .is_none()
    );
}
