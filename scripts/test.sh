#!/usr/bin/env bash
# The project's test command (the README's): installs the system packages the workspace
# tests need beyond a Rust toolchain (scripts/install-deps.sh: the etcd server and protoc
# for crates/cxc-etcd, on Debian), then runs every test of the workspace.
# Usage: scripts/test.sh [extra cargo test arguments]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/install-deps.sh
exec cargo test --workspace "$@"
