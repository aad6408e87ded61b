#!/usr/bin/env bash
# The project's test command (the README's): installs the system packages the etcd
# backend's tests need (scripts/install-deps.sh: the etcd server and protoc, on Debian),
# then runs every test: the workspace, and crates/cxc-etcd (its own workspace).
# `cargo test --workspace --all-features` alone runs everything but the etcd backend (the
# async tests need the `async` feature) and needs only Rust.
# Usage: scripts/test.sh [extra cargo test arguments]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/install-deps.sh
cargo test --workspace --all-features "$@"
cargo test --manifest-path crates/cxc-etcd/Cargo.toml --target-dir "${CARGO_TARGET_DIR:-target}" "$@"
