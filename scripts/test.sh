#!/usr/bin/env bash
# The project's test command (the README's): installs the system packages the tests
# need (scripts/install-deps.sh: the etcd server, protoc and python3-venv, on Debian),
# then runs every test: the workspace, crates/cxc-etcd (its own workspace), and the
# Python bindings (a venv under the target dir, maturin/filelock/pytest from PyPI, the
# wheel, pytest). `cargo test --workspace --all-features` alone runs everything but the
# etcd backend and the Python bindings (the async tests need the `async` feature) and
# needs only Rust.
# Usage: scripts/test.sh [extra cargo test arguments]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/install-deps.sh
cargo test --workspace --all-features "$@"
cargo test --manifest-path crates/cxc-etcd/Cargo.toml --target-dir "${CARGO_TARGET_DIR:-target}" "$@"
# Python bindings (docs/python.md): a venv under the target dir, the wheel, the pytest suite.
py_target="$(realpath -m "${CARGO_TARGET_DIR:-target}")/python" venv="$(realpath -m "${CARGO_TARGET_DIR:-target}")/python-venv"
[[ -x $venv/bin/python ]] || python3 -m venv "$venv"
"$venv/bin/pip" install -q "maturin>=1.5,<2" filelock pytest
rm -rf "$py_target/wheels" && "$venv/bin/maturin" build -q --release -m bindings/python/Cargo.toml -i "$venv/bin/python" --target-dir "$py_target" --out "$py_target/wheels"
"$venv/bin/pip" install -q --force-reinstall --no-deps "$py_target"/wheels/*.whl
(cd bindings/python && CARGO_TARGET_DIR="$py_target" PYO3_PYTHON="$venv/bin/python" "$venv/bin/python" -m pytest -q -p no:cacheprovider)
