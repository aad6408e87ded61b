"""Cross-process locks, semaphores, heartbeats and leader election in memory-mapped
files.

Python bindings of the Rust crate ``cxc`` (Linux). See docs/python.md.
"""

import asyncio as _asyncio

from . import _cxc
from ._errors import Error, FileError, InconsistentError, LostError, Timeout

LeaseGuard = _cxc.LeaseGuard
SemaphorePermit = _cxc.SemaphorePermit
HeartbeatTable = _cxc.HeartbeatTable
Registration = _cxc.Registration
Watchdog = _cxc.Watchdog
Elector = _cxc.Elector
Leadership = _cxc.Leadership
async_waiters = _cxc.async_waiters

__all__ = [
    "Elector",
    "Error",
    "FileError",
    "HeartbeatTable",
    "InconsistentError",
    "Leadership",
    "Lease",
    "LeaseGuard",
    "LostError",
    "Registration",
    "Semaphore",
    "SemaphorePermit",
    "Timeout",
    "Watchdog",
    "async_waiters",
]


def _check_timeout(timeout):
    """Refuses a NaN timeout (as the blocking calls do) before anything is awaited."""
    if timeout is not None and timeout != timeout:
        raise ValueError("invalid timeout: nan")


def _poll_waiter(waiter):
    """Polls an ``_cxc.AsyncWaiter`` on its loop's thread (right after ``start``, then
    whenever the cxc reactor wakes it) and completes its asyncio future when the guard
    or permit is there. The future is completed here, in Python, not inside the
    extension: ``set_result`` runs the loop's ``call_soon``, which may let the GIL go,
    and a daemon loop thread ended by the interpreter's exit there must not have the
    extension's frames on its stack (docs/python.md)."""
    fut = waiter._future
    if fut is None:
        return
    if fut.done():
        # Cancelled (or expired) meanwhile: nothing must be claimed any more.
        waiter.cancel()
        return
    value = waiter._poll()
    if value is not None:
        # Cannot raise: the future is pending and this is its loop's thread. If it did,
        # ``value`` would be collected, which releases it.
        fut.set_result(value)


def _expire_waiter(waiter, fut, what, timeout):
    """The timeout of an ``_cxc.AsyncWaiter`` passed: drops its Rust future and fails
    ``fut`` with :class:`Timeout` if it is still pending."""
    exc = waiter.expire(what, timeout)
    if not fut.done():
        fut.set_exception(exc)


async def _await_waiter(waiter, timeout, what):
    """Awaits an ``_cxc.AsyncWaiter``: its Rust future is polled on this event loop's
    thread, and the cxc reactor's wake-ups reach the loop through
    ``loop.call_soon_threadsafe`` (no executor, no thread per waiter). Cancelling the
    awaiting task, or the timeout, drops the Rust future: nothing stays claimed."""
    loop = _asyncio.get_running_loop()
    fut = loop.create_future()
    timer = None
    try:
        waiter.start(loop, fut, _poll_waiter)
        _poll_waiter(waiter)
        if timeout is not None and not fut.done():
            timer = loop.call_later(max(timeout, 0.0), _expire_waiter, waiter, fut, what,
                                    timeout)
        return await fut
    except BaseException:
        waiter.cancel()
        # Completed, but the task was cancelled before it resumed: give the claim back.
        if fut.done() and not fut.cancelled() and fut.exception() is None:
            try:
                fut.result().release()
            except Error:
                pass
        raise
    finally:
        if timer is not None:
            timer.cancel()


class Lease(_cxc.Lease):
    """A cross-process mutex in a file, released when its holder exits, crashes, or
    stops beating for longer than ``grace`` seconds.

    ``Lease(path, *, create=True, grace=1.0)``; ``lock(timeout=None)``, ``try_lock()``
    and ``await lock_async(timeout=None)`` return a :class:`LeaseGuard`.
    """

    async def lock_async(self, timeout=None):
        """Awaits the lease (at most ``timeout`` seconds; ``None``: forever) on the Rust
        async machinery: no thread per waiter. Raises :class:`Timeout` on timeout;
        cancelling the task leaves nothing claimed."""
        _check_timeout(timeout)
        g = self.try_lock()
        if g is not None:
            return g
        return await _await_waiter(self._async_waiter(), timeout, "lease")


class Semaphore(_cxc.Semaphore):
    """A counting semaphore in a file; a dead holder's permits come back.

    ``Semaphore(path, permits, *, create=True)``; ``acquire(timeout=None)``,
    ``try_acquire()`` and ``await acquire_async(timeout=None)`` return a
    :class:`SemaphorePermit`.
    """

    async def acquire_async(self, timeout=None):
        """Awaits a permit (at most ``timeout`` seconds; ``None``: forever) on the Rust
        async machinery: no thread per waiter. Raises :class:`Timeout` on timeout;
        cancelling the task leaves no permit taken."""
        _check_timeout(timeout)
        p = self.try_acquire()
        if p is not None:
            return p
        return await _await_waiter(self._async_waiter(), timeout, "semaphore")
