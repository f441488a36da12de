//! tern-bench (being built).
