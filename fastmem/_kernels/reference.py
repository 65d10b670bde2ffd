"""Readable numpy/Python reference kernels: the test oracle of ``fastmem._kernels._ext``.

Each function here has the same signature and the same results as its compiled twin;
``FASTMEM_BACKEND=python`` makes fastmem use these.
"""

from __future__ import annotations

import bisect
import math
import os
import struct
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import lz4.block
import msgpack
import numpy as np

# The token counter's reference has a module of its own; these are the kernels' names.
from .bpe_reference import CL100K_PATTERN, Cl100kCounter, SharedCount, ranks_file  # noqa: F401
from .._format import (
    FLAG_FORGOTTEN,
    FLAG_PINNED,
    INDEX_DTYPE,
    INDEX_ROW,
    KIND_MEMORY,
    MAX_DIM,
    MAX_RAW_PAYLOAD,
    RECORD_CRC_AT,
    RECORD_HEADER,
    RECORD_HEADER_SIZE,
    RECORD_KINDS,
    RECORD_MAGIC,
    RECORD_VERSION,
    unpack_dat_header,
    unpack_delta_header,
    unpack_hot,
    unpack_idx_header,
)
from .._format import (
    current_slot as _current_slot,
)
from .. import _format
from .index_open_reference import open_index
# The keyword search's reference has a module of its own, as the token counter's has.
from .keyword_reference import (  # noqa: F401
    bm25_topk, fnv1a64, merge_postings, merge_postings_runs, sort_postings, tokenize_batch,
)  # fmt: skip
from ..errors import CorruptionError, FormatVersionError


def crc32(data: Any, value: int = 0) -> int:
    """CRC-32 (IEEE polynomial, as zlib) of ``data``, continuing from ``value``."""
    return zlib.crc32(data, value)


def _record_length(buf: Any, pos: int, end: int) -> int:
    """Length of the valid record at ``pos``, or 0 when none is there."""
    if pos + RECORD_HEADER_SIZE > end:
        return 0
    magic, version, kind, dim, plen, rlen, crc = RECORD_HEADER.unpack_from(buf, pos)
    length = RECORD_HEADER_SIZE + 2 * dim + plen
    if (
        magic != RECORD_MAGIC
        or version != RECORD_VERSION
        or kind not in RECORD_KINDS
        or dim > MAX_DIM
        or rlen > MAX_RAW_PAYLOAD
        or plen > rlen
        or pos + length > end
    ):
        return 0
    view = memoryview(buf)[pos : pos + length]
    if zlib.crc32(view[RECORD_HEADER_SIZE:], zlib.crc32(view[:RECORD_CRC_AT])) != crc:
        return 0
    return length


def _valid_after(data: bytes, pos: int, end: int) -> bool:
    """Whether a valid record or batch frame starts after ``pos`` (before ``end``)."""
    return _next_valid(data, pos, end) < end


def _next_valid(data: bytes, pos: int, end: int) -> int:
    """The first offset after ``pos`` where a valid record or batch frame starts, else ``end``."""
    nxt = data.find(RECORD_MAGIC, pos + 1, end)
    while nxt != -1 and not (_record_length(data, nxt, end) or _format.batch_count(data, nxt, end)):
        nxt = data.find(RECORD_MAGIC, nxt + 1, end)
    return end if nxt == -1 else nxt


_ZERO_PAGE = bytes(_format.LOST_PAGE)
_ZERO_FRAME = bytes(_format.BATCH_FRAME_SIZE)


def _lost_rest(data: bytes, at: int, end: int, kind: int) -> bool:
    """Whether ``data[at:end]``, from a damaged record of a batch to the end of the file, is
    the rest of the file's last write with pages a power loss did not keep (docs/format.md,
    "Batch frame"): every damaged region that valid records follow holds a page of zeros or
    starts with a frame's length of zeros (the last region may be anything: a torn tail),
    and the records after it are neither a batch frame nor of another kind than ``kind``
    (the batch's; 0: the first record met). A frame or another kind is a later write: a
    write that came after the batch's sync, so the batch lost no page."""
    pos = at
    while pos < end:
        nxt = _next_valid(data, pos, end)
        if nxt == end:
            return True
        if not (data.startswith(_ZERO_FRAME, pos) or data.find(_ZERO_PAGE, pos, nxt) != -1):
            return False
        pos = nxt
        while length := _record_length(data, pos, end):
            kind = kind or data[pos + 5]
            if data[pos + 5] != kind:
                return False
            pos += length
        if pos < end and _format.batch_count(data, pos, end):
            return False
    return True


