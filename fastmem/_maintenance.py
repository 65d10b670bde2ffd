"""Forgetting, compaction, repair and backup: the work that rewrites a store's files.

``MemoryStore.evict``, ``compact``, ``repair`` and ``backup`` are thin methods over the
functions here. The on-disk rules they follow (the compacted prefix, the rename order and
the recovery rule applied at open) are in ``docs/FORMAT.md`` under "Compaction".

Compaction in three steps, so the store's lock is held only briefly:

1. under the lock: note where the data file ends and copy the live rows (a snapshot);
2. without it: write the live memories' records, in (session, timestamp, id) order, to
   ``<name>.dat.compact``, and an index for them to ``<name>.idx.compact``; fsync both;
3. under the lock: append what was written since the snapshot (its records, verbatim),
   rename ``.dat.compact`` over ``.dat`` (the commit point), then ``.idx.compact`` over
   ``.idx``, and continue on the new files.

Readers holding the old files keep reading the old inode (it is not changed, only
unlinked); their next call sees that it is unlinked and opens the new one.
"""

from __future__ import annotations

import ctypes
import fcntl
import math
import mmap
import os
import queue
import struct
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _format as fmt
from . import _kernels
from ._index import MemoryIndex, default_importance
from ._threads import Background
from .errors import (
    CorruptionError, CorruptRecordError, FormatVersionError, InvalidInputError, InvalidTypeError,
    StoreLockedError, StoreNotFoundError,
)  # fmt: skip

from .types import BackupReport, CompactReport, EvictionPolicy, Problem, RepairReport

if TYPE_CHECKING:
    from .store import MemoryStore

COMPACT_SUFFIX = ".compact"  # <name>.dat.compact, <name>.idx.compact: a compaction's new files
DAMAGED_SUFFIX = ".damaged-"  # <name>.dat.damaged-<UTC time>: what repair() cut away
DAMAGED_REGION = struct.Struct("<QQ")  # offset in the old .dat, length; then the bytes
_WRITE_CHUNK = 4 << 20


# --- eviction ---------------------------------------------------------------------------


def check_policy(policy: Any) -> EvictionPolicy | None:
    if policy is None or isinstance(policy, EvictionPolicy):
        if policy is not None:
            _checked(policy.ttl, policy.min_importance, policy.max_count, policy.max_bytes)
        return policy
    raise InvalidTypeError("evict must be a fastmem.EvictionPolicy or None")


