//! Cross-process synchronization primitives that live in memory-mapped files.
//!
//! This crate is a placeholder until the primitives land.
