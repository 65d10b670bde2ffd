"""Replaying records into index rows: the row layout's field positions, the checks a
decoded record passes before it becomes a row, :func:`read_payload` (one record, checked
and decoded), :func:`scan_file`, the scan of bytes a writer may still cut off, and
:class:`Replayer`, which turns the records a scan found into rows for
``MemoryIndex.append`` (``MemoryIndex.replay`` runs it).
"""

from __future__ import annotations

import os
from typing import Any, overload

import numpy as np

from .. import _format as fmt
from .. import _kernels
from .fileio import torn_tail
from ..errors import CorruptRecordError
from ..types import Problem

# A scan's column: an array, or a list of ints (scan_few's, for a few records).
Column = np.ndarray | list[int]

_FLUSH_ROWS = 65536  # rows a replay turns into arrays at once
_SCAN_CHUNK = 1 << 22  # bytes scan_file copies at once (more for a longer record)
# Bytes scan_file walks record by record instead of with scan_records, whose fixed cost
# (~20 numpy calls, its buffers) was most of a catch-up on one record another process added.
_SMALL_SCAN = 1 << 16
_NO_BAD = np.zeros(0, dtype=np.int64)
_PLAIN_RETRY = 8  # records the general way after one the compiled run left to it
# Records one compiled call decodes at most (~2 µs each): the call holds the GIL, and the
# process's other threads (a server's requests, a checkpoint's writer) wait no longer than
# a few milliseconds for it, as they would for Python's own switch interval.
_PLAIN_ROWS = 2048
# A memory record met damaged that an erasing forget of the same scan names (no record's
# kind on disk: Replayer._with_mid_erase gives it).
_KIND_MID_ERASE = 0

# Positions of INDEX_DTYPE's fields in a row tuple (``MemoryIndex.row``).
(F_ID, F_TS, F_SESSION, F_OFFSET, F_META, F_LAST_ACCESS, F_LENGTH, F_IMPORTANCE, F_SCALE,
 F_ACCESS, F_TEXT_TOKENS, F_SUMMARY_TOKENS, F_TYPE, F_FLAGS, F_RESERVED) = range(15)  # fmt: skip
assert fmt.INDEX_DTYPE.names is not None and fmt.INDEX_DTYPE.names[F_FLAGS] == "flags"


# What an erased memory's row holds (fastmem.storage.erase) besides its id, time, offset, length
# and type: the same whether the erasing process sets it or a replay reads the record back.
ERASED_FIELDS = {F_SESSION: 0, F_META: 0, F_LAST_ACCESS: 0.0, F_IMPORTANCE: 0.0, F_SCALE: 0.0,
                 F_ACCESS: 0, F_TEXT_TOKENS: fmt.UNKNOWN_TOKENS,
                 F_SUMMARY_TOKENS: fmt.UNKNOWN_TOKENS, F_FLAGS: fmt.FLAG_FORGOTTEN,
                 F_RESERVED: 0}  # fmt: skip


# An erasing forget's (fastmem.storage.erase): id, timestamp, type name, the records erased
# ``[offset, length, ...]`` and the forget record's offset.
Pending = tuple[int, "float | None", "str | None", list[int], int]


def session_hash(session: str | None) -> int:
    """64-bit hash of a session name (0 = no session); collisions are checked on read."""
    if session is None:
        return 0
    h = int.from_bytes(fmt.blake2b(session.encode(), digest_size=8).digest(), "little")
    return h or 1


def default_importance(type_name: str) -> float:
    return fmt.DEFAULT_IMPORTANCE.get(type_name, fmt.DEFAULT_USER_TYPE_IMPORTANCE)


def update_changes(flags: int, payload: dict[str, Any], offset: int) -> dict[int, Any]:
    """The row fields (``F_*``) that the update record at ``offset`` sets: one rule for the
    writer applying its own update and for a replay reading it back."""
    changes: dict[int, Any] = {}
    if "p" in payload:
        changes[F_IMPORTANCE] = float(payload["p"])
    if "m" in payload:
        changes[F_META] = offset
    if "n" in payload:
        changes[F_FLAGS] = (flags | fmt.FLAG_PINNED) if payload["n"] else (flags & ~fmt.FLAG_PINNED)
    return changes



