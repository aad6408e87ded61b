"""Shared fixtures of the cxc Python tests."""

import os
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
CRATE = HERE.parent


def _target_dir():
    env = os.environ.get("CARGO_TARGET_DIR")
    return pathlib.Path(env) if env else CRATE.parent.parent / "target" / "python"


def _example(name, env_var):
    """The Rust example binary `name` of this crate (built on demand)."""
    exe = os.environ.get(env_var)
    if exe:
        return exe
    target = _target_dir()
    exe = target / "release" / "examples" / name
    if not exe.exists():
        subprocess.run(
            ["cargo", "build", "--release", "--example", name,
             "--manifest-path", str(CRATE / "Cargo.toml"), "--target-dir", str(target)],
            check=True,
            env={**os.environ, "PYO3_PYTHON": sys.executable},
        )
    return str(exe)


@pytest.fixture(scope="session")
def lease_hold():
    """The Rust example binary `lease_hold` (examples/lease_hold.rs)."""
    return _example("lease_hold", "CXC_LEASE_HOLD")


@pytest.fixture(scope="session")
def elect_hold():
    """The Rust example binary `elect_hold` (examples/elect_hold.rs)."""
    return _example("elect_hold", "CXC_ELECT_HOLD")


def python_child(code, *args, **kw):
    """Starts `python -c code args...` with line-buffered pipes."""
    return subprocess.Popen(
        [sys.executable, "-u", "-c", code, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )
