"""Adversarial tests of the Python bindings, fifth round (attack5): the end of an
interpreter, and hostile Python environments.

The package guards the interpreter's exit: once the last `atexit` hook ran (it learns
that when `atexit` drops the object the package registered there at import), a thread
other than the exiting one that is about to take the GIL back in a blocking call parks
for good instead (CPython up to 3.13 would end it with `pthread_exit`, whose unwinding
through Rust frames aborts the process). These tests look at the exit from the sides that
guard does not cover, and at hostile environments:

1. fixed: an `atexit` hook that runs after the package's own one (registered before
   `cxc` was imported, e.g. by a module that imports `cxc` lazily) and joins a worker
   thread that uses cxc: the worker parked for ever in its next `lead.renew()` /
   `lease.lock(timeout=...)`, and the exit hung (every run), while the guard was set by
   the package's hook itself; an `asyncio` wait in a hook is woken as usual;
2. Python code run *inside* a call of the extension on a daemon thread that lets the GIL
   go as the program exits: the thread is ended by `pthread_exit` through Rust frames and
   the process aborts ("FATAL: exception not rethrown", SIGABRT) -- about half the runs;
   the same code outside the extension exits normally.
   - documented limit (docs/python.md): a finalizer run by a collection that the
     extension's own allocation triggers (skipped);
   - fixed: the event loop's `call_soon`, run by `set_result`, which the asyncio
     waiter's `_poll` called inside the extension: the package's Python code completes
     the future now;
3. fixed: `os.fork()` while another thread is in `Watchdog.scan()`: the child inherited
   the binding's watchdog mutex locked and hung for ever (GIL held, Ctrl-C cannot help)
   in its first `scan()`/`reclaim()` -- 2 to 10 forks in 20;
4. held: a holder that ends by `sys.exit` inside `with`, by an exception escaping at top
   level, by `os._exit`, or with a daemon thread holding a guard and a permit: exit status
   as expected, no abort, the lease and the permit free for another process at once
   (grace 30 s);
5. held: `_thread.interrupt_main()` (a KeyboardInterrupt without a signal) while the main
   thread is blocked in `lock()` / `acquire()`: interrupted promptly, nothing claimed.

The test of the documented limit is skipped (`documented limit: ...`); remove its mark to
run it."""

import os
import subprocess
import sys
import time

import pytest

import cxc
from conftest import kill_all, python_child, read_line


def _run(code, *args, timeout=20):
    """Runs `python -c code args...`; (returncode, stdout, stderr), or 'HANG' as the
    returncode when it did not exit within `timeout` s (it is killed)."""
    try:
        r = subprocess.run([sys.executable, "-c", code, *map(str, args)],
                           capture_output=True, text=True, timeout=timeout)
        return r.returncode, r.stdout.strip(), r.stderr.strip()[-300:]
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return "HANG", out.strip(), ""


# ---------------------------------------------------------------------------------------
# 1. an atexit hook that joins a worker thread using cxc

_ATEXIT_JOINS_WORKER = r"""
import atexit, sys, threading, time
stop = threading.Event()
up = threading.Event()
def worker():
    import cxc                      # imported lazily: its atexit hook comes after ours
    if sys.argv[2] == "renew":
        lead = cxc.Elector(sys.argv[1], grace=30).campaign(timeout=5)
        up.set()
        while not stop.is_set():
            lead.renew()
            time.sleep(0.01)
        lead.step_down()
    else:                           # the lease is held by the test: lock() times out
        lease = cxc.Lease(sys.argv[1], grace=30)
        up.set()
        while not stop.is_set():
            try:
                with lease.lock(timeout=0.2):
                    pass
            except cxc.Timeout:
                pass
    print("worker-done", flush=True)
def shutdown():
    stop.set()
    t.join()
    print("joined", flush=True)
atexit.register(shutdown)
t = threading.Thread(target=worker, daemon=True)
t.start()
up.wait(5)
print("exiting", flush=True)
"""


# docs/python.md, *Blocking, the GIL and Ctrl-C*: "Until the last `atexit` hook returned,
# every thread uses cxc normally, whatever the order of the hooks: a hook that stops and
# joins a worker thread using cxc works also when it was registered before `cxc` was
# imported" (before the fix it promised "The thread that runs the exit (and its `atexit`
# hooks) uses cxc normally" and "the exit is normal"). A worker thread stopped and
# joined by an `atexit` hook is the standard shutdown pattern; a hook registered before
# `cxc` is imported (a lazily imported `cxc`, or a library imported first) runs *after*
# the package's hook (`atexit` is LIFO). The worker is not blocked at that moment: it is
# in its loop.
# Found: the worker's next `lead.renew()` (or the end of a `lock()` slice) parked for
# good -- `announce_gil` parked every thread but the exiting one once `EXITING` was set,
# by the package's hook -- so `t.join()` in the hook never returned: the process hung at
# exit, holding the term (or in the lock case the worker's wait), until killed. 3 of 3
# runs of each kind. The same program with `import cxc` at the top (hook order reversed)
# exited in ms. Fixed: `EXITING` is set when `atexit` drops its callbacks, after the last
# hook ran.
@pytest.mark.parametrize("kind", ["renew", "lock"])
def test_atexit_hook_joining_a_worker_that_uses_cxc_does_not_hang(tmp_path, kind):
    path = tmp_path / kind
    g = cxc.Lease(path, grace=30).lock() if kind == "lock" else None
    try:
        results = [_run(_ATEXIT_JOINS_WORKER, path, kind, timeout=6) for _ in range(2)]
    finally:
        if g is not None:
            g.release()
    bad = [r for r in results if r[0] != 0 or r[1].split() != ["exiting", "worker-done",
                                                                  "joined"]]
    assert bad == [], bad


_ATEXIT_AWAITS = r"""
import atexit, asyncio, subprocess, sys, time
def hook():
    import cxc
    lease = cxc.Lease(sys.argv[1], grace=30)
    holder = subprocess.Popen([sys.executable, "-c",
        "import cxc, sys, time; g = cxc.Lease(sys.argv[1], grace=30).lock(); "
        "print('held', flush=True); time.sleep(0.5)", sys.argv[1]],
        stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    t0 = time.monotonic()
    g = asyncio.run(lease.lock_async(timeout=5))
    print("got", round(time.monotonic() - t0, 2), flush=True)
    g.release()
    holder.wait()
atexit.register(hook)
import cxc                          # its hook runs before ours
"""


# docs/python.md, *Blocking, the GIL and Ctrl-C*: "an `asyncio` wait in a hook is woken as
# usual". With the guard set by the package's hook, a hook that ran after it was never
# woken (the wake-up thread no longer delivered): only the timeout ended the wait. Here
# the holder (another process) exits 0.5 s after the wait began: the pidfd wake-up must
# reach the loop, well before the 5 s timeout.
def test_an_asyncio_wait_in_an_atexit_hook_is_woken(tmp_path):
    for i in range(2):
        rc, out, err = _run(_ATEXIT_AWAITS, tmp_path / f"l{i}", timeout=15)
        assert rc == 0, (out, err)
        word, secs = out.split()
        assert word == "got" and float(secs) < 2.0, out


# ---------------------------------------------------------------------------------------
# 2. Python code run inside the extension on a daemon thread at the exit

