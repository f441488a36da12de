//! Applying a RETAIN=1 message: the retained tree ([`crate::state::retained`]) and its
//! record in the store, in one order.

use std::sync::{Arc, Weak};

use crate::engine::Shared;
use crate::model::{Message, Ticket};
use crate::state::ack_pipeline::ReleaseHook;

/// Applies a RETAIN=1 message to the retained store and returns the ticket of its record's
/// write (a set, or the delete of an empty payload), if the store issued one.
///
/// The write is issued under the tree's lock, so the store records retained changes in the
/// order they were applied in memory: per publisher that is its packet order (its ack
/// pipeline releases messages in order), and after a restart the last applied one wins.
pub(crate) fn update(shared: &Shared, message: &Arc<Message>) -> Option<Ticket> {
    let mut retained = shared.retained.write();
    if !retained.set(message, shared.config.max_retained_messages) {
        drop(retained);
        tracing::warn!(topic = %message.topic, "message not retained: retained store full or topic too deep");
        return None;
    }
    let kept = (!message.payload.is_empty()).then_some(&**message);
    shared.store.retained.retained_changed(&message.topic, kept)
}

/// The ack pipeline's release hook, one per broker (`Shared::release_hook`,
/// [`crate::state::ack_pipeline::ReleaseHook`]): a RETAIN=1 PUBLISH is applied when the pipeline
/// releases it, and its PUBACK / PUBREC waits for the retained record as well as for the
/// message's own write. Holds the broker weakly (the broker holds the hook); a connection holds
/// the broker, so the upgrade succeeds while any pipeline can call this.
pub(crate) fn release_hook(shared: Weak<Shared>) -> ReleaseHook<Arc<Message>> {
    Arc::new(move |message: &Arc<Message>| {
        if !message.retain {
            return None;
        }
        let shared = shared.upgrade()?;
        update(&shared, message)
    })
}
