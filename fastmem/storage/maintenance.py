"""Forgetting, compaction, repair and backup: the work that rewrites a store's files.

``MemoryStore.evict``, ``compact``, ``repair`` and ``backup`` are thin methods over the
functions here, which work on the store's :class:`~fastmem.storage.engine.Engine` through its
package-internal interface (see ``fastmem.storage.engine``), never on the store itself. The
on-disk rules they follow (the compacted prefix, the rename order and
the recovery rule applied at open) are in ``docs/format.md`` under "Compaction".

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

import fcntl
import math
import mmap
import os
import struct
import time
from collections.abc import Mapping
from itertools import islice
from typing import Any

import numpy as np

from . import access_counts
from . import erase as _erase  # (``erase`` is forget's argument)
from .. import _kernels
from .. import _format as fmt
from .engine import Engine
from .recovery import COMPACT_SUFFIX, Retired, build_index, fsync_dir, recover, remove_compaction_files
from .index import F_ID, F_LENGTH, F_OFFSET, MemoryIndex, default_importance
from .fileio import torn_tail
from .records import f32
from .replay import read_payload
from .vectors import to_float16
from ..embed import Embedder
from ..namespaces import base_path
from .importance import importance_scores
from ..errors import (
    CorruptionError, CorruptRecordError, FormatVersionError, InvalidInputError, InvalidTypeError,
    StoreLockedError, StoreNotFoundError,
)  # fmt: skip

from ..types import (
    BackupReport, CompactReport, ContextPolicy, EvictionPolicy, Problem, RepairReport, Report,
)  # fmt: skip

DAMAGED_SUFFIX = ".damaged-"  # <name>.dat.damaged-<UTC time>: what repair() cut away
DAMAGED_REGION = struct.Struct("<QQ")  # offset in the old .dat, length; then the bytes
_WRITE_CHUNK = 4 << 20
_EMBED_BATCH = 256  # texts a re-embedding encodes at once


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
    engine: Engine, policy: ContextPolicy, ttl: Any, min_importance: Any, max_count: Any,
    max_bytes: Any, now: float | None, erase: bool = True,
) -> list[str]:  # fmt: skip
    """Forget what the policies select (never a pinned memory); the ids, oldest id first.
    ``policy`` weighs the importance scores the floor and the maxima go by.

    The forgets are one write: one tombstone per memory, appended together; ``erase``: the
    memories' records are then erased (``fastmem.storage.erase.erase``)."""
    ttls, floor, max_count, max_bytes = _checked(ttl, min_importance, max_count, max_bytes)
    if not isinstance(erase, bool):
        raise InvalidTypeError("erase must be True or False")
    now = time.time() if now is None else float(now)
    with engine.writing():
        rows = _chosen(engine.index, importance_scores(engine.index, policy, now), ttls, floor,
                       max_count, max_bytes, now)  # fmt: skip
        if not rows:
            return []
        return _erase.forget_rows(engine, rows, erase, now)


def _chosen(
    index: MemoryIndex, scores: np.ndarray, ttls: dict[str, float], floor: float | None,
    max_count: int | None, max_bytes: int | None, now: float,
) -> list[int]:  # fmt: skip
    """The rows the eviction policies select, in row order."""
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
    return np.nonzero(chosen)[0].tolist()


# --- writing a compacted data file ----------------------------------------------------------


class _Snapshot:
    """The live rows to write, as columns, in id order, as they were when it was taken.

    Taking it under the store's lock costs nothing: it notes the row count and starts the
    engine's log of in-place changes (``Engine.note_change``). The rows are read later
    without the lock; a row that changed meanwhile gets its values from before the change
    from the log (each change is logged before it is made, so whatever change the read saw
    is in the log when it is consulted after the read)."""

    def __init__(self, engine: Engine, index: MemoryIndex) -> None:
        self.index, self.n, self.next_id = index, len(index), index.next_id
        self.changes = engine.start_change_log()

    def fill(self) -> None:
        """Read the rows (outside the lock)."""
        index, n_base = self.index, self.index.n_base
        # The accesses counted so far, which the new index holds: those counted later are
        # carried to it at the swap (``Engine.swap_to``).
        self.touches = dict(index.touches)
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