# A finalizer that runs in the daemon thread inside a cxc call: the collection is
# triggered by the allocation of the `cxc.Timeout` the extension raises. The finalizer
# waits without the GIL (a blocking read, as closing a file or a socket does) until the
# last `atexit` hook ran; the daemon then wants the GIL back while the interpreter
# finalizes.
_GC_IN_THE_EXTENSION = r"""
import atexit, gc, os, sys, threading
r, w = os.pipe()
r2, w2 = os.pipe()
atexit.register(os.write, w, b"x")        # the last hook: then the interpreter finalizes
import cxc
sem = cxc.Semaphore(sys.argv[1], 1)
held = sem.acquire()                      # exhausted: acquire(timeout=0) raises Timeout
class Trap:
    def __init__(self):
        self.me = self                    # a cycle: only the collector frees it
    def __del__(self):
        if threading.current_thread().name != "worker":
            os.write(w2, b"wrong-thread\n")
            return
        os.write(w2, b"in-finalizer\n")
        os.read(r, 1)                     # without the GIL until the exit is under way
def daemon():
    gc.disable()
    Trap()
    gc.set_threshold(1)
    gc.enable()
    if sys.argv[2] == "cxc":
        try:
            sem.acquire(timeout=0)        # the Timeout is allocated in the extension
        except cxc.Timeout:
            pass
    else:
        [[] for _ in range(3)]            # the same collection from pure Python
    os.write(w2, b"not-collected\n")
threading.Thread(target=daemon, daemon=True, name="worker").start()
print(os.read(r2, 100).decode().strip(), flush=True)
"""

# An event loop whose `call_soon` does blocking I/O for one future (as a loop that traces
# or logs its scheduling may): `_poll` grants the lease and calls `set_result`, which
# calls `loop.call_soon` for the awaiting task -- Python code under the extension's
# frames, on the loop's (daemon) thread.
_LOOP_IN_THE_EXTENSION = r"""
import atexit, asyncio, os, sys, threading, time
r, w = os.pipe()
r2, w2 = os.pipe()
atexit.register(os.write, w, b"x")
import cxc
lease = cxc.Lease(sys.argv[1], grace=30)
class Loop(asyncio.SelectorEventLoop):
    watched = None
    def create_future(self):
        f = super().create_future()
        if Loop.watched is None:
            Loop.watched = f
        return f
    def call_soon(self, cb, *args, context=None):
        if args and args[0] is Loop.watched:
            os.write(w2, b"in-call-soon\n")
            os.read(r, 1)
        return super().call_soon(cb, *args, context=context)
async def waiter():
    if sys.argv[2] == "cxc":
        await lease.lock_async()          # granted in `_poll`, inside the extension
    else:
        f = asyncio.get_running_loop().create_future()
        threading.Thread(target=lambda: (time.sleep(0.2),
                                         loop.call_soon_threadsafe(f.set_result, 1))).start()
        await f                           # the same set_result from Python
loop = Loop()
g = lease.lock()
threading.Thread(target=loop.run_until_complete, args=(waiter(),), daemon=True).start()
time.sleep(0.2)
g.release()
print(os.read(r2, 100).decode().strip(), flush=True)
"""


