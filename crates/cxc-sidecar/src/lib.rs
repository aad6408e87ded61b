//! The cxc sidecar: observation rings, the shared strategy handshake and the adaptive
//! policy machinery that observes and tunes cxc primitives.
//!
//! This crate is a placeholder until the sidecar lands; it holds no API yet.
#![forbid(unsafe_code)]
