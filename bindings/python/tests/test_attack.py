"""Adversarial tests of the Python bindings (attack6): forked children inheriting held
guards, permits, registrations and terms; SIGKILL / SIGSTOP of holders; threads sharing a
handle; Ctrl-C during blocking waits; asyncio in a forked child; garbage collection of
held objects; hostile arguments and hostile files.

A `# Found:` comment names what a test caught in the bindings before it was fixed; every
test asserts what docs/python.md (or the general expectation of a Python library)
promises."""

import asyncio
import gc
import json
import multiprocessing
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time

import pytest

import cxc
from conftest import kill_all as _kill
from conftest import outcome as _outcome
from conftest import python_child
from conftest import until as _until
from conftest import wait_child as _wait_child

FORK = multiprocessing.get_context("fork")


# ---------------------------------------------------------------------------------------
# fork: the child is a new identity


def _mp_child_attack(g, p, reg, lead, lease, sem, table, el, q):
    """In a `multiprocessing` fork child: try to act as the parent's holder, then take a
    permit of its own and exit without returning it."""
    r = {
        "g.read": _outcome(g.read),
        "g.write": _outcome(lambda: g.write(b"child")),
        "g.beat": _outcome(g.beat),
        "g.release": _outcome(g.release),
        "lease.try_lock": _outcome(lease.try_lock),
        "lease.lock": _outcome(lambda: lease.lock(timeout=0.2)),
        "p.release": _outcome(p.release),
        "sem.available_after_p.release": sem.available,
        "reg.beat": _outcome(reg.beat),
        "reg.mark": _outcome(lambda: reg.mark(9)),
        "reg.clear": _outcome(lambda: reg.clear(3)),
        "reg.release": _outcome(reg.release),
        "lead.renew": _outcome(lead.renew),
        "lead.step_down": _outcome(lead.step_down),
        "el.try_campaign": _outcome(el.try_campaign),
    }
    own = sem.try_acquire()
    r["own_permit"] = own is not None
    r["sem.available_with_own"] = sem.available
    q.put(r)
    # leave without releasing `own`: its permit must come back on our death


def test_mp_fork_child_cannot_act_as_holder_and_parent_keeps_everything(tmp_path):
    lease = cxc.Lease(tmp_path / "a.lease", grace=5)
    sem = cxc.Semaphore(tmp_path / "s.sem", 3)
    table = cxc.HeartbeatTable(tmp_path / "t.hb", 8)
    el = cxc.Elector(tmp_path / "e.elect", grace=5)
    g = lease.lock(timeout=5)
    g.write(b"parent")
    p = sem.acquire(timeout=5)
    reg = table.join()
    reg.mark(3)
    lead = el.campaign(timeout=5)
    token = lead.token

    q = FORK.Queue()
    kid = FORK.Process(target=_mp_child_attack,
                       args=(g, p, reg, lead, lease, sem, table, el, q))
    kid.start()
    try:
        r = q.get(timeout=15)
    finally:
        kid.join(10)
        if kid.is_alive():
            kid.kill()
            kid.join()
    assert kid.exitcode == 0
    # The child cannot act for the parent's claim ...
    assert r["g.read"] == "LostError" and r["g.write"] == "LostError"
    assert r["g.beat"] == "LostError" and r["g.release"] == "LostError"
    assert r["lease.try_lock"] == "ok:None" and r["lease.lock"] == "Timeout"
    # ... nor return the parent's permit ...
    assert r["sem.available_after_p.release"] == 2
    assert r["own_permit"] and r["sem.available_with_own"] == 1
    # ... nor beat, mark or unregister the parent's slot ...
    assert r["reg.beat"] == "LostError" and r["reg.mark"] == "LostError"
    assert r["reg.clear"] == "LostError"
    # ... nor renew or resign the parent's term, nor lead beside it.
    assert r["lead.renew"] == "LostError" and r["lead.step_down"] == "LostError"
    assert r["el.try_campaign"] == "ok:None"

    # The parent's claims survive the child's exit.
    assert g.is_current() and not g.released
    assert g.read()[:6] == b"parent"
    g.write(b"parent2")
    g.beat()
    assert cxc.Lease(tmp_path / "a.lease").try_lock() is None
    assert _until(lambda: sem.available == 2), "the dead child's permit came back"
    assert not p.released
    reg.beat()
    reg.mark(4)
    snap = table.snapshot(reg.slot)
    assert snap is not None and snap[0] == os.getpid() and not snap[3]
    assert reg.in_flight == (1 << 3) | (1 << 4)
    lead.renew()
    assert lead.is_current()
    assert el.leader() == (el.identity, token)
    g.release()
    p.release()
    reg.release()
    lead.step_down()
    assert sem.available == 3