# docs/python.md, *Blocking, the GIL and Ctrl-C* (before the fix): "CPython up to 3.13
# would end it with `pthread_exit`, whose unwinding through the extension aborts the whole
# process"; "the exit is normal"; and for asyncio "The same holds for the asyncio wake-up
# thread"; now its "Not covered" paragraph states the limit. The
# guard covers the GIL being taken back at the end of a wait (`unblocked`), not Python
# code the extension itself runs with its Rust frames on the stack: a collection
# triggered by one of its allocations (finalizers run there), the loop's `call_soon`
# called by `set_result` in `AsyncWaiter._poll`. Such code that lets the GIL go as the
# program exits is ended by `pthread_exit` through the Rust frames.
# Found: "FATAL: exception not rethrown", SIGABRT (status 134): the finalizer case in 4 of
# 5, then 2 of 4 runs, the `call_soon` case in 3 of 5, then 2 of 4, 2 of 4 (the rest exit
# 0: the daemon got the GIL back before the finalization began). The pure-Python
# controls, same setup, exited 0 in every run.
# The `call_soon` case is fixed: the package's Python code (`_poll_waiter`) completes the
# asyncio future with what `_poll` returns, so the loop's code runs outside the
# extension's frames (10 of 10 exits normal). The finalizer case cannot be prevented by
# an extension (any allocation it makes may run a collection there): it is the limit
# docs/python.md states (still 8 of 9 exits aborted), skipped as such.
@pytest.mark.parametrize("case", [
    pytest.param("finalizer", marks=pytest.mark.skip(
        reason="documented limit (docs/python.md, *Blocking, the GIL and Ctrl-C*): a "
               "finalizer that a collection triggered by the extension's own allocation "
               "runs on a daemon thread, and that lets the GIL go as the interpreter "
               "finalizes, aborts the process on CPython < 3.14")),
    "call_soon",
])
def test_python_code_inside_the_extension_at_exit_does_not_abort(tmp_path, case):
    code = _GC_IN_THE_EXTENSION if case == "finalizer" else _LOOP_IN_THE_EXTENSION
    ready = "in-finalizer" if case == "finalizer" else "in-call-soon"
    results = []
    for i in range(4):
        for mode in ("python", "cxc"):
            path = tmp_path / f"{mode}{i}"
            rc, out, err = _run(code, path, mode, timeout=15)
            if out == ready:              # the setup did what it says (it nearly always does)
                results.append((mode, rc, err[-80:]))
    assert len(results) >= 4 and sum(r[0] == "cxc" for r in results) >= 2, results
    bad = [r for r in results if r[1] != 0]
    assert bad == [], f"{len(bad)} of {len(results)} exits failed: {bad}"


# ---------------------------------------------------------------------------------------
# 3. fork while another thread scans

_FORK_WHILE_SCANNING = r"""
import os, sys, threading, time, warnings, cxc
warnings.simplefilter("ignore")
table = cxc.HeartbeatTable(sys.argv[1], 4096)
wd = cxc.Watchdog(table, grace=1000)
def scanner():
    while True:
        wd.scan()
threading.Thread(target=scanner, daemon=True).start()
hung = 0
for i in range(20):
    pid = os.fork()
    if pid == 0:
        wd.reclaim(0)
        os._exit(0)
    end = time.monotonic() + 1.5
    while time.monotonic() < end:
        if os.waitpid(pid, os.WNOHANG)[0]:
            break
        time.sleep(0.005)
    else:
        hung += 1
        os.kill(pid, 9)
        os.waitpid(pid, 0)
print(hung, flush=True)
"""


# The Rust watchdog is fork-safe by design (crates/cxc-sync/src/forklock.rs: "A
# `ForkSafeMutex` ... for process-local state that a child made by `fork` may use through
# its copy (a watchdog's scan state ...)"); docs/python.md promises for blocking calls
# that nothing hangs uninterruptibly. The binding wraps the watchdog in a
# `std::sync::Mutex` that `Watchdog.scan` holds without the GIL, so a fork from another
# thread during a scan copies it locked.
# Found: the child's `wd.reclaim(0)` (or `scan()`) blocked for ever with the GIL held
# (Ctrl-C cannot end it): 2, 6, 4, 10 and 5 of 20 forks in five runs (4096 slots; 2 of 20
# with 64 slots). Fixed: the binding holds no lock of its own around the watchdog (the
# Rust one is `Sync` with fork-safe scan state); docs/python.md now promises it.
def test_fork_while_another_thread_scans_does_not_hang_the_child(tmp_path):
    rc, out, err = _run(_FORK_WHILE_SCANNING, tmp_path / "t.hb", timeout=60)
    assert rc == 0, err
    assert out == "0", f"{out} of 20 forked children hung in Watchdog.reclaim"


# ---------------------------------------------------------------------------------------
# 4. holders that end abruptly release (or are taken over as dead) at once

