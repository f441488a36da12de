//! tern-broker (being built).
