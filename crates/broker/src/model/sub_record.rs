//! A subscription as a session remembers it, in memory and in the store.

use tern_wire::SubscriptionOptions;

/// One subscription as the session remembers it (for retain handling 1, resubscribe, store).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubRecord {
    pub options: SubscriptionOptions,
    pub subscription_id: Option<u32>,
}