def _folded_record(
    dat: Any, offset: int, length: int, row: dict[str, Any], meta: Any, path: str,
    vector: np.ndarray | None = None,
) -> bytes:  # fmt: skip
    """The memory record at ``offset``, byte for byte when its row says what it says; else a
    new memory record with the row's importance and pin and the current metadata (and, when
    given, ``vector``: a unit float16 vector in place of the stored one)."""
    kind, dim, payload, _ = read_payload(dat, offset, offset + length, path)
    if kind != fmt.KIND_MEMORY or payload.get("i") != row["id"]:
        raise CorruptRecordError(f"{path}: the record at offset {offset} is not memory m{row['id']}",
                                 path=path, offset=offset)  # fmt: skip
    want = dict(payload)
    importance = np.float32(row["importance"])
    type_default = default_importance(payload.get("y", "conversation"))
    if np.float32(payload.get("p", type_default)) != importance:
        want["p"] = f32(float(importance))  # 0.3, not 0.30000001
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
    if want == payload and vector is None:
        return bytes(dat[offset : offset + length])
    stored, raw_len = fmt.encode_payload(want)
    vectors = has = None
    if vector is not None:
        vectors, has = vector.view(np.uint16).reshape(1, -1), np.ones(1, dtype=np.uint8)
    elif dim:
        vectors = fmt.record_vector(dat, offset, dim).view(np.uint16).reshape(1, dim)
        has = np.ones(1, dtype=np.uint8)
    data, _, _ = _kernels.frame_records(fmt.KIND_MEMORY, [stored], np.array([raw_len], np.uint32), vectors, has)
    return data


_UNCHANGED = object()


def _write_records(
    dat: Any, dat_end: int, snap: _Snapshot, fd: int, path: str, embedder: Embedder | None
) -> int:
    """Write the snapshot's memory records to ``fd`` after its header, in (session,
    timestamp, id) order: a session's memories sit together; with ``embedder``, each with
    the vector it makes of the memory's text. Returns the end offset."""
    c = snap.columns
    order = np.lexsort((c["id"], c["timestamp"], c["session"])).tolist()
    offsets, lengths, metas = c["offset"].tolist(), c["length"].tolist(), c["meta_offset"].tolist()
    vectors: dict[int, np.ndarray] = {}
    parts: list[bytes] = []
    size = 0
    end = fmt.DAT_HEADER_SIZE
    for at, i in enumerate(order):
        off, length = offsets[i], lengths[i]
        if embedder is not None and i not in vectors:  # the next batch's texts, embedded at once
            batch = order[at : at + _EMBED_BATCH]
            texts = [read_payload(dat, offsets[j], offsets[j] + lengths[j], path)[2]["x"] for j in batch]
            vectors = dict(zip(batch, to_float16(list(embedder.encode(texts)), 0)))
        meta: Any = _UNCHANGED
        if metas[i]:
            _, update = fmt.read_record(dat, metas[i], dat_end, path)
            meta = update.get("m")
        row = {"id": int(c["id"][i]), "importance": c["importance"][i], "flags": int(c["flags"][i])}
        parts.append(_folded_record(dat, off, length, row, meta, path, vectors.get(i)))
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


