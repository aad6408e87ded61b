"""The API surface: guards, context managers, errors, payload, heartbeat, asyncio."""

import asyncio
import os
import threading
import time

import pytest

import cxc
from conftest import assert_exit_raises_lost_only_without_exception


def test_lease_guard_roundtrip(tmp_path):
    lease = cxc.Lease(tmp_path / "a.lease")
    with lease.lock() as g:
        assert isinstance(g.token, int) and g.token >= 1
        assert g.read() == bytes(48)
        g.write(b"hello")
        assert g.read() == b"hello" + bytes(43)
        assert g.is_current()
        assert lease.try_lock() is None, "a guard excludes every other holder"
        token = g.token
    assert g.released and not g.is_current()
    with pytest.raises(cxc.Error):
        g.read()
    g2 = lease.try_lock()
    assert g2 is not None and g2.token > token
    assert g2.read()[:5] == b"hello"
    g2.release()
    g2.release()  # idempotent


def test_write_limit(tmp_path):
    with cxc.Lease(tmp_path / "a.lease").lock() as g:
        g.write(bytes(range(48)))
        with pytest.raises(ValueError):
            g.write(bytes(49))
        assert g.read() == bytes(range(48))


def test_timeout_is_a_timeout_error(tmp_path):
    lease = cxc.Lease(tmp_path / "a.lease")
    with lease.lock():
        t0 = time.monotonic()
        with pytest.raises(TimeoutError) as e:
            lease.lock(timeout=0.2)
        assert isinstance(e.value, cxc.Timeout) and isinstance(e.value, cxc.Error)
        assert 0.18 <= time.monotonic() - t0 < 1.0


def test_two_handles_same_file(tmp_path):
    a = cxc.Lease(tmp_path / "a.lease")
    b = cxc.Lease(tmp_path / "a.lease", create=False)
    with a.lock():
        assert b.try_lock() is None
    assert b.try_lock() is not None


def test_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError.__mro__[1]) as e:  # OSError
        cxc.Lease(tmp_path / "missing", create=False)
    assert isinstance(e.value, cxc.FileError) and isinstance(e.value, cxc.Error)
    assert e.value.filename == str(tmp_path / "missing")
    assert e.value.errno == 2
    (tmp_path / "junk").write_bytes(b"x" * 10)
    with pytest.raises(cxc.FileError):
        cxc.Lease(tmp_path / "junk")
    cxc.Semaphore(tmp_path / "s", 2)
    with pytest.raises(cxc.Error):
        cxc.Semaphore(tmp_path / "s", 3)


def test_lost_after_stale_hold(tmp_path):
    lease = cxc.Lease(tmp_path / "a.lease", grace=0.2)
    g = lease.lock()
    time.sleep(0.4)  # no beat: stale
    g2 = lease.lock(timeout=2)
    assert not g.is_current()
    with pytest.raises(cxc.LostError):
        g.write(b"late")
    with pytest.raises(cxc.LostError):
        g.release()
    assert g2.is_current()
    g2.release()


def test_exit_raises_lost_only_without_exception(tmp_path):
    lease = cxc.Lease(tmp_path / "a.lease", grace=0.2)

    def taken_over():
        time.sleep(0.4)
        lease.lock(timeout=2).release()

    assert_exit_raises_lost_only_without_exception(lease.lock, taken_over)


def test_gil_released_while_blocking(tmp_path):
    lease = cxc.Lease(tmp_path / "a.lease")
    g = lease.lock()
    ticks = []
    t = threading.Thread(target=lambda: pytest.raises(TimeoutError, lease.lock, timeout=0.5))
    t.start()
    end = time.monotonic() + 0.4
    while time.monotonic() < end:
        ticks.append(1)
        time.sleep(0.001)
    t.join()
    assert len(ticks) > 100
    g.release()


def test_lock_from_thread_wakes_on_release(tmp_path):
    lease = cxc.Lease(tmp_path / "a.lease")
    g = lease.lock()
    got = []
    t = threading.Thread(target=lambda: got.append(lease.lock(timeout=5)))
    t.start()
    time.sleep(0.1)
    t0 = time.monotonic()
    g.release()
    t.join()
    assert got and got[0].is_current()
    assert time.monotonic() - t0 < 0.5
    got[0].release()


def test_semaphore(tmp_path):
    sem = cxc.Semaphore(tmp_path / "s", 2)
    assert (sem.available, sem.max_permits) == (2, 2)
    with sem.acquire() as p1, sem.acquire(timeout=1):
        assert sem.available == 0
        assert sem.try_acquire() is None
        with pytest.raises(TimeoutError):
            sem.acquire(timeout=0.1)
    assert p1.released and sem.available == 2
    other = cxc.Semaphore(tmp_path / "s", 2, create=False)
    p = other.try_acquire()
    assert sem.available == 1
    p.release()
    assert sem.available == 2


def test_heartbeat_and_watchdog(tmp_path):
    table = cxc.HeartbeatTable(tmp_path / "hb", 8)
    wd = cxc.Watchdog(table, grace=2)
    with table.join() as reg:
        reg.mark(3)
        reg.mark(5)
        reg.clear(5)
        assert reg.in_flight == 1 << 3
        assert wd.scan() == []
        reg.beat()
        for _ in range(3):
            dead = wd.scan()
        assert [(s, b) for s, _, b in dead] == [(reg.slot, 1 << 3)]
        assert wd.reclaim(reg.slot) == 1 << 3
        with pytest.raises(cxc.LostError):
            reg.beat()
        assert table.snapshot(reg.slot)[3], "fenced"


def test_asyncio(tmp_path):
    lease = cxc.Lease(tmp_path / "a.lease")
    sem = cxc.Semaphore(tmp_path / "s", 1)

    async def main():
        g = await lease.lock_async()
        order = []

        async def waiter():
            g2 = await lease.lock_async(timeout=5)
            order.append("waiter")
            g2.release()

        t = asyncio.create_task(waiter())
        await asyncio.sleep(0.1)
        order.append("release")
        g.release()
        await t
        assert order == ["release", "waiter"]

        # cancellation leaves nothing held
        g = await lease.lock_async()
        t = asyncio.create_task(lease.lock_async())
        await asyncio.sleep(0.1)
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        g.release()
        await asyncio.sleep(0.2)
        assert lease.try_lock() is not None

        p = await sem.acquire_async()
        with pytest.raises(TimeoutError):
            await sem.acquire_async(timeout=0.1)
        p.release()
        (await sem.acquire_async()).release()

    asyncio.run(main())
