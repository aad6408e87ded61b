"""asyncio on the Rust async machinery: many waiters in one loop and across processes,
cancellation, timeouts, and no thread per waiter."""

import asyncio
import concurrent.futures
import os
import random
import signal
import threading
import time

import pytest

import cxc
from conftest import permit_holders, python_child


def os_threads():
    return len(os.listdir("/proc/self/task"))


class NoExecutor(concurrent.futures.ThreadPoolExecutor):
    """A default executor that refuses work: proves nothing runs in executor threads."""

    def submit(self, *a, **kw):
        raise AssertionError("an executor thread was asked for")


def run(coro):
    async def main():
        asyncio.get_running_loop().set_default_executor(NoExecutor())
        return await coro

    return asyncio.run(main())


def read_counter(g):
    try:
        raw = g.read()
    except cxc.InconsistentError:
        g.acknowledge_inconsistent()
        raw = g.read()
    return int.from_bytes(raw[:8], "little")


def test_many_waiters_one_loop_no_thread_per_waiter(tmp_path):
    lease = cxc.Lease(tmp_path / "a.lease")
    n = 300

    async def main():
        tokens = []

        async def task():
            g = await lease.lock_async(timeout=60)
            with g:
                g.write((read_counter(g) + 1).to_bytes(8, "little"))
                tokens.append(g.token)
                await asyncio.sleep(0)

        # One wake-up first, so that every thread the machinery uses exists (the reactor,
        # its death watch, the wake-up bridge: started on first use).
        holder = await lease.lock_async()
        warm = asyncio.create_task(lease.lock_async())
        await asyncio.sleep(0.05)
        holder.release()
        holder = await warm
        first = asyncio.create_task(task())
        await asyncio.sleep(0.1)
        one = (threading.active_count(), os_threads(), cxc.async_waiters())
        rest = [asyncio.create_task(task()) for _ in range(n - 1)]
        await asyncio.sleep(0.2)
        many = (threading.active_count(), os_threads(), cxc.async_waiters())
        # Every waiter is registered with the reactor; none has a thread.
        assert one[2] == 1 and many[2] == n
        assert many[:2] == one[:2], f"threads with 1 waiter {one}, with {n}: {many}"
        holder.release()
        await asyncio.wait_for(asyncio.gather(first, *rest), 60)
        assert cxc.async_waiters() == 0
        assert len(tokens) == n and tokens == sorted(tokens) and len(set(tokens)) == n
        with lease.try_lock() as g:
            assert read_counter(g) == n
        print(f"\nthreads (python, os) with 1 waiter: {one[:2]}, with {n}: {many[:2]}")

    run(main())


# A worker process: `tasks` asyncio tasks each add `per_task` increments to the counter in
# the lease payload (read and write under the guard, a yield to the loop in between).
ASYNC_WORKER = r"""
import asyncio, sys, cxc
path, tasks, per_task = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
lease = cxc.Lease(path)

async def task():
    for _ in range(per_task):
        g = await lease.lock_async(timeout=60)
        with g:
            try:
                raw = g.read()
            except cxc.InconsistentError:
                g.acknowledge_inconsistent()
                raw = g.read()
            n = int.from_bytes(raw[:8], "little")
            await asyncio.sleep(0)
            g.write((n + 1).to_bytes(8, "little"))

async def main():
    await asyncio.gather(*(task() for _ in range(tasks)))
    assert cxc.async_waiters() == 0

asyncio.run(main())
print("done", flush=True)
"""


def test_async_waiters_across_processes(tmp_path):
    path = tmp_path / "counter.lease"
    lease = cxc.Lease(path)
    procs, tasks, per_task = 3, 20, 25
    kids = [python_child(ASYNC_WORKER, path, tasks, per_task) for _ in range(procs)]

    async def here():
        # This process takes part too, with its own tasks.
        async def task():
            for _ in range(per_task):
                g = await lease.lock_async(timeout=60)
                with g:
                    n = read_counter(g)
                    await asyncio.sleep(0)
                    g.write((n + 1).to_bytes(8, "little"))

        await asyncio.gather(*(task() for _ in range(tasks)))

    run(here())
    for k in kids:
        out, err = k.communicate(timeout=120)
        assert k.returncode == 0 and out.strip() == "done", err
    with lease.lock(timeout=5) as g:
        assert read_counter(g) == (procs + 1) * tasks * per_task