def _new_store(
    engine: Engine, dat: Any, dat_end: int, snap: _Snapshot,
    embedder: Embedder | None = None, identity: tuple[str, int] | None = None,
) -> tuple[int, int]:  # fmt: skip
    """Write ``<name>.dat.compact`` (locked, fsynced) and ``<name>.idx.compact`` for the
    snapshot (with ``embedder``: every memory with its vector, and ``identity`` in the
    header). Returns the new data file's descriptor (open, locked) and its size."""
    snap.fill()
    header = fmt.unpack_dat_header(dat, engine.dat_path)
    # (Under the writer lock.) A compaction killed between its renames left its index under
    # ``.idx.compact``: into place before this one's overwrites it, else the index under the
    # name would stay the data file's before that one (the recovery rule, as at open).
    recover(engine.dat_path, engine.idx_path)
    new_dat = engine.dat_path + COMPACT_SUFFIX
    fd = os.open(new_dat, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        # Locked before anyone can find it under the store's name: a writer that opens the
        # store after the rename waits for this lock, never writes beside this one.
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, bytes(fmt.DAT_HEADER_SIZE))
        end = _write_records(dat, dat_end, snap, fd, engine.dat_path, embedder)
        next_id = max(snap.next_id, header.next_id)
        dim, fingerprint = header.dim, header.embedder
        if identity is not None:
            dim, fingerprint = identity[1], fmt.embedder_fingerprint(*identity)
        new_header = fmt.pack_dat_header(header.uuid, dim, header.created, next_id, end, fingerprint)
        os.pwrite(fd, new_header, 0)
        # The store appends through it from now on (Linux would append the pwrite above
        # too if it had been set already).
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)
        os.fsync(fd)
        _write_index(engine, fd, end, snap)
    except BaseException:
        os.close(fd)
        remove_compaction_files(engine.dat_path, engine.idx_path)
        raise
    return fd, end


def _write_index(engine: Engine, fd: int, end: int, snap: _Snapshot) -> None:
    """``<name>.idx.compact``: the index of the new data file, with the snapshot's access
    statistics (they live only in the index)."""
    mm = mmap.mmap(fd, end, access=mmap.ACCESS_READ)
    try:
        index, problems, _ = build_index(mm, end, engine.dat_path + COMPACT_SUFFIX)
        if problems or len(index) != len(snap):
            raise CorruptionError(f"the compacted data file does not read back: {problems[:3]}")
        tail = index.tail.rows[: index.tail.n]
        if not np.array_equal(tail["id"], snap.columns["id"]):
            raise CorruptionError("the compacted data file lost or reordered memories")
        tail["access_count"] = snap.columns["access_count"]
        tail["last_access"] = snap.columns["last_access"]
        index.save(engine.idx_path + COMPACT_SUFFIX, mm, sync=True)
        del index, tail  # nothing may still look into the map when it closes
    finally:
        mm.close()


def _commit(engine: Engine, fd: int, tail: bytes, saved: access_counts.Touches) -> Retired:
    """Append ``tail`` to the new data file, rename both files into place, and continue on
    them. ``fd`` (the new data file) is this function's from the call on: closed on any
    failure; before the commit point the new files are removed too, after it the handle
    is closed (its old files are no longer the store). The caller holds the engine's lock,
    and calls ``_after_commit`` once it has let it go, with what this returns. ``saved``:
    the handle's accesses the new index holds (the others go along to it)."""
    committed = False
    try:
        if tail:
            _write_all(fd, tail)
            os.fdatasync(fd)  # the rest was synced when it was written
        os.replace(engine.dat_path + COMPACT_SUFFIX, engine.dat_path)  # the commit point
        committed = True
        if engine.durability == "always":
            # Before any write to the new file is acknowledged. The other modes may lose the
            # last few ms of writes to a power loss anyway: they sync it after the lock.
            engine.sync_dir(engine.dat_path)
        try:  # the old index, to drop its pages from the cache later (see Retired)
            old_idx = os.open(engine.idx_path, os.O_RDONLY)
        except FileNotFoundError:
            old_idx = -1
        try:
            os.replace(engine.idx_path + COMPACT_SUFFIX, engine.idx_path)
        except BaseException:
            if old_idx >= 0:
                os.close(old_idx)
            raise
    except BaseException:
        os.close(fd)
        if committed:
            engine.abandon()  # the next open applies the recovery rule to what is on disk
        else:
            remove_compaction_files(engine.dat_path, engine.idx_path)
        raise
    try:
        retired = engine.swap_to(fd, committed=True, saved=saved)
    except BaseException:
        if old_idx >= 0:
            os.close(old_idx)
        raise
    if old_idx >= 0:
        retired.fds.append(old_idx)
    return retired