def check_memory_fields(p: dict[str, Any]) -> None:
    """Check a decoded memory payload's fields against the limits ``add`` enforces.

    Written for replay's speed (about 0.5 us a record): exact type tests, each optional
    field looked up once.

    Raises:
        ValueError: a field has the wrong type or is out of range (a damaged record).
    """
    get = p.get
    text, ts, tokens = p["x"], p["t"], get("k")
    if type(text) is not str:
        raise ValueError("the text is not a string")
    if not (type(ts) is float and 0.0 <= ts <= fmt.MAX_TIMESTAMP):
        _check_number(ts, 0.0, fmt.MAX_TIMESTAMP, "timestamp")  # ints pass; the rest raises
    if tokens is not None:
        if type(tokens) is not list or len(tokens) != 2:
            raise ValueError("the token counts are not two 32-bit counts")
        a, b = tokens
        if type(a) is not int or type(b) is not int or not (0 <= a <= _U32 and 0 <= b <= _U32):
            raise ValueError("the token counts are not two 32-bit counts")
    type_name, session, summary = get("y"), get("s"), get("u")
    if type_name is not None and (type(type_name) is not str or not 0 < len(type_name) <= _MAX_TYPE):
        raise ValueError("the type is not a name of 1 to MAX_TYPE_CHARS characters")
    if session is not None and (type(session) is not str or not 0 < len(session) <= _MAX_SESSION):
        raise ValueError("the session is not a name of 1 to MAX_SESSION_CHARS characters")
    if summary is not None and type(summary) is not str:
        raise ValueError("the summary is not a string")
    known = 3 + (tokens is not None) + (type_name is not None) + (session is not None) + (summary is not None)
    if len(p) > known:  # rarer fields too: importance, pin, metadata
        _check_change_fields(p)


_U32, _MAX_TYPE, _MAX_SESSION = fmt.UNKNOWN_TOKENS, fmt.MAX_TYPE_CHARS, fmt.MAX_SESSION_CHARS


def _check_change_fields(p: dict[str, Any]) -> None:
    """The fields an update may change: importance, pin and metadata."""
    if not 0 <= p["i"] <= fmt.MAX_ID:
        raise ValueError("the id is out of range")
    if "p" in p:
        _check_number(p["p"], 0.0, 1.0, "importance")
    if "n" in p and not isinstance(p["n"], bool):
        raise ValueError("the pin is not a bool")
    if "m" in p and p["m"] is not None and not isinstance(p["m"], dict):
        raise ValueError("the metadata is not a map")


def _check_number(x: Any, lo: float, hi: float, name: str) -> None:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not lo <= x <= hi:  # NaN fails
        raise ValueError(f"the {name} is not a number from {lo} to {hi}")


def read_payload(
    buf: Any, offset: int, end: int, path: str, *, precise: bool = True
) -> tuple[int, int, dict[str, Any], int]:
    """(kind, dim, payload, end) of the record at ``offset``, its checksum checked first.

    Raises:
        CorruptRecordError: the record is damaged (``precise``: with the exact reason).
    """
    info = _kernels.record_payload(buf, offset, end)
    if info is None:
        if precise:
            fmt.read_record(buf, offset, end, path)  # raises the precise error
        raise CorruptRecordError(f"{path}: bad record at {offset}", path=path, offset=offset)
    kind, dim, stored, rlen = info
    plen = len(stored)
    payload = fmt.decode_payload(stored, plen, rlen, offset, path)
    return kind, dim, payload, fmt.payload_start(offset, dim) + plen


def kept_last_batch(fd: int, scanned: tuple[Column, ...], end: int) -> tuple[Column, ...]:
    """``scanned`` (:func:`scan_file`'s columns of the file open as ``fd``, up to ``end``)
    as a replay without the writer lock takes them (its open, its catch-up): when they end
    with a damaged region that starts with a batch frame (the scans take none of a batch
    with nothing valid after it), with the batch's whole records instead, unless the bytes
    look like an interrupted append (``fileio.torn_tail``'s rule, as ``recovery.kept_batch``
    applies it for a writer, ``verify()`` and ``repair()``): bit rot in the file's last
    batch, or its last record being overwritten by another process's erase. A batch
    another process is still writing, or one a crash cut short, ends with fewer whole
    records than its frame names and then nothing or bytes that look torn (a record cut
    short, zeros): none of it is taken, and a later call takes it whole."""
    bad_starts, bad_ends = scanned[4], scanned[5]
    if not len(bad_ends) or int(bad_ends[-1]) != end:  # (the usual case: one test)
        return scanned
    frame_at = int(bad_starts[-1])
    if frame_at + fmt.BATCH_FRAME_SIZE > end:  # a frame the scanned bytes end inside (the file
        return scanned  # grew since: its bytes past ``end`` are for a later call, not this one)
    count = fmt.batch_count(os.pread(fd, fmt.BATCH_FRAME_SIZE, frame_at), 0, fmt.BATCH_FRAME_SIZE)
    if not count:
        return scanned
    inside = scan_file(fd, frame_at + fmt.BATCH_FRAME_SIZE, end)
    bad_starts = inside[4]
    # Where the batch's whole records stop: past it, the bytes an append under way (or a
    # crash) leaves, or damage. Those bytes are read first (a batch may be a gigabyte).
    # (All of them whole now: the bytes changed since the scan, as an erase finishing does.)
    stop = int(bad_starts[0]) if len(bad_starts) else end
    if int(np.count_nonzero(inside[0] < stop)) < count:
        if stop == end:
            return scanned  # all whole and too few: the rest is still to come (or never written)
        rest = os.pread(fd, end - stop, stop)
        if len(rest) != end - stop or torn_tail(rest, stop):
            return scanned  # (a batch under way ends so: read no more of it)
        tail = os.pread(fd, end - frame_at, frame_at)  # (rare: the writer's rule, whole)
        if len(tail) != end - frame_at or torn_tail(tail, frame_at):
            return scanned
    keep = slice(0, len(scanned[4]) - 1)
    return tuple(np.concatenate((a, b)) for a, b in zip(
        scanned[:4] + (scanned[4][keep], scanned[5][keep]), inside))  # fmt: skip


