"""Cross-process locks, semaphores and heartbeats in memory-mapped files.

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

__all__ = [
    "Error",
    "FileError",
    "HeartbeatTable",
    "InconsistentError",
    "Lease",
    "LeaseGuard",
    "LostError",
    "Registration",
    "Semaphore",
    "SemaphorePermit",
    "Timeout",
    "Watchdog",
]


async def _in_executor(call, timeout):
    """Runs the blocking, cancellable ``call(timeout, token)`` in the loop's default
    executor; cancelling the awaiting task makes the call give up within ~50 ms (and
    release anything it acquired too late)."""
    loop = _asyncio.get_running_loop()
    token = _cxc.CancelToken()
    fut = loop.run_in_executor(None, call, timeout, token)
    try:
        return await _asyncio.shield(fut)
    except _asyncio.CancelledError:
        token.cancel()

        def _drop(f):
            if not f.cancelled() and f.exception() is None and f.result() is not None:
                f.result().release()

        fut.add_done_callback(_drop)
        raise


class Lease(_cxc.Lease):
    """A cross-process mutex in a file, released when its holder exits, crashes, or
    stops beating for longer than ``grace`` seconds.

    ``Lease(path, *, create=True, grace=1.0)``; ``lock(timeout=None)``, ``try_lock()``
    and ``await lock_async(timeout=None)`` return a :class:`LeaseGuard`.
    """

    async def lock_async(self, timeout=None):
        """Awaits the lease (the blocking ``lock`` in the loop's default executor)."""
        g = self.try_lock()
        if g is not None:
            return g
        return await _in_executor(self._lock_cancellable, timeout)


class Semaphore(_cxc.Semaphore):
    """A counting semaphore in a file; a dead holder's permits come back.

    ``Semaphore(path, permits, *, create=True)``; ``acquire(timeout=None)``,
    ``try_acquire()`` and ``await acquire_async(timeout=None)`` return a
    :class:`SemaphorePermit`.
    """

    async def acquire_async(self, timeout=None):
        """Awaits a permit (the blocking ``acquire`` in the loop's default executor)."""
        p = self.try_acquire()
        if p is not None:
            return p
        return await _in_executor(self._acquire_cancellable, timeout)
