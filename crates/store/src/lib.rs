//! tern-store (being built).
