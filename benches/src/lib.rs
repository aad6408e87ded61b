//! Shared helpers for the cxc benches (see `benches/`).