def _checked(
    ttl: Any, min_importance: Any, max_count: Any, max_bytes: Any
) -> tuple[dict[str, float], float | None, int | None, int | None]:
    """Validate ``evict``'s arguments (before anything is written)."""
    ttls: dict[str, float] = {}
    if ttl is not None:
        if not isinstance(ttl, Mapping):
            raise InvalidTypeError("ttl must be a dict of type name -> seconds")
        for name, seconds in ttl.items():
            if not isinstance(name, str) or not name:
                raise InvalidTypeError("ttl's keys must be type names")
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
                raise InvalidTypeError(f"ttl[{name!r}] must be a number of seconds")
            if not (math.isfinite(seconds) and seconds >= 0):
                raise InvalidInputError(f"ttl[{name!r}] must be a finite number >= 0")
            ttls[name] = float(seconds)
    if min_importance is not None:
        if isinstance(min_importance, bool) or not isinstance(min_importance, (int, float)):
            raise InvalidTypeError("min_importance must be a number")
        if not math.isfinite(min_importance):
            raise InvalidInputError("min_importance must be finite")
    for name, value in (("max_count", max_count), ("max_bytes", max_bytes)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise InvalidInputError(f"{name} must be an int >= 0, got {value!r}")
    return ttls, min_importance, max_count, max_bytes


def evict(
    store: MemoryStore, ttl: Any, min_importance: Any, max_count: Any, max_bytes: Any,
    now: float | None,
) -> list[str]:  # fmt: skip
    """Forget what the policies select (never a pinned memory); the ids, oldest id first.

    The forgets are one write: one tombstone per memory, appended together."""
    ttls, floor, max_count, max_bytes = _checked(ttl, min_importance, max_count, max_bytes)
    now = time.time() if now is None else float(now)
    with store._lock:
        store._check_writable()
        index = store._index
        flags = index.column("flags")
        live = (flags & fmt.FLAG_FORGOTTEN) == 0
        evictable = live & ((flags & fmt.FLAG_PINNED) == 0)
        chosen = np.zeros(len(index), dtype=bool)
        if ttls:
            ts, types = index.column("timestamp"), index.column("type")
            for name, seconds in ttls.items():
                code = index.type_code(name, create=False)
                if code >= 0:
                    chosen |= evictable & (types == code) & (ts < now - seconds)
        scores = store._importance(now)
        if floor is not None:
            chosen |= evictable & (scores < floor)
        if max_count is not None or max_bytes is not None:
            # Lowest score first, then the oldest, then the smallest id.
            order = np.lexsort((index.column("id"), index.column("timestamp"), scores))
            order = order[(evictable & ~chosen)[order]]
            if max_count is not None:
                excess = int(np.count_nonzero(live & ~chosen)) - max_count
                if excess > 0:
                    chosen[order[:excess]] = True
                    order = order[excess:]
            if max_bytes is not None:
                lengths = index.column("length").astype(np.int64)
                excess = int(lengths[live & ~chosen].sum()) - max_bytes
                if excess > 0:
                    upto = int(np.searchsorted(np.cumsum(lengths[order]), excess)) + 1
                    chosen[order[:upto]] = True
        rows = np.nonzero(chosen)[0].tolist()
        if not rows:
            return []
        ids = index.column("id")[rows].tolist()
        stored, raw_lens = zip(*(fmt.encode_payload({"i": mid, "t": now}) for mid in ids))
        data, lengths_, crcs = _kernels.frame_records(
            fmt.KIND_FORGET, list(stored), np.array(raw_lens, dtype=np.uint32), None, None
        )
        start = store._append(data)
        last = start + int(lengths_[:-1].sum())
        logging = store._changes is not None  # a compaction is running: see _Snapshot
        for g in rows:
            if logging:
                store._note_change(g, index.row(g))
            index.forget(g, int(flags[g]))
        index.note_applied(last, int(lengths_[-1]), int(crcs[-1]))
        store._valid_end = store._dat_end
        return [f"m{mid}" for mid in ids]


# --- writing a compacted data file ----------------------------------------------------------


class _Snapshot:
    """The live rows to write, as columns, in id order, as they were when it was taken.

    Taking it under the store's lock costs nothing: it notes the row count and starts the
    store's log of in-place changes (``MemoryStore._note_change``). The rows are read later
    without the lock; a row that changed meanwhile gets its values from before the change
    from the log (each change is logged before it is made, so whatever change the read saw
    is in the log when it is consulted after the read)."""

    def __init__(self, store: MemoryStore, index: MemoryIndex) -> None:
        self.index, self.n, self.next_id = index, len(index), index.next_id
        self.changes: list[tuple[int, int, int]] = []
        store._changes = self.changes

    def fill(self) -> None:
        """Read the rows (outside the lock)."""
        index, n_base = self.index, self.index.n_base
        base, tail = index.base_rows, index.tail.rows[: self.n - n_base]
        columns = {
            name: np.concatenate([base[name], tail[name]])
            for name in ("flags", "meta_offset", "id", "session", "timestamp", "offset", "length",
                         "importance", "access_count", "last_access")
        }  # fmt: skip
        before: dict[int, tuple[int, int]] = {}
        for g, flags, meta in list(self.changes):
            if g < self.n and g not in before:  # the first change logged: the value before it
                before[g] = (flags, meta)
        for g, (flags, meta) in before.items():
            columns["flags"][g], columns["meta_offset"][g] = flags, meta
        keep = np.nonzero((columns["flags"] & fmt.FLAG_FORGOTTEN) == 0)[0]
        self.dropped = self.n - len(keep)
        self.columns = {name: column[keep] for name, column in columns.items()}
        del self.index

    def __len__(self) -> int:
        return len(self.columns["id"])


def _folded_record(dat: Any, offset: int, length: int, row: dict[str, Any], meta: Any, path: str) -> bytes:
    """The memory record at ``offset``, byte for byte when its row says what it says; else a
    new memory record with the row's importance and pin and the current metadata."""
    info = _kernels.check_record(dat, offset, offset + length)
    if info is None:
        fmt.read_record(dat, offset, offset + length, path)  # raises the precise error
        raise CorruptRecordError(f"{path}: bad record at {offset}", path=path, offset=offset)
    kind, dim, plen, rlen = info
    start = offset + fmt.RECORD_HEADER_SIZE + 2 * dim
    payload = fmt.decode_payload(dat[start : start + plen], plen, rlen, offset, path)
    if kind != fmt.KIND_MEMORY or payload.get("i") != row["id"]:
        raise CorruptRecordError(f"{path}: the record at offset {offset} is not memory m{row['id']}",
                                 path=path, offset=offset)  # fmt: skip
    want = dict(payload)
    importance = np.float32(row["importance"])
    type_default = default_importance(payload.get("y", "conversation"))
    if np.float32(payload.get("p", type_default)) != importance:
        want["p"] = float(str(importance))  # 0.3, not 0.30000001
    pinned = bool(row["flags"] & fmt.FLAG_PINNED)
    if bool(payload.get("n", False)) != pinned:
        if pinned:
            want["n"] = True
        else:
            want.pop("n", None)
    if meta is not _UNCHANGED:
        if meta is None:
            want.pop("m", None)
        else:
            want["m"] = meta
    if want == payload:
        return bytes(dat[offset : offset + length])
    stored, raw_len = fmt.encode_payload(want)
    vectors = has = None
    if dim:
        vectors = fmt.record_vector(dat, offset, dim).view(np.uint16).reshape(1, dim)
        has = np.ones(1, dtype=np.uint8)
    data, _, _ = _kernels.frame_records(fmt.KIND_MEMORY, [stored], np.array([raw_len], np.uint32), vectors, has)
    return data


_UNCHANGED = object()


def _write_records(dat: Any, dat_end: int, snap: _Snapshot, fd: int, path: str) -> int:
    """Write the snapshot's memory records to ``fd`` after its header, in (session,
    timestamp, id) order: a session's memories sit together. Returns the end offset."""
    c = snap.columns
    order = np.lexsort((c["id"], c["timestamp"], c["session"])).tolist()
    offsets, lengths, metas = c["offset"].tolist(), c["length"].tolist(), c["meta_offset"].tolist()
    parts: list[bytes] = []
    size = 0
    end = fmt.DAT_HEADER_SIZE
    for i in order:
        off, length = offsets[i], lengths[i]
        meta: Any = _UNCHANGED
        if metas[i]:
            _, update = fmt.read_record(dat, metas[i], dat_end, path)
            meta = update.get("m")
        row = {"id": int(c["id"][i]), "importance": c["importance"][i], "flags": int(c["flags"][i])}
        parts.append(_folded_record(dat, off, length, row, meta, path))
        size += len(parts[-1])
        if size >= _WRITE_CHUNK:
            end += _write_all(fd, b"".join(parts))
            parts, size = [], 0
    end += _write_all(fd, b"".join(parts))
    return end


def _write_all(fd: int, data: bytes) -> int:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    return len(data)


def _new_store(store: MemoryStore, dat: Any, dat_end: int, snap: _Snapshot) -> tuple[int, int]:
    """Write ``<name>.dat.compact`` (locked, fsynced) and ``<name>.idx.compact`` for the
    snapshot. Returns the new data file's descriptor (open, locked) and its size."""
    snap.fill()
    header = fmt.unpack_dat_header(dat, store.dat_path)
    new_dat = store.dat_path + COMPACT_SUFFIX
    fd = os.open(new_dat, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        # Locked before anyone can find it under the store's name: a writer that opens the
        # store after the rename waits for this lock, never writes beside this one.
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, bytes(fmt.DAT_HEADER_SIZE))
        end = _write_records(dat, dat_end, snap, fd, store.dat_path)
        next_id = max(snap.next_id, header.next_id)
        new_header = fmt.pack_dat_header(header.uuid, header.dim, header.created, next_id, end, header.embedder)
        os.pwrite(fd, new_header, 0)
        # The store appends through it from now on (Linux would append the pwrite above
        # too if it had been set already).
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)
        os.fsync(fd)
        _write_index(store, fd, end, snap)
    except BaseException:
        os.close(fd)
        remove_compaction_files(store.dat_path, store.idx_path)
        raise
    return fd, end