def lost_write(tail: bytes) -> bool:
    """Whether ``tail``, bytes from where a scan's damaged region starts to the end of the
    file, are a batch whose pages a power loss did not keep with valid records after the
    damage (the rule :func:`scan_records` takes none of; see ``_lost_rest``): a torn append.
    False for anything else (a batch with nothing valid after its damage included: the
    torn-tail rule's, ``fastmem.storage.fileio.torn_tail``)."""
    end = len(tail)
    count = _format.batch_count(tail, 0, end)
    if not count:
        zeros_first = tail.startswith(_ZERO_FRAME)  # the frame's page lost
        return zeros_first and _valid_after(tail, 0, end) and _lost_rest(tail, 0, end, 0)
    at, walked, kind = _format.BATCH_FRAME_SIZE, 0, 0
    while walked < count and (length := _record_length(tail, at, end)):
        kind = kind or tail[at + 5]
        walked, at = walked + 1, at + length
    if walked == count or _format.batch_count(tail, at, end) or not _valid_after(tail, at, end):
        return False
    return _lost_rest(tail, at, end, kind) or (
        tail.startswith(_ZERO_FRAME, at) and _lost_rest(tail, at, end, 0)
    )


def scan_records(buf: Any, start: int, end: int) -> tuple[np.ndarray, ...]:
    """Walk the records in ``buf[start:end]``, checking each one's lengths and CRC.

    Returns ``(offsets, lengths, kinds, dims, bad_starts, bad_ends)``: the valid records,
    and the damaged regions between them. A damaged region runs from the first byte that
    does not start a valid record to the next byte that does (or to ``end``). A batch frame
    is not a record: the records it names are given when all are valid; when one is not
    and no valid record or frame starts after it, or the damage looks like pages a power
    loss did not keep with only the batch's kind of records after it (``_lost_rest``),
    none of them (the batch is the file's tail: a damaged region from the frame to
    ``end``); otherwise those that are valid. A frame where a batch's record should be is
    a damaged region (of two frames in a row, the first); a damaged region that starts
    with a frame's length of zeros followed by what ``_lost_rest`` allows runs to ``end``.
    """
    if not 0 <= start <= end <= len(buf):
        raise ValueError("scan range out of bounds")
    data = bytes(memoryview(buf)[:end])
    offsets, lengths, kinds, dims, bad_starts, bad_ends = [], [], [], [], [], []
    pos = start
    while pos < end:
        length = _record_length(data, pos, end)
        if length:
            offsets.append(pos)
            lengths.append(length)
            kinds.append(data[pos + 5])
            dims.append(int.from_bytes(data[pos + 6 : pos + 8], "little"))
            pos += length
            continue
        count = _format.batch_count(data, pos, end)
        if count:  # a batch frame: its records, all of them or (file ends first) none
            walked: list[tuple[int, int]] = []  # offset and length of each whole record
            at = pos + _format.BATCH_FRAME_SIZE
            while len(walked) < count and (length := _record_length(data, at, end)):
                walked.append((at, length))
                at += length
            nested = len(walked) < count and _format.batch_count(data, at, end)
            if len(walked) < count and (not _valid_after(data, at, end) or not nested and (
                    _lost_rest(data, at, end, data[walked[0][0] + 5] if walked else 0)
                    or data.startswith(_ZERO_FRAME, at) and _lost_rest(data, at, end, 0))):
                bad_starts.append(pos)  # the file's tail, or its last write with pages lost
                bad_ends.append(end)
                break
            for off, length in walked:  # (damage inside a whole batch: the rest is kept)
                offsets.append(off)
                lengths.append(length)
                kinds.append(data[off + 5])
                dims.append(int.from_bytes(data[off + 6 : off + 8], "little"))
            if nested and not walked:  # a frame directly after a frame: the first is damage
                bad_starts.append(pos)
                bad_ends.append(at)
            elif nested:  # a frame where a record of the batch should be: damage, not a batch
                bad_starts.append(at)
                at = _next_valid(data, at, end)
                bad_ends.append(at)
            pos = at
            continue
        bad_starts.append(pos)
        if data.startswith(_ZERO_FRAME, pos) and _lost_rest(data, pos, end, 0):
            bad_ends.append(end)  # a batch whose frame's page was lost: the file's last write
            break
        pos = _next_valid(data, pos, end)
        bad_ends.append(pos)
    return (
        np.array(offsets, dtype=np.int64),
        np.array(lengths, dtype=np.uint32),
        np.array(kinds, dtype=np.uint8),
        np.array(dims, dtype=np.uint16),
        np.array(bad_starts, dtype=np.int64),
        np.array(bad_ends, dtype=np.int64),
    )


