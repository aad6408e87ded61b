"""Uncontended lock+release: cxc.Lease and cxc.Semaphore against filelock.FileLock,
multiprocessing.Lock, fcntl.flock (and portalocker / posix_ipc if installed).

python bench.py [--json OUT] [--n N]; prints a Markdown table (median of 5 rounds,
nanoseconds per lock+release).
"""

import argparse
import fcntl
import json
import multiprocessing
import os
import platform
import statistics
import tempfile
import time

import cxc


def per_op(fn, n, rounds=5):
    fn(max(n // 10, 100))  # warm up
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        fn(n)
        samples.append((time.perf_counter_ns() - t0) / n)
    return statistics.median(samples)


def cases(d):
    lease = cxc.Lease(os.path.join(d, "b.lease"))

    def cxc_lease_with(n):
        for _ in range(n):
            with lease.lock():
                pass

    def cxc_lease_try(n):
        for _ in range(n):
            lease.try_lock().release()

    sem = cxc.Semaphore(os.path.join(d, "b.sem"), 1)

    def cxc_sem(n):
        for _ in range(n):
            with sem.acquire():
                pass

    yield "cxc.Lease: `with lease.lock()`", cxc_lease_with
    yield "cxc.Lease: `try_lock().release()`", cxc_lease_try
    yield "cxc.Semaphore(1): `with sem.acquire()`", cxc_sem

    try:
        import filelock

        fl = filelock.FileLock(os.path.join(d, "b.filelock"))

        def filelock_with(n):
            for _ in range(n):
                with fl:
                    pass

        yield "filelock.FileLock: `with lock`", filelock_with
    except ImportError:
        pass

    f = open(os.path.join(d, "b.flock"), "w")

    def flock(n):
        fd = f.fileno()
        for _ in range(n):
            fcntl.flock(fd, fcntl.LOCK_EX)
            fcntl.flock(fd, fcntl.LOCK_UN)

    yield "fcntl.flock on an open file (no crash-safety for data)", flock

    mp = multiprocessing.Lock()

    def mp_lock(n):
        for _ in range(n):
            with mp:
                pass

    yield "multiprocessing.Lock (related processes only)", mp_lock

    try:
        import portalocker

        def pl(n):
            for _ in range(n):
                with portalocker.Lock(os.path.join(d, "b.portalocker")):
                    pass

        yield "portalocker.Lock: `with lock`", pl
    except ImportError:
        pass


def run(n=20000):
    rows = {}
    with tempfile.TemporaryDirectory() as d:
        for name, fn in cases(d):
            rows[name] = per_op(fn, n)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--n", type=int, default=20000)
    a = ap.parse_args()
    rows = run(a.n)
    base = rows.get("filelock.FileLock: `with lock`")
    print(f"Python {platform.python_version()}, {os.cpu_count()} CPUs; ns per lock+release, median of 5\n")
    print("| lock | ns/op | vs filelock |\n|---|---:|---:|")
    for name, ns in rows.items():
        ratio = f"{base / ns:.1f}x" if base else "-"
        print(f"| {name} | {ns:,.0f} | {ratio} |")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