def _write_index(store: MemoryStore, fd: int, end: int, snap: _Snapshot) -> None:
    """``<name>.idx.compact``: the index of the new data file, with the snapshot's access
    statistics (they live only in the index)."""
    mm = mmap.mmap(fd, end, access=mmap.ACCESS_READ)
    try:
        index, problems = build_index(mm, end, store.dat_path + COMPACT_SUFFIX)
        if problems or len(index) != len(snap):
            raise CorruptionError(f"the compacted data file does not read back: {problems[:3]}")
        tail = index.tail.rows[: index.tail.n]
        if not np.array_equal(tail["id"], snap.columns["id"]):
            raise CorruptionError("the compacted data file lost or reordered memories")
        tail["access_count"] = snap.columns["access_count"]
        tail["last_access"] = snap.columns["last_access"]
        index.save(store.idx_path + COMPACT_SUFFIX, mm, sync=True)
        del index, tail  # nothing may still look into the map when it closes
    finally:
        mm.close()


def build_index(dat: Any, end: int, path: str) -> tuple[MemoryIndex, list[Problem]]:
    """An index built from a data file alone (its header's compaction fields included)."""
    header = fmt.unpack_dat_header(dat, path)
    index = MemoryIndex(header.dim, header.uuid)
    index.set_compaction(header)
    problems, _, _ = index.replay(dat, fmt.DAT_HEADER_SIZE, end, path)
    return index, problems