def test_cancellation_leaves_nothing_claimed(tmp_path):
    lease = cxc.Lease(tmp_path / "a.lease")
    sem = cxc.Semaphore(tmp_path / "s", 2)

    async def main():
        g = await lease.lock_async()
        p1, p2 = await sem.acquire_async(), await sem.acquire_async()
        waiting = [asyncio.create_task(lease.lock_async()) for _ in range(50)]
        waiting += [asyncio.create_task(sem.acquire_async()) for _ in range(50)]
        await asyncio.sleep(0.1)
        assert cxc.async_waiters() == 100
        for t in waiting:
            t.cancel()
        for t in waiting:
            with pytest.raises(asyncio.CancelledError):
                await t
        assert cxc.async_waiters() == 0
        g.release()
        p1.release()
        p2.release()
        await asyncio.sleep(0.1)  # a cancelled waiter must not claim after the release
        assert sem.available == 2
        assert lease.try_lock() is not None

        # Cancellation racing the hand-over: cancel each waiter at a random moment
        # around the release. Whoever got the guard or permit gives it back.
        rng = random.Random(int(os.environ.get("CXC_SEED", time.time_ns())))
        for _ in range(200):
            g = lease.try_lock()
            p = sem.try_acquire()
            p2 = sem.try_acquire()
            lt = asyncio.create_task(lease.lock_async())
            st = asyncio.create_task(sem.acquire_async())
            await asyncio.sleep(rng.uniform(0, 0.002))
            g.release()
            p.release()
            await asyncio.sleep(rng.uniform(0, 0.002))
            lt.cancel()
            st.cancel()
            for t in (lt, st):
                try:
                    (await t).release()
                except asyncio.CancelledError:
                    pass
            p2.release()
            assert cxc.async_waiters() == 0
            assert sem.available == 2
            assert lease.try_lock() is not None, "a cancelled waiter kept the lease"

    run(main())


def test_timeouts(tmp_path):
    lease = cxc.Lease(tmp_path / "a.lease")
    sem = cxc.Semaphore(tmp_path / "s", 1)

    async def main():
        g = await lease.lock_async()
        p = await sem.acquire_async()
        for call in (lease.lock_async, sem.acquire_async):
            t0 = time.monotonic()
            with pytest.raises(TimeoutError) as e:
                await call(timeout=0.2)
            assert isinstance(e.value, cxc.Timeout)
            assert 0.18 <= time.monotonic() - t0 < 1.0
            assert cxc.async_waiters() == 0
        # asyncio.wait_for around it cancels the waiter: nothing left behind either
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(lease.lock_async(), 0.1)
        assert cxc.async_waiters() == 0
        g.release()
        p.release()
        # a timeout that is not reached
        (await lease.lock_async(timeout=5)).release()
        (await sem.acquire_async(timeout=5)).release()

    run(main())


HOLD = r"""
import sys, time, cxc
lease = cxc.Lease(sys.argv[1], grace=30)
with lease.lock() as g:
    print("held", flush=True)
    sys.stdin.readline()
print("released", flush=True)
time.sleep(60)
"""


def test_woken_by_another_process(tmp_path):
    path = tmp_path / "a.lease"
    lease = cxc.Lease(path, grace=30)

    async def main():
        # Released by another process: the waiter is woken promptly.
        kid = python_child(HOLD, path, stdin=__import__("subprocess").PIPE)
        assert kid.stdout.readline().strip() == "held"
        t = asyncio.create_task(lease.lock_async(timeout=10))
        await asyncio.sleep(0.2)
        assert not t.done()
        t0 = time.monotonic()
        kid.stdin.write("\n")
        kid.stdin.flush()
        g = await t
        woke = time.monotonic() - t0
        g.release()
        kid.kill()
        kid.wait()
        # Holder SIGKILLed (grace 30 s): taken over at once (the reactor's pidfd watch).
        kid = python_child(HOLD, path, stdin=__import__("subprocess").PIPE)
        assert kid.stdout.readline().strip() == "held"
        t = asyncio.create_task(lease.lock_async(timeout=10))
        await asyncio.sleep(0.2)
        t0 = time.monotonic()
        kid.send_signal(signal.SIGKILL)
        g = await t
        taken = time.monotonic() - t0
        g.release()
        kid.wait()
        print(f"\nwoken {woke * 1e3:.1f} ms after the release; {taken * 1e3:.1f} ms after SIGKILL")
        assert woke < 0.5 and taken < 1.0

    run(main())


def test_async_permit_back_after_holder_sigkill(tmp_path):
    sem, kids = permit_holders(tmp_path / "pool.sem", 2)

    async def main():
        waiters = [asyncio.create_task(sem.acquire_async(timeout=10)) for _ in range(2)]
        await asyncio.sleep(0.2)
        assert not any(w.done() for w in waiters) and cxc.async_waiters() == 2
        t0 = time.monotonic()
        for k in kids:
            k.kill()
            k.wait()
        permits = await asyncio.gather(*waiters)
        took = time.monotonic() - t0
        assert sem.available == 0
        for p in permits:
            p.release()
        assert sem.available == 2
        print(f"\nboth permits of the SIGKILLed holders reached async waiters in {took * 1e3:.0f} ms")
        assert took < 2.0

    run(main())
