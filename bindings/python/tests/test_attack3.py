"""Adversarial tests of the Python bindings, third round (attack3):

1. a worker fenced by a watchdog while SIGSTOPped registers again, as it is told to: the
   collection of its old, fenced `Registration` must not undo the new one;
2. a fenced `Registration` must never act for a later registration of its slot (its
   `mark`/`beat` keep raising `LostError`, its release leaves the newcomer registered);
3. `sem.acquire(timeout=...)` with a timeout below the 20 ms reclaim period, and a dead
   holder's permit (the same call on a `Lease` and an `Elector` takes a dead holder's
   claim at once);
4. Ctrl-C racing the hand-over of a blocking `lock()` inside a `with` block, at random
   moments across many rounds: whenever the interrupted process is idle, it holds nothing;
5. asyncio timeouts and cancellations expiring at the moment another process releases:
   the waiter that gave up leaves nothing claimed, and a second waiter is still woken;
6. two event loops in two threads and a blocking thread of one process, and a second
   process, contending for one lease: no lost wake-up, no overlap, no lost increment;
7. every call on a released guard, permit, registration or stepped-down term raises a
   `cxc` exception or answers, never a Rust panic (`PanicException`);
8. a thread waiting in `lead.wait_lost()` while the work loop stops renewing learns of
   the loss at about `grace`, and a standby process takes over;
9. `el.leader()` is `None` once the leader process is SIGKILLed or SIGSTOPped past
   `grace` (no standby);
10. two watchdog processes racing to reclaim the in-flight bits of SIGKILLed worker
    processes: each bit is taken exactly once;
11. `multiprocessing` 'fork' children started while the parent's async waiters are
    pending: their own async waits are woken, the parent's complete.

Each test cites what of docs/python.md (or of the doc of the primitive it wraps) it
checks. Tests 1-3 failed before their fixes (the `Registration` acted for its slot rather
than for the registration it made; a blocked `acquire` looked for dead holders only after
20 ms of waiting)."""

import asyncio
import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

import cxc
from conftest import kill_all as _kill, read_line
from conftest import outcome as _outcome
from conftest import permit_holders, python_child, until


def _until(pred, timeout=5.0, step=0.005):
    return until(pred, timeout, step)


def _line(proc, timeout=10.0):
    return read_line(proc, timeout)


def _fence(table, wd, slot):
    """Scans with `wd` until `slot` is reported, then reclaims it; the bits taken."""
    for _ in range(200):
        if any(s == slot for s, _, _ in wd.scan()):
            return wd.reclaim(slot)
        time.sleep(0.005)
    pytest.fail(f"slot {slot} never reported by the watchdog")


# ---------------------------------------------------------------------------------------
# 1, 2. Heartbeat registrations after a fence

_REJOINING_WORKER = r"""
import sys, time, cxc
table = cxc.HeartbeatTable(sys.argv[1], 4)
me = table.join()
me.mark(1)
print("joined", me.slot, flush=True)
while True:
    try:
        me.beat()
    except cxc.LostError:
        break
    time.sleep(0.005)
# fenced: "stop and register again" (docs/heartbeat.md); the old object is dropped here
me = table.join()
print("rejoined", me.slot, flush=True)
beats = lost = 0
end = time.monotonic() + 0.6
try:
    me.mark(2)
    while time.monotonic() < end:
        me.beat()
        beats += 1
        time.sleep(0.005)
except cxc.LostError:
    lost += 1
print("result", beats, lost, repr(table.snapshot(me.slot)), flush=True)
"""


