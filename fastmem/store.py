"""``MemoryStore``: an agent's memories in two files, reopened in milliseconds.

>>> import fastmem, tempfile, os
>>> d = tempfile.mkdtemp()
>>> with fastmem.open(os.path.join(d, "agent")) as store:
...     mid = store.add("The user's name is Ada.", type="fact")
...     store.get(mid).text
"The user's name is Ada."
>>> with fastmem.open(os.path.join(d, "agent"), readonly=True) as store:
...     [m.text for m in store.recent(5)]
["The user's name is Ada."]
"""

from __future__ import annotations

import dataclasses
import fcntl
import gc
import math
import mmap
import os
import threading
import time
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, NamedTuple

import msgpack
import numpy as np

from . import _format as fmt
from . import _kernels, _vsearch
from ._index import (
    F_ACCESS, F_FLAGS, F_ID, F_IMPORTANCE, F_LAST_ACCESS, F_LENGTH, F_META, F_OFFSET, F_SESSION,
    F_SUMMARY_TOKENS, F_TEXT_TOKENS, F_TS, MemoryIndex,
    default_importance, session_hash, update_changes,
)  # fmt: skip
from ._vectors import quantize, to_float16
from .embed import default_embedder  # light: the model's libraries load in its thread
from .context import Candidate, check_budget, new_context, pack
from .types import (
    DAY, Context, ContextItem, ContextPolicy, Hit, Level, Memory, Problem, RecordInfo, RecordSize, Report,
    StoreStats,
)  # fmt: skip

_new_memory = tuple.__new__  # Memory's fields in order, without keyword parsing
from . import _maintenance
from .types import BackupReport, CompactReport, EvictionPolicy, RepairReport
from ._threads import Background
from .namespaces import make_private_dirs, namespace_path
from .summarize import KeySentences
from .tokens import TokenCounter
from .errors import (
    CorruptIndexError,
    CorruptRecordError,
    CorruptionError,
    DimensionMismatchError,
    EmbedderMismatchError,
    FastmemError,
    FormatVersionError,
    InvalidInputError,
    InvalidTypeError,
    ReadOnlyError,
    RecoveryWarning,
    StoreClosedError,
    StoreForkedError,
    StoreLockedError,
    StoreNotFoundError,
    UnknownMemoryError,
)

__all__ = ["MemoryStore", "Memory", "Hit", "Report", "Problem", "open", "DURABILITY"]

DURABILITY = ("always", "batch", "none")
GROUP_COMMIT_SECONDS = 0.005  # "batch": a write reaches the disk within this long
CHECKPOINT_TAIL_ROWS = 1 << 20  # checkpoint while writing once the tail is this long...
SUMMARY_TOKENS = 64  # a summary's bound, whoever writes it
STORED_ENCODING = "cl100k_base"  # the token counts kept in the index; others count on demand
_UNKNOWN_TOKENS = (fmt.UNKNOWN_TOKENS, fmt.UNKNOWN_TOKENS)
_ADD_KEYS = frozenset(
    ("text", "type", "timestamp", "session", "importance", "pinned", "metadata", "summary",
     "embedding")
)  # fmt: skip
_DEFAULT = object()  # a keyword left out: the documented default
_IMPORTANCE_FIELDS = ("importance", "flags", "access_count", "last_access", "timestamp")

_fork_generation = 0


_stores: weakref.WeakSet[MemoryStore] = weakref.WeakSet()  # open handles, for the fork hook


def _after_fork_in_child() -> None:
    global _fork_generation
    _fork_generation += 1
    # A thread of the parent may have held a store's lock at fork time; that thread does
    # not exist here, so the lock would never be released and the child would hang
    # instead of getting StoreForkedError. A fresh lock lets every call fail clearly.
    for store in list(_stores):
        store._lock = threading.RLock()
    global _keyword_thread, _keyword_thread_lock
    _keyword_thread, _keyword_thread_lock = None, threading.Lock()  # the parent's thread and lock


os.register_at_fork(after_in_child=_after_fork_in_child)

_keyword_thread: ThreadPoolExecutor | None = None
_keyword_thread_lock = threading.Lock()


def _keyword_worker() -> ThreadPoolExecutor:
    """One thread per process that runs a ranking's keyword search while the caller's
    thread embeds the query and scans the vectors (both release the GIL)."""
    global _keyword_thread
    with _keyword_thread_lock:
        if _keyword_thread is None:
            _keyword_thread = ThreadPoolExecutor(1, thread_name_prefix="fastmem-keyword")
        return _keyword_thread


def open(  # noqa: A001 - the name users expect: fastmem.open(path)
    path: str | os.PathLike[str],
    *,
    dim: int | None = None,
    embedder: Any = _DEFAULT,
    readonly: bool = False,
    durability: str = "batch",
    timeout: float = 0.0,
    summarizer: Any = _DEFAULT,
    policy: ContextPolicy | None = None,
    evict: EvictionPolicy | None = None,
    namespace: str | None = None,
) -> MemoryStore:
    """Open the store at ``path`` (``path.dat`` and ``path.idx``), creating it if needed.

    Args:
        path: the store's name; its two files are ``<path>.dat`` and ``<path>.idx``.
        dim: the embedding dimension (fixed by the first vector when left out).
        embedder: an object with ``encode(list[str]) -> array (n, dim)`` used when ``add``
            gets no ``embedding`` (see :class:`fastmem.embed.Embedder`); by default
            all-MiniLM-L6-v2, loaded in the background (``pip install 'fastmem[embed]'``);
            ``None`` for none (keyword search only).
        readonly: read without taking the writer lock; any number of readers may run
            beside one writer and see every memory it committed before their last call.
        durability: ``"always"`` (``add`` returns after fsync), ``"batch"`` (group commit:
            on disk within ~5 ms, and at ``flush``/``close``) or ``"none"`` (the OS decides).
            Under every mode, a memory whose ``add`` returned survives the process being
            killed; the modes differ on power loss.
        timeout: seconds to wait for another writer to close the store.
        summarizer: writes each new memory's summary when none is given (default:
            :class:`fastmem.summarize.KeySentences`, 64 tokens); ``None`` for none.
        policy: how contexts are built and memories ranked (:class:`ContextPolicy`).
        evict: an :class:`EvictionPolicy` that ``checkpoint()`` and ``close()`` apply.
        namespace: one user's or profile's store under the directory ``path``: its own
            two files, ``<path>/<namespace>/memory.dat`` and ``.idx`` (see
            :mod:`fastmem.namespaces` for valid names); no other namespace's memory can
            enter its searches or contexts.

    Raises:
        StoreLockedError: another process is writing to the store.
        StoreNotFoundError: ``readonly=True`` and there is no store at ``path``.
        CorruptionError: the data file's header is damaged or it is not a fastmem file.
        DimensionMismatchError: ``dim`` differs from the store's.
        EmbedderMismatchError: the store was written by another embedder.
        EmbedderUnavailableError: the default embedder is not installed.
    """
    if namespace is not None:
        path = namespace_path(path, namespace, create=readonly is False)
    return MemoryStore(
        path, dim=dim, embedder=embedder, readonly=readonly, durability=durability,
        timeout=timeout, summarizer=summarizer, policy=policy, evict=evict,
    )  # fmt: skip


def repair(path: str | os.PathLike[str], *, namespace: str | None = None) -> RepairReport:
    """Repair the store at ``path`` without opening it first: what ``MemoryStore.repair``
    does, and also for a store whose data-file header is damaged, which ``open`` refuses
    (the header is rebuilt from the records and the index; see
    ``fastmem._maintenance.rebuild_header``). A store that is not damaged is rewritten
    with a fresh index and reported ``ok``.

    Raises:
        StoreNotFoundError: there is no store at ``path``.
        StoreLockedError: a writer has the store open.
        CorruptionError: the data file holds no intact record.
    """
    if namespace is not None:
        path = namespace_path(path, namespace, create=False)
    base = _base_path(path)
    rebuilt = _maintenance.rebuild_header(base + ".dat", base + ".idx")
    with MemoryStore(base, embedder=None, policy=ContextPolicy(preload=0, recent=0)) as store:
        report = store.repair()
    if rebuilt is None:
        return report
    return dataclasses.replace(report, ok=False, cut=[rebuilt, *report.cut],
                               cut_bytes=report.cut_bytes + fmt.DAT_HEADER_SIZE)  # fmt: skip


def _base_path(path: Any) -> str:
    """A store's name (its files are ``<name>.dat`` and ``<name>.idx``), checked."""
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidTypeError(f"path must be a str or os.PathLike, not {type(path).__name__}")
    base = os.fspath(path)
    if not isinstance(base, str) or not base:
        raise InvalidInputError("path must be a non-empty file name")
    try:
        if b"\0" in os.fsencode(base):
            raise ValueError
    except (UnicodeError, ValueError):
        raise InvalidInputError(f"path {base!r} is not a valid file name") from None
    return base[:-4] if base.endswith((".dat", ".idx")) else base


def _parse_id(mid: Any) -> int:
    if not isinstance(mid, str):
        raise InvalidTypeError(f"a memory id is a string like 'm42', not {type(mid).__name__}")
    if len(mid) < 2 or len(mid) > 21 or mid[0] != "m" or not mid[1:].isdigit() or not mid[1:].isascii():
        raise UnknownMemoryError(f"no memory has the id {mid!r}")
    return int(mid[1:])


_F32_SHORT: dict[float, float] = {}


def _f32(x: float) -> float:
    """The shortest decimal that reads back as the same float32 (0.3, not 0.30000001)."""
    short = _F32_SHORT.get(x)
    if short is None:
        short = float(str(np.float32(x)))
        if len(_F32_SHORT) < 4096:  # importances repeat: keep the common ones
            _F32_SHORT[x] = short
    return short


def _check_str(value: Any, name: str, max_chars: int, *, optional: bool) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise InvalidTypeError(f"{name} must be a string, not {type(value).__name__}")
    if not value or len(value) > max_chars:
        raise InvalidInputError(f"{name} must have 1 to {max_chars} characters")
    _check_utf8(value, name)
    return value


def _type_names(types: Iterable[str] | None) -> list[str] | None:
    """A search's ``types``, listed and checked (``None``: every type)."""
    names = None if types is None else list(types)
    for name in names or ():
        _check_str(name, "a type", fmt.MAX_TYPE_CHARS, optional=False)
    return names


def _check_utf8(value: str, name: str) -> None:
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError:
            raise InvalidInputError(f"{name} is not valid Unicode (lone surrogates)") from None