def topk_int8(
    vectors: np.ndarray,
    scales: np.ndarray,
    flags: np.ndarray,
    types: np.ndarray,
    timestamps: np.ndarray,
    sessions: np.ndarray,
    query: np.ndarray,
    k: int,
    type_allowed: np.ndarray | None,
    since: float,
    until: float,
    session: int,
    require_flags: int,
    exclude_flags: int,
    scales_out: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Filtered top-k rows by ``scale[row] * (vectors[row] . query)`` (exact int32 dot).

    A row qualifies when it has every bit of ``require_flags`` and none of
    ``exclude_flags``, ``since <= timestamp <= until``, its session equals ``session``
    (0 = any) and ``type_allowed[type]`` is set (``None`` = any). Ties go to the lower row.
    ``scales_out``, if given (float32, contiguous), receives a copy of every row's scale:
    a first scan leaves the contiguous column the next scans read.

    Returns ``(rows, scores)``, best first, at most ``k`` of each.
    """
    n = vectors.shape[0]
    if scales_out is not None:
        if len(scales_out) < n:
            raise ValueError("scales_out is shorter than the matrix")
        scales_out[:n] = scales[:n]
    mask = (flags[:n] & require_flags) == require_flags
    mask &= (flags[:n] & exclude_flags) == 0
    if not (math.isinf(since) and since < 0):
        mask &= timestamps[:n] >= since
    if not (math.isinf(until) and until > 0):
        mask &= timestamps[:n] <= until
    if session:
        mask &= sessions[:n] == session
    if type_allowed is not None:
        mask &= type_allowed[types[:n]].astype(bool)
    rows = np.nonzero(mask)[0]
    dots = vectors[rows].astype(np.int32) @ query.astype(np.int32)
    with np.errstate(invalid="ignore"):  # a damaged row's scale may be a signalling NaN
        scores = dots.astype(np.float64) * scales[rows].astype(np.float64)
    best = np.lexsort((rows, -scores))[:k]
    return rows[best].astype(np.int64), scores[best]


def dot_half(buf: Any, offsets: np.ndarray, query: np.ndarray) -> np.ndarray:
    """``query . v`` for the little-endian float16 vector ``v`` of ``len(query)`` entries at
    each byte offset of ``buf``, in float64: each product rounded, then summed in index
    order (the exact cosine of a stored unit vector and a float64 unit query).

    Raises:
        ValueError: a vector lies outside ``buf``.
    """
    dim = len(query)
    offsets = np.asarray(offsets, dtype=np.int64)
    raw = np.frombuffer(buf, dtype=np.uint8)
    if len(offsets) and (int(offsets.min()) < 0 or int(offsets.max()) > len(raw) - 2 * dim):
        raise ValueError("a vector lies outside the buffer")
    if dim == 0 or not len(offsets):
        return np.zeros(len(offsets), dtype=np.float64)
    halves = raw[offsets[:, None] + np.arange(2 * dim)].view("<f2").astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):  # a damaged file's inf or NaN halves:
        # IEEE's results (inf times 0 is NaN), as the compiled kernel gives them, no warning
        return np.add.accumulate(halves * np.asarray(query, dtype=np.float64), axis=1)[:, -1]


def frame_records(
    kind: int,
    payloads: list[bytes],
    raw_lens: np.ndarray,
    vectors: np.ndarray | None,
    has_vector: np.ndarray | None,
) -> tuple[bytes, np.ndarray, np.ndarray]:
    """Frame whole records of one kind, back to back.

    Each record is the 20-byte header (magic, version, ``kind``, vector dim, stored
    payload length, ``raw_lens[i]``, CRC), then row ``i`` of ``vectors`` (float16 viewed as
    uint16) when ``has_vector[i]``, then ``payloads[i]``. The CRC-32 covers the header's
    first 16 bytes and everything after the header.

    Returns ``(bytes, lengths, crcs)``.
    """
    n = len(payloads)
    if len(raw_lens) != n or (vectors is not None and (len(vectors) != n or has_vector is None or len(has_vector) != n)):
        raise ValueError("payloads, raw_lens, vectors and has_vector differ in length")
    if vectors is not None and vectors.shape[1] > MAX_DIM:
        raise ValueError("vectors are longer than MAX_DIM")
    parts, lengths, crcs = [], [], []
    for i, payload in enumerate(payloads):
        raw_len = int(raw_lens[i])
        if len(payload) > raw_len or raw_len > MAX_RAW_PAYLOAD:
            raise ValueError("a payload is longer than its raw length or MAX_RAW_PAYLOAD")
        vector = b""
        if vectors is not None and has_vector is not None and has_vector[i]:
            vector = vectors[i].astype("<u2").tobytes()
        head = RECORD_HEADER.pack(RECORD_MAGIC, RECORD_VERSION, kind, len(vector) // 2, len(payload), raw_len, 0)
        crc = zlib.crc32(payload, zlib.crc32(vector, zlib.crc32(head[:RECORD_CRC_AT])))
        parts += [head[:RECORD_CRC_AT], crc.to_bytes(4, "little"), vector, payload]
        lengths.append(RECORD_HEADER_SIZE + len(vector) + len(payload))
        crcs.append(crc)
    return b"".join(parts), np.array(lengths, dtype=np.uint32), np.array(crcs, dtype=np.uint32)


def to_half(x: np.ndarray) -> tuple[np.ndarray, int]:
    """Float32 rows divided by their norm, rounded to float16.

    The squared norm is summed in float64 in index order; each element is multiplied by
    ``1 / sqrt(sum)`` in float64, rounded to float32, then to float16 (nearest, ties even).

    Returns ``(half bits as uint16 (n, dim), first bad row or -1)``; a row is bad when it
    holds a NaN or an infinity or is all zeros (it and the rows after it are left zero).
    """
    x64 = np.asarray(x, dtype=np.float32).astype(np.float64)
    out = np.zeros(x64.shape, dtype=np.uint16)
    if x64.shape[1] == 0:
        return out, (0 if len(x64) else -1)
    with np.errstate(over="ignore", invalid="ignore"):
        sums = np.add.accumulate(x64 * x64, axis=1)[:, -1]  # accumulate: strictly in order
    bad_rows = np.nonzero((sums == 0) | ~np.isfinite(sums))[0]
    bad = int(bad_rows[0]) if len(bad_rows) else -1
    good = x64[: bad if bad >= 0 else len(x64)]
    unit = (good * (1.0 / np.sqrt(sums[: len(good)]))[:, None]).astype(np.float32)
    out[: len(good)] = unit.astype(np.float16).view(np.uint16)
    return out, bad


def to_half_quantized(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """``to_half(x)`` and ``quantize_half`` of its rows: ``(half bits, int8 rows, scales,
    first bad row or -1)``; the int8 rows and scales are only meaningful without a bad row."""
    half, bad = to_half(x)
    q, scales = quantize_half(half)
    return half, q, scales, bad


def quantize_half(half: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int8 rows and float32 scales with ``int8 * scale ~= float16 rows``.

    ``peak = max|row|``; ``scale = peak / 127`` and ``int8 = rint(row * (127 / peak))``,
    all in float32, ties to even (an all-zero row gets scale 1 and zeros).
    """
    v = np.asarray(half, dtype=np.uint16).view(np.float16).astype(np.float32)
    if v.shape[0] == 0 or v.shape[1] == 0:
        return np.zeros(v.shape, dtype=np.int8), np.ones(v.shape[0], dtype=np.float32)
    peak = np.abs(v).max(axis=1)
    nonzero = peak > 0
    safe = np.where(nonzero, peak, np.float32(1))
    scales = np.where(nonzero, peak / np.float32(127), np.float32(1)).astype(np.float32)
    inv = np.where(nonzero, np.float32(127) / safe, np.float32(1)).astype(np.float32)
    q = np.rint(v * inv[:, None]).clip(-127, 127).astype(np.int8)
    return q, scales


def check_record(buf: Any, offset: int, end: int) -> tuple[int, int, int, int] | None:
    """``(kind, dim, payload_len, raw_len)`` of the valid record at ``offset``, else None."""
    if offset < 0 or end > len(buf) or offset >= end or not _record_length(buf, offset, end):
        return None
    _, _, kind, dim, plen, rlen, _ = RECORD_HEADER.unpack_from(buf, offset)
    return kind, dim, plen, rlen


def record_payload(buf: Any, offset: int, end: int) -> tuple[int, int, bytes, int] | None:
    """``(kind, dim, payload, raw_len)`` of the valid record at ``offset`` (``payload``: its
    stored payload bytes, a copy), else None."""
    info = check_record(buf, offset, end)
    if info is None:
        return None
    kind, dim, plen, rlen = info
    start = offset + RECORD_HEADER_SIZE + 2 * dim
    return kind, dim, bytes(buf[start : start + plen]), rlen


def file_size(fd: int) -> int:
    """The size of the file open as ``fd``, or -1 when no name links to it any more (a
    compaction or repair replaced it)."""
    st = os.fstat(fd)
    return -1 if st.st_nlink == 0 else st.st_size


# --- get's read in one call ------------------------------------------------------------

_ROW_ID = struct.Struct("<Q")  # a row's first field (INDEX_DTYPE "id")
_MAX_DEPTH = 64  # arrays and maps nested in each other, the top one included


def _no_ext(code: int, data: bytes) -> Any:
    raise ValueError("an ext type")


def unpack(data: Any) -> Any:
    """``msgpack.unpackb(data, raw=False, strict_map_key=True)`` when ``data`` is plain
    msgpack: nil, bool, int, float, str, bin, arrays and maps (with str or bytes keys),
    containers at most ``_MAX_DEPTH`` deep, nothing after it. None for anything else (ext
    types, damaged bytes), including an encoded None (the compiled twin decides the same)."""
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=True, ext_hook=_no_ext)
    except Exception:  # msgpack raises several types for damaged bytes
        return None
    return obj if _plain(obj, 0) else None


