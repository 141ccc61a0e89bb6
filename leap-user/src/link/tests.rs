//! Deterministic tests of the link.
