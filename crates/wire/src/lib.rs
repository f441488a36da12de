//! tern-wire (being built).