def _after_commit(engine: Engine, retired: Retired) -> None:
    """Outside the lock: make the renames durable (were the index's lost, the recovery
    rule would rename it again) and let the old files go (even when the sync fails)."""
    try:
        engine.sync_dir(engine.idx_path)
    finally:
        retired.release(drop_cache=True)


def _sizes(engine: Engine) -> tuple[int, int]:
    """The data file's and the index file's sizes."""
    idx = os.path.getsize(engine.idx_path) if os.path.exists(engine.idx_path) else 0
    return os.path.getsize(engine.dat_path), idx


def compact(engine: Engine) -> CompactReport:
    """See ``MemoryStore.compact``."""
    with engine.failures():
        try:
            return _compact(engine)
        finally:
            _erase.deferred(engine)  # what was forgotten meanwhile, erased from the new files


def _compact(engine: Engine) -> CompactReport:
    started = time.perf_counter()
    # The writer lock is held from the snapshot to the swap: other processes' writes wait
    # (their records would otherwise change rows this process reads without its lock).
    with engine.maintenance_lock, engine.write_lock():
        held = time.perf_counter()
        with engine.writing():
            if engine.valid_end != engine.dat_end:
                raise CorruptionError(
                    f"{engine.dat_path} ends with damaged bytes: repair() it first", path=engine.dat_path
                )
            before = _sizes(engine)
            dat, dat_end = engine.data(), engine.dat_end
            # The new index is a checkpoint too: other processes' access statistics first
            access_counts.merge_from_file(engine.index, engine.idx_path, engine.uuid, dat, dat_end)
            snap = _Snapshot(engine, engine.index)
        lock_seconds = time.perf_counter() - held
        try:
            fd, _ = _new_store(engine, dat, dat_end, snap)
        except BaseException:
            with engine.lock:
                engine.stop_change_log()
            raise
        try:
            held = time.perf_counter()
            with engine.writing():
                engine.stop_change_log()
                if engine.valid_end != engine.dat_end:
                    raise CorruptionError(f"{engine.dat_path} was damaged during compaction")
                tail = engine.read_since(dat_end)
                fd, new_fd = -1, fd  # _commit owns it from here, whatever happens
                retired = _commit(engine, new_fd, tail, snap.touches)
                memories = engine.index.live
            lock_seconds = max(lock_seconds, time.perf_counter() - held)
            del dat  # the old map's last reference is the retired one
            _after_commit(engine, retired)
        except BaseException:
            # As in _state.build: the old map must not keep the old data file open until a
            # garbage collection frees this frame from the traceback.
            try:
                del dat
            except NameError:  # already released
                pass
            raise
        finally:
            if fd >= 0:
                os.close(fd)
                remove_compaction_files(engine.dat_path, engine.idx_path)
    return CompactReport(*before, *_sizes(engine), memories, snap.dropped,
                         time.perf_counter() - started, lock_seconds)  # fmt: skip


# --- repair ------------------------------------------------------------------------------------


def repair(engine: Engine) -> RepairReport:
    """See ``MemoryStore.repair``."""
    with engine.failures():
        return _repair(engine)


def _repair(engine: Engine) -> RepairReport:
    with engine.maintenance_lock:
        with engine.writing():
            before = _sizes(engine)
            dat, end = engine.data(), engine.dat_end
            index, problems, records = build_index(dat, end, engine.dat_path)
            regions = [(s, e - s) for s, e in index.damaged]  # (a last batch kept: its damage only)
            for p in problems:  # whole records the replay refused (e.g. they name a lost memory)
                info = None if _in(p.offset, regions) else _kernels.check_record(dat, p.offset, end)
                if info is not None:
                    regions.append((p.offset, fmt.record_size(info[1], info[2])))
            regions.sort()
            damaged_path = None
            if regions:
                damaged_path = f"{engine.dat_path}{DAMAGED_SUFFIX}{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
                _keep_damaged(damaged_path, dat, regions)
            # Access statistics live only in the index: the one built from the data file takes
            # them from the handle's (other processes' merged into it first)
            access_counts.merge_from_file(engine.index, engine.idx_path, engine.uuid, dat, end)
            access_counts.merge(index, engine.index)
            snap = _Snapshot(engine, index)
            engine.stop_change_log()  # all of the repair holds the lock: nothing changes
            fd, _ = _new_store(engine, dat, end, snap)
            retired = _commit(engine, fd, b"", engine.index.touches)
            memories = engine.index.live
        del dat, index
        _after_commit(engine, retired)
    cut = sorted(problems, key=lambda p: p.offset)
    return RepairReport(not regions and not problems, memories, records, cut,
                        sum(n for _, n in regions), damaged_path, sum(before), sum(_sizes(engine)))  # fmt: skip


