"""Erasing forgotten memories from the disk: their records overwritten in place.

A forget that erases (the default) writes, under the writer lock:

1. one forget record per memory whose payload also names the records it erases
   (``"e"``: offset and length of the memory record, then of each update record that held
   its metadata; ``"w"``, ``"y"``: the memory's timestamp and type name, ``y`` left out for
   ``conversation``), appended and synced like any write;
2. each of those records overwritten in place by an *erased record* of the same offset,
   length, kind and vector dimension: a valid record (its CRC matches) whose vector is
   zeros and whose payload is ``{"i": id, "t": timestamp, "y": type, "e": zeros}`` (memory) or
   ``{"i": id, "e": zeros}`` (update), uncompressed; then synced;
3. the index file rewritten whole (a full checkpoint) when it held the memory's row, its
   int8 vector or its record (the hot section).

Step 1 first: a process killed during step 2 leaves a forget record naming records that may
be half overwritten (damaged, as the scan sees them). Every replay of such a forget notes
them (``MemoryIndex.erase_pending``), and whoever holds the writer lock next overwrites any
that is not an erased record yet (:func:`redo`) before it writes: the erase finishes, and
the damage it left is gone. A replay reads an erased memory record as a forgotten row
without text, vector or metadata (``fastmem.storage.replay``): the same row the erasing process
gives the memory (``replay.erase_rows``), so ``verify()`` compares them equal.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
import weakref
from typing import Any

import numpy as np

from .. import _format as fmt
from .. import _kernels
from .records import frame_changes, parse_id
from .replay import F_FLAGS, F_ID, F_LENGTH, F_META, F_OFFSET, F_TS, F_TYPE, Pending, erase_rows
from ..errors import CorruptionError, DurabilityError, FormatVersionError, InvalidTypeError

__all__ = [
    "deferred",
    "erase",
    "finish",
    "forget",
    "forget_payload",
    "records_of",
    "redo",
]

def records_of(engine: Any, row: tuple[Any, ...]) -> list[int]:
    """``[offset, length, ...]`` of the records that hold memory ``row``'s content: its
    memory record, then every update record that set its metadata (they lie between the
    memory record and the last of them, which the row names)."""
    spans = [row[F_OFFSET], row[F_LENGTH]]
    meta = row[F_META]
    if meta:
        dat = engine.data()
        start = row[F_OFFSET] + row[F_LENGTH]  # (a compacted prefix holds no update record)
        end = fmt.parse_record_header(dat, meta, engine.dat_end).length + meta
        offsets, lengths, kinds, _, _, _ = _kernels.scan_records(dat, start, end)
        for off, length, kind in zip(offsets.tolist(), lengths.tolist(), kinds.tolist()):
            if kind == fmt.KIND_UPDATE:
                payload = fmt.read_record(dat, off, off + length)[1]
                if payload.get("i") == row[F_ID] and "m" in payload:
                    spans += [off, length]
    return spans


def forget_payload(
    mid: int, ts: float, type_name: str | None, spans: list[int], now: float
) -> dict[str, Any]:
    """The payload of the forget record that erases ``spans`` (see the module)."""
    payload: dict[str, Any] = {"i": mid, "t": now, "e": spans, "w": float(ts)}
    if type_name is not None:
        payload["y"] = type_name
    return payload


def index_file_after(path: str, uuid: bytes, offset: int) -> bool:
    """Whether the index file at ``path`` is a full checkpoint of the store ``uuid`` that
    covers the data file past ``offset``: written after the forget record there, by a
    process that had applied it (its rows, vectors and hot section hold nothing erased)."""
    try:
        with open(path, "rb") as f:
            head = f.read(fmt.IDX_HEADER_SIZE)
        header = fmt.unpack_idx_header(head, path)
    except (OSError, CorruptionError, FormatVersionError):
        return False
    return header.uuid == uuid and header.covered > offset


def redo(fd: int, pending: list[Pending]) -> bool:
    """Overwrite every record of ``pending`` (``(id, timestamp, spans)`` of erasing forgets
    replayed) that is not an erased record yet; the writer lock is held. Returns whether
    any was written (a process was killed while erasing them)."""
    # The data file is open O_APPEND, under which Linux's pwrite appends wherever it is
    # told to write: the flag is off for the erase (this handle holds the writer lock, and
    # its thread lock: nothing else writes through the descriptor meanwhile).
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_APPEND)
    try:
        return _redo(fd, pending)
    finally:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags)


def _redo(fd: int, pending: list[Pending]) -> bool:
    wrote = False
    for mid, ts, type_name, spans, _ in pending:
        for i in range(0, len(spans), 2):
            off, length = spans[i], spans[i + 1]
            current = os.pread(fd, length, off)
            # (behind a file header's worth of zeros: records start past it)
            at = fmt.DAT_HEADER_SIZE
            if len(current) == length and fmt.is_erased(bytes(at) + current, at, length, mid):
                continue
            kind = fmt.KIND_MEMORY if i == 0 else fmt.KIND_UPDATE
            if not _owned(current, length, kind, mid):
                continue
            dim = _dim_of(current)
            if dim is None or fmt.RECORD_HEADER_SIZE + 2 * dim >= length:
                dim = 0
            if not write_at(fd, fmt.erased_record(kind, dim, mid, length, ts, type_name), off):
                return wrote
            wrote = True
    return wrote


def _owned(record: bytes, length: int, kind: int, mid: int) -> bool:
    """Whether ``record``, the bytes a pending erase names, may be overwritten: memory
    ``mid``'s record of ``kind``, whole or damaged by an erase cut short (a record's magic,
    kind and length are the same in the erased record: any part of it written keeps them). Not
    bytes that start no such record, nor a whole record of another memory: an erase never
    writes over what it does not own, even given a span of another data file."""
    if len(record) != length or record[:4] != fmt.RECORD_MAGIC or record[5] != kind:
        return False
    _, _, _, dim, stored, _, _ = fmt.RECORD_HEADER.unpack_from(record, 0)
    if fmt.record_size(dim, stored) != length:  # (an erase never changes a record's length)
        return False
    at = fmt.DAT_HEADER_SIZE
    try:
        _, payload = fmt.read_record(bytes(at) + record, at, at + length)
    except (CorruptionError, FormatVersionError):
        return True
    return payload.get("i") == mid


def _dim_of(record: bytes) -> int | None:
    """The vector dimension in a record's header, if the header is still readable."""
    if len(record) < fmt.RECORD_HEADER_SIZE or record[:4] != fmt.RECORD_MAGIC:
        return None
    dim = int.from_bytes(record[6:8], "little")
    return dim if dim <= fmt.MAX_DIM else None