# --- the swap ------------------------------------------------------------------------------


def remove_compaction_files(dat_path: str, idx_path: str) -> None:
    for name in (dat_path + COMPACT_SUFFIX, idx_path + COMPACT_SUFFIX, idx_path + COMPACT_SUFFIX + ".tmp"):
        try:
            os.remove(name)
        except FileNotFoundError:
            pass


def recover(dat_path: str, idx_path: str) -> None:
    """The recovery rule, applied by a writer at open (holding the lock): a ``.dat.compact``
    means the compaction never reached its commit point (the rename of the data file): it
    is removed with its index. A lone ``.idx.compact`` is the committed compaction's index:
    it is renamed into place."""
    if os.path.exists(dat_path + COMPACT_SUFFIX):
        remove_compaction_files(dat_path, idx_path)
    elif os.path.exists(idx_path + COMPACT_SUFFIX):
        os.replace(idx_path + COMPACT_SUFFIX, idx_path)
        fsync_dir(idx_path)


def fsync_dir(path: str) -> None:
    """Make the entries of ``path``'s directory durable (a rename, a new file)."""
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _commit(store: MemoryStore, fd: int, tail: bytes) -> _Retired:
    """Append ``tail`` to the new data file, rename both files into place, and continue on
    them. The caller holds the store's lock, and calls ``_after_commit`` once it has let
    it go, with what this returns."""
    if tail:
        _write_all(fd, tail)
        os.fdatasync(fd)  # the rest was synced when it was written
    os.replace(store.dat_path + COMPACT_SUFFIX, store.dat_path)  # the commit point
    if store.durability == "always":
        # Before any write to the new file is acknowledged. The other modes may lose the
        # last few ms of writes to a power loss anyway: they sync it after the lock.
        fsync_dir(store.dat_path)
    try:  # the old index, to drop its pages from the cache later (see _Retired)
        old_idx = os.open(store.idx_path, os.O_RDONLY)
    except FileNotFoundError:
        old_idx = -1
    os.replace(store.idx_path + COMPACT_SUFFIX, store.idx_path)
    retired = switch_files(store, fd)
    if old_idx >= 0:
        retired.fds.append(old_idx)
    return retired


