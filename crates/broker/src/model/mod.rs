//! The model layer: the values every layer above passes around, and the persistence seam.
//! It imports nothing of this crate's but its leaves (`hash`, `config`).
//!
//! - [`message`]: [`Message`], a routed application message, encoded once per protocol.
//! - [`persist`]: the persistence seam ([`MessageStore`]), tickets, and what recovery hands
//!   back ([`Recovered`]); [`MemoryStore`] keeps nothing.
//! - [`stats`]: what the store reports to operators ([`StreamStats`]), and [`ActionError`].
//! - [`sub_record`]: one subscription as a session keeps it ([`SubRecord`]).

pub mod message;
pub mod persist;
pub mod stats;
pub mod sub_record;

pub use message::Message;
pub use persist::{
    HeldSeqs, MemoryStore, MessageStore, OutboundSent, PersistError, Recovered, StoreRef,
    StoredGroup, StoredInflight, StoredSession, StoredWill, Ticket, TicketCompleter, WriterWakes,
};
pub use stats::{ActionError, StreamStats};
pub use sub_record::SubRecord;
