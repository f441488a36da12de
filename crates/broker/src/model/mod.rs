//! The model layer: the values every layer above passes around, and the persistence seam.
//! It imports nothing of this crate's but its leaves (`hash`, `config`).
//!
//! - [`message`]: [`Message`], a routed application message, encoded once per protocol.
//! - [`seam`]: the persistence seam, one small trait per concern ([`MessageLog`],
//!   [`SessionStore`], [`ExchangeStore`], [`RetainedStore`], [`WillStore`], [`CursorStore`],
//!   [`StoreAdmin`], [`Recovery`]) held together in [`Persistence`], with its written
//!   contract; [`MemoryStore`] keeps nothing.
//! - [`ticket`]: [`Ticket`], the completion of one issued write ("durable up to position N").
//! - [`mark`]: [`DurableMark`], a log's durable position (a commit index) completing tickets.
//! - [`recovered`]: what recovery hands back ([`Recovered`]).
//! - [`stats`]: what the store reports to operators ([`StreamStats`]), and [`ActionError`].
//! - [`sub_record`]: one subscription as a session keeps it ([`SubRecord`]).
//! - [`topics`]: the topic spaces the broker reserves (`$SYS`, `$tern/`, `$share/`), named once.

pub(crate) mod mark;
pub(crate) mod message;
pub(crate) mod recovered;
pub(crate) mod seam;
pub(crate) mod stats;
pub(crate) mod sub_record;
pub(crate) mod ticket;
pub(crate) mod topics;

pub use mark::DurableMark;
pub use message::Message;
pub use recovered::{Recovered, StoredGroup, StoredInflight, StoredSession, StoredWill};
pub use seam::{
    Appended, CursorStore, ExchangeStore, FullStore, HeldSeqs, MemoryStore, MessageLog,
    OutboundSent, Persistence, QueueFull, Recovery, RetainedStore, SessionStore, StoreAdmin,
    StoreRef, WillStore, WriterWakes,
};
pub use stats::{ActionError, StreamStats};
pub use sub_record::SubRecord;
pub use ticket::{PersistError, Ticket, TicketCompleter};