@overload
def scan_file(fd: int, start: int, end: int) -> tuple[np.ndarray, ...]: ...
@overload
def scan_file(fd: int, start: int, end: int, lists: bool) -> tuple[Column, ...]: ...
def scan_file(fd: int, start: int, end: int, lists: bool = False) -> tuple[Column, ...]:
    """``_kernels.scan_records`` over bytes ``start:end`` of the file open as ``fd``, read
    with ``pread`` instead of through a map.

    For bytes no record check has passed yet, read without the writer lock: a writer may
    cut them off at any moment (a torn tail at its next write, a failed write of its own),
    and reading a mapped page wholly past the end of the file raises SIGBUS, which kills
    the process. ``pread`` reads what is there (fewer bytes once cut). Records found here
    are never cut (a writer cuts only past the last one), so the replay decodes them from
    the map. The bytes are read a few MiB at a time, each chunk from the end of the last
    record found before it, so a reader far behind does not copy the whole tail at once.
    ``lists=True``: the four columns of a few records (:func:`scan_few`) as lists, for a
    caller that takes them so (a replay: ``Replayer.run``).
    """
    if end - start <= _SMALL_SCAN:
        few = scan_few(fd, start, end)
        if few is not None:
            return (*few, _NO_BAD, _NO_BAD) if lists else _arrays(few)
    parts: list[tuple[np.ndarray, ...]] = []
    chunk = _SCAN_CHUNK
    while start < end:
        want = min(chunk, end - start)
        buf = os.pread(fd, want, start)
        last = len(buf) < want or start + want == end  # short: cut since ``end`` was taken
        offsets, lengths, kinds, dims, bad_starts, bad_ends = _kernels.scan_records(buf, 0, len(buf))
        stop = len(buf)
        at = int(bad_starts[-1]) if not last and len(bad_starts) and bad_ends[-1] == len(buf) else -1
        count = fmt.batch_count(buf, at, len(buf)) if at >= 0 else 0
        batch = _scan_batch(fd, start + at, end, count) if count else None
        if batch is not None:  # the chunk ends inside a whole batch, or one the file ends inside
            keep = offsets < at
            parts.append((offsets[keep] + start, lengths[keep], kinds[keep], dims[keep],
                          bad_starts[:-1] + start, bad_ends[:-1] + start))  # fmt: skip
            parts.append(batch[0])
            start, chunk = batch[1], _SCAN_CHUNK
            continue
        if not last:
            if not len(offsets):  # one record (or damaged region) longer than the chunk
                chunk *= 2
                continue
            # Past the last record the chunk may have cut the next one: scanned again.
            stop = int(offsets[-1]) + int(lengths[-1])
            # A frame there where a batch's record should be is damage up to the next valid
            # record (scan_records reports it): kept, and the next chunk starts past it
            # (started at the frame, a scan would take it for a batch).
            nested = np.flatnonzero((bad_starts == stop) & (bad_ends < len(buf)))
            if len(nested) and fmt.batch_count(buf, stop, len(buf)):
                stop = int(bad_ends[nested[0]])
            keep = bad_starts < stop
            bad_starts, bad_ends = bad_starts[keep], bad_ends[keep]
        parts.append((offsets + start, lengths, kinds, dims, bad_starts + start, bad_ends + start))
        if last:
            break
        start += stop
    if len(parts) == 1:
        return parts[0]
    if not parts:
        return _kernels.scan_records(b"", 0, 0)
    return tuple(np.concatenate(column) for column in zip(*parts))