def _plain(obj: Any, depth: int) -> bool:
    if type(obj) is list:
        return depth < _MAX_DEPTH and all(_plain(v, depth + 1) for v in obj)
    if type(obj) is dict:
        return depth < _MAX_DEPTH and all(
            type(k) in (str, bytes) and _plain(v, depth + 1) for k, v in obj.items()
        )
    return obj is None or type(obj) in (bool, int, float, str, bytes)  # not msgpack's Timestamp


def _find_row(rows: Any, n: int, mid: int, first: int) -> int:
    """The row of id ``mid`` among ``n`` rows in id order, or -1: row ``mid - first`` if it
    holds it (ids are dense until a compaction), else a binary search (as MemoryIndex.find)."""
    ids = [_ROW_ID.unpack_from(rows, k * INDEX_DTYPE.itemsize)[0] for k in range(n)]
    if 0 <= mid - first < n and ids[mid - first] == mid:
        return mid - first
    k = bisect.bisect_left(ids, mid)
    return k if k < n and ids[k] == mid else -1


def read_memory(mid: Any, base: Any, tail: Any, tail_n: int, dat: Any, dat_end: int,
                memory: type, f32: Callable[[float], float]) -> Any:
    """``MemoryStore.get``'s read in one call: the ``memory`` (a tuple subclass) of id
    ``mid``, or None when this is not the plain case; the caller then reads it the general
    way (``Engine.live_row`` and ``decode``), which gives the same memory or the precise error.

    ``base`` holds the index's base rows (``INDEX_DTYPE``, in id order; empty until they
    are checked), ``tail`` at least ``tail_n`` rows added since; ``dat`` is the data file,
    valid up to ``dat_end``. The plain case: ``mid`` is "m" and 1 to 19 ASCII digits; its row
    (in ``base`` when the id is at most the last one there, else in ``tail``) is live and has
    no metadata record; the record it points at is valid (``check_record``), a memory record
    of the row's length, whose payload (after lz4 when compressed) ``unpack`` decodes to a
    dict with the row's id as "i" (an int) and a str as "x". The memory is then
    ``(f"m{id}", x, y or "conversation", timestamp, s, f32(importance), pinned, m, u)``, the
    letters being the payload's values (None when missing), the others the row's.
    """
    if not (type(memory) is type and issubclass(memory, tuple)):
        raise TypeError("memory must be a subclass of tuple")
    if type(mid) is not str or not 2 <= len(mid) <= 20 or mid[0] != "m":
        return None
    digits = mid[1:]
    if not digits.isascii() or not digits.isdigit():
        return None
    want, size = int(digits), INDEX_DTYPE.itemsize
    n = len(base) // size
    if n and want <= _ROW_ID.unpack_from(base, (n - 1) * size)[0]:
        rows, at = base, _find_row(base, n, want, 0)
    elif tail_n <= 0:
        return None
    else:
        if len(memoryview(tail).cast("B")) // size < tail_n:
            raise ValueError("tail_n is more than the tail's rows")
        first = _ROW_ID.unpack_from(tail, 0)[0]
        rows, at = tail, _find_row(tail, tail_n, want, first)
    if at < 0 or not 0 < dat_end <= len(dat):
        return None
    row = INDEX_ROW.unpack_from(rows, at * size)
    if row[3] >= dat_end:  # the record's offset
        return None
    return _plain_memory(row, dat, row[3], dat_end, memory, f32)


