#!/usr/bin/env bash
# Installs the system packages the workspace needs beyond a Rust toolchain, on Debian:
#   etcd-server        the `etcd` binary that crates/cxc-etcd's tests start on loopback
#   etcd-client        `etcdctl`, for the interop tests (`etcdctl lock` / `etcdctl elect`
#                      against the same names as cxc-etcd)
#   protobuf-compiler  `protoc`, for etcd-client's build script
#   libprotobuf-dev    the well-known .proto includes (google/protobuf/descriptor.proto,
#                      struct.proto) that etcd's protos import; protobuf-compiler alone
#                      does not ship them on Debian 12
#   python3-venv       `python3 -m venv` for the Python bindings' tests (scripts/test.sh)
# Idempotent: installs only what is missing, runs `apt-get update` only when it must.
# Usage: scripts/install-deps.sh   (as root, or with sudo available)
set -euo pipefail

need=()
command -v etcd >/dev/null 2>&1 || [[ -x /usr/bin/etcd ]] || need+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || [[ -x /usr/bin/etcdctl ]] || need+=(etcd-client)
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
[[ -f /usr/include/google/protobuf/descriptor.proto ]] || need+=(libprotobuf-dev)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)

if ((${#need[@]} == 0)); then
    echo "install-deps: etcd, etcdctl, protoc and the protobuf includes already present" >&2
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-deps: missing ${need[*]} and no apt-get here; install them by hand" >&2
    exit 1
fi

sudo=()
if [[ $(id -u) -ne 0 ]]; then
    sudo=(sudo)
fi

echo "+ apt-get install ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# A fresh machine may have no package lists yet: update once, then install.
if ! "${sudo[@]}" apt-get install -y --no-install-recommends "${need[@]}"; then
    "${sudo[@]}" apt-get update
    "${sudo[@]}" apt-get install -y --no-install-recommends "${need[@]}"
fi
# The Debian package starts etcd as a system service on the default ports; the tests
# start their own servers, so stop that one if it is running (no-op without systemd).
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet etcd 2>/dev/null; then
    "${sudo[@]}" systemctl stop etcd || true
fi
command -v etcd >/dev/null && command -v etcdctl >/dev/null && command -v protoc >/dev/null
echo "install-deps: installed ${need[*]}" >&2