def _after_commit(store: MemoryStore, retired: _Retired) -> None:
    """Outside the lock: make the renames durable (were the index's lost, the recovery
    rule would rename it again) and let the old files go."""
    fsync_dir(store.idx_path)
    retired.release(drop_cache=True)


class _Retired:
    """The old files' index, maps and descriptors after a swap.

    Letting go of them takes time in proportion to what was read from them: unmapping
    (which holds the GIL, in ``mmap.close``) and, when the last reference to a replaced
    file goes, freeing its cached pages. So the pages are first unmapped with
    ``madvise(MADV_DONTNEED)`` through ctypes (which lets the GIL go), the maps closed
    after that cost little, and the descriptors, which keep the files alive until then,
    are closed last (``os.close`` lets the GIL go too). The writer does it outside the
    store's lock, dropping the old files' cached pages first; a reader, in a thread."""

    def __init__(self, objects: list[Any], fds: list[int]) -> None:
        self.objects, self.fds = objects, fds

    def release(self, drop_cache: bool) -> None:
        maps = []
        for obj in self.objects:
            if isinstance(obj, mmap.mmap):
                maps.append(obj)
            closer = getattr(obj, "file_closer", None)  # an index: its map's descriptor
            if closer is not None and closer.alive:
                info = closer.detach()
                if info is not None:
                    maps.append(info[0])
                    self.fds.append(info[2][0])
        work = (self.objects, maps, self.fds, drop_cache)
        self.objects, self.fds = [], []
        if drop_cache:
            _let_go(*work)
        else:  # a reader: not on the call that met the swap (nor waiting for a thread to start)
            releaser().put(work)


_releaser: tuple[int, queue.SimpleQueue[Any]] | None = None
_releaser_lock = threading.Lock()


def releaser() -> queue.SimpleQueue[Any]:
    """The queue of this process's release thread (started once, by the first reader, so
    that a reader meeting a swap only puts its old files there)."""
    global _releaser
    with _releaser_lock:
        if _releaser is None or _releaser[0] != os.getpid():  # none yet, or forked since
            work: queue.SimpleQueue[Any] = queue.SimpleQueue()
            Background(lambda: _release_loop(work), "fastmem-release")
            _releaser = (os.getpid(), work)
        return _releaser[1]


def _release_loop(work: queue.SimpleQueue[Any]) -> None:
    while True:
        item = work.get()
        try:
            _let_go(*item)
        except OSError:  # nothing to report to: the files are gone either way
            pass
        del item


def _let_go(objects: list[Any], maps: list[mmap.mmap], fds: list[int], drop_cache: bool) -> None:
    for mm in maps:
        _unmap_pages(mm)
    maps.clear()
    objects.clear()  # the maps close here: cheap now
    for fd in fds:
        if drop_cache and hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)  # a writer's old lock: on the old inode, no one else can want it now


_libc: Any = None