def read_hot(rows: Any, starts: Sequence[int], records: Any, n: int, memory: type,
             f32: Callable[[float], float]) -> list[Any] | None:
    """A restart's newest memories in one call: the ``memory`` of each of the first ``n``
    rows of an index's hot section, or None when any of them is not the plain case (the
    caller then decodes them the general way, which gives the same memories or the precise
    error).

    ``rows`` holds the section's rows (``INDEX_DTYPE``), ``records`` their records one after
    another, row ``i``'s at ``starts[i]`` (valid up to the end of ``records``). The plain
    case is ``read_memory``'s, the record being read at ``starts[i]`` of ``records``
    instead of at the row's offset in the data file.
    """
    if not (type(memory) is type and issubclass(memory, tuple)):
        raise TypeError("memory must be a subclass of tuple")
    size = INDEX_DTYPE.itemsize
    if not 0 <= n <= len(starts) or len(memoryview(rows).cast("B")) < n * size:
        raise ValueError("n is more than the section's rows")
    end = len(memoryview(records).cast("B"))
    out = []
    for i in range(n):
        at = starts[i]
        if not 0 <= at < end:
            return None
        row = INDEX_ROW.unpack_from(rows, i * size)
        memory_i = _plain_memory(row, records, at, end, memory, f32)
        if memory_i is None:
            return None
        out.append(memory_i)
    return out


def _plain_memory(row: tuple[Any, ...], buf: Any, offset: int, end: int, memory: type,
                  f32: Callable[[float], float]) -> Any:
    """The ``memory`` of ``row`` from its record at ``offset`` of ``buf`` (valid up to
    ``end``), or None when this is not the plain case (see read_memory)."""
    (rid, ts, _, _, meta, _, length, importance, _, _, _, _, _, flags, _) = row
    if flags & FLAG_FORGOTTEN or meta != 0:
        return None
    info = check_record(buf, offset, end)
    if info is None or info[0] != KIND_MEMORY or RECORD_HEADER_SIZE + 2 * info[1] + info[2] != length:
        return None
    _, dim, plen, rlen = info
    start = offset + RECORD_HEADER_SIZE + 2 * dim
    raw = bytes(memoryview(buf)[start : start + plen])
    if plen != rlen:
        try:
            raw = lz4.block.decompress(raw, uncompressed_size=rlen)
        except Exception:  # as decode_payload: lz4 raises several types
            return None
        if len(raw) != rlen:
            return None
    p = unpack(raw)
    if type(p) is not dict or type(p.get("i")) is not int or p["i"] != rid or type(p.get("x")) is not str:
        return None
    return tuple.__new__(memory, (f"m{rid}", p["x"], p.get("y", "conversation"), ts, p.get("s"),
                                  f32(importance), bool(flags & FLAG_PINNED), p.get("m"), p.get("u")))


# --- the fixed headers a restart reads (twins of src_cython/heads.pyx) -------------------
# Each returns what fastmem._format's parser returns, or None where that one raises: the
# caller then calls the parser for the precise error. ``cls`` is the named tuple to make.