def _check_real(value: Any, name: str, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InvalidTypeError(f"{name} must be a number, not {type(value).__name__}")
    x = float(value)
    if not (math.isfinite(x) and lo <= x <= hi):
        raise InvalidInputError(f"{name} must be a finite number from {lo} to {hi}, got {value!r}")
    return x


def _check_metadata(metadata: Any) -> dict[str, Any] | None:
    if metadata is None:
        return None
    if not isinstance(metadata, Mapping):
        raise InvalidTypeError(f"metadata must be a dict, not {type(metadata).__name__}")
    try:
        packed = msgpack.packb(dict(metadata), use_bin_type=True)
        value = msgpack.unpackb(packed, raw=False, strict_map_key=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidInputError(
            f"metadata must hold only msgpack types (str keys, numbers, str, bytes, lists, "
            f"dicts, bool, None): {exc}"
        ) from None
    if not _plain(value):
        raise InvalidInputError(
            "metadata must hold only msgpack types (str keys, numbers, str, bytes, lists, "
            "dicts, bool, None): no extension types"
        )
    if len(packed) > fmt.MAX_METADATA_BYTES:
        raise InvalidInputError(
            f"metadata is {len(packed)} bytes packed; the limit is {fmt.MAX_METADATA_BYTES}: "
            f"keep large content in the memory's text"
        )
    return value


_PLAIN = (str, bytes, int, float, bool, type(None))


def _plain(value: Any) -> bool:
    """Only msgpack's own types: a msgpack.ExtType or Timestamp would pack, but it is not
    data every reader understands."""
    if isinstance(value, dict):
        return all(_plain(v) for v in value.values())
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    return isinstance(value, _PLAIN)


class _GroupCommit:
    """Background fdatasync for ``durability="batch"``: writes reach the disk in batches."""

    def __init__(self, fd: int, interval: float) -> None:
        self._fd, self._interval = fd, interval
        self._pending = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="fastmem-commit", daemon=True)
        self._thread.start()

    def notify(self) -> None:
        self._pending.set()

    def _run(self) -> None:
        while True:
            self._pending.wait()
            if not self._stopping:
                time.sleep(self._interval)  # let the writes of the next few ms join this sync
            self._pending.clear()
            try:
                os.fdatasync(self._fd)
            except OSError:  # the next flush or close reports it to the caller
                pass
            if self._stopping:
                return

    def stop(self) -> None:
        self._stopping = True
        self._pending.set()
        self._thread.join()


class MemoryStore:
    """An open fastmem store; create it with :func:`fastmem.open`.

    Safe to share between threads. One process may write at a time (an OS lock on the
    data file, released when the process ends, however it ends); any number may read.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        dim: int | None = None,
        embedder: Any = _DEFAULT,
        readonly: bool = False,
        durability: str = "batch",
        timeout: float = 0.0,
        summarizer: Any = _DEFAULT,
        policy: ContextPolicy | None = None,
        evict: EvictionPolicy | None = None,
    ) -> None:
        base = _base_path(path)
        if dim is not None:
            if isinstance(dim, bool) or not isinstance(dim, int) or not 0 < dim <= fmt.MAX_DIM:
                raise InvalidInputError(f"dim must be an int from 1 to {fmt.MAX_DIM}, got {dim!r}")
        if not isinstance(durability, str) or durability not in DURABILITY:
            raise InvalidInputError(f"durability must be one of {DURABILITY}, got {durability!r}")
        if not isinstance(readonly, bool):
            raise InvalidTypeError("readonly must be True or False")
        timeout = _check_real(timeout, "timeout", 0.0, 1e9)
        if embedder is not _DEFAULT and embedder is not None and not callable(
            getattr(embedder, "encode", None)
        ):
            raise InvalidTypeError("embedder must have an encode(list[str]) method, or be None")
        if summarizer is not _DEFAULT and summarizer is not None and not callable(
            getattr(summarizer, "summarize", None)
        ):
            raise InvalidTypeError("summarizer must have a summarize(list[str]) method, or be None")
        if policy is not None and not isinstance(policy, ContextPolicy):
            raise InvalidTypeError("policy must be a fastmem.ContextPolicy")
        self._eviction = _maintenance.check_policy(evict)

        self.path = base
        self.dat_path, self.idx_path = base + ".dat", base + ".idx"
        self.readonly = readonly
        self.durability = durability
        self._embedder = _resolve_embedder(embedder)
        self.policy = policy or ContextPolicy()
        self._summarizer_arg = summarizer
        self._cache = _ContentCache(self.policy.cache_bytes)
        self._preload: _Preload | None = None
        self._counters: dict[str, TokenCounter] = {}
        self._lock = threading.RLock()
        self._maintenance_lock = threading.Lock()  # one compaction or repair at a time
        self._epoch = 0  # counts data file replacements: row numbers change with it
        self._changes: list[tuple[int, int, int]] | None = None  # see _note_change
        self._generation = _fork_generation
        _stores.add(self)
        self._closed = True
        self._commit: _GroupCommit | None = None
        self._dat: mmap.mmap | None = None
        self._map_fd = -1
        self._fd = self._open_data_file(timeout)
        try:
            self._load(dim)
        except BaseException:
            self._release()
            raise
        self._closed = False
        self._last_call = time.monotonic()  # when a caller last asked for memories (see _Preload)
        if self.policy.preload or self.policy.recent:
            self._preload = _Preload(self)

    # --- opening -----------------------------------------------------------------------

    def _open_data_file(self, timeout: float) -> int:
        if self.readonly:
            _maintenance.releaser()  # ready before a compaction elsewhere needs it
            try:
                return os.open(self.dat_path, os.O_RDONLY)
            except FileNotFoundError:
                raise StoreNotFoundError(f"no fastmem store at {self.dat_path}") from None
        parent = os.path.dirname(os.path.abspath(self.dat_path))
        if not os.path.isdir(parent):
            make_private_dirs(parent)
        fd = os.open(self.dat_path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if os.fstat(fd).st_nlink == 0:
                    # A compaction replaced the file while we waited: lock the new one.
                    os.close(fd)
                    fd = os.open(self.dat_path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
                    continue
                _maintenance.recover(self.dat_path, self.idx_path)
                return fd
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise StoreLockedError(
                        f"{self.dat_path} is open for writing in another process or handle: "
                        f"close it, open with readonly=True, or pass timeout= to wait"
                    ) from None
                time.sleep(min(0.005, max(0.0, deadline - time.monotonic())))

    def _load(self, dim: int | None, retries: int = 3) -> None:
        size = os.fstat(self._fd).st_size
        created = size < fmt.DAT_HEADER_SIZE
        if created:
            self._create_data_file(size, dim or 0)
            size = fmt.DAT_HEADER_SIZE
        self._map_data(size)
        assert self._dat is not None
        header = fmt.unpack_dat_header(self._dat, self.dat_path)
        self._uuid = header.uuid
        self._check_embedder(header)
        if not hasattr(self, "tokens"):  # not again when a compaction's files are loaded
            self.tokens = TokenCounter(STORED_ENCODING)
            if self._summarizer_arg is _DEFAULT:
                self._summarizer: Any = KeySentences(SUMMARY_TOKENS, self.tokens.count)
            else:
                self._summarizer = self._summarizer_arg
        try:
            index = MemoryIndex.load(self.idx_path, header.uuid, header.dim, self._dat, size)
            reason = None
        except FileNotFoundError:
            index, reason = None, "it was missing"
        except (CorruptionError, FormatVersionError) as exc:
            if self.readonly and retries and os.fstat(self._fd).st_size != size:
                # A writer appended and checkpointed since the size was taken: the index
                # covers more than that size. Look again rather than rebuild.
                return self._load(dim, retries - 1)
            index, reason = None, str(exc)
        if index is None and self.readonly:
            if os.fstat(self._fd).st_nlink == 0:  # replaced meanwhile: read the new one
                _maintenance.follow(self)
                return
            index = _maintenance.pending_index(self, header, size)  # mid-swap
            reason = reason if index is None else None
        started = time.perf_counter()
        if index is None:
            index = MemoryIndex(header.dim, header.uuid)
        index.set_compaction(header)
        self._index = index
        problems, valid_end, _ = index.replay(self._dat, index.applied, size, self.dat_path)
        self._dat_end = size
        if reason is not None and not created:
            warnings.warn(
                f"fastmem rebuilt the index of {self.path} from its data file in "
                f"{time.perf_counter() - started:.3f} s ({len(index)} rows; {reason})",
                RecoveryWarning,
                stacklevel=4,
            )
        if not self.readonly and any(p.offset >= valid_end for p in problems):
            if _torn(self._dat, valid_end, size):
                # An interrupted write: nothing in it was acknowledged (its write never ended).
                os.ftruncate(self._fd, valid_end)
                self._dat_end = valid_end
                warnings.warn(
                    f"fastmem cut {size - valid_end} bytes of an interrupted write from the end "
                    f"of {self.dat_path}",
                    RecoveryWarning,
                    stacklevel=4,
                )
            else:
                warnings.warn(
                    f"fastmem found {size - valid_end} damaged bytes at the end of "
                    f"{self.dat_path} (offset {valid_end}); they are kept, and verify() "
                    f"reports them",
                    RecoveryWarning,
                    stacklevel=4,
                )
        self._valid_end = valid_end
        if dim is not None:
            if index.dim and index.dim != dim:
                raise DimensionMismatchError(
                    f"{self.path} holds {index.dim}-dimensional vectors, not {dim}: open it "
                    f"with dim={index.dim} or the embedder that wrote it"
                )
            index.set_dim(dim)
        if not self.readonly and (reason is not None or not os.path.exists(self.idx_path)):
            self._checkpoint()

    def _create_data_file(self, size: int, dim: int) -> None:
        if self.readonly:
            raise StoreNotFoundError(f"{self.dat_path} is still being created; try again")
        head = os.pread(self._fd, size, 0)
        if head[:8] != fmt.DAT_MAGIC[: len(head[:8])]:
            raise CorruptionError(
                f"{self.dat_path} is not a fastmem data file", path=self.dat_path, offset=0
            )
        os.ftruncate(self._fd, 0)  # a creation that was interrupted: start it again
        fingerprint = bytes(4)
        identity = _embedder_identity(self._embedder)
        if identity is not None:
            dim = dim or identity[1]
            if dim != identity[1]:
                raise DimensionMismatchError(f"dim={dim}, but the embedder makes {identity[1]}")
            fingerprint = fmt.embedder_fingerprint(*identity)
        header = fmt.pack_dat_header(os.urandom(16), dim, time.time(), embedder=fingerprint)
        os.write(self._fd, header)
        os.fsync(self._fd)
        _maintenance.fsync_dir(self.dat_path)

    def _check_embedder(self, header: fmt.DatHeader) -> None:
        """Refuse an embedder whose vectors would not compare with the stored ones."""
        identity = _embedder_identity(self._embedder)
        if identity is None:
            return
        name, dim = identity
        if header.dim and dim != header.dim:
            raise DimensionMismatchError(
                f"{self.path} holds {header.dim}-dimensional vectors; the embedder {name!r} "
                f"makes {dim}: open it with the embedder that wrote it, or embedder=None"
            )
        if header.embedder != bytes(4) and header.embedder != fmt.embedder_fingerprint(name, dim):
            raise EmbedderMismatchError(
                f"{self.path} was written by another embedder than {name!r} ({dim} dims): "
                f"its vectors would not compare; open it with the embedder that wrote it, "
                f"or embedder=None"
            )

    def _map_data(self, size: int) -> None:
        # Mapped through a descriptor of its own: mmap keeps a duplicate of the one it is
        # given, which must not be the locked one, or the lock would outlive close().
        if self._map_fd < 0:
            self._map_fd = os.open(self.dat_path, os.O_RDONLY)
        self._dat = mmap.mmap(self._map_fd, size, access=mmap.ACCESS_READ)

    # --- guards ------------------------------------------------------------------------

    def _check(self) -> None:
        if self._generation != _fork_generation:
            raise StoreForkedError(
                f"the store {self.path} was opened before fork(); open it again in this process"
            )
        if self._closed:
            raise StoreClosedError(f"the store {self.path} is closed; open it again")
        if self.readonly:
            self._refresh()

    def _check_writable(self) -> None:
        self._check()
        if self.readonly:
            raise ReadOnlyError(f"{self.path} was opened with readonly=True")

    def _refresh(self) -> None:
        """Readers: apply the records the writer has committed since the last call."""
        st = os.fstat(self._fd)
        if st.st_nlink == 0:  # a compaction or repair replaced the file: open the new one
            _maintenance.follow(self)
            return
        size = st.st_size
        if size == self._dat_end and self._valid_end == size:
            return
        if size < self._valid_end:  # the writer cut a damaged tail: start again
            self._cache = _ContentCache(self._cache.max_bytes)  # rows are numbered anew
            self._epoch += 1
            self._load(None)
            return
        self._map_data(size)
        self._dat_end = size
        self._valid_end = self._index.replay(self._dat, self._valid_end, size, self.dat_path)[1]

    def _data(self) -> mmap.mmap:
        """The data file's map, remapped when the file has grown past it."""
        assert self._dat is not None
        if len(self._dat) < self._dat_end:
            self._map_data(self._dat_end)
        return self._dat

    # --- writing -----------------------------------------------------------------------

    def add(
        self,
        text: str,
        *,
        type: str = "conversation",  # noqa: A002 - the documented keyword
        timestamp: float | None = None,
        session: str | None = None,
        importance: float | None = None,
        pinned: bool = False,
        metadata: dict[str, Any] | None = None,
        summary: str | None = None,
        embedding: Any = None,
    ) -> str:
        """Store one memory and return its id (``"m<number>"``).

        Args:
            text: the memory's content; non-empty, at most 1 MiB of UTF-8.
            type: ``conversation``, ``tool_result``, ``plan``, ``fact`` or your own name.
            timestamp: Unix seconds; now when left out.
            session: the session it belongs to.
            importance: 0 to 1; left out, the type's default (fact 0.9 ... conversation 0.3).
            pinned: kept in every context ("remember this").
            metadata: a dict of msgpack types, at most 64 KiB packed.
            summary: a short form of the text (at most 64 KiB).
            embedding: a precomputed vector of the store's dimension (normalised on write).

        Raises:
            InvalidInputError: a value is out of range (nothing is written).
            InvalidTypeError: a value has the wrong type (nothing is written).
            DimensionMismatchError: the embedding's length is not the store's dimension.
        """
        return self.add_many(
            [{"text": text, "type": type, "timestamp": timestamp, "session": session,
              "importance": importance, "pinned": pinned, "metadata": metadata,
              "summary": summary, "embedding": embedding}]
        )[0]  # fmt: skip

    def add_many(self, items: Iterable[Mapping[str, Any]]) -> list[str]:
        """Store many memories in one write and one commit; returns their ids in order.

        Each item is a dict with ``add``'s keyword names (``text`` required). Every item is
        checked before anything is written: one bad item raises and writes nothing.
        """
        if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Iterable):
            raise InvalidTypeError("add_many takes an iterable of dicts")
        items = list(items)
        with self._lock, _no_cyclic_gc():
            self._check_writable()
            if not items:
                return []
            now = time.time()
            prepared = [self._prepare(i, item, now) for i, item in enumerate(items)]
            vectors16 = self._vectors_for(items, prepared)
            self._summarize_and_count([item[0] for item in prepared])
            return self._commit_memories(prepared, vectors16)

    def _prepare(self, i: int, item: Any, now: float) -> list[Any]:
        """Validate one item; returns [payload, type name, session, importance, flags, embedding]."""
        if type(item) is not dict and not isinstance(item, Mapping):
            raise InvalidTypeError(f"item {i} must be a dict, not {type(item).__name__}")
        if not _ADD_KEYS.issuperset(item):
            unknown = sorted(map(str, item.keys() - _ADD_KEYS))
            raise InvalidInputError(f"item {i} has unknown keys {unknown}")
        get = item.get
        text = get("text")
        if type(text) is not str:
            raise InvalidTypeError(f"item {i}: text must be a string, not {type(text).__name__}")
        if not text or text.isspace():
            raise InvalidInputError(f"item {i}: text is empty")
        if not text.isascii():
            _check_utf8(text, "text")
            if len(text) > fmt.MAX_TEXT_BYTES // 4 and len(text.encode()) > fmt.MAX_TEXT_BYTES:
                raise InvalidInputError(f"item {i}: text is over {fmt.MAX_TEXT_BYTES} bytes of UTF-8")
        elif len(text) > fmt.MAX_TEXT_BYTES:
            raise InvalidInputError(f"item {i}: text is over {fmt.MAX_TEXT_BYTES} bytes of UTF-8")
        payload: dict[str, Any] = {"i": 0, "t": now, "x": text}
        ts = get("timestamp")
        if ts is not None:
            payload["t"] = _check_real(ts, "timestamp", 0.0, fmt.MAX_TIMESTAMP)
        type_name = get("type")
        if type_name is None or (type(type_name) is str and type_name == "conversation"):
            type_name = "conversation"
        else:
            payload["y"] = _check_str(type_name, "type", fmt.MAX_TYPE_CHARS, optional=False)
        session = get("session")
        if session is not None:
            payload["s"] = _check_str(session, "session", fmt.MAX_SESSION_CHARS, optional=False)
        importance = get("importance")
        if importance is None:
            importance = default_importance(type_name)
        else:
            importance = _check_real(importance, "importance", 0.0, 1.0)
            if importance != default_importance(type_name):
                payload["p"] = importance
        pinned = get("pinned", False)
        if pinned is not False:
            if pinned is not True:
                raise InvalidTypeError(f"item {i}: pinned must be True or False")
            payload["n"] = True
        metadata = get("metadata")
        if metadata is not None:
            payload["m"] = _check_metadata(metadata)
        summary = get("summary")
        if summary is not None:
            _check_str(summary, "summary", fmt.MAX_SUMMARY_BYTES, optional=False)
            if len(summary.encode()) > fmt.MAX_SUMMARY_BYTES:
                raise InvalidInputError(f"item {i}: summary is over {fmt.MAX_SUMMARY_BYTES} bytes")
            payload["u"] = summary
        return [payload, type_name, session, importance, fmt.FLAG_PINNED if pinned else 0,
                get("embedding")]

    def _summarize_and_count(self, payloads: list[dict[str, Any]]) -> None:
        """Give each payload its summary (unless it has one) and its token counts, once."""
        if self._summarizer is not None:
            todo = [p for p in payloads if "u" not in p]
            made = self._summarizer.summarize([p["x"] for p in todo]) if todo else []
            if not isinstance(made, list) or len(made) != len(todo):
                raise InvalidInputError("the summarizer must return a list: one summary or None per text")
            for payload, summary in zip(todo, made):
                if summary is None:
                    continue
                if not isinstance(summary, str):
                    raise InvalidTypeError(f"the summarizer returned a {type(summary).__name__}, not a str")
                summary = self.tokens.truncate(summary.strip(), SUMMARY_TOKENS)
                if summary and summary != payload["x"]:
                    _check_utf8(summary, "the summary")
                    payload["u"] = summary
        count = self.tokens.count
        for payload in payloads:
            summary = payload.get("u")
            payload["k"] = [count(payload["x"]), 0 if summary is None else count(summary)]

    def _vectors_for(self, items: list[Any], prepared: list[list[Any]]) -> np.ndarray | None:
        """Unit float16 vectors (n, dim) for the items that have or get one (zeros elsewhere)."""
        given = [j for j, p in enumerate(prepared) if p[5] is not None]
        missing = [j for j, p in enumerate(prepared) if p[5] is None]
        if missing and self._embedder is not None:
            encoded = self._embedder.encode([prepared[j][0]["x"] for j in missing])
            for j, vec in zip(missing, encoded):
                prepared[j][5] = vec
            given = list(range(len(prepared)))
        if not given:
            return None
        try:
            half = to_float16([prepared[j][5] for j in given], self._index.dim)
        except InvalidInputError as exc:
            row = getattr(exc, "row", None)
            if row is not None:
                raise InvalidInputError(f"item {given[row]}: {exc}") from None
            for j in given:  # find the item to name in the message
                try:
                    to_float16([prepared[j][5]], self._index.dim)
                except InvalidInputError as item_exc:
                    raise type(item_exc)(f"item {j}: {item_exc}") from None
            raise InvalidInputError("embeddings have different lengths") from None
        if len(given) == len(prepared):
            vectors = half
        else:
            vectors = np.zeros((len(prepared), half.shape[1]), dtype="<f2")
            vectors[given] = half
        for j in given:
            prepared[j][4] |= fmt.FLAG_HAS_VECTOR
        return vectors

    def _commit_memories(self, prepared: list[list[Any]], vectors16: np.ndarray | None) -> list[str]:
        index = self._index
        n = len(prepared)
        if vectors16 is not None and not index.dim:
            index.set_dim(vectors16.shape[1])
        first_id = index.next_id
        n_types = len(index.user_types)
        payloads = [item[0] for item in prepared]
        texts = [payload["x"] for payload in payloads]
        for j, payload in enumerate(payloads):
            payload["i"] = first_id + j
        token_counts = [p.get("k", _UNKNOWN_TOKENS) for p in payloads]
        stored, raw_lens = [], []
        for raw in _kernels.pack_payloads(payloads):
            if len(raw) < fmt.COMPRESS_MIN:  # most memories: no call to make
                stored.append(raw)
                raw_lens.append(len(raw))
            else:
                data, raw_len = fmt.compress_payload(raw)
                stored.append(data)
                raw_lens.append(raw_len)
        known = index.type_codes
        for item in prepared:  # the row's fields in place of payload, type and session names
            item[0] = item[0]["t"]
            code = known.get(item[1])
            item[1] = index.type_code(item[1], create=True) if code is None else code
            item[2] = 0 if item[2] is None else session_hash(item[2])
        ts, codes, sessions, importance, flags, _ = zip(*prepared)
        rows = np.zeros(n, dtype=fmt.INDEX_DTYPE)
        rows["id"] = np.arange(first_id, first_id + n)
        rows["timestamp"], rows["type"], rows["session"] = ts, codes, sessions
        rows["importance"], rows["flags"] = importance, flags
        rows["text_tokens"], rows["summary_tokens"] = np.array(token_counts, dtype=np.uint32).T
        has_vector = None
        if vectors16 is not None:
            has_vector = ((rows["flags"] & fmt.FLAG_HAS_VECTOR) != 0).view(np.uint8)
        data, lengths, crcs = _kernels.frame_records(
            fmt.KIND_MEMORY, stored, np.array(raw_lens, dtype=np.uint32),
            None if vectors16 is None else vectors16.view(np.uint16), has_vector,
        )  # fmt: skip
        try:
            start = self._append(data)
        except BaseException:
            del index.user_types[n_types:]
            index.type_codes = {
                name: code for name, code in index.type_codes.items()
                if code < fmt.FIRST_USER_TYPE + n_types
            }  # fmt: skip
            raise
        rows["length"] = lengths
        rows["offset"] = start + np.concatenate(([0], np.cumsum(lengths[:-1], dtype=np.uint64)))
        index.append(rows, vectors16, texts)
        index.note_applied(int(rows["offset"][-1]), int(lengths[-1]), int(crcs[-1]))
        self._valid_end = self._dat_end
        if index.tail.n >= CHECKPOINT_TAIL_ROWS:
            self._checkpoint()
        return [f"m{mid}" for mid in range(first_id, first_id + n)]

    def _append(self, data: bytes) -> int:
        """Append whole records; on failure the file is cut back and nothing is applied."""
        start = self._dat_end
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._fd, view) :]
        except BaseException:
            os.ftruncate(self._fd, start)
            raise
        self._dat_end = start + len(data)
        if self.durability == "always":
            os.fdatasync(self._fd)
        elif self.durability == "batch":
            if self._commit is None:
                self._commit = _GroupCommit(self._fd, GROUP_COMMIT_SECONDS)
            self._commit.notify()
        return start

    def _append_change(self, kind: int, payload: dict[str, Any]) -> int:
        stored, raw_len = fmt.encode_payload(payload)
        data, lengths, crcs = _kernels.frame_records(
            kind, [stored], np.array([raw_len], dtype=np.uint32), None, None
        )
        offset = self._append(data)
        self._index.note_applied(offset, len(data), int(crcs[0]))
        self._valid_end = self._dat_end
        return offset

    def update(
        self,
        mid: str,
        *,
        importance: float | None = None,
        pinned: bool | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        """Change a memory's importance, pin or metadata (``None`` leaves a field as it is).

        Raises:
            UnknownMemoryError: no live memory has this id.
        """
        with self._lock:
            self._check_writable()
            g, row = self._live_row(mid)
            payload: dict[str, Any] = {"i": row[F_ID], "t": time.time()}
            if importance is not None:
                payload["p"] = _check_real(importance, "importance", 0.0, 1.0)
            if pinned is not None:
                if not isinstance(pinned, bool):
                    raise InvalidTypeError("pinned must be True or False")
                payload["n"] = pinned
            if metadata is not None:
                payload["m"] = _check_metadata(metadata)
            if len(payload) == 2:
                return
            offset = self._append_change(fmt.KIND_UPDATE, payload)
            self._note_change(g, row)
            self._index.change(g, update_changes(row[F_FLAGS], payload, offset))

    def pin(self, mid: str, pinned: bool = True) -> None:
        """Pin a memory ("remember this") or, with ``pinned=False``, unpin it."""
        self.update(mid, pinned=pinned)

    def forget(self, mid: str) -> None:
        """Forget a memory: it is gone from every read (a tombstone in the data file).

        Raises:
            UnknownMemoryError: no live memory has this id.
        """
        with self._lock:
            self._check_writable()
            g, row = self._live_row(mid)
            self._append_change(fmt.KIND_FORGET, {"i": row[F_ID], "t": time.time()})
            self._note_change(g, row)
            self._index.forget(g, row[F_FLAGS])

    # --- reading -----------------------------------------------------------------------

    def _live_row(self, mid: str) -> tuple[int, tuple[Any, ...]]:
        g = self._index.find(_parse_id(mid))
        row = self._index.row(g) if g >= 0 else None
        if row is None or row[F_FLAGS] & fmt.FLAG_FORGOTTEN:
            raise UnknownMemoryError(f"no memory has the id {mid!r} (never added, or forgotten)")
        return g, row

    def _memory(self, g: int) -> Memory:
        row = self._index.row(g)
        return self._decode(row, self._data(), row[F_OFFSET], self._dat_end)

    def _decode(self, row: tuple[Any, ...], buf: Any, offset: int, end: int) -> Memory:
        """The memory of ``row`` from its record at ``offset`` of ``buf`` (the data file's
        map, or the index's hot section)."""
        info = _kernels.check_record(buf, offset, end)
        if info is None:
            if buf is self._dat:
                fmt.read_record(buf, offset, end, self.dat_path)  # raises the precise error
            raise CorruptRecordError(f"{self.dat_path}: bad record at {offset}", offset=offset)
        kind, dim, plen, rlen = info
        start = offset + fmt.RECORD_HEADER_SIZE + 2 * dim
        p = fmt.decode_payload(buf[start : start + plen], plen, rlen, offset, self.dat_path)
        if kind != fmt.KIND_MEMORY or p["i"] != row[F_ID] or start + plen - offset != row[F_LENGTH]:
            raise CorruptIndexError(
                f"{self.idx_path}: row of memory m{row[F_ID]} points at another record "
                f"(offset {row[F_OFFSET]}); delete the .idx file to rebuild it",
                path=self.idx_path,
            )
        text = p.get("x")
        if not isinstance(text, str):
            raise CorruptRecordError(
                f"{self.dat_path}: the record at offset {offset} has no text", offset=offset
            )
        metadata = p.get("m")
        if row[F_META]:
            head, update = fmt.read_record(self._data(), row[F_META], self._dat_end, self.dat_path)
            if update.get("i") != row[F_ID]:
                raise CorruptIndexError(f"{self.idx_path}: metadata of m{row[F_ID]} is misplaced")
            metadata = update.get("m")
        return _new_memory(
            Memory,
            (f"m{row[F_ID]}", text, p.get("y", "conversation"), row[F_TS], p.get("s"),
             _f32(row[F_IMPORTANCE]), bool(row[F_FLAGS] & fmt.FLAG_PINNED), metadata,
             p.get("u")),
        )  # fmt: skip

    def get(self, mid: str) -> Memory:
        """The memory with id ``mid``.

        Raises:
            UnknownMemoryError: no live memory has this id.
            CorruptRecordError: its record in the data file is damaged.
        """
        self._last_call = time.monotonic()
        with self._lock:
            self._check()
            row = self._live_row(mid)[1]
            return self._decode(row, self._data(), row[F_OFFSET], self._dat_end)

    def vector(self, mid: str) -> np.ndarray | None:
        """The embedding stored with memory ``mid`` (unit length, float16 precision, as a
        float32 array), or ``None`` when it has none: what an export needs so that an
        import keeps vectors given with ``add(embedding=...)`` instead of re-embedding.

        Raises:
            UnknownMemoryError: no live memory has this id.
            CorruptRecordError: its record in the data file is damaged.
        """
        with self._lock:
            self._check()
            row = self._live_row(mid)[1]
            if not row[F_FLAGS] & fmt.FLAG_HAS_VECTOR:
                return None
            buf, offset = self._data(), row[F_OFFSET]
            self._decode(row, buf, offset, self._dat_end)  # checks the record is this memory's
            start = offset + fmt.RECORD_HEADER_SIZE  # the vector follows the record's header
            return np.frombuffer(buf, dtype="<f2", count=self._index.dim, offset=start).astype(np.float32)

    def recent(self, n: int = 20) -> list[Memory]:
        """The ``n`` newest live memories by timestamp, newest first (level 1 of a restart)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidInputError(f"n must be an int >= 0, got {n!r}")
        n = min(n, 1 << 62)  # more than any store holds: all of them
        self._last_call = time.monotonic()
        with self._lock:
            self._check()
            hot = self._index.hot_rows()
            if hot is not None and (n <= hot[1] or hot[1] == self._index.live):
                try:
                    return self._hot_recent(hot[0], min(n, hot[1]))
                except CorruptionError:
                    pass  # verify() reports it; the rows and the data file still answer
            return [self._memory(g) for g in islice(self._index.by_time(newest_first=True), n)]

    def _hot_recent(self, hot: fmt.HotSection, n: int) -> list[Memory]:
        """The newest memories from the copy the last checkpoint kept in the index: a
        restart reads a few contiguous pages instead of a row and a record per memory."""
        size = fmt.INDEX_DTYPE.itemsize
        records, end = hot.records, len(hot.records)
        return [
            self._decode(fmt.INDEX_ROW.unpack_from(hot.rows, i * size), records, hot.starts[i], end)
            for i in range(n)
        ]

    def __iter__(self) -> Iterator[Memory]:
        """Live memories, oldest first (by timestamp, then id)."""
        with self._lock:
            self._check()
            ids = self._index.column("id")
            order = [int(ids[g]) for g in self._index.by_time(newest_first=False)]
        for mid in order:  # by id: a compaction meanwhile numbers the rows anew
            with self._lock:
                self._check()
                g = self._index.find(mid)
                if g >= 0 and not self._index.row(g)[F_FLAGS] & fmt.FLAG_FORGOTTEN:
                    yield self._memory(g)

    def __len__(self) -> int:
        with self._lock:
            self._check()
            return self._index.live

    def __contains__(self, mid: object) -> bool:
        with self._lock:
            self._check()
            try:
                self._live_row(mid)  # type: ignore[arg-type]
            except (UnknownMemoryError, InvalidTypeError):
                return False
            return True

    def search(
        self,
        query: Any,
        k: int = 10,
        *,
        types: Iterable[str] | None = None,
        since: float | None = None,
        until: float | None = None,
        session: str | None = None,
        mode: str = "hybrid",
    ) -> list[Hit]:
        """The ``k`` live memories that best match ``query``.

        Args:
            query: text, or a vector of the store's dimension (a vector is searched by
                vector whatever the mode).
            k: how many hits, 1 to 10,000.
            types: keep only these types.
            since, until: keep only timestamps in ``[since, until]``.
            session: keep only this session.
            mode: ``"hybrid"`` (text: vector and keyword rankings fused as ``context()``
                ranks, with importance and recency bonuses; the policy's weights), ``"vector"``
                (cosine; text is embedded by the store's embedder) or ``"keyword"`` (Okapi
                BM25 over the memories' text; tokenization rules in ``fastmem._keyword``).

        Returns:
            Hits best first (ties: the older id first). Vector mode: ``score`` is the exact
            cosine against the stored float16 vector (an int8 scan picks candidates, they
            are rescored). Keyword mode: the BM25 score. Hybrid: the fused relevance (1 for
            the best hit), with ``vector`` (approximate cosine) and ``keyword`` (BM25) set.
            A hybrid search before the embedding model has loaded ranks by keywords alone.
        """
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 10_000:
            raise InvalidInputError(f"k must be an int from 1 to 10000, got {k!r}")
        lo = -math.inf if since is None else _check_real(since, "since", -1e300, 1e300)
        hi = math.inf if until is None else _check_real(until, "until", -1e300, 1e300)
        session = _check_str(session, "session", fmt.MAX_SESSION_CHARS, optional=True)
        if types is not None and (isinstance(types, str) or not isinstance(types, Iterable)):
            raise InvalidTypeError("types must be a list of type names")
        if not isinstance(mode, str) or mode not in ("hybrid", "vector", "keyword"):
            raise InvalidInputError(f"mode must be 'hybrid', 'vector' or 'keyword', got {mode!r}")
        self._last_call = time.monotonic()
        if mode == "keyword":
            return self._keyword_search(query, k, types, lo, hi, session)
        if isinstance(query, str):
            if mode == "hybrid":
                return self._hybrid_search(query, k, types, lo, hi, session)
            query = self._embed_query(query)
        try:
            flat = np.ndim(query) == 1
        except ValueError:  # e.g. lists nested deeper than numpy's 64 dimensions
            flat = False
        if not flat:
            raise InvalidInputError("query must be text or one flat vector")
        with self._lock:
            self._check()
            index = self._index
            q16 = to_float16([query], index.dim, "query")  # checked even when nothing can match
            if not index.dim:
                return []
            q8, _ = quantize(q16)
            q = np.asarray(query, dtype=np.float64)
            q = q / np.linalg.norm(q)
            allowed = self._type_mask(_type_names(types))
            want = _vsearch.candidate_count(k, len(index))
            cand, _ = _vsearch.scan(index, q8[0], want, allowed, lo, hi, session_hash(session))
            try:
                exact = _vsearch.rescore(index, self._data(), cand, q)
            except ValueError:  # an index row pointing outside the data file
                raise CorruptIndexError(
                    f"{self.idx_path}: a row points outside the data file; run repair()",
                    path=self.idx_path, offset=0,
                ) from None
            if not np.isfinite(exact).all():  # an index row over a damaged vector
                raise CorruptRecordError(
                    f"{self.dat_path}: a stored vector is not finite; run repair()",
                    path=self.dat_path, offset=int(index.row(int(cand[~np.isfinite(exact)][0]))[F_OFFSET]),
                )
            best = np.lexsort((cand, -exact))  # rows are in id order: ties to the older id
            hits = []
            for g, score in zip(cand[best].tolist(), exact[best].tolist()):
                memory = self._memory(g)
                if session is not None and memory.session != session:
                    continue  # a 64-bit hash collision
                hits.append(Hit(memory.id, score, memory))
                if len(hits) == k:
                    break
            return hits

    def _embed_query(self, text: str) -> np.ndarray:
        _check_utf8(text, "query")
        if self._embedder is None:
            raise InvalidInputError(
                "this store has no embedder: search text with mode='keyword' or 'hybrid', or "
                "pass a vector"
            )
        wait = getattr(self._embedder, "wait", None)
        if wait is not None:
            wait()  # a vector search asked for explicitly waits for the model
        return _query_vector(self._embedder, text)

    def _hybrid_search(
        self, query: str, k: int, types: Iterable[str] | None, lo: float, hi: float,
        session: str | None,
    ) -> list[Hit]:  # fmt: skip
        _check_utf8(query, "query")
        if len(query) > fmt.MAX_TEXT_BYTES:
            raise InvalidInputError(f"query is over {fmt.MAX_TEXT_BYTES} characters")
        names = _type_names(types)
        with self._lock:
            self._check()
            filters = _Filters(self._type_mask(names), lo, hi, session_hash(session))
            ranked, _ = self._rank(query, max(k, self.policy.candidates), session=None,
                                   now=time.time(), filters=filters)  # fmt: skip
            hits = []
            for g, relevance, cosine, keyword in ranked:
                memory = self._memory(g)
                if session is not None and memory.session != session:
                    continue  # a 64-bit hash collision
                hits.append(Hit(memory.id, relevance, memory, cosine, keyword))
                if len(hits) == k:
                    break
            return hits

    def _type_mask(self, names: list[str] | None) -> np.ndarray | None:
        if names is None:
            return None
        allowed = np.zeros(65536, dtype=np.uint8)
        for name in names:
            code = self._index.type_code(name, create=False)
            if code >= 0:
                allowed[code] = 1
        return allowed

    def _keyword_search(
        self, query: Any, k: int, types: Iterable[str] | None, lo: float, hi: float,
        session: str | None,
    ) -> list[Hit]:
        """``search(mode="keyword")``: BM25 hits, best first (ties: the older id first)."""
        if not isinstance(query, str):
            raise InvalidTypeError(f"a keyword query is a string, not {type(query).__name__}")
        _check_utf8(query, "query")
        if len(query) > fmt.MAX_TEXT_BYTES:
            raise InvalidInputError(f"query is over {fmt.MAX_TEXT_BYTES} characters")
        names = _type_names(types)
        with self._lock:
            self._check()
            index = self._index
            allowed = self._type_mask(names)
            rows, scores = index.keyword.search(
                index, query, k, allowed, lo, hi, session_hash(session)
            )
            hits = []
            for g, score in zip(rows.tolist(), scores.tolist()):
                memory = self._memory(g)
                if session is not None and memory.session != session:
                    continue  # a 64-bit hash collision
                hits.append(Hit(memory.id, score, memory))
            return hits

    # --- context: the three levels ------------------------------------------------------

    def context(
        self,
        query: str = "",
        budget: int = 1300,
        *,
        session: str | None = None,
        encoding: str | None = None,
        exclude: Iterable[str] | None = None,
    ) -> Context:
        """The memories that matter for ``query``, as text within ``budget`` tokens.

        Merges pinned memories, the newest memories (level 1) and a hybrid search for the
        query over everything (level 3); removes duplicates; orders them for a model to
        read (pinned first, then by time under one header per session and day); uses a
        memory's summary where its full text would not fit or matter. ``tokens`` is the
        exact count of ``text`` in ``encoding`` (``cl100k_base``, whose counts the index keeps, by default) and never exceeds
        ``budget``. Every memory used counts as an access (importance statistics).

        Args:
            query: what the model is about to be asked ("" for no search).
            budget: tokens, 1 to 1,000,000 (≈1,300 is what fastmem is tuned for).
            session: the current session: its memories rank a little higher.
            encoding: count with another tiktoken encoding than the store's.
            exclude: ids of memories to leave out (e.g. those the model has already been
                shown this session); ids of forgotten or unknown memories are ignored.
        """
        started = time.perf_counter()
        self._last_call = time.monotonic()
        budget = check_budget(budget)
        if not isinstance(query, str):
            raise InvalidTypeError(f"query must be a string, not {type(query).__name__}")
        _check_utf8(query, "query")
        session = _check_str(session, "session", fmt.MAX_SESSION_CHARS, optional=True)
        counter = self._counter(encoding)
        stored_counts = counter is self.tokens
        policy = self.policy
        if exclude is not None and (isinstance(exclude, str) or not isinstance(exclude, Iterable)):
            raise InvalidTypeError("exclude must be a list of memory ids")
        excluded_ids = set() if exclude is None else set(exclude)
        for mid in excluded_ids:
            if not isinstance(mid, str):
                raise InvalidTypeError(f"exclude holds memory ids (strings), not {type(mid).__name__}")
        with self._lock:
            self._check()
            now = time.time()
            ranked, degraded = self._rank(query, policy.candidates, session=session, now=now)
            # An excluded row is marked as already placed, so no level takes it.
            levels: dict[int, tuple[Level, float]] = {}  # row -> (level, priority)
            skip = self._rows_of(excluded_ids)
            share = {0: policy.pinned_share * budget, 1: policy.recent_share * budget}
            spent = {0: 0.0, 1: 0.0}
            for level, rows in ((Level.PINNED, self._pinned_rows()), (Level.RECENT, self._level1_rows())):
                for i, g in enumerate(rows):
                    row = self._index.row(g)
                    cost = row[F_TEXT_TOKENS] if row[F_TEXT_TOKENS] != fmt.UNKNOWN_TOKENS else 64
                    if g in levels or g in skip or spent[level] + cost > share[level]:
                        continue
                    spent[level] += cost
                    levels[g] = (level, 3.0 - level - i * 1e-6)
            scores = {}
            for g, relevance, _, _ in ranked:
                scores[g] = relevance
                if g not in levels and g not in skip:
                    levels[g] = (Level.FOUND, relevance)
            candidates = self._candidates(levels, scores, counter, stored_counts, budget)
            text, tokens, items = pack(candidates, budget, counter.count)
            if not self.readonly:
                used = [self._index.find(_parse_id(item.id)) for item in items]
                self._index.touch(used, now)
        return new_context(text, tokens, budget, items, counter.name, degraded, started)

    def _rows_of(self, ids: set[str]) -> set[int]:
        """The index rows of the memory ids that exist (others are left out silently)."""
        rows = set()
        for mid in ids:
            try:
                g = self._index.find(_parse_id(mid))
            except UnknownMemoryError:  # not an id fastmem makes: nothing to leave out
                continue
            if g >= 0:
                rows.add(g)
        return rows

    def _counter(self, encoding: str | None) -> TokenCounter:
        if encoding is not None and not isinstance(encoding, str):
            raise InvalidTypeError("encoding must be a tiktoken encoding name")
        if encoding is None or encoding == self.tokens.name:
            return self.tokens
        counter = self._counters.get(encoding)
        if counter is None:
            counter = self._counters[encoding] = TokenCounter(encoding)
        counter.encoding  # noqa: B018 - load it now: an unknown name fails here, clearly
        return counter

    def _candidates(
        self, levels: dict[int, tuple[Level, float]], scores: dict[int, float],
        counter: TokenCounter, stored_counts: bool, budget: int,
    ) -> list[Candidate]:  # fmt: skip
        """Context candidates for rows, best first, near-duplicates left out (the better one
        stays); enough of them to fill the budget twice over, no more are read."""
        policy = self.policy
        order = sorted(levels, key=lambda g: -levels[g][1])
        vectors, has_vector = self._index.unit_vectors(np.array(order, dtype=np.int64))
        kept = np.zeros((len(order), vectors.shape[1]), dtype=np.float32)
        n_kept = 0
        seen_texts: set[str] = set()
        out: list[Candidate] = []
        total = 0
        for j, g in enumerate(order):
            if total > 2 * budget:
                break
            level, priority = levels[g]
            row = self._index.row(g)
            memory = self._cached_memory(g)
            key = " ".join(memory.text.casefold().split())
            if key in seen_texts:
                continue
            if has_vector[j]:
                if level == 3 and n_kept and float((kept[:n_kept] @ vectors[j]).max()) >= policy.near_duplicate:
                    continue
                kept[n_kept] = vectors[j]
                n_kept += 1
            seen_texts.add(key)
            if stored_counts and row[F_TEXT_TOKENS] != fmt.UNKNOWN_TOKENS:
                text_tokens, summary_tokens = row[F_TEXT_TOKENS], row[F_SUMMARY_TOKENS]
            else:
                text_tokens = counter.count(memory.text)
                summary_tokens = counter.count(memory.summary) if memory.summary else 0
            score = scores.get(g, 0.0)
            item = ContextItem(memory.id, level, score, memory.text, False, memory.timestamp,
                               memory.session, memory.type)  # fmt: skip
            summary = (memory.summary, summary_tokens) if memory.summary else None
            if summary is not None and level == 3 and score < policy.full_text_score:
                # Weakly related: its summary first (more evidence fits), its text if room.
                item = ContextItem(memory.id, level, score, memory.summary or "", True,
                                   memory.timestamp, memory.session, memory.type)  # fmt: skip
                out.append(Candidate(item, summary_tokens, priority))
                total += summary_tokens
            else:
                out.append(Candidate(item, text_tokens, priority, summary))
                total += text_tokens
        return out

    def _cached_memory(self, g: int) -> Memory:
        memory = self._cache.get(g)
        if memory is None:
            memory = self._memory(g)
            self._cache.put(g, memory)
        return memory

    def _pinned_rows(self) -> list[int]:
        """Pinned live memories, most important first."""
        if self._index.pinned is None:
            self._index.pinned = self._find_pinned()
        return self._index.pinned

    def _find_pinned(self) -> list[int]:
        pinned, importance = [], []
        for first, rows, _ in self._index.segments():
            flags = rows["flags"]
            hit = np.nonzero((flags & fmt.FLAG_PINNED != 0) & (flags & fmt.FLAG_FORGOTTEN == 0))[0]
            pinned.append(hit + first)
            importance.append(rows["importance"][hit])
        if not pinned:
            return []
        rows_ = np.concatenate(pinned)
        return rows_[np.lexsort((rows_, -np.concatenate(importance)))].tolist()

    def _level1_rows(self) -> list[int]:
        """Level 1, newest first: the last ``recent`` memories, or those of the last
        ``recent_minutes``, or the whole last session (policy)."""
        policy = self.policy
        newest = self._index.by_time(newest_first=True)
        if policy.recent_session:
            out: list[int] = []
            last = None
            for g in newest:
                row = self._index.row(g)
                if last is None:
                    last = row[F_SESSION]
                elif row[F_SESSION] != last:
                    break
                out.append(g)
            return out
        if policy.recent_minutes is not None:
            out, since = [], None
            for g in newest:
                ts = self._index.row(g)[F_TS]
                since = ts - policy.recent_minutes * 60 if since is None else since
                if ts < since:
                    break
                out.append(g)
            return out
        return list(islice(newest, policy.recent))

    def _rank(
        self, query: str, k: int, *, session: str | None, now: float,
        filters: _Filters | None = None,
    ) -> tuple[list[tuple[int, float, float | None, float]], bool]:  # fmt: skip
        """Level 3: rows ranked for ``query``, best first, with relevance from 0 to 1.

        The ``k`` best rows by vector and the ``k`` best by keyword, and the memories next
        to them in their sessions, are scored by both (z-scores over these candidates,
        weighted); each score is then smoothed with its neighbours' (an answer often sits
        next to the turn that matches the question) and importance, recency and the
        current session add small bonuses.

        Returns ``(ranked, degraded)``: ``ranked`` holds (row, relevance, cosine or None,
        BM25 score); ``degraded`` when the store has an embedder that is not loaded yet (the
        ranking then has no vector component).
        """
        index = self._index
        if not query.strip() or not index.live:
            return [], False
        f = filters or _NO_FILTERS
        policy = self.policy
        vector = None
        parts = []
        embedder = self._embedder
        words = _content_words(query)
        degraded = embedder is not None and bool(index.dim) and not getattr(embedder, "ready", True)
        if embedder is not None and index.dim and not degraded:
            keyword_job = _keyword_worker().submit(index.keyword.search, index, words, k, *f)
            try:
                vector = _query_vector(embedder, query)
                parts.append(self._vector_candidates(vector, k, f)[0])
            finally:
                wait([keyword_job])  # it reads the index: done before anything can change it
            kw_rows, kw_scores = keyword_job.result()
        else:
            kw_rows, kw_scores = index.keyword.search(index, words, k, *f)
        parts.append(kw_rows)
        found = np.unique(np.concatenate(parts)).astype(np.int64)
        if not len(found):
            return [], degraded
        cand, prev, nxt = self._with_neighbours(found, f)
        score = np.zeros(len(cand))
        cosines = None
        if vector is not None:
            cosines = self._cosines(cand, vector)
            score += policy.vector_weight * _z(cosines)
        keyword = np.zeros(len(cand))
        at = np.searchsorted(cand, kw_rows)
        kept = at < len(cand)  # a keyword hit the filters drop (a damaged row) is not a candidate
        kept[kept] &= cand[at[kept]] == kw_rows[kept]
        keyword[at[kept]] = kw_scores[kept]
        score += policy.keyword_weight * _z(keyword)
        # Neighbours: smooth, then let a strong match lift the memory next to it.
        lam = policy.neighbour_weight
        floor = float(score.min())
        before = np.where(prev >= 0, score[np.maximum(prev, 0)], floor)
        after = np.where(nxt >= 0, score[np.maximum(nxt, 0)], floor)
        smooth = score + lam * (before + after)
        before = np.where(prev >= 0, smooth[np.maximum(prev, 0)], -np.inf)
        after = np.where(nxt >= 0, smooth[np.maximum(nxt, 0)], -np.inf)
        fused = np.maximum(smooth, np.maximum(before, after) - policy.neighbour_gap)
        fused += self._bonuses(cand, session, now)
        order = np.lexsort((cand, -fused))
        lo, hi = float(fused.min()), float(fused.max())
        relevance = (fused - lo) / (hi - lo) if hi > lo else np.ones(len(fused))
        return [
            (int(cand[i]), float(relevance[i]), None if cosines is None else float(cosines[i]),
             float(keyword[i]))
            for i in order
        ], degraded  # fmt: skip

    def _with_neighbours(
        self, found: np.ndarray, f: _Filters
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``found`` plus the live memory before and after each in the same session (rows
        are in the order memories were added) that pass the filters, sorted; and for each,
        the position of its neighbour before and after in the result (-1: none)."""
        index = self._index
        near = np.concatenate([found - 1, found, found + 1])
        near = np.unique(near[(near >= 0) & (near < len(index))])
        fields = index.gather(near, ("flags", "timestamp", "session", "type"))
        kept = f.mask(fields)
        cand, session = near[kept], fields["session"][kept]
        prev = self._neighbour_positions(cand, session, -1)
        nxt = self._neighbour_positions(cand, session, 1)
        return cand, prev, nxt

    @staticmethod
    def _neighbour_positions(cand: np.ndarray, session: np.ndarray, step: int) -> np.ndarray:
        """For each of the sorted rows ``cand``, the position in ``cand`` of row ``g + step``
        when it is there and in the same session, else -1."""
        if not len(cand):
            return np.zeros(0, dtype=np.int64)
        at = np.minimum(np.searchsorted(cand, cand + step), len(cand) - 1)
        found = (cand[at] == cand + step) & (session[at] == session)
        return np.where(found, at, -1).astype(np.int64)

    def _cosines(self, rows: np.ndarray, query: Any) -> np.ndarray:
        """Approximate cosines (int8 vectors) of ``rows`` with a query vector; rows without a
        vector get the lowest."""
        q = np.asarray(query, dtype=np.float32)
        q = q / (np.linalg.norm(q) or 1.0)
        vectors, has = self._index.unit_vectors(rows)
        out = vectors @ q
        if has.any() and not has.all():
            out[~has] = out[has].min()
        return out

    def _bonuses(self, rows: np.ndarray, session: str | None, now: float) -> np.ndarray:
        policy = self.policy
        wanted = session_hash(session) if session else 0
        scale = 1.0 / (policy.recency_half_life_days * DAY)
        fields = self._index.gather(rows, ("importance", "timestamp", "session"))
        age = np.fmax(0.0, now - fields["timestamp"].astype(np.float64))  # fmax: a NaN age is 0
        with np.errstate(invalid="ignore"):  # a damaged row's importance: a signalling NaN
            bonus = policy.importance_weight * fields["importance"].astype(np.float64)
        bonus += policy.recency_weight * 2.0 ** (-age * scale)
        if wanted:
            bonus += policy.session_weight * (fields["session"] == wanted)
        return bonus

    def _vector_candidates(
        self, query: Any, k: int, f: _Filters
    ) -> tuple[np.ndarray, np.ndarray]:
        """Rows of the ``k`` best int8 scores for a query vector (no rescoring)."""
        index = self._index
        q16 = to_float16([query], index.dim, "query")
        q8, _ = quantize(q16)
        return _vsearch.scan(index, q8[0], k, *f)

    def importance_scores(self, now: float | None = None) -> np.ndarray:
        """Every row's current importance (float32; forgotten rows ``-inf``), computed by
        the compiled kernel from base importance, decayed access count, recency and pins."""
        with self._lock:
            self._check()
            return self._importance(time.time() if now is None else float(now))

    def _importance(self, now: float, rows: np.ndarray | None = None) -> np.ndarray:
        """The importance score of every row, or of ``rows`` only."""
        policy = self.policy
        if rows is None:
            parts: list[tuple[int, Any]] = [(first, seg) for first, seg, _ in self._index.segments()]
            out = np.empty(len(self._index), dtype=np.float32)
        else:
            parts = [(0, self._index.gather(rows, _IMPORTANCE_FIELDS))]
            out = np.empty(len(rows), dtype=np.float32)
        for first, cols in parts:
            _kernels.importance(
                cols["importance"], cols["flags"], cols["access_count"], cols["last_access"],
                cols["timestamp"], out[first : first + len(cols["flags"])], now,
                policy.access_half_life_days * DAY, policy.access_weight,
                policy.recency_half_life_days * DAY, policy.recency_weight, policy.pin_bonus,
                fmt.FLAG_PINNED, fmt.FLAG_FORGOTTEN,
            )  # fmt: skip
        return out

    @property
    def preload_progress(self) -> tuple[int, int]:
        """Level 2: (memories preloaded, memories to preload) by the background thread."""
        preload = self._preload
        return (0, 0) if preload is None else (preload.done, preload.total)

    def wait_preload(self, timeout: float | None = None) -> bool:
        """Wait for the level-2 preload to finish; whether it has."""
        preload = self._preload
        return True if preload is None else preload.finished.wait(timeout)

    # --- figures for operators ----------------------------------------------------------

    def stats(self) -> StoreStats:
        """The store's figures, read from the index alone (no record is decoded, so it
        costs milliseconds even at a million memories): counts by type, pins, sessions,
        time span, tokens, vectors and file sizes."""
        with self._lock:
            self._check()
            index = self._index
            cols = self._live_columns(("type", "flags", "session", "timestamp", "text_tokens"))
            codes, counts = np.unique(cols["type"], return_counts=True)
            types = {index.type_name(c): n for c, n in zip(codes.tolist(), counts.tolist())}
            known = cols["text_tokens"][cols["text_tokens"] != fmt.UNKNOWN_TOKENS]
            ts, sessions, flags = cols["timestamp"], cols["session"], cols["flags"]
            return StoreStats(
                path=self.path,
                memories=int(index.live),
                forgotten=int(len(index) - index.live),
                pinned=int(np.count_nonzero(flags & fmt.FLAG_PINNED)),
                with_vector=int(np.count_nonzero(flags & fmt.FLAG_HAS_VECTOR)),
                dim=int(index.dim),
                types=dict(sorted(types.items(), key=lambda kv: (-kv[1], kv[0]))),
                sessions=int(len(np.unique(sessions[sessions != 0]))),
                oldest=float(ts.min()) if len(ts) else None,
                newest=float(ts.max()) if len(ts) else None,
                text_tokens=int(known.sum(dtype=np.int64)),
                dat_bytes=os.path.getsize(self.dat_path),
                idx_bytes=os.path.getsize(self.idx_path) if os.path.exists(self.idx_path) else 0,
                backend=_kernels.BACKEND,
            )

    def largest(self, n: int = 10) -> list[RecordSize]:
        """The ``n`` live memories with the largest records, largest first (ties: the
        older id first)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidInputError(f"n must be an int >= 0, got {n!r}")
        with self._lock:
            self._check()
            cols = self._live_columns(("id", "length", "text_tokens"))
            order = np.lexsort((cols["id"], -cols["length"].astype(np.int64)))[:n]
            return [
                RecordSize(f"m{int(cols['id'][i])}", int(cols["length"][i]), int(cols["text_tokens"][i]))
                for i in order.tolist()
            ]

    def info(self, mid: str) -> RecordInfo:
        """Where and how memory ``mid`` is stored, from its index row.

        Raises:
            UnknownMemoryError: no live memory has this id.
        """
        with self._lock:
            self._check()
            g, row = self._live_row(mid)
            score = float(self._importance(time.time(), np.array([g]))[0])
            known = row[F_TEXT_TOKENS] != fmt.UNKNOWN_TOKENS
            return RecordInfo(
                record_offset=int(row[F_OFFSET]),
                record_bytes=int(row[F_LENGTH]),
                text_tokens=int(row[F_TEXT_TOKENS]) if known else None,
                summary_tokens=int(row[F_SUMMARY_TOKENS]) if known else None,
                has_vector=bool(row[F_FLAGS] & fmt.FLAG_HAS_VECTOR),
                access_count=int(row[F_ACCESS]),
                last_access=float(row[F_LAST_ACCESS]) or None,
                importance_score=score,
            )

    def pinned(self) -> list[Memory]:
        """The pinned memories, most important first (ties: the older id first)."""
        with self._lock:
            self._check()
            return [self._memory(g) for g in self._pinned_rows()]

    def check_items(self, items: Iterable[Mapping[str, Any]]) -> None:
        """Check items as ``add_many`` would, writing nothing: what an import does before
        its first write, so that a bad line in a file leaves the store as it was. An
        item's embedding must have the store's dimension (or, in an empty store, the
        first embedding's).

        Raises:
            InvalidInputError: an item is invalid; its ``item`` attribute says which.
            InvalidTypeError: an item has a value of the wrong type (``item`` too).
        """
        if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Iterable):
            raise InvalidTypeError("check_items takes an iterable of dicts")
        with self._lock:
            self._check()
            dim = self._index.dim
        now = time.time()
        for i, item in enumerate(items):
            try:
                self._prepare(i, item, now)
                embedding = item.get("embedding")
                if embedding is not None:
                    dim = dim or to_float16([embedding], 0).shape[1]
                    to_float16([embedding], dim)
            except InvalidInputError as exc:
                if exc.item is None:
                    message = str(exc)
                    exc = type(exc)(message if message.startswith(f"item {i}:") else f"item {i}: {message}")
                    exc.item = i
                raise exc from None

    def record_access(self, ids: Iterable[str], now: float | None = None) -> None:
        """Count one access for each memory of ``ids`` (unknown or forgotten ids are
        left out): what ``context()`` does for the memories it uses. For a process
        that reads through a read-only handle (the Hermes provider) and hands the ids
        to its writer, so that importance still learns from use.

        Raises:
            ReadOnlyError: the store was opened with ``readonly=True``.
        """
        if isinstance(ids, str) or not isinstance(ids, Iterable):
            raise InvalidTypeError("ids must be a list of memory ids")
        wanted = set(ids)
        for mid in wanted:
            if not isinstance(mid, str):
                raise InvalidTypeError(f"ids holds memory ids (strings), not {type(mid).__name__}")
        when = time.time() if now is None else _check_real(now, "now", 0.0, fmt.MAX_TIMESTAMP)
        with self._lock:
            self._check_writable()
            self._index.touch(sorted(self._rows_of(wanted)), when)

    def _live_columns(self, names: tuple[str, ...]) -> dict[str, np.ndarray]:
        live = (self._index.column("flags") & fmt.FLAG_FORGOTTEN) == 0
        return {name: self._index.column(name)[live] for name in names}

    # --- durability and integrity -------------------------------------------------------

    def flush(self) -> None:
        """Make every write so far durable (fsync); for readers, catch up with the writer."""
        with self._lock:
            self._check()
            if not self.readonly:
                os.fdatasync(self._fd)

    def checkpoint(self) -> None:
        """Write the index file now (``close`` does it too), so the next open replays nothing."""
        with self._lock:
            self._check_writable()
            self._evict_by_policy()
            self._checkpoint()

    def _evict_by_policy(self) -> None:
        policy = self._eviction
        if policy is not None:
            _maintenance.evict(self, policy.ttl, policy.min_importance, policy.max_count,
                               policy.max_bytes, None)  # fmt: skip

    # --- forgetting, compaction, repair, backup (fastmem._maintenance) --------------------

    def evict(
        self,
        *,
        ttl: Mapping[str, float] | None = None,
        min_importance: float | None = None,
        max_count: int | None = None,
        max_bytes: int | None = None,
        now: float | None = None,
    ) -> list[str]:
        """Forget the memories the policies select; returns their ids. Pinned memories
        are never evicted. The policies (each optional, all applied) are those of
        :class:`EvictionPolicy`: ``ttl`` seconds by type name, an importance-score floor,
        a maximum count, a maximum of live record bytes (lowest scores go first).
        The forgets are tombstones, as ``forget`` writes; ``compact()`` reclaims the space.
        """
        return _maintenance.evict(self, ttl, min_importance, max_count, max_bytes, now)

    def compact(self) -> CompactReport:
        """Rewrite the live memories into new files and swap them in atomically (a crash
        leaves the old store or the new one); a session's memories end up side by side.

        Ids stay the same and are never reused. Other threads wait only for the snapshot
        and the swap; readers in other processes move to the new files on their next call.
        Returns a :class:`CompactReport` (bytes before and after, time the lock was held).

        Raises:
            CorruptionError: the data file has damaged records: ``repair()`` it.
        """
        return _maintenance.compact(self)

    def repair(self) -> RepairReport:
        """Keep every intact record of a damaged data file: rewrite the store from them
        (as ``compact`` does) and rebuild its index. What is cut away is kept in
        ``<name>.dat.damaged-<time>`` (see ``docs/FORMAT.md``) and listed in the
        :class:`RepairReport`."""
        return _maintenance.repair(self)

    def backup(self, dest: str | os.PathLike[str]) -> BackupReport:
        """Copy the store to ``dest`` (``dest.dat``, ``dest.idx``; new names) while
        writes go on: the copy holds every memory committed before the call, opens
        without recovery and ``verify()``s clean."""
        return _maintenance.backup(self, dest)

    def _note_change(self, g: int, row: tuple[Any, ...]) -> None:
        """Before row ``g`` changes in place: while a compaction runs, it reads the rows
        without the lock and takes their values from before the change here."""
        if self._changes is not None:
            self._changes.append((g, row[F_FLAGS], row[F_META]))

    def _stop_preload(self) -> None:
        preload, self._preload = self._preload, None
        if preload is not None:
            preload.stop()

    def _start_preload(self) -> None:
        if self._preload is None and not self._closed and (self.policy.preload or self.policy.recent):
            self._preload = _Preload(self)

    def _checkpoint(self) -> None:
        sync = self.durability != "none"
        if sync:
            os.fdatasync(self._fd)  # the index must never cover data that is not on disk
        self._index.save(self.idx_path, self._data(), sync=sync)
        if sync:
            _maintenance.fsync_dir(self.idx_path)  # the rename itself must survive a power loss
        # Continue from the file just written: the tail's memory is released.
        assert self._dat is not None
        self._index = MemoryIndex.load(
            self.idx_path, self._uuid, self._index.dim, self._data(), self._dat_end
        )

    def verify(self) -> Report:
        """Check every record's checksum and the index against the data file.

        Returns a :class:`Report`; each problem names its file and byte offset (or row).
        """
        with self._lock:
            self._check()
            dat = self._data()
            header = fmt.unpack_dat_header(dat, self.dat_path)
            fresh = MemoryIndex(header.dim, self._uuid)
            fresh.set_compaction(header)
            problems, _, records = fresh.replay(dat, fmt.DAT_HEADER_SIZE, self._dat_end, self.dat_path)
            try:
                problems += _damaged_rows(self._index, fresh.damaged)
                problems += _compare(self._index, fresh)
                problems += _compare_keyword(self._index, fresh)
                problems += self._check_hot(dat)
            except CorruptionError as exc:  # an index too damaged to compare row by row
                problems.append(Problem("idx", 0, str(exc)))
            size = self._dat_end
            if os.path.exists(self.idx_path):
                size += os.path.getsize(self.idx_path)
            return Report(ok=not problems, problems=problems, records=records, bytes=size)

    def _check_hot(self, dat: Any) -> list[Problem]:
        """The index's copy of the newest memories must be those memories, byte for byte."""
        current = self._index.hot_rows()
        if current is None:
            return []
        hot, count = current
        newest = list(islice(self._index.by_time(newest_first=True), count))
        if len(newest) != count:
            return [Problem("idx", 0, f"the hot section holds {count} memories, not {len(newest)}")]
        size = fmt.INDEX_DTYPE.itemsize
        for i, g in enumerate(newest):
            row = self._index.row(g)
            start = hot.starts[i]
            copy = hot.records[start : start + row[F_LENGTH]]
            if (
                _without_statistics(fmt.INDEX_ROW.unpack_from(hot.rows, i * size))
                != _without_statistics(row)
                or copy != dat[row[F_OFFSET] : row[F_OFFSET] + row[F_LENGTH]]
            ):
                return [Problem("idx", i, f"entry {i} of the hot section differs from m{row[F_ID]}")]
        return []

    def close(self) -> None:
        """Checkpoint the index, make everything durable and release the lock; idempotent."""
        preload = self._preload
        if preload is not None:
            preload.stop()  # outside the lock: the preload thread takes it between chunks
        with self._lock:
            if self._closed or self._generation != _fork_generation:
                self._closed = True
                return
            try:
                if self._preload is not None:
                    self._preload.stop()
                if not self.readonly:
                    self._evict_by_policy()
                if self._commit is not None:
                    self._commit.stop()
                    self._commit = None
                # Nothing new since the last checkpoint means nothing unsynced: it synced.
                # Access statistics alone are worth a checkpoint too (they live only there), and
                # keyword postings built for an index that lacked them (when their build has
                # finished: close never waits for it).
                if not self.readonly and (
                    self._index.applied != self._index.covered or self._index.stats_changed
                    or self._index.keyword.built_unsaved
                ):
                    self._checkpoint()
            finally:
                self._closed = True
                self._release()

    def _release(self) -> None:
        self._dat = None
        self._index = None  # type: ignore[assignment]
        if self._map_fd >= 0:
            os.close(self._map_fd)
            self._map_fd = -1
        os.close(self._fd)  # releases the writer lock

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self._index.live} memories"
        mode = "readonly" if self.readonly else self.durability
        return f"<fastmem.MemoryStore {self.path!r} {state}, {mode}>"


def _resolve_embedder(embedder: Any) -> Any:
    """The embedder a store uses: the default model unless one (or ``None``) is given.

    ``FASTMEM_EMBEDDER=none`` in the environment makes the default ``None`` (a keyword-only
    store): for tools and tests that never embed.
    """
    if embedder is not _DEFAULT:
        return embedder
    choice = os.environ.get("FASTMEM_EMBEDDER", "default")
    if choice == "none":
        return None
    if choice != "default":
        raise InvalidInputError(f"FASTMEM_EMBEDDER must be 'default' or 'none', not {choice!r}")
    return default_embedder()  # the model loads in the background: open never waits


def _embedder_identity(embedder: Any) -> tuple[str, int] | None:
    """(model name, dimension) when the embedder says them (``name`` and ``dim``)."""
    name, dim = getattr(embedder, "name", None), getattr(embedder, "dim", None)
    if isinstance(name, str) and isinstance(dim, int) and not isinstance(dim, bool) and dim > 0:
        return name, dim
    return None


class _Filters(NamedTuple):
    """What a search keeps: as the kernels take it (type mask, time range, session hash)."""

    allowed: np.ndarray | None
    since: float
    until: float
    session: int

    def mask(self, fields: dict[str, np.ndarray]) -> np.ndarray:
        """Which rows pass, from their fields (``MemoryIndex.gather``)."""
        ts = fields["timestamp"]
        keep = (fields["flags"] & fmt.FLAG_FORGOTTEN) == 0
        keep &= (ts >= self.since) & (ts <= self.until)  # a NaN timestamp fails both
        if self.session:
            keep &= fields["session"] == self.session
        if self.allowed is not None:
            keep &= self.allowed[fields["type"]].astype(bool)
        return keep


_NO_FILTERS = _Filters(None, -math.inf, math.inf, 0)

_STOP_WORDS = frozenset(
    "a an and are as at be but by can could did do does for from had has have he her him his "
    "how i if in into is it its me my no not of on or our she should so than that the their "
    "them then there these they this those to was we were what when where which who whom why "
    "will with would you your".split()
)


def _content_words(query: str) -> str:
    """The query without question and function words, for BM25 (all of it if nothing is
    left): they match everywhere and push the content words' matches down."""
    words = [w for w in query.split() if w.strip("?!.,;:'\"()").lower() not in _STOP_WORDS]
    return " ".join(words) if words else query


def _z(x: np.ndarray) -> np.ndarray:
    """Standard scores: comparable across the vector and keyword scales."""
    std = float(x.std())
    return (x - x.mean()) / std if std > 0 else np.zeros(len(x))


def _query_vector(embedder: Any, query: str) -> np.ndarray:
    encode_query = getattr(embedder, "encode_query", None)
    if encode_query is not None:
        return np.asarray(encode_query(query))
    return np.asarray(embedder.encode([query]))[0]


class _ContentCache:
    """Decoded memories by row, least recently used first out, bounded in bytes."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: OrderedDict[int, tuple[Memory, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, g: int) -> Memory | None:
        with self._lock:
            hit = self._items.get(g)
            if hit is None:
                return None
            self._items.move_to_end(g)
            return hit[0]

    def put(self, g: int, memory: Memory) -> None:
        size = len(memory.text) + len(memory.summary or "") + 200
        with self._lock:
            old = self._items.pop(g, None)
            if old is not None:
                self.bytes -= old[1]
            if size > self.max_bytes:
                return
            self._items[g] = (memory, size)
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, (_, dropped) = self._items.popitem(last=False)
                self.bytes -= dropped

    def discard(self, g: int) -> None:
        with self._lock:
            old = self._items.pop(g, None)
            if old is not None:
                self.bytes -= old[1]

    def __len__(self) -> int:
        return len(self._items)


class _Preload:
    """Level 2: a background thread that reads the most important memories (their summaries
    and texts) into the store's cache, a chunk at a time, taking the store's lock only per
    chunk so callers never wait long; stopped by ``close()``.

    It works for later calls, so it gives way to the call being made: each step waits until
    callers have left the store alone for ``_QUIET`` seconds (at most ``_MAX_DEFER``, so a
    busy caller does not starve it). The first search after a restart would otherwise wait
    for the importance pass over every row (at 1 M rows, faulting in 80 MB of rows).
    """

    _QUIET = 0.05
    _MAX_DEFER = 0.5

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.done = 0
        self.total = 0
        self.finished = threading.Event()
        self._stopping = threading.Event()
        self._thread = Background(self._run, "fastmem-preload")

    def _run(self) -> None:
        store = self.store
        try:
            if not self._defer():
                return
            with store._lock:
                if store._closed:
                    return
                epoch = store._epoch
                for g in store._level1_rows():  # level 1 first: loaded whole
                    store._cached_memory(g)
                scores = store._importance(time.time())
                k = min(store.policy.preload, int(np.count_nonzero(np.isfinite(scores))))
                top = np.argpartition(-scores, k - 1)[:k] if k else np.zeros(0, np.int64)
                top = top[np.lexsort((top, -scores[top]))].tolist()
            self.total = len(top)
            chunk = max(1, store.policy.preload_chunk)
            for start in range(0, len(top), chunk):
                if not self._defer():
                    return
                with store._lock:
                    if store._closed or store._epoch != epoch:  # rows were numbered anew
                        return
                    for g in top[start : start + chunk]:
                        store._cached_memory(g)
                self.done = min(start + chunk, len(top))
        except FastmemError:
            pass  # a damaged record: the caller meets it when it reads that memory
        finally:
            self.finished.set()

    def _defer(self) -> bool:
        """Wait for a quiet moment (see the class); False once the preload is stopped."""
        deadline = time.monotonic() + self._MAX_DEFER
        while True:
            wait = min(self.store._last_call + self._QUIET, deadline) - time.monotonic()
            if wait <= 0:
                return not self._stopping.is_set()
            if self._stopping.wait(wait):
                return False

    def stop(self) -> None:
        self._stopping.set()
        if not self._thread.is_current():
            self._thread.join()


@contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Pause the cycle collector while a batch is built: its many short-lived dicts and
    lists hold no cycles (reference counting frees them), yet they would trigger full
    collections that cost a quarter of add_many's time on large batches."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


_STATISTICS = frozenset(
    fmt.INDEX_DTYPE.names.index(name) for name in ("access_count", "last_access")  # type: ignore[union-attr]
)


def _without_statistics(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A row without its access statistics: they change after the hot section is written."""
    return tuple(v for i, v in enumerate(row) if i not in _STATISTICS)


def _torn(dat: Any, start: int, end: int) -> bool:
    """Whether ``dat[start:end]`` looks like an interrupted append, not damaged records.

    An interrupted append leaves less than a header, zeros (blocks allocated, never
    written), or a record that claims more bytes than the file has. Anything else may be
    an acknowledged record hit by bit rot: it is kept for ``verify()`` to report.
    """
    tail = dat[start:end]
    if len(tail) < fmt.RECORD_HEADER_SIZE or not any(tail):
        return True
    if tail[:4] != fmt.RECORD_MAGIC:
        return False
    _, _, _, dim, plen, _, _ = fmt.RECORD_HEADER.unpack_from(tail, 0)
    return fmt.RECORD_HEADER_SIZE + 2 * dim + plen > len(tail)


_COMPARED = ("id", "timestamp", "session", "offset", "meta_offset", "length", "importance",
             "scale", "text_tokens", "summary_tokens", "type", "flags", "reserved")  # fmt: skip


def _damaged_rows(index: MemoryIndex, regions: list[tuple[int, int]]) -> list[Problem]:
    """The records the index points at that lie inside a damaged region, past its start (the
    region's own problem names its start): one problem per damaged record, at its offset,
    even when damaged records follow each other."""
    if not regions or not len(index):
        return []
    starts = np.array([s for s, _ in regions], dtype=np.int64)
    ends = np.array([e for _, e in regions], dtype=np.int64)
    ids = index.column("id")
    problems = []
    for name, what in (("offset", "memory record"), ("meta_offset", "metadata update")):
        at = index.column(name).astype(np.int64)
        region = np.maximum(np.searchsorted(starts, at, side="right") - 1, 0)
        inside = (at > starts[region]) & (at < ends[region])
        for g in np.nonzero(inside)[0].tolist():
            problems.append(Problem("dat", int(at[g]), f"the {what} of m{ids[g]} is damaged"))
    return problems


def _compare(live: MemoryIndex, fresh: MemoryIndex) -> list[Problem]:
    """Where the index in use differs from one rebuilt from the data file."""
    problems = []
    if len(live) != len(fresh):
        return [Problem("idx", 0, f"the index has {len(live)} rows, the data file {len(fresh)}")]
    if live.user_types != fresh.user_types:
        problems.append(Problem("idx", 0, "the type table differs from the data file's"))
    if live.live != fresh.live:
        problems.append(Problem("idx", 0, f"the index counts {live.live} live memories, the data file {fresh.live}"))
    bad = np.zeros(len(live), dtype=bool)
    for name in _COMPARED:
        bad |= live.column(name) != fresh.column(name)
    if live.dim == fresh.dim and live.dim:
        for (first, _, lv), (_, _, fv) in zip(live.segments(), _segments_like(fresh, live)):
            if lv.shape == fv.shape:
                bad[first : first + len(lv)] |= (lv != fv).any(axis=1)
    for g in np.nonzero(bad)[0].tolist():
        problems.append(Problem("idx", g, f"row {g} (m{fresh.row(g)[F_ID]}) differs from its record"))
    expected_order = np.argsort(live.base_rows["timestamp"], kind="stable")
    for i in np.nonzero(live.base_order != expected_order)[0].tolist():
        problems.append(Problem("idx", i, f"entry {i} of the time order is wrong"))
    return problems


def _compare_keyword(live: MemoryIndex, fresh: MemoryIndex) -> list[Problem]:
    """Whether the index's keyword postings are those of the data file's texts."""
    try:
        mine = live.keyword.section()
    except CorruptionError as exc:
        return [Problem("idx", 0, str(exc))]
    theirs = fresh.keyword.section()
    for name, a, b in zip(mine._fields, mine, theirs):
        if not np.array_equal(a, b):
            return [Problem("idx", 0, f"the keyword section's {name} differ from the data file's texts")]
    if live.keyword.live_tokens != fresh.keyword.live_tokens:
        return [Problem("idx", 0, "the keyword section's token total differs from the data file's")]
    return []


def _segments_like(fresh: MemoryIndex, live: MemoryIndex) -> list[tuple[int, Any, np.ndarray]]:
    """``fresh``'s vectors cut at the same rows as ``live``'s segments."""
    vectors = np.concatenate([v for _, _, v in fresh.segments()]) if len(fresh) else None
    return [(first, None, vectors[first : first + len(v)]) for first, _, v in live.segments()]  # type: ignore[index]