def write_at(fd: int, data: bytes, offset: int) -> bool:
    """``pwrite`` all of ``data`` at ``offset``."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        if n <= 0:
            return False
        view, offset = view[n:], offset + n
    return True


# --- on an engine (its write path, from inside: under its writer lock and thread lock) ------

# Ids forgotten while a compaction of the engine's process ran: erased once it is done.
_after_compaction: weakref.WeakKeyDictionary[Any, list[str]] = weakref.WeakKeyDictionary()


def forget(engine: Any, mid: str, erase_it: bool, now: float) -> None:
    """``MemoryStore.forget`` (in ``engine.writing()``): erased, or a tombstone only."""
    if not isinstance(erase_it, bool):
        raise InvalidTypeError("erase must be True or False")
    g, row = engine.live_row(mid)
    if erase_it:
        erase(engine, [g], now)
        return
    engine.append_change(fmt.KIND_FORGET, {"i": row[F_ID], "t": now})
    engine.note_change(g, row)
    engine.index.forget(g, row[F_FLAGS])


def forget_many(engine: Any, mids: Any, erase_it: bool, now: float) -> None:
    """``MemoryStore.forget_many`` (in ``engine.writing()``): every id checked first, then
    one write for all of them (and, erasing, one pass over the files), not one per memory."""
    if not isinstance(erase_it, bool):
        raise InvalidTypeError("erase must be True or False")
    if isinstance(mids, (str, bytes)):
        raise InvalidTypeError("forget_many takes a list of ids, not one id: use forget(id)")
    rows = sorted({engine.live_row(mid)[0] for mid in mids})
    if rows:
        forget_rows(engine, rows, erase_it, now)


def forget_rows(engine: Any, rows: list[int], erase_it: bool, now: float) -> list[str]:
    """Forget ``rows`` with one write: erased (``erase``), or a tombstone each; their ids."""
    return erase(engine, rows, now) if erase_it else engine.append_tombstones(rows, now)


def erase(engine: Any, rows: list[int], now: float) -> list[str]:
    """Forget ``rows`` and erase them from the files (see the module): their forget records
    appended with one write and synced, their records overwritten in place and synced, the
    index file rewritten whole if it held any of them. Returns their ids.

    Raises:
        DurabilityError: a failure before the forget records were durable (nothing
            happened), or after (the memories are forgotten; the next write erases them).
    """
    if engine.maintenance_lock.locked():
        # A compaction of this process may be copying the records meanwhile: its new file
        # would hold them again, and the forget records' offsets are the old file's.
        # Tombstones now; the erase once it is done (deferred).
        ids = engine.append_tombstones(rows, now)
        _after_compaction.setdefault(engine, []).extend(ids)
        return ids
    index = engine.index
    pending = []
    for g in rows:
        row = index.row(g)
        type_name = None if row[F_TYPE] == 0 else index.type_name(row[F_TYPE])
        pending.append((row[F_ID], row[F_TS], type_name, records_of(engine, row), 0))
    for mid, ts, type_name, spans, _ in pending:  # fails here, before anything is written
        fmt.erased_record(fmt.KIND_MEMORY, 0, mid, spans[1], ts, type_name)
    covered = _index_file_holds(engine, rows)
    payloads = [forget_payload(*p[:4], now) for p in pending]
    _, lengths, _ = frame_changes(fmt.KIND_FORGET, payloads)  # (the offsets they will have)
    engine.append_tombstones(rows, now, payloads)  # durable, or nothing happened
    # They end the file (a batch frame before them when there are several)
    at = (
        engine.dat_end
        - int(lengths.sum())
        + np.concatenate(([0], np.cumsum(lengths[:-1]))).astype(np.int64)
    )
    # The forget is done. What follows finishes the erase; a failure there leaves it for
    # the next write (erase_pending), and is raised.
    pending = [(*p[:4], int(a)) for p, a in zip(pending, at)]
    erase_rows(index, rows)
    index.erase_pending.extend(pending)
    try:
        if _redo_on(engine, pending) and engine.durability != "none":
            engine.flush()
        if covered:
            engine.checkpoint(full=True)
    except OSError as exc:
        code = exc.errno or errno.EIO
        raise DurabilityError(
            code, f"forgotten, but erasing the memories' bytes failed ({os.strerror(code)}): "
            f"the next write to the store tries again", engine.dat_path,
        ) from exc  # fmt: skip
    done = {id(p) for p in pending}
    engine.index.erase_pending = [p for p in engine.index.erase_pending if id(p) not in done]
    return [f"m{p[0]}" for p in pending]


def _redo_on(engine: Any, pending: list[Pending]) -> bool:
    """:func:`redo` through a descriptor of the engine's data file of its own."""
    fd = engine.copy_descriptor()
    try:
        return redo(fd, pending)
    finally:
        os.close(fd)