def dat_header(buf: Any, cls: type) -> Any:
    try:
        return cls(*unpack_dat_header(buf, ""))
    except (CorruptionError, FormatVersionError):
        return None


def idx_header(buf: Any, cls: type) -> Any:
    try:
        return cls(*unpack_idx_header(buf, ""))
    except (CorruptionError, FormatVersionError):
        return None


def current_slot(buf: Any, at: int, cls: type) -> tuple[int, Any] | None:
    if at < 0:
        return None
    write_next, slot = _current_slot(buf, at)
    return write_next, None if slot is None else cls(*slot)


def hot_section(buf: Any, at: int, length: int, cls: type) -> Any:
    if at < 0 or length < 4 or at + length > len(buf):
        return None
    try:
        hot = unpack_hot(memoryview(buf)[at : at + length], "")
    except CorruptionError:
        return None
    return None if hot is None else cls(*hot)


def delta_header(buf: Any, at: int, cls: type) -> Any:
    if at < 0:
        return None
    try:
        return cls(*unpack_delta_header(buf, at, ""))
    except CorruptionError:
        return None


def idx_open(buf: Any, size: int, uuid: bytes, dat_dim: int, dat: Any, dat_end: int, types: tuple[type, ...]) -> Any:
    # The reference itself makes fastmem._format's named tuples, which ``types`` names.
    try:
        return open_index(buf, size, "", uuid, dat_dim, dat, dat_end)
    except (CorruptionError, FormatVersionError):
        return None


_packer = msgpack.Packer(use_bin_type=True, autoreset=True)


def pack_memories(
    payloads: list[dict[str, Any]], first_id: int, text_tokens: np.ndarray, summary_tokens: np.ndarray
) -> tuple[list[bytes], np.ndarray]:
    """The records' payloads of a batch of memories: each payload dict packed as
    ``msgpack.packb(p, use_bin_type=True)`` packs it (the smallest encoding of every int,
    str8 for short strings, float64 for floats), with ``"i"`` (its first key) set to ``first_id + j`` and
    ``"k"`` (last, unless already there) to ``[text_tokens[j], summary_tokens[j]]``, and
    their lengths (uint32). The dicts are not changed."""
    if len(text_tokens) != len(payloads) or len(summary_tokens) != len(payloads):
        raise ValueError("payloads and token counts differ in length")
    out = [
        _packer.pack({**p, "i": first_id + j, "k": [int(a), int(b)]})
        for j, (p, a, b) in enumerate(zip(payloads, text_tokens, summary_tokens))
    ]
    return out, np.array([len(raw) for raw in out], dtype=np.uint32)


def importance(
    base: np.ndarray,
    flags: np.ndarray,
    access_count: np.ndarray,
    last_access: np.ndarray,
    timestamps: np.ndarray,
    out: np.ndarray,
    now: float,
    access_half_life: float,
    access_weight: float,
    recency_half_life: float,
    recency_weight: float,
    pin_bonus: float,
    pinned_flag: int,
    exclude_flags: int,
) -> None:
    """Each row's importance, written into ``out`` (float32), computed in float64:

    ``base + access_weight * d / (1 + d) + recency_weight * 2**(-age / recency_half_life)
    + pin_bonus [if pinned]``, where ``d = access_count * 2**(-(now - last_access) /
    access_half_life)`` is the access count decayed by the time since the last access, and
    ``age = now - timestamp``; ages below zero count as zero. Rows with any of
    ``exclude_flags`` get ``-inf``.
    """
    n = base.shape[0]
    if min(len(flags), len(access_count), len(last_access), len(timestamps), len(out)) < n:
        raise ValueError("a column is shorter than base")
    if not (access_half_life > 0 and recency_half_life > 0):
        raise ValueError("half-lives must be > 0")
    flags = flags[:n]
    count = access_count[:n].astype(np.float64)
    decayed = count * np.exp2(-np.maximum(now - last_access[:n], 0.0) * (1.0 / access_half_life))
    with np.errstate(invalid="ignore"):  # a damaged row's importance may be a signalling NaN
        score = base[:n].astype(np.float64)
    score = score + np.where(count > 0, access_weight * decayed / (1.0 + decayed), 0.0)
    age = np.maximum(now - timestamps[:n], 0.0)
    score = score + recency_weight * np.exp2(-age * (1.0 / recency_half_life))
    score = score + np.where(flags & pinned_flag, pin_bonus, 0.0)
    out[:n] = np.where(flags & exclude_flags, -np.inf, score).astype(np.float32)


# --- add_many's items --------------------------------------------------------------------


