"""fastmem's exceptions: one base class, specific leaves, builtin mixins.

Every error fastmem raises on purpose is a :class:`FastmemError`; the builtin mixins let
callers who do not know fastmem catch them the ordinary way (``except KeyError``,
``except ValueError``).
"""

from __future__ import annotations

__all__ = [
    "FastmemError",
    "InvalidInputError",
    "InvalidTypeError",
    "DimensionMismatchError",
    "UnknownMemoryError",
    "CorruptionError",
    "CorruptRecordError",
    "CorruptIndexError",
    "FormatVersionError",
    "StoreNotFoundError",
    "StoreLockedError",
    "StoreClosedError",
    "StoreForkedError",
    "ReadOnlyError",
    "StoreFullError",
    "DurabilityError",
    "DependencyUnavailableError",
    "EncodingUnavailableError",
    "EmbedderMismatchError",
    "EmbedderUnavailableError",
    "McpUnavailableError",
    "RecoveryWarning",
]


class FastmemError(Exception):
    """Base class of every error fastmem raises on purpose."""


class InvalidInputError(FastmemError, ValueError):
    """An argument has a value fastmem cannot store or use; nothing was written.

    Attributes:
        item: for a batch (``add_many``, ``check_items``), the position of the item at
            fault, when one is; ``None`` otherwise.
    """

    item: int | None = None


class InvalidTypeError(InvalidInputError, TypeError):
    """An argument has the wrong type; nothing was written."""


class DimensionMismatchError(InvalidInputError):
    """A vector's length differs from the store's embedding dimension."""


class UnknownMemoryError(FastmemError, KeyError):
    """No live memory has this id (never added, or forgotten)."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0]) if self.args else "unknown memory"


class CorruptionError(FastmemError, ValueError):
    """A file's bytes are damaged or are not a fastmem file.

    Attributes:
        path: the damaged file.
        offset: byte offset of the damage in that file, or ``None`` when not known.
    """

    def __init__(self, message: str, *, path: str | None = None, offset: int | None = None):
        super().__init__(message)
        self.path = path
        self.offset = offset


class CorruptRecordError(CorruptionError):
    """A record of the data file failed its checks (length, magic, checksum or decoding)."""


class CorruptIndexError(CorruptionError):
    """The index file disagrees with the data file; ``store.verify()`` tells more,
    and deleting the ``.idx`` file makes the next writer rebuild it."""


class FormatVersionError(FastmemError):
    """The file was written by a format version this fastmem cannot read."""


class StoreNotFoundError(FastmemError, FileNotFoundError):
    """A read-only open found no store at the path."""


class StoreLockedError(FastmemError):
    """Another process holds the store's writer lock."""


class StoreClosedError(FastmemError):
    """The store was closed; open it again with ``fastmem.open``."""


class StoreForkedError(StoreClosedError):
    """A store handle was used in a child process after ``fork()``; open the store anew in the child."""


class ReadOnlyError(FastmemError):
    """A write was attempted on a store opened with ``readonly=True``."""


class StoreFullError(FastmemError, OSError):
    """The device or the user's quota is full (``ENOSPC``, ``EDQUOT``): a write could not be
    made. Nothing of the failed call was kept (its records were cut off again) and the store
    stays consistent; free space and write again, on the same handle.

    ``errno`` is the operating system's; ``filename`` the file being written.
    """


class DurabilityError(FastmemError, OSError):
    """An I/O error (``EIO``) or a failed ``fsync``/``fdatasync``: what was written may not
    be on the disk. A failed sync is sticky: the handle raises it from the next ``add``,
    ``flush``, ``checkpoint`` or ``close`` and refuses writes until the store is opened
    again, which reads what actually reached the file (the kernel reports a writeback
    error once, so a later sync that succeeds proves nothing; PostgreSQL's rule since 2018).

    ``errno`` is the operating system's; ``filename`` the file concerned.
    """


class DependencyUnavailableError(FastmemError):
    """Something fastmem needs for this call is not installed or cannot be loaded: a
    package, a model or a token encoding. The message says what to install.

    No ``ImportError`` mixin: these are raised by calls, not by imports (fastmem imports
    without any of them), and one of them also means a damaged model file; an
    ``except ImportError`` around an import must not start catching them.
    """


class EncodingUnavailableError(DependencyUnavailableError):
    """The token encoding asked for cannot be loaded on this machine (no network is used)."""


class EmbedderMismatchError(InvalidInputError):
    """The embedder differs from the one that wrote the store's vectors (model or dimension):
    its vectors would not be comparable with the stored ones."""


class EmbedderUnavailableError(DependencyUnavailableError):
    """The embedding model cannot be used: not installed, failed its checksum, or failed to
    load. A store opened with ``embedder=None`` needs none (keyword search only)."""


class McpUnavailableError(DependencyUnavailableError):
    """The ``mcp`` package (the official MCP SDK) is not installed: ``pip install 'fastmem[mcp]'``."""


class RecoveryWarning(UserWarning):
    """fastmem repaired or found something on open: rebuilt a missing or stale index, or kept
    damaged bytes at the end of the data file (``verify()`` reports them). An interrupted
    write at the end of the data file is cut without one: nothing in it was acknowledged."""
