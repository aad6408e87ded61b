"""Shared fixtures of the cxc Python tests."""

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

import cxc

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
    # Always through cargo (a no-op when up to date): a binary left by an older build
    # would speak an older file format.
    subprocess.run(
        ["cargo", "build", "--release", "--example", name,
         "--manifest-path", str(CRATE / "Cargo.toml"), "--target-dir", str(target)],
        check=True,
        env={**os.environ, "PYO3_PYTHON": sys.executable},
    )
    return str(target / "release" / "examples" / name)


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


PERMIT_HOLDER = r"""
import sys, time, cxc
sem = cxc.Semaphore(sys.argv[1], int(sys.argv[2]))
p = sem.acquire(timeout=10)
print("held", flush=True)
time.sleep(60)
"""


def permit_holders(path, permits):
    """Semaphore `path` with `permits` permits, each taken and kept by a child process
    of its own: returns (the semaphore, the children) once every child holds."""
    sem = cxc.Semaphore(path, permits)
    kids = [python_child(PERMIT_HOLDER, path, permits) for _ in range(permits)]
    for k in kids:
        assert k.stdout.readline().strip() == "held"
    return sem, kids


def interrupt_waiting_child(code, path, ready):
    """Starts `python -c code path`, waits for its line `ready`, lets it block, sends
    SIGINT; it must exit within 0.5 s. Returns (its stdout, its exit code)."""
    kid = python_child(code, path)
    assert kid.stdout.readline().strip() == ready
    time.sleep(0.2)
    t0 = time.monotonic()
    kid.send_signal(signal.SIGINT)
    out, _ = kid.communicate(timeout=5)
    assert time.monotonic() - t0 < 0.5
    return out, kid.returncode


def ticks_while(thread, seconds=0.4):
    """Starts `thread`, counts this thread's 1 ms sleeps for `seconds`, joins `thread`
    and returns the count (over 100: the other thread's blocking left the GIL free)."""
    ticks = 0
    thread.start()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        ticks += 1
        time.sleep(0.001)
    thread.join()
    return ticks


def assert_exit_raises_lost_only_without_exception(hold, lose):
    """`hold()` gives a context manager; `lose()`, run inside it, makes it lose what it
    holds. Leaving it then raises LostError, unless an exception leaves it: that one
    propagates instead."""
    with pytest.raises(cxc.LostError):
        with hold():
            lose()
    with pytest.raises(KeyError):
        with hold():
            lose()
            raise KeyError("mine")


def outcome(f):
    """'ok:<repr>' of `f()`, or the class name of what it raised (a PanicException is a
    BaseException, so every kind is caught)."""
    try:
        return "ok:" + repr(f())
    except BaseException as e:  # noqa: BLE001 - we report every kind
        return type(e).__name__


def wait_child(pid, timeout=10.0):
    """waitpid with a deadline; kills the child (and fails) if it does not exit."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"forked child {pid} did not exit within {timeout} s")


def kill_all(procs):
    """Kills every process of `procs` still running and reaps them all."""
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def until(pred, timeout=2.0, step=0.01):
    """Polls `pred` every `step` seconds until it holds or `timeout` passed; its last
    value."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step)
    return pred()


def read_line(proc, timeout=10.0):
    """The next stdout line of `proc`, stripped (bounded: a hang fails the test instead
    of blocking it)."""
    import threading

    out = []
    t = threading.Thread(target=lambda: out.append(proc.stdout.readline()), daemon=True)
    t.start()
    t.join(timeout)
    if not out:
        pytest.fail(f"no line from child {proc.pid} within {timeout} s")
    return out[0].strip()