def _unmap_pages(mm: mmap.mmap) -> None:
    """``madvise(MADV_DONTNEED)`` over a map that nothing reads any more, without the GIL."""
    global _libc
    try:
        view = np.frombuffer(mm, dtype=np.uint8)
    except (ValueError, TypeError, BufferError):  # closed, or empty
        return
    addr, size = view.ctypes.data, view.size
    del view  # the map cannot close while a view of it exists
    if not size or not hasattr(mmap, "MADV_DONTNEED"):
        return
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    _libc.madvise(ctypes.c_void_p(addr), ctypes.c_size_t(size), mmap.MADV_DONTNEED)


def switch_files(store: MemoryStore, fd: int) -> _Retired:
    """Continue on the data file open as ``fd`` (the one now under the store's name): drop
    the cached memories (rows are numbered anew) and reload. Returns the old index, maps
    and descriptors, for the caller to release (see ``_Retired``)."""
    if store._commit is not None:
        store._commit.stop()
        store._commit = None
    retired = _Retired([getattr(store, "_index", None), store._dat, store._cache], [store._fd])
    if store._map_fd >= 0:
        retired.fds.append(store._map_fd)
    store._dat = None
    store._index = None  # type: ignore[assignment]
    store._fd, store._map_fd = fd, -1
    store._cache = type(store._cache)(store._cache.max_bytes)
    store._epoch += 1
    store._load(None)
    return retired


def follow(store: MemoryStore) -> None:
    """A reader whose data file was replaced (it is unlinked): continue on the new one."""
    switch_files(store, os.open(store.dat_path, os.O_RDONLY)).release(drop_cache=False)


def pending_index(store: MemoryStore, header: fmt.DatHeader, size: int) -> MemoryIndex | None:
    """A reader that opened the new data file before the compaction renamed its index:
    the index waiting under ``.idx.compact``, if it is the one for this file."""
    try:
        return MemoryIndex.load(store.idx_path + COMPACT_SUFFIX, header.uuid, header.dim, store._dat, size)
    except (OSError, CorruptionError):
        return None


def _sizes(store: MemoryStore) -> tuple[int, int]:
    """The data file's and the index file's sizes."""
    idx = os.path.getsize(store.idx_path) if os.path.exists(store.idx_path) else 0
    return os.path.getsize(store.dat_path), idx


def compact(store: MemoryStore) -> CompactReport:
    """See ``MemoryStore.compact``."""
    started = time.perf_counter()
    with store._maintenance_lock:
        store._stop_preload()
        held = time.perf_counter()
        with store._lock:
            store._check_writable()
            if store._valid_end != store._dat_end:
                raise CorruptionError(
                    f"{store.dat_path} ends with damaged bytes: repair() it first", path=store.dat_path
                )
            before = _sizes(store)
            dat, dat_end = store._data(), store._dat_end
            snap = _Snapshot(store, store._index)
        lock_seconds = time.perf_counter() - held
        try:
            fd, _ = _new_store(store, dat, dat_end, snap)
        except BaseException:
            with store._lock:
                store._changes = None
            raise
        try:
            held = time.perf_counter()
            with store._lock:
                store._changes = None
                store._check_writable()
                if store._valid_end != store._dat_end:
                    raise CorruptionError(f"{store.dat_path} was damaged during compaction")
                tail = os.pread(store._fd, store._dat_end - dat_end, dat_end)
                retired = _commit(store, fd, tail)
                fd = -1
                memories = store._index.live
            lock_seconds = max(lock_seconds, time.perf_counter() - held)
            del dat  # the old map's last reference is the retired one
            _after_commit(store, retired)
        finally:
            if fd >= 0:
                os.close(fd)
                remove_compaction_files(store.dat_path, store.idx_path)
        store._start_preload()
    return CompactReport(*before, *_sizes(store), memories, snap.dropped,
                         time.perf_counter() - started, lock_seconds)  # fmt: skip


# --- repair ------------------------------------------------------------------------------------