def prepare_batch(items: list[Any], now: float, fallback: Any) -> tuple[Any, ...]:
    """Check the items of an ``add_many`` batch and build their payloads and row columns.

    ``fallback(i, item, now)`` (``fastmem.storage.records.prepare``) checks one item, raising the
    error that names it, and returns its ``Prepared``; this reference calls it for every
    item (the compiled twin only for item shapes it does not take itself, which include
    every item with metadata or a summary: ``fastmem.storage.records.Batch`` counts on it). Returns
    ``(payloads, texts, embeddings, type_names, type_index, sessions, session_index,
    importance, flags, timestamps)``: per item its payload dict, text and embedding (or
    None); the distinct type names in order of first use and each item's index into them
    (uint32); the distinct sessions likewise, each item's index counting from 1 (0: no
    session); the importance (float64), flags (uint16) and timestamp (float64) columns.
    """
    n = len(items)
    payloads, texts, embeddings = [], [], []
    type_ids: dict[str, int] = {}
    session_ids: dict[str, int] = {}
    type_index = np.empty(n, dtype=np.uint32)
    session_index = np.empty(n, dtype=np.uint32)
    importance = np.empty(n, dtype=np.float64)
    flags = np.empty(n, dtype=np.uint16)
    timestamps = np.empty(n, dtype=np.float64)
    for i, item in enumerate(items):
        prepared = fallback(i, item, now)
        payloads.append(prepared.payload)
        texts.append(prepared.payload["x"])
        embeddings.append(prepared.embedding)
        type_index[i] = type_ids.setdefault(prepared.type_name, len(type_ids))
        session = prepared.session
        session_index[i] = 0 if session is None else session_ids.setdefault(session, len(session_ids) + 1)
        importance[i] = prepared.importance
        flags[i] = prepared.flags
        timestamps[i] = prepared.payload["t"]
    return (payloads, texts, embeddings, list(type_ids), type_index, list(session_ids),
            session_index, importance, flags, timestamps)  # fmt: skip


def memory_ids(first: int, n: int) -> list[str]:
    """The ids of ``n`` memories numbered from ``first``: ``["m<first>", ...]``."""
    return [f"m{number}" for number in range(first, first + n)]


def gather_vectors(vectors: list[Any], dim: int) -> np.ndarray | None:
    """The vectors stacked into one C-ordered float32 (n, length) array, when every one is a
    1-D, C-contiguous, native-order float32 ``numpy.ndarray`` (no subclass) of length
    ``dim`` (with ``dim`` 0: of the first one's length, at most ``MAX_DIM``); else None, and
    the caller converts them the general way (which names what is wrong). The compiled twin
    returns consecutive rows of one buffer as a read-only view of it instead of a copy."""
    if not vectors:
        return None
    length = dim
    for v in vectors:
        if (type(v) is not np.ndarray or v.ndim != 1 or v.dtype != np.float32
                or not v.dtype.isnative or not v.flags.c_contiguous):  # fmt: skip
            return None
        length = length or len(v)
        if len(v) != length or not 0 < length <= MAX_DIM:
            return None
    return np.stack(vectors)


# --- replay: other processes' memory records into index rows ---------------------------

_PLAIN_FIELDS = frozenset("itxkysupnm")  # a plain memory payload's keys