# docs/python.md, API table: "`Registration` | `slot`, `in_flight`, `beat()`, `mark(bit)`,
# `clear(bit)` (bits 0..63; `LostError` once fenced), `release()`, context manager";
# docs/heartbeat.md: "a worker declared dead is fenced and told so (H3), and dead slots
# are reused (H4)", and the Rust `Registration::beat`: "`Fenced` if a watchdog declared
# this worker dead: stop and register again". A worker that was SIGSTOPped long enough to
# be fenced does exactly that when it resumes (`me = table.join()`); its new registration
# must then work: it beats without `LostError` and its slot shows it.
# Failed before the fix: the binding's `Registration` acts through the table handle's per-slot owner
# word (`HeartbeatTable::beat/unregister(slot)`), not the owner word of the registration
# it made (the Rust guard's `beat_owned`/`unregister_owned`). The new registration
# reuses the fenced slot; assigning it to `me` drops the old object, whose `Drop`
# unregisters the slot -- the new registration -- and every later beat raises LostError.
def test_rejoin_after_fence_is_not_undone_by_the_old_registration(tmp_path):
    path = tmp_path / "w.hb"
    table = cxc.HeartbeatTable(path, 4)
    wd = cxc.Watchdog(table, grace=2)
    kid = python_child(_REJOINING_WORKER, path)
    try:
        line = _line(kid).split()
        assert line[0] == "joined"
        slot = int(line[1])
        for _ in range(5):  # a beating worker is never reported
            assert wd.scan() == []
            time.sleep(0.02)
        kid.send_signal(signal.SIGSTOP)
        assert _fence(table, wd, slot) == 1 << 1
        kid.send_signal(signal.SIGCONT)
        assert _line(kid).split()[0] == "rejoined"
        # the watchdog goes on scanning while the worker beats
        reclaimed = []
        end = time.monotonic() + 5
        while kid.poll() is None and time.monotonic() < end:
            for s, _, _ in wd.scan():
                reclaimed.append((s, wd.reclaim(s)))
            time.sleep(0.02)
        out = _line(kid)
    finally:
        kid.send_signal(signal.SIGCONT)
        _kill([kid])
    result = out.split(maxsplit=3)
    assert result[0] == "result", out
    beats, lost, snap = int(result[1]), int(result[2]), result[3]
    assert lost == 0 and beats > 10, (
        f"after registering again the worker beat {beats} times, then LostError "
        f"({lost}); its slot: {snap}; the watchdog reclaimed {reclaimed}")


# docs/python.md, API table (as above): "`LostError` once fenced". A fenced registration
# stays fenced: when another worker of the same process (thread B) registers and gets the
# freed slot, the fenced one (thread A, resuming) must keep raising `LostError` on
# `mark`/`beat`, must not report B's bits as its own, and leaving its `with` block must
# not unregister B.
# Failed before the fix: as above, the fenced Registration acts through the handle's current owner word
# of the slot, which is B's: A's `mark(5)` succeeds and sets bit 5 in B's slot, and A's
# release unregisters B (B's next beat raises LostError).
def test_fenced_registration_never_acts_for_a_later_one_in_its_slot(tmp_path):
    table = cxc.HeartbeatTable(tmp_path / "w.hb", 2)
    wd = cxc.Watchdog(table, grace=1)
    res = {}
    a_fenced, b_joined, a_done = threading.Event(), threading.Event(), threading.Event()
    b = {}

    def worker_a():
        with table.join() as me:
            me.mark(3)
            res["a.slot"] = me.slot
            a_fenced.wait(10)
            res["a.beat"] = _outcome(me.beat)
            b_joined.wait(10)
            res["a.mark_after_b"] = _outcome(lambda: me.mark(5))
            res["a.beat_after_b"] = _outcome(me.beat)
            res["a.in_flight"] = me.in_flight
        a_done.set()

    def worker_b():
        b_joined.wait(10)  # (joined by the main thread, below, for a known order)
        a_done.wait(10)
        reg = b["reg"]
        res["b.beat"] = _outcome(reg.beat)
        res["b.snapshot"] = table.snapshot(reg.slot)
        res["b.in_flight"] = reg.in_flight
        reg.release()

    ta, tb = threading.Thread(target=worker_a), threading.Thread(target=worker_b)
    ta.start()
    tb.start()
    assert _until(lambda: "a.slot" in res)
    assert _fence(table, wd, res["a.slot"]) == 1 << 3
    a_fenced.set()
    assert _until(lambda: "a.beat" in res)
    b["reg"] = table.join()
    b_joined.set()
    ta.join(10)
    tb.join(10)
    assert res["a.beat"] == "LostError"
    reused = b["reg"].slot == res["a.slot"]
    assert reused, "the freed slot was not reused (the scenario did not happen)"
    want = {"a.mark_after_b": "LostError", "a.beat_after_b": "LostError",
            "a.in_flight": 0, "b.beat": "ok:None", "b.in_flight": 0}
    got = {k: res[k] for k in want}
    snap = res["b.snapshot"]
    assert got == want and snap is not None and snap[0] == os.getpid() and not snap[3], (
        f"fenced A, then B registered in its slot: {got}; B's slot (pid, epoch, bits, "
        f"fenced): {snap}")


# ---------------------------------------------------------------------------------------
# 3. A short acquire timeout and a dead holder's permit