def repair(store: MemoryStore) -> RepairReport:
    """See ``MemoryStore.repair``."""
    with store._maintenance_lock:
        store._stop_preload()
        with store._lock:
            store._check_writable()
            before = _sizes(store)
            dat, end = store._data(), store._dat_end
            index, problems = build_index(dat, end, store.dat_path)
            found, _, _, _, bad_starts, bad_ends = _kernels.scan_records(dat, fmt.DAT_HEADER_SIZE, end)
            regions = [(int(s), int(e) - int(s)) for s, e in zip(bad_starts, bad_ends)]
            for p in problems:  # whole records the replay refused (e.g. they name a lost memory)
                info = None if _in(p.offset, regions) else _kernels.check_record(dat, p.offset, end)
                if info is not None:
                    regions.append((p.offset, fmt.RECORD_HEADER_SIZE + 2 * info[1] + info[2]))
            regions.sort()
            records = len(found)
            damaged_path = None
            if regions:
                damaged_path = f"{store.dat_path}{DAMAGED_SUFFIX}{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
                _keep_damaged(damaged_path, dat, regions)
            snap = _Snapshot(store, index)
            store._changes = None  # all of the repair holds the lock: nothing changes
            fd, _ = _new_store(store, dat, end, snap)
            try:
                retired = _commit(store, fd, b"")
            except BaseException:
                os.close(fd)
                remove_compaction_files(store.dat_path, store.idx_path)
                raise
            memories = store._index.live
        del dat, index
        _after_commit(store, retired)
        store._start_preload()
    cut = sorted(problems, key=lambda p: p.offset)
    return RepairReport(not regions and not problems, memories, records, cut,
                        sum(n for _, n in regions), damaged_path, sum(before), sum(_sizes(store)))  # fmt: skip