def memory_rows(buf: Any, offsets: np.ndarray, lengths: np.ndarray, kinds: np.ndarray,
                dims: np.ndarray, first: int, stop: int, next_id: int, dim: int,
                type_codes: dict[str, int], defaults: dict[str, float], user_default: float,
                sessions: dict[Any, int], session_hash: Callable[[str], int], rows: Any,
                vectors: Any, quantized: np.ndarray | None = None) -> tuple[int, list[str], int]:
    """Index rows of the scanned records ``first:stop`` of ``buf`` (a replay of what other
    processes appended), up to the first record that is not the plain case.

    The records were checked by the scan (lengths, checksum). A record is the plain case
    when it is a memory record whose payload is plain msgpack (:func:`unpack`, after lz4 if
    compressed): a map of the keys ``i t x`` and any of ``k y s u p n m`` only, each valid
    (``fastmem.storage.replay.check_memory_fields``' rules, without their widenings: a float
    time, an existing type code in ``type_codes``), its id from ``next_id`` up and above
    the one before, its vector (if any) of ``dim`` finite halves. For each, in order, row
    ``i`` of ``rows`` (``INDEX_DTYPE``, writable) is set as ``fastmem.storage.replay.Replayer``
    sets it (scale 0: quantizing sets it) and row ``i`` of ``vectors`` (uint16, ``(n, dim)``)
    to its vector's halves or zeros; ``sessions`` caches ``session_hash`` of each session.
    With ``quantized`` (int8, ``(n, dim)``, writable), row ``i`` of it and the scale of row
    ``i`` of ``rows`` are set to :func:`quantize_half` of the vector, or zeros and scale 0
    for a record without one (``fastmem.storage.index.quantize_rows``' rule).

    Returns:
        How many records were the plain case (rows set), their texts, and how many of them
        have a vector. The caller takes the next record the general way (which names what
        is wrong with it, if anything).

    Raises:
        ValueError: ``first:stop`` is not a range of the records, or ``rows`` or ``vectors``
            is shorter than ``stop - first`` rows, or ``quantized`` is not ``(stop - first,
            dim)`` or longer.
    """
    n = len(offsets)
    if not (0 <= first <= stop <= n) or not len(lengths) == len(kinds) == len(dims) == n:
        raise ValueError("first:stop is not a range of the scanned records")
    if quantized is not None and (quantized.shape[0] < stop - first or quantized.shape[1] != dim):
        raise ValueError("quantized is not stop - first rows of dim int8")
    if type(next_id) is not int or next_id < 0:
        raise ValueError("next_id is not an id")
    out: np.ndarray = np.asarray(rows).reshape(-1).view(np.uint8)  # views of the caller's arrays
    out = out[: len(out) // INDEX_DTYPE.itemsize * INDEX_DTYPE.itemsize].view(INDEX_DTYPE)
    halves: np.ndarray = np.asarray(vectors).reshape(-1).view(np.uint8)  # 2-D (rows) below
    halves = halves[: len(halves) // 2 * 2].view(np.uint16)
    if len(out) < stop - first or len(halves) < (stop - first) * dim:
        raise ValueError("rows or vectors hold fewer than stop - first rows")
    halves = halves[: (stop - first) * dim].reshape(stop - first, dim)
    from .. import _format as fmt  # (at the call: the module list stays as the kernels')

    data = memoryview(buf).cast("B")
    end, low, texts, found, vector_at = len(data), next_id, [], [], []
    for j in range(first, stop):
        off, length, d = int(offsets[j]), int(lengths[j]), int(dims[j])
        if int(kinds[j]) != KIND_MEMORY or off < 0 or length < RECORD_HEADER_SIZE + 2 * d or off > end - length:
            break
        _, _, kind, hdim, plen, rlen, _ = RECORD_HEADER.unpack_from(data, off)
        if kind != KIND_MEMORY or hdim != d or (d and d != dim):
            break
        start = off + RECORD_HEADER_SIZE + 2 * d
        if start + plen != off + length or plen == 0:
            break
        raw = bytes(data[start : off + length])
        if plen != rlen:
            try:
                raw = lz4.block.decompress(raw, uncompressed_size=rlen)
            except Exception:  # as decode_payload: lz4 raises several types
                break
            if len(raw) != rlen or rlen == 0:
                break
        p = unpack(raw)
        if type(p) is not dict or not p.keys() <= _PLAIN_FIELDS or not p.keys() >= {"i", "t", "x"}:
            break
        mid, ts, text, tokens = p["i"], p["t"], p["x"], p.get("k")
        if type(mid) is not int or not low <= mid <= fmt.MAX_ID:
            break
        if type(ts) is not float or not 0.0 <= ts <= fmt.MAX_TIMESTAMP or type(text) is not str:
            break
        if tokens is None:
            tokens = [fmt.UNKNOWN_TOKENS, fmt.UNKNOWN_TOKENS]
        elif type(tokens) is not list or len(tokens) != 2 or not all(
            type(t) is int and 0 <= t <= fmt.UNKNOWN_TOKENS for t in tokens
        ):
            break
        type_name = p.get("y", "conversation")
        if type(type_name) is not str or not 0 < len(type_name) <= fmt.MAX_TYPE_CHARS:
            break
        code = type_codes.get(type_name)
        if type(code) is not int or not 0 <= code <= 0xFFFF:
            break
        session = p.get("s")
        if session is not None and (type(session) is not str or not 0 < len(session) <= fmt.MAX_SESSION_CHARS):
            break
        summary, metadata, pinned = p.get("u"), p.get("m"), p.get("n", False)
        if summary is not None and type(summary) is not str:
            break
        if (metadata is not None and type(metadata) is not dict) or type(pinned) is not bool:
            break
        importance = p.get("p", defaults.get(type_name, user_default))
        if type(importance) not in (float, int) or not 0.0 <= importance <= 1.0:
            break
        if session is None:
            hashed = 0
        else:
            known = sessions.get(session)
            if known is None:
                known = sessions[session] = session_hash(session)
            hashed = known
        flags = (FLAG_PINNED if pinned else 0) | (4 if d else 0)  # 4: fmt.FLAG_HAS_VECTOR
        found.append((mid, ts, hashed, off, 0, 0.0, length, float(importance), 0.0, 0,
                      tokens[0], tokens[1], code, flags, 0))  # fmt: skip
        vector_at.append(off + RECORD_HEADER_SIZE if d else -1)
        texts.append(text)
        low = mid + 1
    count = len(found)
    if dim and count:  # the vectors, and the first record whose vector is not finite
        zero = bytes(2 * dim)
        got = np.frombuffer(b"".join(zero if at < 0 else data[at : at + 2 * dim] for at in vector_at),
                            dtype="<u2").reshape(count, dim)  # fmt: skip
        bad = np.flatnonzero(((got & 0x7C00) == 0x7C00).any(axis=1))
        count = int(bad[0]) if len(bad) else count
        halves[:count] = got[:count]
    out[:count] = np.array(found[:count], dtype=INDEX_DTYPE)
    if quantized is not None:
        has = np.array([at >= 0 for at in vector_at[:count]], dtype=bool)
        quantized[:count] = 0
        if dim and has.any():
            q, scales = quantize_half(halves[:count][has])
            quantized[np.flatnonzero(has)] = q
            out["scale"][np.flatnonzero(has)] = scales
    return count, texts[:count], sum(at >= 0 for at in vector_at[:count]) if dim else 0