_OS_FORK_FINALIZE = r"""
import gc, os, sys, cxc
d = sys.argv[1]
lease = cxc.Lease(d + "/a.lease", grace=5)
sem = cxc.Semaphore(d + "/s.sem", 1)
table = cxc.HeartbeatTable(d + "/t.hb", 4)
el = cxc.Elector(d + "/e.elect", grace=5)
g = lease.lock(timeout=5)
g.write(b"kept")
p = sem.acquire(timeout=5)
reg = table.join()
reg.mark(1)
lead = el.campaign(timeout=5)
held = [g, p, reg, lead]
pid = os.fork()
if pid == 0:
    # the child: collect what it inherited, then the interpreter's normal shutdown
    # (module globals, the handles) -- sys.exit, not os._exit
    del held[:]
    g = p = reg = lead = None
    gc.collect()
    sys.exit(0)
_, status = os.waitpid(pid, 0)
gc.collect()
g, p, reg, lead = held
reg.beat()
lead.renew()
print(os.waitstatus_to_exitcode(status), g.is_current(), g.read()[:4] == b"kept",
      sem.available, p.released, table.snapshot(reg.slot)[0] == os.getpid(),
      lead.is_current(), el.leader()[1] == lead.token)
"""


def test_os_fork_child_finalization_leaves_parent_claims(tmp_path):
    """A child made by os.fork() that exits through the normal interpreter shutdown
    (every inherited guard, permit, registration, term and handle garbage-collected, the
    Leadership's collection "also resigns") must not release anything of the parent."""
    r = subprocess.run([sys.executable, "-c", _OS_FORK_FINALIZE, str(tmp_path)],
                       capture_output=True, text=True, timeout=30)
    assert r.stdout.split() == ["0", "True", "True", "0", "False", "True", "True",
                                "True"], r.stderr


# Found: Leadership.is_current() answers True in a forked child whose renew()
# raises LostError and whose wait_lost() reports the term lost (LeaseGuard.is_current()
# answers False there).
def test_forked_child_leadership_is_not_current(tmp_path):
    el = cxc.Elector(tmp_path / "e.elect", grace=5)
    lead = el.campaign(timeout=5)
    lease = cxc.Lease(tmp_path / "a.lease", grace=5)
    g = lease.lock(timeout=5)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            res = {
                "guard.is_current": g.is_current(),
                "lead.is_current": lead.is_current(),
                "lead.renew": _outcome(lead.renew),
                "lead.wait_lost": lead.wait_lost(timeout=0),
            }
            os.write(w, json.dumps(res).encode())
        finally:
            os._exit(0)
    os.close(w)
    assert _wait_child(pid) == 0
    res = json.loads(os.read(r, 4096))
    os.close(r)
    assert res["guard.is_current"] is False
    assert res["lead.renew"] == "LostError" and res["lead.wait_lost"] is True
    # docs: is_current() is "not lost, renewed within grace, current in the file"; the
    # child's own renew() and wait_lost() say the term is lost for it.
    assert res["lead.is_current"] is False, "a forked child believes it leads"
    assert lead.is_current()
    lead.step_down()
    g.release()


# Found: the default identity "py:PID" is fixed when the Elector is made; a forked
# child that campaigns with the inherited Elector leads under its parent's pid, so
# observers (el.leader()) name a process that does not lead.
def test_forked_child_elected_with_default_identity_names_itself(tmp_path):
    el = cxc.Elector(tmp_path / "e.elect", grace=5)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            lead = el.try_campaign()
            os.write(w, json.dumps([os.getpid(), lead is not None, el.leader()]).encode())
            lead.step_down()
        finally:
            os._exit(0)
    os.close(w)
    assert _wait_child(pid) == 0
    child, won, leader = json.loads(os.read(r, 4096))
    os.close(r)
    assert won and leader[0] == f"py:{child}", (
        f"child {child} leads; observers see {leader[0]!r} (the parent is {os.getpid()})")


_HOLD_LEASE = r"""
import sys, time, cxc
g = cxc.Lease(sys.argv[1], grace=30).lock(timeout=10)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
g.release()
print("released", flush=True)
time.sleep(5)
"""


# Found: the asyncio wake-up bridge thread (`cxc-asyncio-wake`) is started once
# per process (a OnceLock); a forked child inherits the initialised Sender but not the
# thread, so its async waiters are never woken and lock_async() only ends by timeout.
def test_lock_async_in_forked_child_after_parent_awaited(tmp_path):
    path = tmp_path / "a.lease"
    lease = cxc.Lease(path, grace=30)

    async def take(timeout):
        return await lease.lock_async(timeout=timeout)

    # The parent's async waiter is woken once (this starts the bridge thread).
    holder = python_child(_HOLD_LEASE, path, 0.3)
    try:
        assert holder.stdout.readline().strip() == "held"
        asyncio.run(take(10)).release()
    finally:
        _kill([holder])

    holder = python_child(_HOLD_LEASE, path, 0.5)
    try:
        assert holder.stdout.readline().strip() == "held"
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                t0 = time.monotonic()
                try:
                    g = asyncio.run(take(4))
                    res = ["got", time.monotonic() - t0]
                    g.release()
                except BaseException as e:  # noqa: BLE001
                    res = [type(e).__name__, time.monotonic() - t0]
                os.write(w, json.dumps(res).encode())
            finally:
                os._exit(0)
        os.close(w)
        assert _wait_child(pid, 15) == 0
        res = json.loads(os.read(r, 4096))
        os.close(r)
    finally:
        _kill([holder])
    assert res[0] == "got", f"lock_async in the forked child: {res[0]} after {res[1]:.2f} s"
    assert res[1] < 3.0