def reembed(engine: Engine, embedder: Embedder, identity: tuple[str, int]) -> int:
    """See ``MemoryStore.reembed``: a compaction whose records carry the vectors
    ``embedder`` makes of their texts, and whose header records ``identity``. Holds the
    writer lock throughout (other processes' writes wait: no record may be written with the
    old model's vector while the new one is being made). Returns the memories re-embedded."""
    with engine.maintenance_lock, engine.writing():
        if engine.valid_end != engine.dat_end:
            raise CorruptionError(f"{engine.dat_path} ends with damaged bytes: repair() it first",
                                  path=engine.dat_path)  # fmt: skip
        before = engine.identity
        dat = engine.data()
        access_counts.merge_from_file(engine.index, engine.idx_path, engine.uuid, dat, engine.dat_end)
        snap = _Snapshot(engine, engine.index)
        engine.stop_change_log()  # all of it holds the lock: nothing changes meanwhile
        fd, _ = _new_store(engine, dat, engine.dat_end, snap, embedder, identity)
        engine.identity = identity  # the new header's: the swap checks it
        try:
            retired = _commit(engine, fd, b"", engine.index.touches)
        except BaseException:
            engine.identity = before
            raise
        memories = engine.index.live
    del dat
    _after_commit(engine, retired)
    return memories