# docs/python.md, API table: "`sem.acquire(timeout=None)`, `sem.try_acquire()` ... when no
# permit is free, `try_acquire` first returns dead holders' permits to the pool (at most
# every 20 ms per handle), as a blocked `acquire` does"; "every `timeout=` | ... a
# negative one does not wait". `lease.lock(timeout=0)` and `el.campaign(timeout=0)` take
# a SIGKILLed holder's claim at once (checked here too); `sem.acquire(timeout=t)` must
# not be weaker than `try_acquire()`: with a dead holder's permit to take it must not
# raise `Timeout`, whatever `t`.
# Failed before the fix: `Semaphore.acquire` tries once without reclaiming, then calls the Rust
# `acquire_timeout(t)`, whose first reclaim comes 20 ms into the wait: every timeout below
# 20 ms (0, negative, 5 ms, 15 ms) raises Timeout, repeated polls never get the permit
# back, and `try_acquire()` right after gets it.
def test_short_acquire_timeout_takes_a_dead_holders_permit(tmp_path):
    # the lease and the election: a dead holder's claim is taken at once (holds)
    lpath, epath = tmp_path / "a.lease", tmp_path / "e.elect"
    lease, el = cxc.Lease(lpath, grace=30), cxc.Elector(epath, grace=30)
    code = ("import sys, time, cxc; g = cxc.Lease(sys.argv[1], grace=30).lock(timeout=5); "
            "l = cxc.Elector(sys.argv[2], grace=30).campaign(timeout=5); "
            "print('held', flush=True); time.sleep(60)")
    kid = python_child(code, lpath, epath)
    try:
        assert _line(kid) == "held"
    finally:
        _kill([kid])
    lease.lock(timeout=0).release()
    el.campaign(timeout=0).step_down()

    outcomes = {}
    for t in (0, -1, 0.005, 0.015):
        sem, kids = permit_holders(str(tmp_path / f"s{t}.sem"), 1)
        _kill(kids)
        got = []
        for _ in range(5):  # a poller: acquire(timeout=t) every 30 ms
            try:
                got.append(sem.acquire(timeout=t))
                break
            except cxc.Timeout:
                time.sleep(0.03)
        outcomes[t] = "got" if got else "Timeout x5"
        if not got:
            p = sem.try_acquire()
            outcomes[t] += f", then try_acquire(): {'permit' if p else None}"
            got.append(p)
        for p in got:
            if p is not None:
                p.release()
    assert all(v == "got" for v in outcomes.values()), outcomes


# ---------------------------------------------------------------------------------------
# 4. Ctrl-C racing the hand-over of a blocking lock()

_INTERRUPTIBLE_LOCKER = r"""
import signal, sys, time, cxc
lease = cxc.Lease(sys.argv[1], grace=30)
state = {"in_round": False, "late": False}

def on_sigint(signum, frame):
    # Ctrl-C's KeyboardInterrupt inside a round; one that comes after the round ended
    # is noted (the parent sends exactly one a round), so it never hits the reporting.
    if state["in_round"]:
        raise KeyboardInterrupt
    state["late"] = True

signal.signal(signal.SIGINT, on_sigint)
print("ready", flush=True)
while sys.stdin.readline():
    state["late"] = False
    try:
        state["in_round"] = True
        with lease.lock(timeout=5) as g:
            g.write(b"child")
        state["in_round"] = False
        res = "got"
    except KeyboardInterrupt:
        state["in_round"] = False
        res = "int"
    except cxc.Timeout:
        state["in_round"] = False
        res = "timeout"
    if res == "got":
        end = time.monotonic() + 5
        while not state["late"] and time.monotonic() < end:
            time.sleep(0.001)
    print(res, flush=True)
"""


