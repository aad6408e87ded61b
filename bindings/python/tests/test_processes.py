"""Several processes on one file: SIGKILLed holders, a Rust process, Ctrl-C."""

import os
import random
import signal
import subprocess
import sys
import time

import pytest

import cxc
from conftest import interrupt_waiting_child, permit_holders, python_child

# A worker: takes the lease, increments the 8-byte counter in its payload, and logs the
# value it is about to publish ("w V") and the value it published ("d V"), until it has
# `goal` published increments (counted over its incarnations in the same log).
WORKER = r"""
import os, sys, time, cxc
path, log, goal = sys.argv[1], sys.argv[2], int(sys.argv[3])
done = 0
if os.path.exists(log):
    done = sum(1 for l in open(log) if l.startswith("d "))
lease = cxc.Lease(path)
out = open(log, "a", buffering=1)
while done < goal:
    with lease.lock(timeout=30) as g:
        try:
            raw = g.read()
        except cxc.InconsistentError:
            g.acknowledge_inconsistent()
            raw = g.read()
        n = int.from_bytes(raw[:8], "little") + 1
        out.write(f"w {n}\n")
        time.sleep(0.0005)
        g.write(n.to_bytes(8, "little"))
        out.write(f"d {n}\n")
        done += 1
    time.sleep(0.0005)
"""


def test_killed_counter_no_lost_or_doubled_increment(tmp_path):
    path = tmp_path / "counter.lease"
    cxc.Lease(path)
    goal, workers = 500, 4
    logs = [tmp_path / f"w{i}.log" for i in range(workers)]
    procs = [python_child(WORKER, path, log, goal) for log in logs]
    rng = random.Random(int(os.environ.get("CXC_SEED", time.time_ns())))
    kills = 0
    deadline = time.monotonic() + 90
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(rng.uniform(0.05, 0.25))
        alive = [i for i, p in enumerate(procs) if p.poll() is None]
        if alive and kills < 12:
            i = rng.choice(alive)
            procs[i].send_signal(signal.SIGKILL)
            procs[i].wait()
            kills += 1
            procs[i] = python_child(WORKER, path, logs[i], goal)
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
    assert kills >= 3

    published, ambiguous = [], []
    for log in logs:
        lines = [l.split() for l in log.read_text().splitlines() if l.strip()]
        ds = [int(v) for k, v in lines if k == "d"]
        assert len(ds) == goal
        published += ds
        # a "w" without its "d": the process was killed between deciding and logging
        pending = [int(v) for k, v in lines if k == "w"]
        ambiguous += sorted(set(pending) - set(ds))
    assert len(published) == len(set(published)), "a doubled increment"
    with cxc.Lease(path).lock() as g:
        try:
            final = int.from_bytes(g.read()[:8], "little")
        except cxc.InconsistentError:
            g.acknowledge_inconsistent()
            final = int.from_bytes(g.read()[:8], "little")
    # Every value 1..final was published exactly once: by a logged "d", or by a killed
    # worker whose write landed before its log line (at most one per kill).
    seen = set(published) | {v for v in ambiguous if v <= final}
    assert max(published) <= final
    assert seen == set(range(1, final + 1)), "a lost increment"
    assert final - workers * goal <= kills
    print(f"\n{kills} kills, final counter {final}, {len(ambiguous)} ambiguous")


HOLD = r"""
import sys, time, cxc
lease = cxc.Lease(sys.argv[1])
with lease.lock() as g:
    print("held", g.token, flush=True)
    end = time.monotonic() + float(sys.argv[2])
    while time.monotonic() < end:
        g.beat()
        time.sleep(0.05)
print("released", flush=True)
"""


def test_rust_and_python_exclude_each_other(tmp_path, lease_hold):
    path = tmp_path / "shared.lease"
    lease = cxc.Lease(path)
    # Rust holds: Python cannot take it until Rust releases.
    rust = subprocess.Popen([lease_hold, str(path), "hold", "0.6"], stdout=subprocess.PIPE, text=True)
    assert rust.stdout.readline().startswith("held")
    assert lease.try_lock() is None
    with pytest.raises(TimeoutError):
        lease.lock(timeout=0.1)
    t0 = time.monotonic()
    with lease.lock(timeout=5) as g:
        assert rust.stdout.readline().strip() == "released"
        assert time.monotonic() - t0 > 0.2
        r = subprocess.run([lease_hold, str(path), "try"], capture_output=True, text=True)
        assert r.stdout.strip() == "busy"
        g.write(b"from python")
    rust.wait(timeout=5)
    # Python (another process) holds: Rust is busy, then gets it after.
    py = python_child(HOLD, path, 0.4)
    assert py.stdout.readline().startswith("held")
    r = subprocess.run([lease_hold, str(path), "try"], capture_output=True, text=True)
    assert r.stdout.strip() == "busy"
    assert py.stdout.readline().strip() == "released"
    py.wait(timeout=5)
    r = subprocess.run([lease_hold, str(path), "try"], capture_output=True, text=True)
    assert r.stdout.startswith("got")


def test_killed_holder_releases_lease(tmp_path):
    path = tmp_path / "a.lease"
    lease = cxc.Lease(path, grace=30)
    py = python_child(HOLD, path, 60)
    assert py.stdout.readline().startswith("held")
    assert lease.try_lock() is None
    py.send_signal(signal.SIGKILL)
    t0 = time.monotonic()
    with lease.lock(timeout=5):
        pass
    assert time.monotonic() - t0 < 1.0, "taken over long before the 30 s grace"
    py.wait()


def test_semaphore_permits_return_after_sigkill(tmp_path):
    sem, kids = permit_holders(tmp_path / "pool.sem", 3)
    assert sem.available == 0
    assert sem.try_acquire() is None
    for k in kids:
        k.send_signal(signal.SIGKILL)
        k.wait()
    t0 = time.monotonic()
    permits = [sem.acquire(timeout=5) for _ in range(3)]
    assert time.monotonic() - t0 < 2.0
    for p in permits:
        p.release()
    assert sem.available == 3


WAITER = r"""
import sys, cxc
lease = cxc.Lease(sys.argv[1])
print("waiting", flush=True)
try:
    lease.lock()
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(3)
"""


def test_ctrl_c_interrupts_blocking_lock(tmp_path):
    path = tmp_path / "a.lease"
    lease = cxc.Lease(path)
    with lease.lock():
        out, code = interrupt_waiting_child(WAITER, path, "waiting")
        assert code == 3 and "interrupted" in out