def test_forked_child_waits_while_parent_thread_waits(tmp_path):
    """A parent thread is blocked in lock()/acquire()/campaign() at the fork; the child's
    own blocking wait on the inherited handle must still be woken by the holder's
    release (not hang, not get it early)."""
    cases = {
        "lease": (lambda p: cxc.Lease(p, grace=30), lambda o, t: o.lock(timeout=t),
                  _HOLD_LEASE),
        "sem": (lambda p: cxc.Semaphore(p, 1), lambda o, t: o.acquire(timeout=t),
                _HOLD_LEASE.replace("cxc.Lease(sys.argv[1], grace=30).lock(timeout=10)",
                                    "cxc.Semaphore(sys.argv[1], 1).acquire(timeout=10)")),
    }
    for name, (make, wait, hold) in cases.items():
        path = tmp_path / name
        obj = make(path)
        holder = python_child(hold, path, 1.0)
        try:
            assert holder.stdout.readline().strip() == "held"
            t_res = []

            def blocked():
                try:
                    t_res.append(wait(obj, 0.6))
                except cxc.Timeout:
                    t_res.append("timeout")

            th = threading.Thread(target=blocked)
            th.start()
            time.sleep(0.2)
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                try:
                    t0 = time.monotonic()
                    try:
                        got = wait(obj, 5)
                        res = ["got", time.monotonic() - t0]
                        got.release()
                    except BaseException as e:  # noqa: BLE001
                        res = [type(e).__name__, time.monotonic() - t0]
                    os.write(w, json.dumps(res).encode())
                finally:
                    os._exit(0)
            os.close(w)
            th.join(10)
            assert _wait_child(pid, 15) == 0
            res = json.loads(os.read(r, 4096))
            os.close(r)
            assert t_res == ["timeout"]
        finally:
            _kill([holder])
        assert res[0] == "got", (name, res)
        assert 0.5 < res[1] < 3.5, (name, res)


# ---------------------------------------------------------------------------------------
# SIGSTOP, SIGKILL


_STOPPABLE_WRITER = r"""
import sys, time, cxc
lease = cxc.Lease(sys.argv[1], grace=0.5)
g = lease.lock(timeout=10)
print("held", g.token, flush=True)
i = 0
while True:
    try:
        g.write(b"child %d" % i)
        g.beat()
    except cxc.LostError:
        print("lost-write", i, flush=True)
        break
    i += 1
    time.sleep(0.002)
print("is_current", g.is_current(), flush=True)
try:
    g.release()
    print("release ok", flush=True)
except cxc.LostError:
    print("release lost", flush=True)
try:
    with lease.lock(timeout=0.1):
        print("relocked?!", flush=True)
except cxc.Timeout:
    print("busy", flush=True)
"""


def test_sigstopped_lease_holder_superseded_and_late_writes_refused(tmp_path):
    path = tmp_path / "a.lease"
    lease = cxc.Lease(path, grace=0.5)
    kid = python_child(_STOPPABLE_WRITER, path)
    try:
        line = kid.stdout.readline().split()
        assert line[0] == "held"
        child_token = int(line[1])
        time.sleep(0.1)
        kid.send_signal(signal.SIGSTOP)
        t0 = time.monotonic()
        g = lease.lock(timeout=5)
        waited = time.monotonic() - t0
        assert waited >= 0.3, f"superseded a live holder after {waited:.3f} s (grace 0.5)"
        assert waited < 2.5
        assert g.token > child_token
        try:
            before = g.read()
        except cxc.InconsistentError:
            g.acknowledge_inconsistent()
            before = g.read()
        assert before.startswith(b"child ")
        g.write(b"parent")
        kid.send_signal(signal.SIGCONT)
        out, err = kid.communicate(timeout=10)
        lines = out.splitlines()
        assert lines[0].startswith("lost-write"), out + err
        assert "is_current False" in lines
        assert "release lost" in lines
        assert "busy" in lines
        assert g.read() == b"parent" + bytes(42), "a stopped holder's late write landed"
        assert g.is_current()
        g.release()
    finally:
        _kill([kid])


