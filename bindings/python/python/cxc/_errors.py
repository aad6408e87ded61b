"""The exception classes of cxc."""


class Error(Exception):
    """Base class of every cxc error."""


class LostError(Error):
    """The claim (lease or heartbeat registration) was lost: superseded after a stale
    heartbeat or a judged-dead process, or released by someone else. Nothing the holder
    wrote after the loss was published."""


class InconsistentError(Error):
    """The lease was taken over from a holder that died or stalled mid-update: write a
    value or call ``acknowledge_inconsistent()`` before reading."""


class Timeout(Error, TimeoutError):
    """A blocking acquire with a timeout gave up (also a built-in ``TimeoutError``)."""


class FileError(Error, OSError):
    """The file could not be created, opened or validated (``.filename`` is the path;
    ``.errno`` is set when the operating system reported one)."""


for _cls in (Error, LostError, InconsistentError, Timeout, FileError):
    _cls.__module__ = "cxc"