def _scan_batch(fd: int, frame_at: int, end: int, count: int) -> tuple[tuple[np.ndarray, ...], int] | None:
    """For :func:`scan_file`: the batch whose frame (naming ``count`` records) is at
    ``frame_at``, read a chunk at a time (one ``add_many`` may be a gigabyte, more than a
    reader should copy at once). Returns the scan's columns and where to go on: its records
    and the batch's end when all of them are there and valid; a damaged region from the
    frame to ``end`` when one is not and nothing valid follows (none of it is taken, as
    ``scan_records`` does); None when a record inside is damaged and something follows
    (the caller scans those bytes whole)."""
    parts, pos, left = [], frame_at + fmt.BATCH_FRAME_SIZE, count
    while left:
        want = min(_SCAN_CHUNK, end - pos)
        buf = os.pread(fd, want, pos) if want > 0 else b""
        offsets, lengths, kinds, dims, bad_starts, _ = _kernels.scan_records(buf, 0, len(buf))
        valid_after = len(offsets) > 0 or any(fmt.batch_count(buf, int(b), len(buf)) for b in bad_starts)
        if len(bad_starts):  # only whole records from the chunk's start
            keep = offsets < bad_starts[0]
            offsets, lengths, kinds, dims = offsets[keep], lengths[keep], kinds[keep], dims[keep]
        # Records back to back from the chunk's start only: a batch frame where the batch's
        # next record should be is damage there (scan_records reports it), not a new batch.
        follow = offsets == np.cumsum(lengths, dtype=np.int64) - lengths
        take = min(left, len(offsets) if follow.all() else int(np.argmin(follow)))
        if not take:  # (a record is shorter than a chunk: this one is cut short, or damaged)
            if (len(buf) < want or pos + want == end) and not valid_after:  # the file's tail
                frame = np.array([frame_at], dtype=np.int64)
                return _kernels.scan_records(b"", 0, 0)[:4] + (frame, np.array([end])), end
            return None
        parts.append((offsets[:take] + pos, lengths[:take], kinds[:take], dims[:take]))
        left -= take
        pos += int(offsets[take - 1]) + int(lengths[take - 1])
    columns = tuple(np.concatenate(column) for column in zip(*parts))
    return (*columns, _NO_BAD, _NO_BAD), pos


def _arrays(few: tuple[list[int], ...]) -> tuple[np.ndarray, ...]:
    """:func:`scan_few`'s columns as :func:`scan_file` gives them: arrays."""
    offsets, lengths, kinds, dims = few
    return (np.array(offsets, dtype=np.int64), np.array(lengths, dtype=np.uint32),
            np.array(kinds, dtype=np.uint8), np.array(dims, dtype=np.uint16), _NO_BAD, _NO_BAD)  # fmt: skip


def scan_few(fd: int, start: int, end: int) -> tuple[list[int], ...] | None:
    """:func:`scan_file`'s columns (offsets, lengths, kinds, dims), as lists, for at most
    ``_SMALL_SCAN`` bytes that hold whole valid records only (the usual catch-up: what
    another process appended since the last call), each checked by the compiled record
    check, and whole batches (a batch frame and every record it names); None for anything
    else (more bytes, a record or batch cut short or still being written, damage, a cut
    file), which the full scan then reads again and places. Lists, not arrays: a replay
    of one record takes them as they are (``Replayer.run``, ``_kernels.memory_rows``), and
    making four arrays cost several microseconds of a one-record catch-up."""
    if end - start > _SMALL_SCAN:
        return None
    buf = os.pread(fd, end - start, start)
    n = len(buf)
    if n < end - start:
        return None
    offsets, lengths, kinds, dims = [], [], [], []
    check, header = _kernels.check_record, fmt.RECORD_HEADER_SIZE
    pos = batch = 0  # batch: the records the last batch frame names that are still to come
    while pos < n:
        info = check(buf, pos, n)
        if info is None:
            if batch or not (batch := fmt.batch_count(buf, pos, n)):
                return None
            pos += fmt.BATCH_FRAME_SIZE
            continue
        batch -= batch > 0
        kind, dim, plen, _ = info
        offsets.append(start + pos)
        lengths.append(header + 2 * dim + plen)  # fmt.record_size, inlined
        kinds.append(kind)
        dims.append(dim)
        pos += lengths[-1]
    if batch:
        return None
    return offsets, lengths, kinds, dims


def _listed(column: Column) -> list[int]:
    return column if isinstance(column, list) else column.tolist()


