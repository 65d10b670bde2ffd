"""fastmem: embedded, persistent memory for AI agents.

>>> import fastmem, tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "agent_memory")
>>> with fastmem.open(path) as store:
...     mid = store.add("The user prefers short answers.", type="fact")
>>> with fastmem.open(path) as store:
...     print(store.get(mid).text)
The user prefers short answers.
"""

from __future__ import annotations

from typing import Any

from . import _kernels
from .errors import (
    CorruptIndexError,
    CorruptionError,
    CorruptRecordError,
    DependencyUnavailableError,
    DimensionMismatchError,
    DurabilityError,
    EmbedderMismatchError,
    EmbedderUnavailableError,
    EncodingUnavailableError,
    FastmemError,
    FormatVersionError,
    InvalidInputError,
    InvalidTypeError,
    ReadOnlyError,
    RecoveryWarning,
    StoreClosedError,
    StoreForkedError,
    StoreFullError,
    StoreLockedError,
    StoreNotFoundError,
    UnknownMemoryError,
)
from .types import (
    BackupReport, CompactReport, Context, ContextItem, ContextPolicy, EvictionPolicy, Hit, Level,
    Memory, Problem, RecordInfo, RecordSize, RepairReport, Report, StoreStats,
)  # fmt: skip
from .store import DURABILITY, LOCK_TIMEOUT, MemoryStore, open, repair

__version__ = "0.2.0"

__all__ = [
    "__version__",
    "BACKEND",
    "BackupReport",
    "CompactReport",
    "Context",
    "ContextItem",
    "ContextPolicy",
    "CorruptIndexError",
    "CorruptionError",
    "CorruptRecordError",
    "DependencyUnavailableError",
    "DimensionMismatchError",
    "DURABILITY",
    "DurabilityError",
    "EmbedderMismatchError",
    "EmbedderUnavailableError",
    "EncodingUnavailableError",
    "EvictionPolicy",
    "FastmemError",
    "FormatVersionError",
    "Hit",
    "InvalidInputError",
    "InvalidTypeError",
    "Level",
    "LOCK_TIMEOUT",
    "Memory",
    "MemoryStore",
    "open",
    "Problem",
    "ReadOnlyError",
    "RecordInfo",
    "RecordSize",
    "RecoveryWarning",
    "repair",
    "RepairReport",
    "Report",
    "StoreClosedError",
    "StoreForkedError",
    "StoreFullError",
    "StoreLockedError",
    "StoreNotFoundError",
    "StoreStats",
    "UnknownMemoryError",
]


def __getattr__(name: str) -> Any:
    if name == "BACKEND":  # "cython" or "python": which kernels are in use right now
        return _kernels.BACKEND
    raise AttributeError(f"module 'fastmem' has no attribute {name!r}")