def _index_file_holds(engine: Any, rows: list[int]) -> bool:
    """Whether the index file under the store's name may hold any of ``rows``: the engine's
    index covers their records, or the file is not the one it loaded (another process
    checkpointed since; one stat tells)."""
    loaded = engine.index.file
    try:
        st = os.stat(engine.idx_path)
    except FileNotFoundError:
        return False
    here = (st.st_dev, st.st_ino, st.st_size)
    if loaded is None or here != (loaded.dev, loaded.ino, loaded.size):
        return True
    return any(engine.index.row(g)[F_OFFSET] < engine.index.covered for g in rows)


def deferred(engine: Any) -> None:
    """Erase the memories forgotten while a compaction ran (see :func:`erase`)."""
    if not _after_compaction.get(engine) or engine.closed:
        return
    with engine.writing():
        ids = _after_compaction.pop(engine, [])
        rows = [g for g in (engine.index.find(parse_id(mid)) for mid in ids) if g >= 0]
        if rows:  # (the compaction may have dropped them: then nothing is left)
            erase(engine, rows, time.time())


def finish(engine: Any) -> None:
    """Holding the writer lock: overwrite the records erasing forgets named that are not
    erased yet (a process was killed while erasing them); the rows are then read again from
    the files, and the index file is rewritten whole if it may still hold them."""
    pending = engine.index.erase_pending
    if not pending:
        return
    engine.index.erase_pending = []
    try:
        wrote = _redo_on(engine, pending)
    except BaseException:
        engine.index.erase_pending = pending + engine.index.erase_pending
        raise
    if wrote:
        if engine.durability != "none":
            engine.flush()
        engine.reload()
        engine.index.erase_pending = []  # the replay just now noted them again: all erased
    # The eraser rewrites the index file last: killed before, it left one that may hold what
    # was erased (the memory was in it when the record lies before what it covers).
    first = min(p[4] for p in pending)
    if any(p[3][0] < engine.index.covered for p in pending) and not index_file_after(
        engine.idx_path, engine.uuid, first
    ):
        engine.checkpoint(full=True)
