"""Type stubs of the cxc package (Linux): cross-process primitives in files."""

import os
import pathlib
from types import TracebackType
from typing import List, Optional, Tuple, Type, Union

_Path = Union[str, "os.PathLike[str]"]

class Error(Exception):
    """Base class of every cxc error."""

class LostError(Error):
    """The claim was lost (superseded, or released by someone else)."""

class InconsistentError(Error):
    """Taken over from a holder that died mid-update: write or acknowledge first."""

class Timeout(Error, TimeoutError):
    """A blocking acquire with a timeout gave up."""

class FileError(Error, OSError):
    """The file could not be created, opened or validated (``filename`` is the path)."""

class LeaseGuard:
    """A held lease; a context manager that releases on exit."""

    @property
    def token(self) -> int:
        """Fencing token of this claim (grows with every claim of the file)."""
    @property
    def released(self) -> bool: ...
    @property
    def payload_may_be_inconsistent(self) -> bool: ...
    def read(self) -> bytes:
        """The 48-byte payload (raises LostError, InconsistentError)."""
    def write(self, data: bytes) -> None:
        """Publishes at most 48 bytes, zero-padded, atomically (raises LostError)."""
    def beat(self) -> None:
        """Refreshes the heartbeat; hold longer than the grace only while beating."""
    def is_current(self) -> bool: ...
    def acknowledge_inconsistent(self) -> None: ...
    def release(self) -> None:
        """Releases (LostError if the claim was lost meanwhile); idempotent."""
    def __enter__(self) -> "LeaseGuard": ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool: ...

class Lease:
    """A cross-process mutex in a file; a crashed or hung holder loses it."""

    def __init__(self, path: _Path, *, create: bool = True, grace: float = 1.0) -> None: ...
    @property
    def path(self) -> "pathlib.Path": ...
    def lock(self, timeout: Optional[float] = None) -> LeaseGuard:
        """Blocks (GIL released, Ctrl-C interrupts); raises Timeout on timeout."""
    def try_lock(self) -> Optional[LeaseGuard]: ...
    async def lock_async(self, timeout: Optional[float] = None) -> LeaseGuard:
        """Awaits the lease on the Rust async machinery (no thread per waiter); raises
        Timeout on timeout; cancelling the task leaves nothing claimed."""

class SemaphorePermit:
    """One held permit; a context manager that returns it on exit."""

    @property
    def released(self) -> bool: ...
    def release(self) -> None: ...
    def __enter__(self) -> "SemaphorePermit": ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool: ...

class Semaphore:
    """A counting semaphore in a file; a dead holder's permits come back."""

    def __init__(self, path: _Path, permits: int, *, create: bool = True) -> None: ...
    @property
    def path(self) -> "pathlib.Path": ...
    @property
    def available(self) -> int: ...
    @property
    def max_permits(self) -> int: ...
    def acquire(self, timeout: Optional[float] = None) -> SemaphorePermit: ...
    def try_acquire(self) -> Optional[SemaphorePermit]: ...
    def reclaim_dead(self) -> int: ...
    async def acquire_async(self, timeout: Optional[float] = None) -> SemaphorePermit:
        """Awaits a permit on the Rust async machinery (no thread per waiter); raises
        Timeout on timeout; cancelling the task leaves no permit taken."""

class Registration:
    """A worker's slot in a HeartbeatTable; unregisters on exit."""

    @property
    def slot(self) -> int: ...
    @property
    def in_flight(self) -> int: ...
    def beat(self) -> None:
        """Refreshes the heartbeat; LostError once a watchdog fenced this worker."""
    def mark(self, bit: int) -> None: ...
    def clear(self, bit: int) -> None: ...
    def release(self) -> None: ...
    def __enter__(self) -> "Registration": ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool: ...

class HeartbeatTable:
    """Worker heartbeats and in-flight bits (each watchdog scan is one epoch)."""

    def __init__(self, path: _Path, capacity: int = 64, *, create: bool = True) -> None: ...
    @property
    def path(self) -> "pathlib.Path": ...
    @property
    def capacity(self) -> int: ...
    def join(self, pid: Optional[int] = None) -> Registration: ...
    def snapshot(self, slot: int) -> Optional[Tuple[int, int, int, bool]]:
        """(pid, last_seen_epoch, in_flight, fenced), or None for a free slot."""

class Watchdog:
    """Reports workers that stopped beating or died; reclaims their in-flight bits."""

    def __init__(self, table: HeartbeatTable, grace: int = 3) -> None: ...
    def scan(self) -> List[Tuple[int, int, int]]:
        """Ticks the epoch; dead slots with work: [(slot, pid, in_flight)]."""
    def reclaim(self, slot: int) -> int:
        """Fences a slot of the last scan and takes its bits (once across watchdogs)."""

class Leadership:
    """A won term of an election; a context manager that steps down on exit."""

    @property
    def token(self) -> int:
        """Fencing token of this term: strictly greater for every later leader."""
    @property
    def stepped_down(self) -> bool: ...
    def is_current(self) -> bool:
        """Not lost, renewed within the lease duration, and current in the file."""
    def renew(self) -> None:
        """Proof of progress: call at least once per grace; LostError once the term is over."""
    def wait_lost(self, timeout: Optional[float] = None) -> bool:
        """Blocks (GIL released, Ctrl-C interrupts) until lost (True) or timeout (False)."""
    def step_down(self) -> None:
        """Ends the term now (LostError if it was already over); idempotent."""
    def __enter__(self) -> "Leadership": ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool: ...

class Elector:
    """A candidate in the leader election on a lease file (progress-driven renewal)."""

    def __init__(
        self,
        path: _Path,
        *,
        create: bool = True,
        grace: float = 1.0,
        identity: Optional[str] = None,
    ) -> None: ...
    @property
    def path(self) -> "pathlib.Path": ...
    @property
    def identity(self) -> str: ...
    @property
    def grace(self) -> float:
        """The lease duration: a leader that does not renew within it is replaced."""
    def campaign(self, timeout: Optional[float] = None) -> Leadership:
        """Blocks until elected (GIL released, Ctrl-C interrupts); Timeout on timeout."""
    def try_campaign(self) -> Optional[Leadership]: ...
    def leader(self) -> Optional[Tuple[str, int]]:
        """(identity, token) of the current leader, or None."""

def async_waiters() -> int:
    """Async waiters registered with this process's cxc reactor (0 when none waits)."""