_HOLDER_ENDS = r"""
import os, sys, threading, time, cxc
lease = cxc.Lease(sys.argv[1], grace=30)
sem = cxc.Semaphore(sys.argv[2], 1)
how = sys.argv[3]
if how == "daemon":
    def hold():
        with lease.lock(timeout=5), sem.acquire(timeout=5):
            print("held", flush=True)
            time.sleep(60)
    threading.Thread(target=hold, daemon=True).start()
    time.sleep(0.5)
    sys.exit(0)
with lease.lock(timeout=5) as g, sem.acquire(timeout=5):
    print("held", flush=True)
    if how == "sys.exit":
        sys.exit(3)
    if how == "os._exit":
        os._exit(4)
    if how == "raise":
        raise KeyError("escapes to the top level")
"""


# docs/python.md, the comparison table: "holder killed (SIGKILL) | released: the next
# waiter takes over in ms (pidfd)"; the API table: "`guard.release()` / leaving `with` |
# releases"; *Blocking*: "the exit is normal". Whatever way a holder's interpreter ends,
# its exit status is its own, and the lease and the permit are free at once for another
# process (grace 30 s: not by staleness).
@pytest.mark.parametrize("how,status", [("sys.exit", 3), ("os._exit", 4), ("raise", 1),
                                        ("daemon", 0)])
def test_a_holder_that_ends_abruptly_gives_everything_back_at_once(tmp_path, how, status):
    lpath, spath = tmp_path / "l.lease", tmp_path / "s.sem"
    lease, sem = cxc.Lease(lpath, grace=30), cxc.Semaphore(spath, 1)
    kid = python_child(_HOLDER_ENDS, lpath, spath, how)
    try:
        assert read_line(kid) == "held"
        assert kid.wait(10) == status, kid.stderr.read()[-300:]
        assert "FATAL" not in kid.stderr.read()
        t0 = time.monotonic()
        g = lease.lock(timeout=2)
        p = sem.acquire(timeout=2)
        assert time.monotonic() - t0 < 1.0
        assert g.is_current() and sem.available == 0
        g.release()
        p.release()
        assert sem.available == 1
    finally:
        kill_all([kid])


# ---------------------------------------------------------------------------------------
# 5. interrupt_main while blocked

_INTERRUPTED = r"""
import _thread, sys, threading, time, cxc
kind = sys.argv[2]
if kind == "lock":
    obj = cxc.Lease(sys.argv[1], grace=30)
    wait = obj.lock
else:
    obj = cxc.Semaphore(sys.argv[1], 1)
    wait = obj.acquire
threading.Timer(0.3, _thread.interrupt_main).start()
t0 = time.monotonic()
try:
    wait(timeout=10)
    print("acquired", flush=True)
except KeyboardInterrupt:
    print("interrupted", round(time.monotonic() - t0, 2), cxc.async_waiters(), flush=True)
sys.stdin.readline()                      # the test released: we must get it now
got = obj.try_lock() if kind == "lock" else obj.try_acquire()
print("free" if got is not None else "taken", flush=True)
"""


# docs/python.md, *Blocking, the GIL and Ctrl-C*: "Ctrl-C (`KeyboardInterrupt`)
# interrupts a blocking `lock()` / `acquire()` ... within one slice (tests: < 0.5 s), and
# leaves nothing claimed." `_thread.interrupt_main()` raises the same KeyboardInterrupt
# without a signal (IDEs, test runners and watchdog threads use it).
@pytest.mark.parametrize("kind", ["lock", "acquire"])
def test_interrupt_main_while_blocked_leaves_nothing_claimed(tmp_path, kind):
    path = tmp_path / kind
    held = cxc.Lease(path, grace=30).lock() if kind == "lock" else \
        cxc.Semaphore(path, 1).acquire()
    kid = subprocess.Popen([sys.executable, "-u", "-c", _INTERRUPTED, str(path), kind],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        line = read_line(kid).split()
        assert line[0] == "interrupted", line
        assert float(line[1]) < 0.3 + 0.5 and line[2] == "0"
        held.release()
        kid.stdin.write("go\n")
        kid.stdin.flush()
        assert read_line(kid) == "free"
        assert kid.wait(10) == 0
    finally:
        kill_all([kid])