_SEM_WORKER = r"""
import fcntl, json, os, random, sys, time, cxc
path, book, maxp = sys.argv[1], sys.argv[2], int(sys.argv[3])
sem = cxc.Semaphore(path, maxp)

def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")

def update(fn):
    with open(book + ".lock", "a") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        try:
            with open(book) as f:
                d = json.load(f)
        except FileNotFoundError:
            d = {"in": [], "viol": [], "n": 0}
        fn(d)
        tmp = f"{book}.{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(d, f)
        os.replace(tmp, book)

me = os.getpid()
def enter(d):
    d["in"] = [p for p in d["in"] if alive(p)] + [me]
    d["n"] += 1
    if len(d["in"]) > maxp:
        d["viol"].append(list(d["in"]))
def leave(d):
    d["in"] = [p for p in d["in"] if p != me]

rng = random.Random(me)
print("ready", flush=True)
while True:
    p = sem.acquire(timeout=30)
    update(enter)
    time.sleep(rng.uniform(0, 0.004))
    update(leave)
    p.release()
"""


def test_semaphore_never_exceeds_max_under_kills(tmp_path):
    path, book, maxp = str(tmp_path / "s.sem"), str(tmp_path / "book.json"), 2
    sem = cxc.Semaphore(path, maxp)
    procs = [python_child(_SEM_WORKER, path, book, maxp) for _ in range(5)]
    rng = random.Random(int(os.environ.get("CXC_SEED", time.time_ns())))
    kills = 0
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        end = time.monotonic() + 6
        while time.monotonic() < end:
            time.sleep(rng.uniform(0.03, 0.15))
            i = rng.randrange(len(procs))
            procs[i].send_signal(signal.SIGKILL)
            procs[i].wait()
            kills += 1
            procs[i] = python_child(_SEM_WORKER, path, book, maxp)
            assert 0 <= sem.available <= maxp
    finally:
        _kill(procs)
    with open(book) as f:
        d = json.load(f)
    assert kills >= 20
    assert d["n"] > 100, "the workers made too little progress to judge"
    assert d["viol"] == [], f"more than {maxp} live holders at once"
    # (a blocked acquire reclaims the killed holders' permits)
    held = [sem.acquire(timeout=3) for _ in range(maxp)]
    assert sem.try_acquire() is None
    for p in held:
        p.release()
    assert sem.available == maxp


# Found: try_acquire() never reclaimed a dead holder's permits
# (only a blocked acquire() scanned for dead holders, and reclaim_dead() was not bound), so
# a process that polled with try_acquire() never got them back while nobody blocked.
def test_try_acquire_gets_back_a_killed_holders_permit(tmp_path):
    from conftest import permit_holders
    sem, kids = permit_holders(str(tmp_path / "pool.sem"), 2)
    try:
        assert sem.try_acquire() is None
        for k in kids:
            k.send_signal(signal.SIGKILL)
            k.wait()
        got = []
        end = time.monotonic() + 3
        while len(got) < 2 and time.monotonic() < end:
            p = sem.try_acquire()
            if p is not None:
                got.append(p)
            time.sleep(0.02)
        avail = sem.available
        for p in got:
            p.release()
        assert len(got) == 2, (f"try_acquire() got {len(got)} of the 2 permits of dead "
                               f"holders in 3 s; available={avail}")
    finally:
        _kill(kids)


# ---------------------------------------------------------------------------------------
# threads of one process