def rebuild_header(dat_path: str, idx_path: str, timeout: float = 0.0) -> Problem | None:
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
        StoreLockedError: another process held the writer lock for ``timeout`` seconds.
        CorruptionError: the file holds no intact record: not a store, or nothing to save.
        FormatVersionError: the header is intact and from another format version.
    """
    try:
        fd = os.open(dat_path, os.O_RDWR)
    except FileNotFoundError:
        raise StoreNotFoundError(f"no fastmem store at {dat_path}") from None
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise StoreLockedError(
                        f"{dat_path} has been locked for writing for {timeout:g} s: pass a "
                        f"longer timeout to wait for it"
                    ) from None
                time.sleep(0.005)
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


def backup(engine: Engine, dest: Any) -> BackupReport:
    """See ``MemoryStore.backup``: a failure leaves nothing at ``dest``."""
    with engine.failures():
        return _backup(engine, dest)


def _backup(engine: Engine, dest: Any) -> BackupReport:
    base = base_path(dest)
    dat_path, idx_path = base + ".dat", base + ".idx"
    if os.path.abspath(dat_path) == os.path.abspath(engine.dat_path):
        raise InvalidInputError("a backup cannot overwrite the store it copies")
    if os.path.exists(dat_path) or os.path.exists(idx_path):
        raise InvalidInputError(f"{base} already holds a store: back up to a new name")
    with engine.lock:
        engine.check()
        # Everything before the last applied record's end is whole records, and the data
        # file is append-only: those bytes never change (an erase overwrites some in place:
        # the copy finishes what it may have missed, below). A descriptor of its own keeps the
        # same file even if a compaction replaces it meanwhile.
        end = engine.valid_end
        src = engine.copy_descriptor()
    tmp = dat_path + ".tmp"
    out = -1
    try:
        os.makedirs(os.path.dirname(os.path.abspath(dat_path)), mode=0o700, exist_ok=True)
        out = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        at = 0
        while at < end:
            chunk = os.pread(src, min(_WRITE_CHUNK, end - at), at)
            if not chunk:
                raise CorruptionError(f"{engine.dat_path} is shorter than it was")
            _write_all(out, chunk)
            at += len(chunk)
        os.fsync(out)
        mm = mmap.mmap(out, end, access=mmap.ACCESS_READ)
        try:
            index, _, _ = build_index(mm, end, dat_path)
            # An erase whose records were copied before it overwrote them (it runs without
            # this lock) or that a crash interrupted: finished in the copy (fastmem.storage.erase).
            if index.erase_pending and _erase.redo(out, index.erase_pending):
                os.fsync(out)
                index, _, _ = build_index(mm, end, dat_path)
            index.save(idx_path, mm, sync=True)
            memories = index.live
            del index
        finally:
            mm.close()
        os.replace(tmp, dat_path)
        fsync_dir(dat_path)
    except BaseException:
        # A failed backup leaves nothing: not half a copy, nor a copy whose directory
        # entry may not survive (the directory sync failed), nor the index's .tmp.
        for name in (tmp, idx_path, idx_path + ".tmp", dat_path):
            try:
                os.remove(name)
            except FileNotFoundError:
                pass
        raise
    finally:
        if out >= 0:
            os.close(out)
        os.close(src)
    return BackupReport(base, memories, end + os.path.getsize(idx_path))


# --- verify ------------------------------------------------------------------------------------


def verify(engine: Engine) -> Report:
    """See ``MemoryStore.verify``."""
    with engine.lock:
        engine.check()
        dat, index = engine.data(), engine.index
        fd = engine.copy_descriptor()  # the tail is read with pread: a writer may cut it
        try:
            fresh, problems, records = build_index(dat, engine.dat_end, engine.dat_path, fd)
            start, end = engine.valid_end, engine.dat_end
            if start < end and _interrupted(fd, start, end):
                # An append a crash interrupted (or one under way): nothing in it was
                # acknowledged, and the next write cuts it. Not damage.
                problems = [p for p in problems if not (p.file == "dat" and start <= p.offset < end)]
                fresh.damaged = [(s, e) for s, e in fresh.damaged if s < start]
        finally:
            os.close(fd)
        try:
            problems += _damaged_rows(index, fresh.damaged)
            problems += _compare(index, fresh)
            problems += _compare_keyword(index, fresh)
            problems += _check_hot(index, dat)
        except CorruptionError as exc:  # an index too damaged to compare row by row
            problems.append(Problem("idx", 0, str(exc)))
        size = engine.dat_end
        if os.path.exists(engine.idx_path):
            size += os.path.getsize(engine.idx_path)
        return Report(ok=not problems, problems=problems, records=records, bytes=size)


def _interrupted(fd: int, start: int, end: int) -> bool:
    """Whether the data file's bytes ``start:end``, past its last whole record, are an
    interrupted append (``torn_tail``), read with ``pread``: a writer may cut them."""
    tail = os.pread(fd, end - start, start)
    return len(tail) < end - start or torn_tail(tail, start)


def _check_hot(index: MemoryIndex, dat: Any) -> list[Problem]:
    """The index's copy of the newest memories must be those memories, byte for byte."""
    current = index.hot_rows()
    if current is None:
        return []
    hot, count = current
    newest = list(islice(index.by_time(newest_first=True), count))
    if len(newest) != count:
        return [Problem("idx", 0, f"the hot section holds {count} memories, not {len(newest)}")]
    size = fmt.INDEX_DTYPE.itemsize
    for i, g in enumerate(newest):
        row = index.row(g)
        start = hot.starts[i]
        copy = hot.records[start : start + row[F_LENGTH]]
        if (
            _without_statistics(fmt.INDEX_ROW.unpack_from(hot.rows, i * size))
            != _without_statistics(row)
            or copy != dat[row[F_OFFSET] : row[F_OFFSET] + row[F_LENGTH]]
        ):
            return [Problem("idx", i, f"entry {i} of the hot section differs from m{row[F_ID]}")]
    return []


_STATISTICS = frozenset(
    fmt.INDEX_DTYPE.names.index(name) for name in ("access_count", "last_access")  # type: ignore[union-attr]
)


def _without_statistics(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A row without its access statistics: they change after the hot section is written."""
    return tuple(v for i, v in enumerate(row) if i not in _STATISTICS)


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
