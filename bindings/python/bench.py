"""Uncontended lock+release: cxc.Lease against filelock.FileLock, multiprocessing.Lock,
fcntl.flock (and portalocker if installed); cxc.Semaphore acquire+release against
multiprocessing.Semaphore (and posix_ipc semaphores if installed).

python bench.py [--json OUT] [--n N]; prints two Markdown tables (median of 5 rounds,
nanoseconds per lock+release, every row measured in the same run).
"""

import argparse
import asyncio
import fcntl
import json
import multiprocessing
import os
import platform
import statistics
import tempfile
import time

import cxc

FILELOCK = "filelock.FileLock: `with lock`"
SEM_FIRST = "cxc.Semaphore(1): `with sem.acquire()`"
POSIX_IPC = "posix_ipc.Semaphore: `acquire(); release()`"


def per_op(fn, n, rounds=5):
    fn(max(n // 10, 100))  # warm up
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        fn(n)
        samples.append((time.perf_counter_ns() - t0) / n)
    return statistics.median(samples)


def entered(lock):
    """A benchmark body: `with lock: pass`, n times."""

    def body(n):
        for _ in range(n):
            with lock:
                pass

    return body


def cases(d):
    lease = cxc.Lease(os.path.join(d, "b.lease"))

    def cxc_lease_with(n):
        for _ in range(n):
            with lease.lock():
                pass

    def cxc_lease_try(n):
        for _ in range(n):
            lease.try_lock().release()

    def cxc_lease_async(n):
        async def loop():
            for _ in range(n):
                (await lease.lock_async()).release()

        asyncio.run(loop())

    yield "cxc.Lease: `with lease.lock()`", cxc_lease_with
    yield "cxc.Lease: `try_lock().release()`", cxc_lease_try
    yield "cxc.Lease: `(await lease.lock_async()).release()` (incl. asyncio.run)", cxc_lease_async

    try:
        import filelock

        fl = filelock.FileLock(os.path.join(d, "b.filelock"))

        yield FILELOCK, entered(fl)
    except ImportError:
        pass

    f = open(os.path.join(d, "b.flock"), "w")

    def flock(n):
        fd = f.fileno()
        for _ in range(n):
            fcntl.flock(fd, fcntl.LOCK_EX)
            fcntl.flock(fd, fcntl.LOCK_UN)

    yield "fcntl.flock on an open file (no lock object)", flock

    mp = multiprocessing.Lock()

    yield "multiprocessing.Lock (related processes only)", entered(mp)

    try:
        import portalocker

        def pl(n):
            for _ in range(n):
                with portalocker.Lock(os.path.join(d, "b.portalocker")):
                    pass

        yield "portalocker.Lock: `with lock`", pl
    except ImportError:
        pass

    sem = cxc.Semaphore(os.path.join(d, "b.sem"), 1)

    def cxc_sem(n):
        for _ in range(n):
            with sem.acquire():
                pass

    yield SEM_FIRST, cxc_sem

    mps = multiprocessing.Semaphore(1)

    yield "multiprocessing.Semaphore(1) (related processes only)", entered(mps)

    try:
        import posix_ipc

        ps = posix_ipc.Semaphore(f"/cxc-bench-{os.getpid()}", posix_ipc.O_CREX, initial_value=1)
        ps.unlink()  # the open handle stays usable

        def pipc(n):
            for _ in range(n):
                ps.acquire()
                ps.release()

        yield POSIX_IPC, pipc
    except ImportError:
        pass


def run(n=20000):
    rows = {}
    with tempfile.TemporaryDirectory() as d:
        for name, fn in cases(d):
            # filelock and portalocker open and close a file per acquisition: fewer rounds.
            k = n // 10 if ("filelock" in name or "portalocker" in name) else n
            rows[name] = per_op(fn, max(k, 100))
    return rows


def table(rows, names, base_name, what):
    base = rows.get(base_name)
    print(f"| {what} | ns/op | vs {base_name.split(':')[0]} |")
    print("|---|---:|---:|")
    for name in names:
        ns = rows[name]
        ratio = f"{base / ns:,.1f}x" if base else "-"
        print(f"| {name} | {ns:,.0f} | {ratio} |")
    print()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--n", type=int, default=20000)
    a = ap.parse_args()
    rows = run(a.n)
    print(f"Python {platform.python_version()}, {os.cpu_count()} CPUs; ns per operation, median of 5 rounds\n")
    sems = [x for x in rows if "Semaphore" in x]
    table(rows, [x for x in rows if x not in sems], FILELOCK, "lock + release")
    table(rows, sems, POSIX_IPC, "acquire + release")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