def test_threads_sharing_one_lease_handle_never_overlap(tmp_path):
    lease = cxc.Lease(tmp_path / "a.lease", grace=10)
    per, nthreads = 300, 4
    inside = [0]
    overlaps = []
    errors = []

    def work(k):
        try:
            for i in range(per):
                if (i + k) % 3 == 0:
                    g = lease.try_lock()
                    while g is None:
                        time.sleep(0)
                        g = lease.try_lock()
                else:
                    g = lease.lock(timeout=10)
                with g:
                    inside[0] += 1
                    if inside[0] != 1:
                        overlaps.append(inside[0])
                    n = int.from_bytes(g.read()[:8], "little")
                    time.sleep(0)  # let another thread run inside the hold
                    g.write((n + 1).to_bytes(8, "little"))
                    inside[0] -= 1
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(nthreads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [] and overlaps == []
    with lease.lock(timeout=5) as g:
        assert int.from_bytes(g.read()[:8], "little") == per * nthreads


def test_guard_released_by_another_thread_wakes_a_waiter(tmp_path):
    lease = cxc.Lease(tmp_path / "a.lease", grace=10)
    g = lease.lock()
    got = []
    waiter = threading.Thread(target=lambda: got.append(lease.lock(timeout=5)))
    waiter.start()
    time.sleep(0.2)
    assert got == []
    releasers = [threading.Thread(target=g.release) for _ in range(4)]
    for t in releasers:
        t.start()
    for t in releasers:
        t.join()
    waiter.join(5)
    assert len(got) == 1 and got[0].token > g.token and g.released
    with pytest.raises(cxc.Error):
        g.write(b"x")
    got[0].release()


# Found: a thread blocked in lead.wait_lost() holds the Leadership's mutex for a
# whole 50 ms slice; renew()/is_current()/step_down() from the work loop block on it
# *with the GIL held* (every thread of the interpreter stalls ~25-50 ms per call).
def test_wait_lost_thread_does_not_stall_the_leaders_calls(tmp_path):
    el = cxc.Elector(tmp_path / "e.elect", grace=10)
    lead = el.campaign(timeout=5)
    watcher = threading.Thread(target=lambda: lead.wait_lost(timeout=5))
    watcher.start()
    time.sleep(0.1)
    times = {}
    try:
        for name, call in (("renew", lead.renew), ("is_current", lead.is_current)):
            ts = []
            for _ in range(15):
                time.sleep(0.007)
                t0 = time.perf_counter()
                call()
                ts.append(time.perf_counter() - t0)
            times[name] = statistics.median(ts)
    finally:
        lead.step_down()
        watcher.join(5)
    assert not watcher.is_alive()
    slow = {k: f"{v * 1e3:.1f} ms" for k, v in times.items() if v > 0.010}
    assert not slow, f"median call time with a thread in wait_lost(): {slow}"


# ---------------------------------------------------------------------------------------
# Ctrl-C during blocking waits: interrupted within 0.5 s, nothing left claimed


_INTERRUPTED = r"""
import sys, time, cxc
kind, path = sys.argv[1], sys.argv[2]
if kind == "sem":
    obj = cxc.Semaphore(path, 1)
    wait = obj.acquire
elif kind == "lease":
    obj = cxc.Lease(path, grace=30)
    wait = obj.lock
elif kind == "el":
    obj = cxc.Elector(path, grace=30)
    wait = obj.campaign
print("waiting", flush=True)
try:
    wait()
    print("acquired?!", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
sys.stdin.readline()   # the parent has released its hold
time.sleep(0.3)
if kind == "sem":
    print("available", obj.available, flush=True)
elif kind == "el":
    print("leader", obj.leader(), flush=True)
else:
    g = obj.try_lock()
    print("try_lock", g is not None, flush=True)
    if g is not None:
        g.release()
sys.stdin.readline()
"""


@pytest.mark.parametrize("kind", ["sem", "lease", "el"])
def test_ctrl_c_during_blocking_wait_leaves_nothing_claimed(tmp_path, kind):
    path = tmp_path / kind
    if kind == "sem":
        sem = cxc.Semaphore(path, 1)
        release = sem.acquire().release
    elif kind == "el":
        release = cxc.Elector(path, grace=30).campaign(timeout=5).step_down
    else:
        release = cxc.Lease(path, grace=30).lock().release
    kid = subprocess.Popen([sys.executable, "-u", "-c", _INTERRUPTED, kind, str(path)],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        assert kid.stdout.readline().strip() == "waiting"
        time.sleep(0.3)
        t0 = time.monotonic()
        kid.send_signal(signal.SIGINT)
        assert kid.stdout.readline().strip() == "interrupted"
        assert time.monotonic() - t0 < 0.5
        release()
        kid.stdin.write("\n")
        kid.stdin.flush()
        line = kid.stdout.readline().split()
        # the interrupted child is still alive: nothing may stay claimed for it
        if kind == "sem":
            assert line == ["available", "1"]
            assert sem.available == 1
        elif kind == "el":
            assert line == ["leader", "None"], "the interrupted campaign won later"
        else:
            assert line == ["try_lock", "True"]
        kid.stdin.write("\n")
        kid.stdin.flush()
        kid.wait(5)
    finally:
        _kill([kid])


_WAIT_LOST_INTERRUPTED = r"""
import sys, time, cxc
el = cxc.Elector(sys.argv[1], grace=30)
lead = el.campaign(timeout=5)
print("leading", lead.token, flush=True)
try:
    lead.wait_lost()
    print("lost?!", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
lead.renew()
print("still", lead.is_current(), el.leader()[1] == lead.token, flush=True)
lead.step_down()
"""


def test_ctrl_c_interrupts_wait_lost_and_keeps_the_term(tmp_path):
    kid = python_child(_WAIT_LOST_INTERRUPTED, tmp_path / "e.elect")
    try:
        assert kid.stdout.readline().startswith("leading")
        time.sleep(0.3)
        t0 = time.monotonic()
        kid.send_signal(signal.SIGINT)
        assert kid.stdout.readline().strip() == "interrupted"
        assert time.monotonic() - t0 < 0.5
        assert kid.stdout.readline().strip() == "still True True"
        kid.wait(5)
        assert kid.returncode == 0
    finally:
        _kill([kid])


_ASYNC_INTERRUPTED = r"""
import asyncio, sys, time, cxc
sem = cxc.Semaphore(sys.argv[1], 2)
lease = cxc.Lease(sys.argv[2], grace=30)
async def main():
    tasks = [asyncio.create_task(sem.acquire_async()) for _ in range(20)]
    tasks += [asyncio.create_task(lease.lock_async()) for _ in range(20)]
    await asyncio.sleep(0.1)
    print("waiting", cxc.async_waiters(), flush=True)
    await asyncio.gather(*tasks)
try:
    asyncio.run(main())
except KeyboardInterrupt:
    print("interrupted", cxc.async_waiters(), flush=True)
sys.stdin.readline()
time.sleep(0.3)
g = lease.try_lock()
print("after", sem.available, g is not None, cxc.async_waiters(), flush=True)
"""


def test_ctrl_c_during_asyncio_waits_leaks_no_permit(tmp_path):
    spath, lpath = tmp_path / "s.sem", tmp_path / "a.lease"
    sem = cxc.Semaphore(spath, 2)
    held = [sem.acquire(), sem.acquire(), cxc.Lease(lpath, grace=30).lock()]
    kid = subprocess.Popen([sys.executable, "-u", "-c", _ASYNC_INTERRUPTED, str(spath),
                            str(lpath)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        assert kid.stdout.readline().split() == ["waiting", "40"]
        kid.send_signal(signal.SIGINT)
        assert kid.stdout.readline().split() == ["interrupted", "0"]
        for h in held:
            h.release()
        kid.stdin.write("\n")
        kid.stdin.flush()
        assert kid.stdout.readline().split() == ["after", "2", "True", "0"]
        kid.wait(5)
    finally:
        _kill([kid])


def test_asyncio_wait_for_and_timeouts_leak_nothing(tmp_path):
    lease = cxc.Lease(tmp_path / "a.lease", grace=30)
    sem = cxc.Semaphore(tmp_path / "s.sem", 2)

    async def main():
        g = lease.try_lock()
        p = [sem.try_acquire(), sem.try_acquire()]
        for t in (0, -5, 0.01):
            with pytest.raises(cxc.Timeout):
                await lease.lock_async(timeout=t)
            with pytest.raises(cxc.Timeout):
                await sem.acquire_async(timeout=t)
        for t in (0, 0.001, 0.02):
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(lease.lock_async(), t)
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(sem.acquire_async(), t)
        assert cxc.async_waiters() == 0
        # many waiters, then the holder goes: each waiter gets it in turn and gives back
        waiters = [asyncio.create_task(lease.lock_async(timeout=5)) for _ in range(10)]
        waiters += [asyncio.create_task(sem.acquire_async(timeout=5)) for _ in range(10)]
        await asyncio.sleep(0.05)
        g.release()
        for x in p:
            x.release()
        for w in asyncio.as_completed(waiters):
            (await w).release()
        assert cxc.async_waiters() == 0
        assert sem.available == 2 and lease.try_lock() is not None

    asyncio.run(main())


# ---------------------------------------------------------------------------------------
# context managers, garbage collection


def test_exceptions_leaving_with_blocks_release_everything(tmp_path):
    lease = cxc.Lease(tmp_path / "a.lease", grace=30)
    sem = cxc.Semaphore(tmp_path / "s.sem", 1)
    table = cxc.HeartbeatTable(tmp_path / "t.hb", 1)
    el = cxc.Elector(tmp_path / "e.elect", grace=30)
    for exc in (ValueError("x"), KeyboardInterrupt(), SystemExit(3), GeneratorExit()):
        with pytest.raises(type(exc)):
            with lease.lock() as g, sem.acquire() as p, table.join() as r, \
                    el.campaign(timeout=5) as lead:
                r.beat()
                raise exc
        assert g.released and p.released and lead.stepped_down
        assert sem.available == 1 and table.snapshot(0) is None
        assert el.leader() is None
        assert lease.try_lock() is not None  # (released again at once: no reference)


def test_gc_of_unreleased_objects_releases(tmp_path):
    path = tmp_path / "a.lease"
    lease = cxc.Lease(path, grace=30)
    sem = cxc.Semaphore(tmp_path / "s.sem", 1)
    table = cxc.HeartbeatTable(tmp_path / "t.hb", 1)
    epath = tmp_path / "e.elect"
    el = cxc.Elector(epath, grace=30)

    class Cycle:
        pass

    c = Cycle()
    c.me = c
    c.held = [lease.lock(), sem.acquire(), table.join(), el.campaign(timeout=5)]
    del c
    gc.collect()
    assert sem.available == 1 and table.snapshot(0) is None
    # another process sees the lease free and nobody leading
    code = ("import sys, cxc; g = cxc.Lease(sys.argv[1], grace=30).try_lock(); "
            "e = cxc.Elector(sys.argv[2], grace=30); l = e.try_campaign(); "
            "print(g is not None, l is not None)")
    out = subprocess.run([sys.executable, "-c", code, str(path), str(epath)],
                         capture_output=True, text=True, timeout=20)
    assert out.stdout.split() == ["True", "True"], out.stderr
    # a guard outliving its Lease object and collected later
    g = cxc.Lease(path, grace=30).lock()
    gc.collect()
    assert g.is_current()
    del g
    gc.collect()
    assert lease.try_lock() is not None


# ---------------------------------------------------------------------------------------
# hostile arguments


def test_bad_arguments_raise_python_exceptions(tmp_path):
    p = lambda n: tmp_path / n  # noqa: E731
    lease = cxc.Lease(p("a"))
    g = lease.lock()
    bad = [
        (lambda: cxc.Lease(None), TypeError),
        (lambda: cxc.Lease(p("b"), grace=None), TypeError),
        (lambda: cxc.Lease(p("b"), grace="1"), TypeError),
        (lambda: cxc.Lease(p("b"), grace=float("inf")), ValueError),
        (lambda: cxc.Lease(p("b"), grace=1e300), (ValueError, cxc.Error)),
        (lambda: cxc.Lease(""), (cxc.FileError, ValueError)),
        (lambda: cxc.Lease(str(p("x\0y"))), (cxc.FileError, ValueError)),
        (lambda: lease.lock(timeout="1"), TypeError),
        (lambda: lease.lock(timeout=float("inf")), (ValueError, OverflowError)),
        (lambda: lease.lock(timeout=1e300), (ValueError, OverflowError)),
        (lambda: g.write(None), TypeError),
        (lambda: g.write("text"), TypeError),
        (lambda: g.write(bytes(49)), ValueError),
        (lambda: g.write(bytes(10**6)), ValueError),
        (lambda: cxc.Semaphore(p("s"), 0), cxc.Error),
        (lambda: cxc.Semaphore(p("s"), -1), (OverflowError, ValueError)),
        (lambda: cxc.Semaphore(p("s"), 2**32), (OverflowError, ValueError)),
        (lambda: cxc.Semaphore(p("s"), 2**31), (cxc.Error, ValueError)),
        (lambda: cxc.Semaphore(p("s"), None), TypeError),
        (lambda: cxc.Semaphore(p("s"), 1.5), TypeError),
        (lambda: cxc.HeartbeatTable(p("h"), 0), (cxc.Error, ValueError)),
        (lambda: cxc.HeartbeatTable(p("h"), -1), (OverflowError, ValueError)),
        (lambda: cxc.HeartbeatTable(p("h"), 2**64 - 1), (cxc.Error, ValueError)),
        (lambda: cxc.HeartbeatTable(p("h"), 2**70), (OverflowError, ValueError)),
        (lambda: cxc.Watchdog(None), TypeError),
        (lambda: cxc.Watchdog(cxc.HeartbeatTable(p("h2"), 2), grace=-1),
         (OverflowError, ValueError)),
        (lambda: cxc.HeartbeatTable(p("h3"), 2).join(pid=0), (cxc.Error, ValueError)),
        (lambda: cxc.HeartbeatTable(p("h4"), 2).join(pid=-1), (OverflowError, ValueError)),
        (lambda: cxc.HeartbeatTable(p("h5"), 2).join().mark(64), ValueError),
        (lambda: cxc.HeartbeatTable(p("h6"), 2).join().mark(-1), (OverflowError, ValueError)),
        (lambda: cxc.HeartbeatTable(p("h7"), 2).join().clear(10**9),
         (OverflowError, ValueError)),
        (lambda: cxc.Elector(p("e"), grace=0), ValueError),
        (lambda: cxc.Elector(p("e"), grace=-1), ValueError),
        (lambda: cxc.Elector(p("e"), identity=""), ValueError),
        (lambda: cxc.Elector(p("e"), identity="x" * 33), ValueError),
        (lambda: cxc.Elector(p("e"), identity="\U0001F600" * 9), ValueError),
        (lambda: cxc.Elector(p("e"), identity="\ud800"), (ValueError, UnicodeError)),
        (lambda: cxc.Elector(p("e"), identity=5), TypeError),
    ]
    for i, (call, exc) in enumerate(bad):
        with pytest.raises(exc):
            call()
    # out-of-range slots are answered, not crashed on
    t = cxc.HeartbeatTable(p("h8"), 2)
    assert t.snapshot(10**9) is None
    assert cxc.Watchdog(t).reclaim(10**9) == 0
    assert cxc.Watchdog(t, grace=2**64 - 1).scan() == []
    g.release()


# Found: a negative or NaN `grace` is silently clamped to 0 (duration() in
# src/lib.rs), giving a Lease whose holder any other process supersedes at once: no
# mutual exclusion at all. (Elector refuses the same values with ValueError.)
@pytest.mark.parametrize("grace", [-1.0, float("nan")])
def test_lease_negative_or_nan_grace_is_refused(tmp_path, grace):
    path = tmp_path / "a.lease"
    try:
        lease = cxc.Lease(path, grace=grace)
    except ValueError:
        return
    g = lease.lock()
    code = ("import sys, cxc; g = cxc.Lease(sys.argv[1], grace=float(sys.argv[2]))"
            ".try_lock(); print(g is not None)")
    out = subprocess.run([sys.executable, "-c", code, str(path), str(grace)],
                         capture_output=True, text=True, timeout=20)
    stolen = out.stdout.strip() == "True"
    g.release() if g.is_current() else None
    pytest.fail(f"Lease(grace={grace}) accepted; another process "
                f"{'took the held lease at once' if stolen else 'could not take it'}")


# Found: a NaN timeout is silently turned into 0 by lock() (immediate Timeout),
# and into an asyncio timer at NaN by lock_async() (fires at once or never); the
# standard library refuses NaN timeouts with ValueError.
def test_nan_timeout_is_refused(tmp_path):
    lease = cxc.Lease(tmp_path / "a.lease", grace=30)
    sem = cxc.Semaphore(tmp_path / "s.sem", 1)
    nan = float("nan")
    g = lease.lock()
    p = sem.acquire()
    outcomes = {
        "lock": _outcome(lambda: lease.lock(timeout=nan)),
        "acquire": _outcome(lambda: sem.acquire(timeout=nan)),
        "campaign": _outcome(lambda: cxc.Elector(tmp_path / "e", grace=1).campaign(
            timeout=nan).step_down()),
        "lock_async": _outcome(lambda: asyncio.run(
            asyncio.wait_for(lease.lock_async(timeout=nan), 1.0))),
    }
    g.release()
    p.release()
    assert all(v == "ValueError" for v in outcomes.values()), outcomes


# ---------------------------------------------------------------------------------------
# hostile files


_OPEN_HOSTILE = r"""
import json, sys, cxc
for path, kind, create in json.loads(sys.argv[1]):
    make = {
        "lease": lambda: cxc.Lease(path, create=create, grace=0.2),
        "sem": lambda: cxc.Semaphore(path, 3, create=create),
        "hb": lambda: cxc.HeartbeatTable(path, 8, create=create),
        "el": lambda: cxc.Elector(path, create=create, grace=0.2),
    }[kind]
    print(json.dumps([path, kind, create]), flush=True)
    try:
        make()
        res = ["opened"]
    except cxc.FileError as e:
        res = ["FileError", e.errno, e.filename]
    except BaseException as e:
        res = [type(e).__name__, str(e)]
    print(json.dumps(res), flush=True)
"""


def test_hostile_files_give_file_error(tmp_path):
    kinds = {
        "lease": lambda p: cxc.Lease(p),
        "sem": lambda p: cxc.Semaphore(p, 3),
        "hb": lambda p: cxc.HeartbeatTable(p, 8),
        "el": lambda p: cxc.Elector(p),
    }
    good = {}
    for k, make in kinds.items():
        make(tmp_path / f"good.{k}")
        good[k] = (tmp_path / f"good.{k}").read_bytes()
    cases = []

    def put(name, data):
        (tmp_path / name).write_bytes(data)
        for kind in kinds:
            for create in (True, False):
                cases.append((str(tmp_path / name), kind, create))

    rng = random.Random(7)
    for k, v in good.items():
        for n in (0, 1, 8, 63, len(v) // 2, len(v) - 1):
            put(f"{k}.trunc{n}", v[:n])
        put(f"{k}.longer", v + bytes(4096))
        put(f"{k}.random", bytes(rng.randrange(256) for _ in range(len(v))))
        put(f"{k}.ff", b"\xff" * len(v))
        for other in kinds:
            if other != k:  # another kind's file (the election file is a lease file
                # of another payload size)
                for create in (True, False):
                    cases.append((str(tmp_path / f"good.{k}"), other, create))
    os.mkfifo(tmp_path / "fifo")
    os.mkdir(tmp_path / "dir")
    with open(tmp_path / "sparse", "wb") as f:
        f.truncate(1 << 40)
    for name in ("fifo", "dir", "sparse"):
        for kind in kinds:
            for create in (True, False):
                cases.append((str(tmp_path / name), kind, create))
    for kind in kinds:
        cases.append(("/dev/zero", kind, True))

    # One child for every case, with a deadline: a hang or a crash shows as the last
    # case it started.
    kid = subprocess.Popen([sys.executable, "-c", _OPEN_HOSTILE, json.dumps(cases)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = kid.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        kid.kill()
        out, err = kid.communicate()
        err = "HANG " + err
    lines = [json.loads(line) for line in out.splitlines()]
    started, results = lines[0::2], lines[1::2]
    assert kid.returncode == 0 and len(results) == len(cases), (
        f"rc={kid.returncode} at case {started[-1] if started else None}: {err[-500:]}")
    problems = [(c, r) for c, r in zip(cases, results)
                if r[0] != "FileError" or r[2] != c[0]]
    assert problems == []