# docs/python.md, *Blocking, the GIL and Ctrl-C*: "Ctrl-C (`KeyboardInterrupt`) interrupts
# a blocking `lock()` ... and leaves nothing claimed"; "dropping it (timeout, signal)
# leaves no claim". Sent at random moments around the release that hands the lease to
# the blocked `with lease.lock() as g:` -- before the hand-over, inside it, inside the
# `with` block or its `__exit__` -- the interrupted process must never keep the lease:
# each time it is idle again, another process takes the lease at once.
def test_ctrl_c_racing_the_hand_over_leaves_nothing_claimed(tmp_path):
    path = tmp_path / "a.lease"
    lease = cxc.Lease(path, grace=30)
    kid = subprocess.Popen([sys.executable, "-u", "-c", _INTERRUPTIBLE_LOCKER, str(path)],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    rng = random.Random(int(os.environ.get("CXC_SEED", time.time_ns())))
    counts = {"got": 0, "int": 0}
    leaks = []
    g = lease.lock(timeout=5)
    try:
        assert _line(kid) == "ready"
        end = time.monotonic() + 25
        rounds = 0
        while rounds < 100 and time.monotonic() < end:
            rounds += 1
            kid.stdin.write("go\n")
            kid.stdin.flush()
            time.sleep(rng.uniform(0.005, 0.02))  # (let it block: part of the race)
            # SIGINT from 1.5 ms before the release to 1.5 ms after it
            d = rng.uniform(-0.0015, 0.0015)
            first, then = ((g.release, lambda: kid.send_signal(signal.SIGINT)) if d >= 0
                           else (lambda: kid.send_signal(signal.SIGINT), g.release))
            first()
            spin_until = time.perf_counter() + abs(d)
            while time.perf_counter() < spin_until:
                pass
            then()
            res = _line(kid)
            assert res in counts, (res, kid.stderr.read() if kid.poll() is not None else "")
            counts[res] += 1
            g = lease.try_lock()  # the child is idle now: it must hold nothing
            if g is None:
                leaks.append((rounds, res))
                g = lease.lock(timeout=5)
        kid.stdin.close()
        kid.wait(10)
    finally:
        g.release()
        _kill([kid])
    assert leaks == [], f"the idle interrupted child held the lease after rounds {leaks}"
    assert counts["int"] >= 5 and counts["got"] >= 5, (
        f"the race was not exercised both ways: {counts}")


# ---------------------------------------------------------------------------------------
# 5. asyncio waits given up at the moment of a cross-process release

_STDIN_HOLDER = r"""
import sys, cxc
lease = cxc.Lease(sys.argv[1], grace=30)
sem = cxc.Semaphore(sys.argv[2], 1)
for cmd in sys.stdin:
    cmd = cmd.strip()
    if cmd == "hold":
        g, p = lease.lock(timeout=10), sem.acquire(timeout=10)
        print("held", flush=True)
    elif cmd == "release":
        g.release()
        p.release()
"""


# docs/python.md, *asyncio*: "`timeout=` is a `loop.call_later` that drops the Rust future
# and fails the `asyncio.Future` with `cxc.Timeout`; `asyncio.wait_for(...)` around the
# call works as a cancellation"; "Cancellation: ... if the guard or permit had been handed
# over just before the cancellation, releases it"; "The future's `Waker` is called by
# the reactor thread when the lease may be claimable (a release ...)". A waiter whose
# timeout or cancellation falls at the moment another process releases must leave
# nothing claimed -- and a second waiter of the same process must still be woken by that
# release (a hand-over passed to the waiter that gave up must not be lost).
@pytest.mark.parametrize("how", ["timeout", "cancel", "wait_for"])
def test_async_give_up_at_the_release_loses_no_wake_up(tmp_path, how):
    lpath, spath = tmp_path / "a.lease", tmp_path / "s.sem"
    lease, sem = cxc.Lease(lpath, grace=30), cxc.Semaphore(spath, 1)
    kid = subprocess.Popen([sys.executable, "-u", "-c", _STDIN_HOLDER, str(lpath),
                            str(spath)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    rng = random.Random(int(os.environ.get("CXC_SEED", time.time_ns())))
    problems = []
    outcomes = {"quitter got it": 0, "quitter gave up": 0}

    def send(cmd):
        kid.stdin.write(cmd + "\n")
        kid.stdin.flush()

    async def round_(i, obj, wait):
        send("hold")
        assert _line(kid) == "held"
        giving_up = 0.03
        if how == "timeout":
            quitter = asyncio.create_task(wait(timeout=giving_up))
        else:
            quitter = asyncio.create_task(wait())
        second = asyncio.create_task(wait(timeout=5))
        await asyncio.sleep(0.005)
        t0 = time.monotonic()
        # the release lands within +-2 ms of the moment the first waiter gives up
        loop = asyncio.get_running_loop()
        loop.call_later(giving_up - 0.005 + rng.uniform(-0.002, 0.002), send, "release")
        if how == "cancel":
            loop.call_later(giving_up - 0.005, quitter.cancel)
        if how == "wait_for":
            quitter = asyncio.create_task(asyncio.wait_for(quitter, giving_up - 0.005))
        try:
            (await quitter).release()
            outcomes["quitter got it"] += 1
        except (cxc.Timeout, asyncio.TimeoutError, asyncio.CancelledError):
            outcomes["quitter gave up"] += 1
        try:
            (await second).release()
        except cxc.Timeout:
            problems.append((i, "the second waiter was never woken",
                             round(time.monotonic() - t0, 3)))
        if cxc.async_waiters() != 0:
            problems.append((i, "waiters left", cxc.async_waiters()))
        probe = obj.try_lock() if isinstance(obj, cxc.Lease) else obj.try_acquire()
        if probe is None:
            problems.append((i, "claimed after both waiters are done"))
        else:
            probe.release()

    async def main():
        for i in range(25):
            await round_(i, lease, lease.lock_async)
            await round_(i, sem, sem.acquire_async)

    try:
        asyncio.run(asyncio.wait_for(main(), 50))
    finally:
        kid.stdin.close()
        _kill([kid])
    assert problems == [], (problems, outcomes)
    assert outcomes["quitter gave up"] >= 5, outcomes


# ---------------------------------------------------------------------------------------
# 6. Two event loops, a blocking thread and another process on one lease

_CONTENDER = r"""
import sys, cxc
lease = cxc.Lease(sys.argv[1], grace=30)
for _ in range(int(sys.argv[2])):
    with lease.lock(timeout=30) as g:
        try:
            raw = g.read()
        except cxc.InconsistentError:
            g.acknowledge_inconsistent()
            raw = g.read()
        g.write((int.from_bytes(raw[:8], "little") + 1).to_bytes(8, "little"))
print("done", flush=True)
"""


# docs/python.md, *asyncio*: the bridge thread "takes the GIL and calls
# `loop.call_soon_threadsafe(waiter._poll)`" for each waiter's own loop; "Threads: the
# reactor, its death watch and the bridge -- three per process in all, however many
# waiters"; *Blocking*: `Lease.lock` "polls the Rust owned lock future ... parking the
# thread between wake-ups: the process's cxc reactor thread wakes it". One process with
# two event loops in two threads and a thread in blocking `lock()` on the same `Lease`
# handle, plus another process, all incrementing the payload: every increment lands
# (none lost, none doubled), no waiter times out (a lost wake-up would leave an async
# waiter asleep), and nothing stays registered.
def test_two_loops_a_blocking_thread_and_a_process_share_one_lease(tmp_path):
    path = tmp_path / "a.lease"
    lease = cxc.Lease(path, grace=30)
    per = 60
    kid = python_child(_CONTENDER, path, 2 * per)
    inside = [0]
    errors = []

    def bump(g):
        inside[0] += 1
        if inside[0] != 1:
            errors.append(f"{inside[0]} holders at once")
        try:
            raw = g.read()
        except cxc.InconsistentError:
            g.acknowledge_inconsistent()
            raw = g.read()
        g.write((int.from_bytes(raw[:8], "little") + 1).to_bytes(8, "little"))
        inside[0] -= 1

    def loop_thread():
        async def task():
            for _ in range(per):
                g = await lease.lock_async(timeout=20)
                with g:
                    bump(g)
                    await asyncio.sleep(0)

        async def main():
            await asyncio.gather(task(), task())

        try:
            asyncio.run(main())
        except BaseException as e:  # noqa: BLE001
            errors.append(repr(e))

    def blocking_thread():
        try:
            for _ in range(per):
                with lease.lock(timeout=20) as g:
                    bump(g)
        except BaseException as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=loop_thread), threading.Thread(target=loop_thread),
               threading.Thread(target=blocking_thread)]
    t0 = time.monotonic()
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(55)
        assert not any(t.is_alive() for t in threads), "a contender hung"
        assert _line(kid, 30) == "done"
    finally:
        _kill([kid])
    took = time.monotonic() - t0
    assert errors == []
    assert cxc.async_waiters() == 0
    with lease.lock(timeout=5) as g:
        n = int.from_bytes(g.read()[:8], "little")
    assert n == 2 * 2 * per + per + 2 * per, f"counter {n} after {took:.1f} s"


# ---------------------------------------------------------------------------------------
# 7. Calls on released objects

# docs/python.md, API table: `guard.release()` ... "idempotent"; `lead.step_down()` ...
# "idempotent"; `guard.is_current()`, `guard.released` are `bool`; errors are `cxc.Error`
# subclasses (*Errors*). Every call on an object already released must raise a
# `cxc.Error` (or answer), and never surface a Rust panic (`PanicException`, a
# BaseException that `except Exception` does not catch) nor crash the interpreter.
def test_calls_on_released_objects_raise_cxc_errors(tmp_path):
    lease = cxc.Lease(tmp_path / "a.lease", grace=30)
    sem = cxc.Semaphore(tmp_path / "s.sem", 1)
    table = cxc.HeartbeatTable(tmp_path / "t.hb", 2)
    el = cxc.Elector(tmp_path / "e.elect", grace=30)
    g, p, reg, lead = lease.lock(), sem.acquire(), table.join(), el.campaign(timeout=5)
    for x in (g, p, reg):
        x.release()
    lead.step_down()
    calls = {
        "g.read": g.read, "g.write": lambda: g.write(b"x"), "g.beat": g.beat,
        "g.is_current": g.is_current, "g.released": lambda: g.released,
        "g.payload_may_be_inconsistent": lambda: g.payload_may_be_inconsistent,
        "g.acknowledge_inconsistent": g.acknowledge_inconsistent, "g.release": g.release,
        "g.token": lambda: g.token, "g.repr": lambda: repr(g),
        "g.exit": lambda: g.__exit__(None, None, None),
        "p.release": p.release, "p.released": lambda: p.released,
        "p.exit": lambda: p.__exit__(None, None, None), "p.repr": lambda: repr(p),
        "reg.beat": reg.beat, "reg.mark": lambda: reg.mark(1),
        "reg.clear": lambda: reg.clear(1), "reg.release": reg.release,
        "reg.slot": lambda: reg.slot,
        "lead.renew": lead.renew, "lead.is_current": lead.is_current,
        "lead.wait_lost": lambda: lead.wait_lost(timeout=1), "lead.step_down": lead.step_down,
        "lead.stepped_down": lambda: lead.stepped_down, "lead.token": lambda: lead.token,
        "lead.exit": lambda: lead.__exit__(None, None, None), "lead.repr": lambda: repr(lead),
    }
    got = {}
    for name, f in calls.items():
        try:
            got[name] = "ok:" + repr(f())
        except cxc.Error as e:
            got[name] = "cxc." + type(e).__name__
        except BaseException as e:  # noqa: BLE001
            got[name] = "NOT-CXC:" + type(e).__name__
    bad = {k: v for k, v in got.items() if v.startswith("NOT-CXC")}
    assert bad == {}, got
    assert got["g.is_current"] == "ok:False" and got["g.released"] == "ok:True"
    assert got["g.release"] == "ok:None" and got["lead.step_down"] == "ok:None"
    assert got["lead.wait_lost"] == "ok:True" and got["lead.is_current"] == "ok:False"
    assert got["lead.renew"] == "cxc.LostError"
    # the objects gave nothing back twice: the pool and the files are as they should be
    assert sem.available == 1 and table.snapshot(0) is None and el.leader() is None
    assert lease.try_lock() is not None


# ---------------------------------------------------------------------------------------
# 8. wait_lost in a watcher thread while the work loop stops renewing

_STANDBY = r"""
import sys, cxc
el = cxc.Elector(sys.argv[1], grace=float(sys.argv[2]))
print("waiting", flush=True)
lead = el.campaign(timeout=20)
print("leading", lead.token, flush=True)
lead.step_down()
"""


# docs/python.md, *Leader election*: "a leader that stops renewing for longer than `grace`
# loses the term even while its process lives"; API table: "`lead.wait_lost(timeout=None)`
# | blocks until the term is lost (`True`)", and docs/leader-election.md: `wait_lost`
# "blocks until the term is lost (superseded, or its local deadline passed)". The watcher
# pattern -- a thread in `wait_lost()` to stop the work when the term ends -- must see a
# term that the (stuck) work loop stopped renewing end at about `grace`: not before, not
# much later; a standby process then leads with a larger token.
def test_wait_lost_thread_sees_an_unrenewed_term_end(tmp_path):
    path, grace = tmp_path / "e.elect", 0.5
    el = cxc.Elector(path, grace=grace)
    lead = el.campaign(timeout=5)
    standby = python_child(_STANDBY, path, grace)
    try:
        assert _line(standby) == "waiting"
        for _ in range(10):  # a healthy work loop: renewing, the term holds
            lead.renew()
            time.sleep(grace / 5)
        assert lead.is_current()
        res = []
        t_last = time.monotonic()
        lead.renew()
        watcher = threading.Thread(
            target=lambda: res.append((lead.wait_lost(timeout=10), time.monotonic())))
        watcher.start()
        # the work loop is stuck from here on (no renew)
        watcher.join(15)
        line = _line(standby).split()
    finally:
        _kill([standby])
    assert res and res[0][0] is True, "wait_lost() did not see the term end"
    after = res[0][1] - t_last
    assert 0.6 * grace <= after < grace + 1.5, f"wait_lost returned {after:.3f} s after " \
        f"the last renew (grace {grace})"
    assert line[0] == "leading" and int(line[1]) > lead.token
    with pytest.raises(cxc.LostError):
        lead.renew()
    assert not lead.is_current()


# ---------------------------------------------------------------------------------------
# 9. leader() after the leader died or went stale

_LEADER = r"""
import sys, time, cxc
el = cxc.Elector(sys.argv[1], grace=float(sys.argv[2]))
lead = el.campaign(timeout=10)
print("leading", lead.token, flush=True)
while True:
    lead.renew()
    time.sleep(0.02)
"""


# docs/python.md, API table: "`el.leader()` | `(identity, token)` of the current leader,
# or `None`"; docs/leader-election.md: `observe()` is "`None` when nobody leads, also once
# the last leader's lease ran out or its process is gone and before anyone takes over".
# With no standby, an observer must stop naming a leader that was SIGKILLed (at once) or
# SIGSTOPped (once `grace` passed).
@pytest.mark.parametrize("sig", ["SIGKILL", "SIGSTOP"])
def test_leader_is_none_once_the_leader_is_dead_or_stale(tmp_path, sig):
    path, grace = tmp_path / "e.elect", 0.5
    observer = cxc.Elector(path, grace=grace, identity="observer")
    kid = python_child(_LEADER, path, grace)
    try:
        line = _line(kid).split()
        assert line[0] == "leading"
        token = int(line[1])
        assert observer.leader() == (f"py:{kid.pid}", token)
        time.sleep(0.1)
        assert observer.leader() == (f"py:{kid.pid}", token), "a renewing leader"
        kid.send_signal(getattr(signal, sig))
        t0 = time.monotonic()
        if sig == "SIGKILL":
            kid.wait(5)
            assert _until(lambda: observer.leader() is None, 2.0), observer.leader()
        else:
            assert _until(lambda: observer.leader() is None, grace + 2.0), observer.leader()
            took = time.monotonic() - t0
            assert took >= 0.6 * grace - 0.1, f"a live leader unnamed after {took:.3f} s"
    finally:
        kid.send_signal(signal.SIGCONT)
        _kill([kid])


# ---------------------------------------------------------------------------------------
# 10. Two watchdog processes reclaiming killed workers' bits

_HB_WORKER = r"""
import sys, time, cxc
table = cxc.HeartbeatTable(sys.argv[1], 16)
me = table.join()
for b in map(int, sys.argv[2].split(",")):
    me.mark(b)
print("marked", me.slot, flush=True)
while True:
    me.beat()
    time.sleep(0.01)
"""

_HB_WATCHDOG = r"""
import json, sys, time, cxc
table = cxc.HeartbeatTable(sys.argv[1], 16)
wd = cxc.Watchdog(table, grace=int(sys.argv[2]))
print("ready", flush=True)
taken = []
end = time.monotonic() + float(sys.argv[3])
while time.monotonic() < end:
    for slot, pid, bits in wd.scan():
        got = wd.reclaim(slot)
        if got:
            taken.append([slot, pid, got])
    time.sleep(0.05)  # (each scan is an epoch: grace 3 is 3 scans)
print(json.dumps(taken), flush=True)
"""


# docs/python.md, API table: "`Watchdog(table, grace=3)` | `scan()` -> `[(slot, pid,
# in_flight)]`, `reclaim(slot)` -> bits taken", and the example's "`taken =
# wd.reclaim(slot)` # exactly once across watchdogs". Two watchdog processes scan the same
# table while worker processes (each with its own bits in flight) are SIGKILLed: every
# killed worker's bits are taken, each bit by exactly one watchdog; no live worker's.
def test_two_watchdog_processes_reclaim_each_bit_exactly_once(tmp_path):
    path = tmp_path / "w.hb"
    cxc.HeartbeatTable(path, 16)
    n = 8
    bits = {i: [i * 8 + j for j in range(1 + i % 4)] for i in range(n)}
    workers = [python_child(_HB_WORKER, path, ",".join(map(str, bits[i]))) for i in range(n)]
    wds = []
    try:
        for w in workers:
            assert _line(w).split()[0] == "marked"
        wds = [python_child(_HB_WATCHDOG, path, 3, 6) for _ in range(2)]
        for w in wds:
            assert _line(w) == "ready"
        killed = {}
        for i in range(0, n, 2):  # half of them die, one by one
            workers[i].kill()
            workers[i].wait()
            killed[workers[i].pid] = bits[i]
            time.sleep(0.1)
        results = [json.loads(_line(w, 20)) for w in wds]
    finally:
        _kill(workers + wds)
    taken = {}
    double = []
    for res in results:
        for slot, pid, got in res:
            for b in range(64):
                if got >> b & 1:
                    if (pid, b) in taken:
                        double.append((pid, b))
                    taken[(pid, b)] = slot
    want = {(pid, b) for pid, bs in killed.items() for b in bs}
    assert double == [], f"bits taken twice: {double}"
    assert set(taken) == want, (
        f"taken {sorted(taken)} vs the killed workers' bits {sorted(want)}")


# ---------------------------------------------------------------------------------------
# 11. multiprocessing 'fork' children started while the parent's async waiters are pending

_FORK = multiprocessing.get_context("fork")

_HOLD_BOTH = r"""
import sys, cxc
lease = cxc.Lease(sys.argv[1], grace=30)
sem = cxc.Semaphore(sys.argv[2], 1)
g, p = lease.lock(timeout=10), sem.acquire(timeout=10)
print("held", flush=True)
sys.stdin.readline()
g.release()
p.release()
sys.stdin.readline()
"""


def _forked_async_child(lpath, spath, q):
    lease, sem = cxc.Lease(lpath, grace=30), cxc.Semaphore(spath, 1)

    async def main():
        t0 = time.monotonic()
        r = {"waiters_at_start": cxc.async_waiters()}
        for name, wait in (("lease", lease.lock_async), ("sem", sem.acquire_async)):
            try:
                x = await wait(timeout=8)
                r[name] = round(time.monotonic() - t0, 3)
                x.release()
            except BaseException as e:  # noqa: BLE001
                r[name] = type(e).__name__
        r["waiters_at_end"] = cxc.async_waiters()
        return r

    q.put(asyncio.run(main()))


# docs/python.md, *asyncio*: "A child made by `fork` starts a bridge thread of its own on
# its first wake-up (it inherits the parent's sender but not its thread)"; `async_waiters()`
# counts the waiters "registered with this process's reactor". An asyncio program starts
# `multiprocessing` 'fork' children while 10 of its own waiters are pending: each child
# counts 0 waiters of its own at first, its own `lock_async`/`acquire_async` are woken by
# the holder's release (not by their timeout), and the parent's pending waiters all
# complete too.
def test_fork_children_started_while_async_waiters_are_pending(tmp_path):
    lpath, spath = str(tmp_path / "a.lease"), str(tmp_path / "s.sem")
    lease, sem = cxc.Lease(lpath, grace=30), cxc.Semaphore(spath, 1)
    holder = subprocess.Popen([sys.executable, "-u", "-c", _HOLD_BOTH, lpath, spath],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    kids = []

    async def main():
        assert _line(holder) == "held"
        mine = [asyncio.create_task(lease.lock_async(timeout=15)) for _ in range(5)]
        mine += [asyncio.create_task(sem.acquire_async(timeout=15)) for _ in range(5)]
        await asyncio.sleep(0.1)
        pending = cxc.async_waiters()
        q = _FORK.Queue()
        kids.extend(_FORK.Process(target=_forked_async_child, args=(lpath, spath, q))
                    for _ in range(3))
        for k in kids:
            k.start()
        await asyncio.sleep(0.3)
        released_at = time.monotonic()
        holder.stdin.write("\n")
        holder.stdin.flush()
        for t in mine:
            (await t).release()
        mine_took = time.monotonic() - released_at
        results = [await asyncio.get_running_loop().run_in_executor(None, q.get, True, 20)
                   for _ in kids]
        return pending, mine_took, results

    try:
        pending, mine_took, results = asyncio.run(main())
        for k in kids:
            k.join(10)
    finally:
        for k in kids:
            if k.is_alive():
                k.kill()
                k.join()
        _kill([holder])
    assert pending == 10 and mine_took < 5
    assert [k.exitcode for k in kids] == [0, 0, 0]
    for r in results:
        assert r["waiters_at_start"] == 0 and r["waiters_at_end"] == 0, results
        # woken by the release (0.3 s after the start), long before the 8 s timeout
        assert isinstance(r["lease"], float) and r["lease"] < 4, results
        assert isinstance(r["sem"], float) and r["sem"] < 4, results
    assert cxc.async_waiters() == 0 and sem.available == 1
    assert lease.try_lock() is not None