def rebuild_header(dat_path: str, idx_path: str) -> Problem | None:
    """Write a new header over a damaged one so that the store opens again; ``None`` when
    the header is intact (nothing is written).

    The 64 bytes are all that stands between an intact data file and every memory in it, so
    they are rebuilt from what the records and the index say: the dimension from the first
    memory record with a vector; the store's UUID from the index's header when that is
    intact (the index then stays valid), a new one otherwise; the end of the run of memory
    records at the start as the compacted prefix (a compacted file's prefix is sorted by id
    on replay; in a file never compacted that run is in id order already); no id floor
    (an id of a memory dropped by an earlier compaction may be given again); no embedder
    fingerprint (any embedder of the right dimension is accepted). The old bytes are kept
    in ``<name>.dat.damaged-<time>-header``.

    Raises:
        StoreNotFoundError: there is no data file.
        StoreLockedError: a writer has the store open.
        CorruptionError: the file holds no intact record: not a store, or nothing to save.
        FormatVersionError: the header is intact and from another format version.
    """
    try:
        fd = os.open(dat_path, os.O_RDWR)
    except FileNotFoundError:
        raise StoreNotFoundError(f"no fastmem store at {dat_path}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StoreLockedError(f"{dat_path} is open for writing: close it first") from None
        size = os.fstat(fd).st_size
        head = os.pread(fd, fmt.DAT_HEADER_SIZE, 0)
        try:
            fmt.unpack_dat_header(head, dat_path)
            return None
        except FormatVersionError:
            raise
        except CorruptionError:
            pass
        offsets = lengths = kinds = dims = np.zeros(0, dtype=np.int64)
        if size > fmt.DAT_HEADER_SIZE:
            with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as dat:
                offsets, lengths, kinds, dims, _, _ = _kernels.scan_records(dat, fmt.DAT_HEADER_SIZE, size)
        if not len(offsets):
            raise CorruptionError(
                f"{dat_path} has a damaged header and no intact record: not a fastmem store, "
                f"or nothing left to repair", path=dat_path, offset=0,
            )  # fmt: skip
        memory = kinds == fmt.KIND_MEMORY
        with_vector = np.nonzero(memory & (dims > 0))[0]
        dim = int(dims[with_vector[0]]) if len(with_vector) else 0
        other = np.nonzero(~memory)[0]
        run = int(other[0]) if len(other) else len(offsets)
        prefix_end = int(offsets[run - 1] + lengths[run - 1]) if run else 0
        uuid = os.urandom(16)
        try:
            with open(idx_path, "rb") as f:
                h = fmt.unpack_idx_header(f.read(fmt.IDX_HEADER_SIZE), idx_path)
            if h.dim in (0, dim):
                uuid = h.uuid
        except (OSError, CorruptionError, FormatVersionError):
            pass  # no usable index: it is rebuilt at open
        kept = f"{dat_path}{DAMAGED_SUFFIX}{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-header"
        _keep_damaged(kept, head, [(0, len(head))])
        os.pwrite(fd, fmt.pack_dat_header(uuid, dim, time.time(), 0, prefix_end), 0)
        os.fsync(fd)
        return Problem("dat", 0, f"the file header was damaged and has been rebuilt "
                                 f"(dimension {dim}); its old bytes are in {kept}")  # fmt: skip
    finally:
        os.close(fd)  # and with it the lock


def _in(offset: int, regions: list[tuple[int, int]]) -> bool:
    return any(start <= offset < start + n for start, n in regions)


def _keep_damaged(path: str, dat: Any, regions: list[tuple[int, int]]) -> None:
    """Each region cut away: its offset and length (two u64), then its bytes."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        for start, n in regions:
            _write_all(fd, DAMAGED_REGION.pack(start, n) + bytes(dat[start : start + n]))
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(path)


# --- backup ------------------------------------------------------------------------------------


def backup(store: MemoryStore, dest: Any) -> BackupReport:
    """See ``MemoryStore.backup``."""
    if not isinstance(dest, (str, os.PathLike)):
        raise InvalidTypeError(f"dest must be a str or os.PathLike, not {type(dest).__name__}")
    base = os.fspath(dest)
    if not isinstance(base, str) or not base:
        raise InvalidInputError("dest must be a non-empty file name")
    if base.endswith((".dat", ".idx")):
        base = base[:-4]
    dat_path, idx_path = base + ".dat", base + ".idx"
    if os.path.abspath(dat_path) == os.path.abspath(store.dat_path):
        raise InvalidInputError("a backup cannot overwrite the store it copies")
    if os.path.exists(dat_path) or os.path.exists(idx_path):
        raise InvalidInputError(f"{base} already holds a store: back up to a new name")
    with store._lock:
        store._check()
        # Everything before the last applied record's end is whole records, and the data
        # file is append-only: those bytes never change. A descriptor of its own keeps the
        # same file even if a compaction replaces it meanwhile.
        end = store._valid_end
        src = os.dup(store._fd)
    parent = os.path.dirname(os.path.abspath(dat_path))
    os.makedirs(parent, mode=0o700, exist_ok=True)
    tmp = dat_path + ".tmp"
    out = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        at = 0
        while at < end:
            chunk = os.pread(src, min(_WRITE_CHUNK, end - at), at)
            if not chunk:
                raise CorruptionError(f"{store.dat_path} is shorter than it was")
            _write_all(out, chunk)
            at += len(chunk)
        os.fsync(out)
        mm = mmap.mmap(out, end, access=mmap.ACCESS_READ)
        try:
            index, _ = build_index(mm, end, dat_path)
            index.save(idx_path, mm, sync=True)
            memories = index.live
            del index
        finally:
            mm.close()
        os.replace(tmp, dat_path)
        fsync_dir(dat_path)
    except BaseException:
        for name in (tmp, idx_path):
            try:
                os.remove(name)
            except FileNotFoundError:
                pass
        raise
    finally:
        os.close(out)
        os.close(src)
    return BackupReport(base, memories, end + os.path.getsize(idx_path))
