//! tern-topic (being built).