class Replayer:
    """Turns checked records into index rows, batching new rows for ``append``."""

    def __init__(
        self, index: Any, dat: Any, path: str, problems: list[Problem], sort: bool = False,
        erased: set[int] | None = None,
    ) -> None:  # fmt: skip
        self.index, self.dat, self.path, self.problems = index, dat, path, problems
        self.sort = sort  # records come in any id order: sort the rows once, at the end
        self.rows: list[list[Any]] = []
        self.pending: dict[int, int] = {}  # id -> position in self.rows
        self.vec_rows: list[int] = []
        self.texts: list[str] = []  # of the rows in self.rows
        self.sessions: dict[str | None, int] = {None: 0}  # names repeat: hash each once
        # Ids read from erased memory records: a plain forget of one of them may follow (it
        # was forgotten while a compaction copied it, and erased after: fastmem.storage.erase.erase).
        self.erased: set[int] = erased if erased is not None else set()
        self.erase_rows: list[int] = []  # rows applied before, erased by a forget here
        self.mid_erase: dict[int, dict[str, Any]] = {}  # see _with_mid_erase

    def run(self, offsets: Column, lengths: Column, kinds: Column, dims: Column) -> None:
        """Apply the scanned records (their columns as arrays, or lists: :func:`scan_few`)."""
        apply = {
            fmt.KIND_MEMORY: self._memory,
            fmt.KIND_UPDATE: self._update,
            fmt.KIND_FORGET: self._forget,
        }
        dat, raw_len_at = self.dat, fmt.RECORD_RAW_LEN_AT
        kind_list = _listed(kinds)
        if self.index.damaged and fmt.KIND_FORGET in kind_list:  # (rare: damage met)
            columns4 = self._with_mid_erase(
                np.asarray(offsets, dtype=np.int64), np.asarray(lengths, dtype=np.uint32),
                np.asarray(kinds, dtype=np.uint8), np.asarray(dims, dtype=np.uint16), kind_list,
            )  # fmt: skip
            offsets, lengths, kinds, dims = columns4
            kind_list = kinds.tolist()
        n, at, retry = len(offsets), 0, 0
        columns = zip(_listed(offsets), _listed(lengths), kind_list, _listed(dims))
        for j, (off, length, kind, dim) in enumerate(columns):
            if j < at:
                continue  # applied by the compiled path
            if kind == _KIND_MID_ERASE:
                try:
                    self._memory(off, length, dim, self.mid_erase.pop(off))
                except (TypeError, ValueError, OverflowError, KeyError) as exc:
                    problem = f"record fields are invalid ({exc!r})"
                    self.problems.append(Problem("dat", off, problem))
                continue
            # The compiled kernel only: its numpy reference is slower than the general way.
            # After a record it left, the next few go the general way: records that are
            # seldom plain (another writer's fields) do not pay for a try each.
            if kind == fmt.KIND_MEMORY and not self.sort and j >= retry and _kernels.BACKEND == "cython":
                at = j + self._plain_run(offsets, lengths, kinds, dims, j, n)
                if at > j:
                    continue
                if not (dim and not self.index.dim):  # (the first vector sets the dimension)
                    retry = j + _PLAIN_RETRY
            try:
                # The scan has checked lengths and CRC; only decoding is left.
                start = fmt.payload_start(off, dim)
                raw_len = int.from_bytes(dat[off + raw_len_at : off + raw_len_at + 4], "little")
                payload = fmt.decode_payload(dat[start : off + length], off + length - start, raw_len, off, self.path)
                apply[kind](off, length, dim, payload)
            except CorruptRecordError as exc:
                self.problems.append(Problem("dat", off, str(exc)))
            except (TypeError, ValueError, OverflowError, KeyError) as exc:
                self.problems.append(Problem("dat", off, f"record fields are invalid ({exc!r})"))
            crc = int.from_bytes(self.dat[off + fmt.RECORD_CRC_AT : off + fmt.RECORD_CRC_AT + 4], "little")
            self.index.note_applied(off, length, crc)
            if len(self.rows) >= _FLUSH_ROWS and not self.sort:
                self._flush()
        self._flush()
        if self.erase_rows:
            erase_rows(self.index, self.erase_rows)
            self.erase_rows = []

    def _with_mid_erase(
        self, offsets: np.ndarray, lengths: np.ndarray, kinds: np.ndarray, dims: np.ndarray,
        kind_list: list[int],
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
        """The columns with, in file order, the memory records that this scan met damaged
        and that an erasing forget among its records names (``fastmem.storage.erase``): records
        another process was overwriting (an erase appends its forget first and overwrites
        after; a replay without the writer lock may read them half written), or that an
        eraser killed halfway left so. Each is given (kind ``_KIND_MID_ERASE``, its payload
        in ``self.mid_erase``) as the erased record the erase writes there reads back, from
        the forget's fields: the forgotten row every replay of the finished erase makes, in
        id order. (Left out, the handle's index would lack that row for good.)"""
        damaged = set(self.index.damaged)
        found: dict[int, tuple[int, int, dict[str, Any]]] = {}  # offset: length, dim, payload
        for j in [j for j, k in enumerate(kind_list) if k == fmt.KIND_FORGET]:
            off, length = int(offsets[j]), int(lengths[j])
            try:
                p = read_payload(self.dat, off, off + length, self.path, precise=False)[2]
                if "e" not in p:
                    continue
                mid, ts, type_name, spans, _ = _erase_pending(p, off)
                at, size = spans[0], spans[1]
                head = bytes(self.dat[at : at + fmt.RECORD_HEADER_SIZE])
                if (
                    type(mid) is not int or mid < self.index.next_id or mid > fmt.MAX_ID
                    or (at, at + size) not in damaged or head[:4] != fmt.RECORD_MAGIC
                    or head[5] != fmt.KIND_MEMORY
                ):  # fmt: skip
                    continue
                dim = int.from_bytes(head[6:8], "little")
                if dim > fmt.MAX_DIM or fmt.RECORD_HEADER_SIZE + 2 * dim >= size:
                    dim = 0  # (as _erase.redo writes it)
                record = fmt.erased_record(fmt.KIND_MEMORY, dim, mid, size, ts, type_name)
                pad = fmt.DAT_HEADER_SIZE  # (records start past a file header)
                found[at] = (size, dim, fmt.read_record(bytes(pad) + record, pad, pad + size)[1])
            except (CorruptRecordError, TypeError, ValueError, KeyError, IndexError):
                continue  # the run reports what is wrong with the forget
        if not found:
            return offsets, lengths, kinds, dims
        ats = sorted(found)
        where = np.searchsorted(offsets, ats)
        read = where < len(offsets)  # (a record read whole at that offset is no gap)
        read[read] = offsets[where[read]] == np.array(ats)[read]
        if read.any():
            ats, where = [a for a, r in zip(ats, read.tolist()) if not r], where[~read]
        if not ats:
            return offsets, lengths, kinds, dims
        self.mid_erase = {at: found[at][2] for at in ats}
        return (
            np.insert(offsets, where, ats),
            np.insert(lengths, where, [found[a][0] for a in ats]),
            np.insert(kinds, where, _KIND_MID_ERASE),
            np.insert(dims, where, [found[a][1] for a in ats]),
        )

    def _plain_run(
        self, offsets: Column, lengths: Column, kinds: Column, dims: Column, first: int, n: int
    ) -> int:
        """Apply the plain memory records from record ``first`` on, decoded into rows by
        the compiled kernel (``_kernels.memory_rows``) and appended at once; returns how
        many (0: record ``first`` is not the plain case, and the general way takes it)."""
        self._flush()  # the rows before them go first (and their ids set next_id)
        index = self.index
        stop = min(n, first + _PLAIN_ROWS)
        # The rows and their int8 vectors are written straight into the tail's room past
        # its rows (nothing reads there; append(staged=True) makes them its own), each
        # vector quantized while it is in the cache: a separate quantize call, then the
        # copies into the tail, were ~15 µs of a one-record catch-up, mostly fixed costs.
        rows, quantized = index.tail.room(stop - first)
        vectors = np.empty((stop - first, index.dim), dtype=np.uint16)
        # (The compiled kernel, the only one this runs, takes the columns as lists too.)
        count, texts, _ = _kernels.memory_rows(
            self.dat, offsets, lengths, kinds, dims,  # type: ignore[arg-type]
            first, stop, index.next_id, index.dim,
            index.type_codes, fmt.DEFAULT_IMPORTANCE, fmt.DEFAULT_USER_TYPE_IMPORTANCE,
            self.sessions, session_hash, rows, vectors, quantized,
        )  # fmt: skip
        if not count:
            return 0
        index.append(rows[:count], None, texts, staged=True, forgotten=0)
        last = first + count - 1
        off = int(offsets[last])
        crc_at = off + fmt.RECORD_CRC_AT
        index.note_applied(off, int(lengths[last]), int.from_bytes(self.dat[crc_at : crc_at + 4], "little"))
        return count

    def _flush(self) -> None:
        if not self.rows:
            return
        if self.sort:
            # Sorted by id here, appended below in blocks: no single numpy call holds the
            # GIL for the whole prefix (a compaction's other threads keep running).
            ids = np.fromiter((r[F_ID] for r in self.rows), dtype=np.int64, count=len(self.rows))
            order = np.argsort(ids, kind="stable").tolist()
            position = np.empty(len(order), dtype=np.int64)
            position[order] = np.arange(len(order))
            self.rows = [self.rows[i] for i in order]
            self.texts = [self.texts[i] for i in order]
            self.vec_rows = np.sort(position[self.vec_rows]).tolist() if self.vec_rows else []
        block = _FLUSH_ROWS
        vec_at = 0
        for lo in range(0, len(self.rows), block):
            hi = min(lo + block, len(self.rows))
            vec_end = vec_at
            while vec_end < len(self.vec_rows) and self.vec_rows[vec_end] < hi:
                vec_end += 1
            self._append(lo, hi, self.vec_rows[vec_at:vec_end])
            vec_at = vec_end
        self.rows, self.pending, self.vec_rows, self.texts = [], {}, [], []

    def _append(self, lo: int, hi: int, vec_rows: list[int]) -> None:
        """Append ``self.rows[lo:hi]`` (``vec_rows``: those of them with a vector)."""
        index = self.index
        rows = np.array([tuple(r) for r in self.rows[lo:hi]], dtype=fmt.INDEX_DTYPE)
        vectors = None
        if index.dim and vec_rows:
            width = 2 * index.dim
            raw = bytearray(len(rows) * width)  # zeros for the rows without a vector
            dat = self.dat
            for pos in vec_rows:
                start = fmt.vector_start(self.rows[pos][F_OFFSET])
                at = (pos - lo) * width
                raw[at : at + width] = dat[start : start + width]
            vectors = np.frombuffer(raw, dtype="<f2").reshape(len(rows), index.dim)
            bad = ~np.isfinite(vectors).all(axis=1)
            if bad.any():  # only a damaged record (its CRC made to fit) holds inf or NaN
                vectors[bad] = 0
                rows["flags"][bad] &= ~np.uint16(fmt.FLAG_HAS_VECTOR)
                self.problems.extend(
                    Problem("dat", int(off), "the vector is not finite: the memory is kept without it")
                    for off in rows["offset"][bad].tolist()
                )
        index.append(rows, vectors, self.texts[lo:hi])

    def _memory(self, off: int, length: int, dim: int, p: dict[str, Any]) -> None:
        index = self.index
        mid = p["i"]
        if mid < index.next_id or mid > fmt.MAX_ID or mid in self.pending or (
            not self.sort and self.rows and mid <= self.rows[-1][F_ID]
        ):
            raise ValueError(f"memory id {mid} is not above the ids before it")
        if "e" in p:
            self._erased(mid, off, length, p)
            return
        check_memory_fields(p)
        ts = float(p["t"])
        text = p["x"]
        type_name = p.get("y", "conversation")
        session = p.get("s")
        importance = float(p.get("p", default_importance(type_name)))
        flags = fmt.FLAG_PINNED if p.get("n") else 0
        if dim:
            if index.dim == 0:
                index.set_dim(dim)
            if dim != index.dim:
                raise ValueError(f"vector length {dim} differs from the store's {index.dim}")
            flags |= fmt.FLAG_HAS_VECTOR
            self.vec_rows.append(len(self.rows))
        tokens = p.get("k") or (fmt.UNKNOWN_TOKENS, fmt.UNKNOWN_TOKENS)
        code = index.type_code(type_name, create=True)
        self.pending[mid] = len(self.rows)
        self.texts.append(text)
        hashed = self.sessions.get(session)
        if hashed is None:
            hashed = self.sessions[session] = session_hash(session)
        self.rows.append(
            [mid, ts, hashed, off, 0, 0.0, length, importance, 0.0, 0,
             int(tokens[0]), int(tokens[1]), code, flags, 0]
        )  # fmt: skip

    def _erased(self, mid: int, off: int, length: int, p: dict[str, Any]) -> None:
        """An erased memory record (fastmem.storage.erase): a forgotten row with nothing of it but
        its id, time, type, offset and length."""
        ts, type_name = p.get("t", 0.0), p.get("y", "conversation")
        if not (type(ts) is float and 0.0 <= ts <= fmt.MAX_TIMESTAMP) or type(type_name) is not str:
            raise ValueError("the erased memory's time or type is invalid")
        row = [mid, ts, 0, off, 0, 0.0, length, 0.0, 0.0, 0, 0, 0, 0, 0, 0]
        for field, value in ERASED_FIELDS.items():
            row[field] = value
        row[F_TYPE] = self.index.type_code(type_name, create=True)
        self.pending[mid] = len(self.rows)
        self.texts.append("")
        self.rows.append(row)
        self.erased.add(mid)

    def _target(self, mid: int) -> tuple[list[Any] | None, int]:
        pos = self.pending.get(mid)
        if pos is not None:
            return self.rows[pos], -1
        g = self.index.find(mid)
        if g < 0:
            raise ValueError(f"the record changes memory {mid}, which does not exist")
        return None, g

    def _update(self, off: int, length: int, dim: int, p: dict[str, Any]) -> None:
        _check_change_fields(p)
        row, g = self._target(p["i"])
        flags = row[F_FLAGS] if row is not None else self.index.row(g)[F_FLAGS]
        if flags & fmt.FLAG_FORGOTTEN:
            # Only an erased memory's updates come after it is forgotten (its record was
            # overwritten, its forget record follows): nothing of them is kept.
            return
        changes = update_changes(flags, p, off)
        if row is None:
            self.index.change(g, changes)
        else:
            for field, value in changes.items():
                row[field] = value

    def _forget(self, off: int, length: int, dim: int, p: dict[str, Any]) -> None:
        _check_change_fields(p)
        if "e" not in p:
            if p["i"] in self.erased:
                return
            row, g = self._target(p["i"])
            flags = row[F_FLAGS] if row is not None else self.index.row(g)[F_FLAGS]
            if flags & fmt.FLAG_FORGOTTEN:
                raise ValueError(f"memory {p['i']} is forgotten twice")
            if row is None:
                self.index.forget(g, flags)
            else:
                row[F_FLAGS] = flags | fmt.FLAG_FORGOTTEN
            return
        # A forget that erased records (fastmem.storage.erase): they may be erased records already
        # (the memory's row is then forgotten), whole or, if the eraser was killed, damaged.
        pending = _erase_pending(p, off)
        self.index.erase_pending.append(pending)
        mid = pending[0]
        pos = self.pending.get(mid)
        if pos is not None:
            row = self.rows[pos]
            if row[F_FLAGS] & fmt.FLAG_HAS_VECTOR:
                self.vec_rows.remove(pos)
            for field, value in ERASED_FIELDS.items():
                row[field] = value
            self.texts[pos] = ""
            return
        g = self.index.find(mid)
        if g >= 0:
            self.erase_rows.append(g)  # all at once, after the run (one pass over the postings)
        else:  # its memory record was being erased when the eraser was killed: see redo
            self.index.next_id = max(self.index.next_id, mid + 1)


def _erase_pending(p: dict[str, Any], before: int) -> Pending:
    """What an erasing forget's payload asks to erase, checked (raises ``ValueError``):
    pairs of ints, each record inside the data file before the forget record at ``before``."""
    spans, ts, type_name = p["e"], p.get("w"), p.get("y")
    if (
        type(spans) is not list
        or not spans
        or len(spans) % 2
        or not all(type(v) is int for v in spans)
    ):
        raise ValueError("the erased records are not pairs of offsets and lengths")
    for off, length in zip(spans[::2], spans[1::2]):
        if not (
            fmt.DAT_HEADER_SIZE <= off
            and fmt.RECORD_HEADER_SIZE < length
            and off + length <= before
        ):
            raise ValueError("an erased record lies outside the data file")
    if ts is not None and not (type(ts) is float and 0.0 <= ts <= fmt.MAX_TIMESTAMP):
        raise ValueError("the erased memory's timestamp is out of range")
    if type_name is not None and type(type_name) is not str:
        raise ValueError("the erased memory's type is not a name")
    return p["i"], ts, type_name, spans, before


def erase_rows(index: Any, rows: list[int]) -> None:
    """Set ``index``'s rows ``rows`` as their erased records read back (fastmem.storage.erase):
    forgotten, with no session, metadata, statistics, tokens, keyword postings or vector
    (their int8 vectors zeroed here, so that no checkpoint of the index writes them again)."""
    nb = index.n_base
    for g in rows:
        row = index.row(g)
        if not row[F_FLAGS] & fmt.FLAG_FORGOTTEN:
            index.forget(g, row[F_FLAGS])
        index.change(g, ERASED_FIELDS)
        vectors, i = (index.base_vectors, g) if g < nb else (index.tail.vectors, g - nb)
        if i < len(vectors):
            vectors[i] = 0
        if g < nb:
            index.erased_base.add(g)
            if index.base_scales is not None:
                index.base_scales[g] = 0.0
    index.keyword.erase(np.array(rows, dtype=np.int64))
