"""Adversarial tests of the Python bindings, second round (attack18): huge finite
timeouts, daemon threads blocked at interpreter exit, a forked child dropping an inherited
permit while it holds one of its own, a forked child's step_down() while a parent thread
waits in wait_lost(), event loops closed with waiters pending, step_down() beside a thread
in wait_lost(), async waiters and a stopped holder, holders that died but were not reaped,
Python signal handlers during blocking waits, pickling and copying of handles.

Each test cites the sentence of docs/python.md (or of the doc of the primitive it wraps)
it checks. A `# Found (fixed since):` comment marks a test that failed on the code it
was written against, and what happened then."""

import asyncio
import copy
import json
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import threading
import time

import pytest

import cxc
from conftest import kill_all as _kill
from conftest import python_child
from conftest import wait_child as _wait_child


def _run(code, *args, timeout=30):
    """Runs `python -c code args...` to its end (bounded); returns the CompletedProcess."""
    return subprocess.run([sys.executable, "-u", "-c", code, *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


# ---------------------------------------------------------------------------------------
# Huge finite timeouts

# docs/python.md, API table: "every `timeout=` | seconds; `None`: no limit; a negative
# one does not wait; NaN raises `ValueError`". A finite timeout of 1e19 s is a valid
# float; the call must wait (here: until the holder releases) or refuse it with a Python
# exception of a documented kind (ValueError / OverflowError), never panic.
# Found (fixed since): `Instant::now() + timeout` overflows: pyo3_runtime.PanicException
# ("overflow when adding duration to instant"), a BaseException that `except Exception`
# does not catch (every run).
@pytest.mark.parametrize("kind", ["lock", "acquire", "campaign", "wait_lost"])
def test_huge_finite_timeout_waits_or_is_refused_never_panics(tmp_path, kind):
    huge = 1e19
    lease = cxc.Lease(tmp_path / "a.lease", grace=30)
    sem = cxc.Semaphore(tmp_path / "s.sem", 1)
    el = cxc.Elector(tmp_path / "e.elect", grace=30)
    held = {"lock": lease.lock, "acquire": sem.acquire}.get(kind, lambda: None)()
    lead = el.campaign(timeout=5) if kind == "wait_lost" else None
    call = {
        "lock": lambda: lease.lock(timeout=huge),
        "acquire": lambda: sem.acquire(timeout=huge),
        "campaign": lambda: el.campaign(timeout=huge),
        "wait_lost": lambda: lead.wait_lost(timeout=huge),
    }[kind]
    out = []

    def waiter():
        try:
            out.append(("ok", call()))
        except BaseException as e:  # noqa: BLE001 - PanicException is a BaseException
            out.append((type(e).__name__, str(e)))

    t = threading.Thread(target=waiter, daemon=True)
    t.start()
    time.sleep(0.3)
    # end the wait: release what blocks it (or end the term wait_lost waits on)
    if held is not None:
        held.release()
    if lead is not None:
        lead.step_down()
    t.join(5)
    assert not t.is_alive(), f"{kind}(timeout=1e19) still waiting after the release"
    res = out[0]
    if res[0] == "ok" and hasattr(res[1], "release"):
        res[1].release()
    elif res[0] == "ok" and hasattr(res[1], "step_down"):
        res[1].step_down()
    assert res[0] in ("ok", "ValueError", "OverflowError"), (
        f"{kind}(timeout=1e19) raised {res[0]}: {res[1]}")


# ---------------------------------------------------------------------------------------
# Daemon threads blocked at interpreter exit

_DAEMON_BLOCKED = r"""
import sys, threading, time, cxc
kind, path = sys.argv[1], sys.argv[2]
if kind == "lock":
    f = cxc.Lease(path, grace=30).lock
elif kind == "acquire":
    f = cxc.Semaphore(path, 1).acquire
elif kind == "campaign":
    f = cxc.Elector(path, grace=30).campaign
else:
    f = cxc.Elector(path, grace=30).campaign(timeout=5).wait_lost
threading.Thread(target=f, daemon=True).start()
time.sleep(0.2)
print("exiting", flush=True)
"""


# docs/python.md, *Blocking, the GIL and Ctrl-C*: "Every blocking call releases the GIL
# and waits in slices of at most 50 ms"; *Measured*: "a thread blocked in `lock()`,
# `campaign()` or `wait_lost()` lets the main thread run (the GIL is released)". A
# daemon thread waiting so while the main thread ends is the ordinary worker-thread
# pattern: the interpreter must exit normally (status 0), not abort.
# Found (fixed since): the daemon thread's next slice retakes the GIL during finalization,
# CPython ends the thread with pthread_exit inside the extension, and the process aborts
# ("FATAL: exception not rethrown", SIGABRT, status 134) -- in about 9 of 10 exits.
@pytest.mark.parametrize("kind", ["lock", "acquire", "campaign", "wait_lost"])
def test_daemon_thread_blocked_in_a_wait_does_not_abort_the_exit(tmp_path, kind):
    path = tmp_path / kind
    holder = {
        "lock": lambda: cxc.Lease(path, grace=30).lock(),
        "acquire": lambda: cxc.Semaphore(path, 1).acquire(),
        "campaign": lambda: cxc.Elector(path, grace=30).campaign(timeout=5),
        "wait_lost": lambda: None,  # the child leads and waits for the end of its term
    }[kind]()
    results = []
    try:
        for _ in range(3):
            r = _run(_DAEMON_BLOCKED, kind, path, timeout=30)
            results.append((r.returncode, r.stdout.strip(), r.stderr.strip()[-200:]))
    finally:
        if holder is not None:
            (getattr(holder, "release", None) or holder.step_down)()
    bad = [x for x in results if x[0] != 0 or x[1] != "exiting"]
    assert bad == [], f"{len(bad)} of 3 exits failed: {bad}"


# ---------------------------------------------------------------------------------------
# fork: an inherited permit object dropped by a child that holds a permit of its own

_CHILD_DROPS_INHERITED_PERMIT = r"""
import gc, json, os, sys, time, cxc
path = sys.argv[1]
sem = cxc.Semaphore(path, 2)
inherited = sem.acquire(timeout=5)      # the parent's permit
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    try:
        own = sem.acquire(timeout=5)    # the child's own permit: both are out now
        before = sem.available
        del inherited                   # the child drops its copy of the parent's object
        gc.collect()
        after = sem.available
        third = sem.try_acquire()       # would be a third holder of a 2-permit semaphore
        res = [before, after, own.released, third is not None]
        os.write(w, json.dumps(res).encode())
    finally:
        os._exit(0)
os.close(w)
_, status = os.waitpid(pid, 0)
print(os.read(r, 4096).decode(), flush=True)
"""


# docs/python.md, API table: `sem.acquire()` returns a "`SemaphorePermit` (context
# manager, `release()`)", and *Blocking*: "a permit holds the `Arc<SharedSemaphore>` it
# returns itself to" -- a permit object returns the permit it stands for, not another one;
# docs/shared-semaphore.md: "at most 4 across all processes, even if some crash"; and
# test_attack.py established that a forked child cannot return the parent's permit. A
# child that drops its copy of the parent's permit object while it holds a permit of its
# own must keep its own: 0 available, `own` still held, no third permit for anyone.
# Found (fixed since): the drop releases "a permit of the calling process", i.e. the child's
# own one: available goes 0 -> 1, `own.released` stays False, and another acquire
# succeeds -- 3 holders of a 2-permit semaphore (every run).
def test_forked_child_dropping_inherited_permit_keeps_its_own(tmp_path):
    r = _run(_CHILD_DROPS_INHERITED_PERMIT, tmp_path / "s.sem", timeout=30)
    assert r.returncode == 0, r.stderr[-500:]
    before, after, own_released, third = json.loads(r.stdout)
    assert before == 0 and not own_released
    assert (after, third) == (0, False), (
        f"after the child dropped the parent's permit object: available={after}, a third "
        f"permit {'was' if third else 'was not'} granted (max 2; parent and child hold one "
        f"each)")


_FORK_BESIDE_WAIT_LOST = r"""
import json, os, signal, sys, threading, time, cxc
el = cxc.Elector(sys.argv[1], grace=30)
lead = el.campaign(timeout=5)
watchers = [threading.Thread(target=lead.wait_lost, args=(30,), daemon=True)
            for _ in range(3)]
for t in watchers:
    t.start()
time.sleep(0.2)
results = []
for attempt in range(3):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            res = []
            for name in ("is_current", "renew", "step_down"):
                try:
                    res.append([name, repr(getattr(lead, name)())])
                except BaseException as e:
                    res.append([name, type(e).__name__])
            os.write(w, json.dumps(res).encode())
        finally:
            os._exit(0)
    os.close(w)
    end = time.monotonic() + 5
    while not os.waitpid(pid, os.WNOHANG)[0]:
        if time.monotonic() > end:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            break
        time.sleep(0.01)
    got = os.read(r, 4096)
    os.close(r)
    results.append(json.loads(got) if got else "hung")
    time.sleep(0.07)
lead.renew()
ok = lead.is_current()
lead.step_down()
for t in watchers:  # (they see the term end; joined: no daemon thread left waiting)
    t.join(5)
print(json.dumps([results, ok]), flush=True)
"""


# docs/python.md, API table: "`lead.step_down()` / leaving `with` | ... `LostError` if it
# was already over ...; idempotent" and "`lead.is_current()` | ... this process's (a
# forked child's copy is not)"; test_attack.py: a forked child's renew() and step_down()
# of the inherited term raise LostError. The same must hold when the leader forks while
# another of its threads waits in `lead.wait_lost()` (the documented watcher pattern):
# the child's calls answer (False, LostError, LostError), they do not hang.
# Found (fixed since): wait_lost() holds the term's lock (read side) across each 50 ms slice
# without the GIL; a child forked meanwhile inherits the lock read-held by a thread it does
# not have, and its step_down() (write side) blocks forever -- uninterruptible, outside
# the GIL (with 3 watcher threads: 12 of 12 forks hung in 4 runs; with one, 2 of 3).
def test_forked_child_step_down_beside_a_wait_lost_thread_does_not_hang(tmp_path):
    r = _run(_FORK_BESIDE_WAIT_LOST, tmp_path / "e.elect", timeout=60)
    assert r.returncode == 0, r.stderr[-500:]
    results, parent_ok = json.loads(r.stdout)
    assert parent_ok
    want = [["is_current", "False"], ["renew", "LostError"], ["step_down", "LostError"]]
    assert results == [want] * 3, results


# ---------------------------------------------------------------------------------------
# asyncio: an event loop closed while waiters are pending

_CLOSED_LOOP = r"""
import asyncio, gc, sys, time, cxc
lpath, spath = sys.argv[1], sys.argv[2]
lease = cxc.Lease(lpath, grace=30)
sem = cxc.Semaphore(spath, 1)
loop = asyncio.new_event_loop()
tasks = [loop.create_task(lease.lock_async()) for _ in range(5)]
tasks += [loop.create_task(sem.acquire_async()) for _ in range(5)]
loop.run_until_complete(asyncio.sleep(0.1))
print("waiting", cxc.async_waiters(), flush=True)
loop.close()                      # the waiters' loop is closed under them
sys.stdin.readline()              # the parent released: wake-ups for the closed loop
time.sleep(0.3)
del tasks, loop
for _ in range(3):
    gc.collect()
g = lease.try_lock()
p = sem.try_acquire()
print("after", cxc.async_waiters(), g is not None, p is not None, flush=True)
"""


# docs/python.md, *asyncio*: "a wake-up for a loop that was closed meanwhile is dropped
# (the waiter is gone with its loop)"; API table: "`cxc.async_waiters()` | `int`: async
# waiters registered with this process's reactor (0 when none waits)". Once the loop is
# closed and its tasks are gone, nobody waits: 0 registered waiters, nothing claimed.
# Found (fixed since): the 10 waiters stay registered for good (`async_waiters()` == 10 after
# the loop, the tasks and a gc): the reactor's waker holds the loop and the waiter
# through Python references the cycle collector cannot see (every run). (Nothing is
# claimed: the lease and the permit are free.)
def test_waiters_of_a_closed_loop_are_gone_with_it(tmp_path):
    lpath, spath = tmp_path / "a.lease", tmp_path / "s.sem"
    g = cxc.Lease(lpath, grace=30).lock()
    p = cxc.Semaphore(spath, 1).acquire()
    kid = subprocess.Popen([sys.executable, "-u", "-c", _CLOSED_LOOP, str(lpath),
                            str(spath)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        assert kid.stdout.readline().split() == ["waiting", "10"]
        g.release()
        p.release()
        kid.stdin.write("\n")
        kid.stdin.flush()
        out, err = kid.communicate(timeout=20)
    finally:
        _kill([kid])
    assert out.split() == ["after", "0", "True", "True"], out + err[-500:]


# ---------------------------------------------------------------------------------------
# step_down() beside a thread in wait_lost()

# docs/python.md, API table: "`lead.step_down()` / leaving `with` | ends the term so a
# standby leads at once"; "`lead.wait_lost(timeout=None)` | blocks until the term is
# lost". The documented pattern -- one thread waits in wait_lost(), the work loop steps
# down -- must end the term at once (allowed here: 100 ms, two of the 50 ms slices).
# Found (fixed since): step_down() waits for the write side of the lock wait_lost() re-takes
# for every 50 ms slice, and loses the race again and again: median ~130 ms, up to
# ~540 ms per step_down() (vs ~1 us without the waiting thread).
def test_step_down_beside_a_wait_lost_thread_is_prompt(tmp_path):
    el = cxc.Elector(tmp_path / "e.elect", grace=30)
    took, lost = [], []
    for _ in range(10):
        lead = el.campaign(timeout=5)
        t = threading.Thread(target=lambda: lost.append(lead.wait_lost(timeout=5)))
        t.start()
        time.sleep(0.08)
        t0 = time.monotonic()
        lead.step_down()
        took.append(time.monotonic() - t0)
        t.join(6)
        assert not t.is_alive()
    assert lost == [True] * 10
    ms = sorted(round(x * 1e3, 1) for x in took)
    assert max(took) < 0.100, f"step_down() with a thread in wait_lost() took {ms} ms"


# ---------------------------------------------------------------------------------------
# Holders that died but were not reaped (zombies)

# docs/python.md: "`Lease` ... released when its holder exits, crashes" (the Lease class
# docstring), "A dead leader is replaced at once", "`sem.reclaim_dead()` | the permits of
# holders whose process is gone", "a negative one does not wait" -- a holder that exited
# but whose parent has not reaped it yet (a zombie) is gone: its lease, permit and term
# come back without a wait, and even before the reaping.
def test_exited_but_unreaped_holders_release_everything(tmp_path):
    lease = cxc.Lease(tmp_path / "a.lease", grace=30)
    sem = cxc.Semaphore(tmp_path / "s.sem", 1)
    el = cxc.Elector(tmp_path / "e.elect", grace=30)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            held = [lease.lock(timeout=5), sem.acquire(timeout=5), el.campaign(timeout=5)]
            os.write(w, b"x" if all(held) else b"-")
        finally:
            os._exit(0)  # dies holding all three
    os.close(w)
    try:
        assert os.read(r, 1) == b"x"
        os.close(r)
        # Wait until it has exited, without reaping it. Not "until /proc says Z": that is
        # its main thread; the library's own thread (the lease's sentinel) may still be
        # on its way out, and the process is dead only once both are gone.
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        g = lease.lock(timeout=-1)
        assert g.is_current()
        p = sem.try_acquire()
        assert p is not None
        lead = el.try_campaign()
        assert lead is not None and lead.is_current()
        assert el.leader() == (el.identity, lead.token)
        g.release()
        p.release()
        lead.step_down()
    finally:
        _wait_child(pid)


_BEATING_HOLDER = r"""
import sys, time, cxc
g = cxc.Lease(sys.argv[1], grace=0.5).lock(timeout=10)
print("held", g.token, flush=True)
while True:
    g.beat()
    time.sleep(0.01)
"""


# docs/python.md, *Blocking*: "the process's cxc reactor thread wakes it on a release, a
# holder's exit (pidfd) or a stale heartbeat (docs/async.md)", and *asyncio*: "The
# future's `Waker` is called by the reactor thread when the lease may be claimable (a
# release, a holder's death, a stale heartbeat)". A holder that stops (SIGSTOP) stops
# beating: async waiters are woken once its heartbeat is older than `grace`, exactly one
# of them takes the lease (with a larger token), not before `grace`, and the others stay
# waiting until cancelled (nothing left registered).
def test_async_waiters_take_over_from_a_stopped_holder_after_grace(tmp_path):
    path = tmp_path / "a.lease"
    lease = cxc.Lease(path, grace=0.5)
    kid = python_child(_BEATING_HOLDER, path)
    try:
        line = kid.stdout.readline().split()
        assert line[0] == "held"
        token = int(line[1])

        async def main():
            waiters = [asyncio.create_task(lease.lock_async(timeout=5)) for _ in range(3)]
            await asyncio.sleep(0.2)
            assert not any(w.done() for w in waiters)
            kid.send_signal(signal.SIGSTOP)
            t0 = time.monotonic()
            done, pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            took = time.monotonic() - t0
            await asyncio.sleep(0.1)
            winners = [w for w in waiters if w.done()]
            for w in pending:
                w.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            return took, [w.result() for w in winners]

        took, won = asyncio.run(main())
        assert len(won) == 1, f"{len(won)} async waiters took the lease"
        g = won[0]
        assert 0.3 <= took < 2.5, f"taken {took:.3f} s after the stop (grace 0.5)"
        assert g.token > token and g.is_current()
        assert cxc.async_waiters() == 0
        g.release()
    finally:
        kid.send_signal(signal.SIGCONT)
        _kill([kid])


# ---------------------------------------------------------------------------------------
# Python signal handlers during blocking waits

# docs/python.md, *Blocking, the GIL and Ctrl-C*: "Every blocking call ... waits in
# slices of at most 50 ms, calling `PyErr_CheckSignals` between slices: Ctrl-C ...
# interrupts a blocking `lock()` / `acquire()` / `campaign()` / `wait_lost()` within one
# slice ... and leaves nothing claimed." The same holds for any Python signal handler
# that raises (here SIGALRM from setitimer), and a handler that does not raise must not
# end the wait early (the timeout still applies).
def test_signal_handlers_run_during_blocking_waits(tmp_path):
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers run on the main thread only")

    class Alarm(Exception):
        pass

    def alarm(signum, frame):
        raise Alarm

    usr1 = []
    old_alrm = signal.signal(signal.SIGALRM, alarm)
    old_usr1 = signal.signal(signal.SIGUSR1, lambda s, f: usr1.append(s))
    lease = cxc.Lease(tmp_path / "a.lease", grace=30)
    sem = cxc.Semaphore(tmp_path / "s.sem", 1)
    el = cxc.Elector(tmp_path / "e.elect", grace=30)
    g = lease.lock()
    p = sem.acquire()
    lead = el.campaign(timeout=5)
    try:
        for name, call in (("lock", lease.lock), ("acquire", sem.acquire),
                           ("wait_lost", lead.wait_lost)):
            signal.setitimer(signal.ITIMER_REAL, 0.2)
            t0 = time.monotonic()
            with pytest.raises(Alarm):
                call()
            took = time.monotonic() - t0
            assert 0.15 < took < 0.5, (name, took)
        # a handler that does not raise: the wait goes on until its timeout
        timer = threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGUSR1))
        timer.start()
        t0 = time.monotonic()
        with pytest.raises(cxc.Timeout):
            lease.lock(timeout=0.5)
        assert time.monotonic() - t0 >= 0.45 and usr1 == [signal.SIGUSR1]
        timer.join()
        # nothing was claimed by the interrupted waits; the term was kept
        assert lead.is_current() and el.leader() == (el.identity, lead.token)
        g.release()
        p.release()
        assert sem.available == 1
        assert lease.try_lock() is not None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_alrm)
        signal.signal(signal.SIGUSR1, old_usr1)
        for x in (g, p):
            x.release()
        lead.step_down()


# ---------------------------------------------------------------------------------------
# Pickling, copying, the spawn start method

def _spawn_target(obj):  # never runs: the argument cannot be pickled
    obj.release()


# docs/python.md, *Blocking*: "Guards hold an `Arc` of the handle" -- a guard, a permit or
# a term is one claim of one process; a copy (pickle, copy.copy, a `spawn` child's
# argument) would be a second object for the same claim, or a claim in another process.
# No sentence promises pickling: the Python convention for unpicklable objects is a
# TypeError, raised before any child runs, with the claims intact.
def test_handles_and_claims_refuse_pickle_and_copy(tmp_path):
    lease = cxc.Lease(tmp_path / "a.lease", grace=30)
    sem = cxc.Semaphore(tmp_path / "s.sem", 1)
    table = cxc.HeartbeatTable(tmp_path / "t.hb", 2)
    el = cxc.Elector(tmp_path / "e.elect", grace=30)
    g, p, reg, lead = lease.lock(), sem.acquire(), table.join(), el.campaign(timeout=5)
    objs = [lease, g, sem, p, table, reg, cxc.Watchdog(table), el, lead]
    for o in objs:
        for f in (pickle.dumps, copy.copy, copy.deepcopy):
            with pytest.raises(TypeError):
                f(o)
    ctx = multiprocessing.get_context("spawn")
    for o in (g, p, lead):
        proc = ctx.Process(target=_spawn_target, args=(o,))
        with pytest.raises(TypeError):
            proc.start()
        if proc._popen is not None:  # (not started; be sure)
            proc.kill()
            proc.join(5)
    assert g.is_current() and not p.released and lead.is_current()
    assert sem.available == 0 and table.snapshot(reg.slot)[0] == os.getpid()
    g.release()
    p.release()
    reg.release()
    lead.step_down()


# docs/python.md, API table: "`Semaphore(path, permits, *, create=True)` | an existing
# file must have `permits` permits (`cxc.Error` otherwise)" -- with `create=True` too.
def test_semaphore_permit_count_mismatch_is_an_error_with_create(tmp_path):
    path = tmp_path / "s.sem"
    sem = cxc.Semaphore(path, 3)
    for n in (2, 4, 1):
        for create in (True, False):
            with pytest.raises(cxc.Error):
                cxc.Semaphore(path, n, create=create)
    assert sem.max_permits == 3 and sem.available == 3
