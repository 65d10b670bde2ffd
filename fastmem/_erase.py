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
without text, vector or metadata (``fastmem._replay``): the same row the erasing process
gives the memory (``MemoryIndex.erase``), so ``verify()`` compares them equal.
"""

from __future__ import annotations

import fcntl
import os
import struct
import zlib
from typing import Any

import msgpack

from . import _format as fmt
from ._replay import F_ID, F_LENGTH, F_META, F_OFFSET
from .errors import CorruptionError, FormatVersionError

__all__ = ["erased_record", "forget_payload", "is_erased", "pending_of", "records_of", "redo"]

_FLOAT = struct.Struct(">d")
# (msgpack bin code, length field, header bytes, most bytes): any of them may carry a given
# padding (msgpack readers take a wider header than needed), so every size can be met.
_BIN = ((0xC4, struct.Struct(">B"), 2, 0xFF), (0xC5, struct.Struct(">H"), 3, 0xFFFF),
        (0xC6, struct.Struct(">I"), 5, 0xFFFFFFFF))  # fmt: skip


def _payload(mid: int, ts: float | None, type_name: str | None, size: int) -> bytes | None:
    """``{"i": mid, "t": ts, "y": type_name, "e": zeros}`` (``t``, ``y`` left out when
    None) packed into exactly ``size`` bytes, or None when it does not fit."""
    keys = 2 + (ts is not None) + (type_name is not None)
    body = bytes([0x80 | keys]) + b"\xa1i" + msgpack.packb(mid)
    if ts is not None:
        body += b"\xa1t\xcb" + _FLOAT.pack(ts)
    if type_name is not None:
        body += b"\xa1y" + msgpack.packb(type_name)
    body += b"\xa1e"
    room = size - len(body)
    for code, length, width, most in _BIN:
        pad = room - width
        if 0 <= pad <= most:
            return body + bytes([code]) + length.pack(pad) + bytes(pad)
    return None


def erased_record(
    kind: int, dim: int, mid: int, length: int, ts: float | None, type_name: str | None
) -> bytes:
    """The erased record that replaces a record of ``kind`` with a ``dim``-float16 vector and
    ``length`` bytes, for memory ``mid``. A memory's keeps its timestamp and type name
    (``ts``, ``type_name``; None for ``conversation``): the index's time order and type
    table stay as they were."""
    size = length - fmt.RECORD_HEADER_SIZE - 2 * dim
    payload = None
    if kind == fmt.KIND_MEMORY:
        payload = _payload(mid, ts, type_name, size) or _payload(mid, None, type_name, size)
    payload = payload or _payload(mid, None, None, size)
    if payload is None:  # a stored payload is never this short (add writes more)
        raise ValueError(f"a record of {length} bytes cannot hold an erased record")
    head = fmt.RECORD_HEADER.pack(fmt.RECORD_MAGIC, fmt.FORMAT_VERSION, kind, dim, size, size, 0)
    body = bytes(2 * dim) + payload
    crc = zlib.crc32(body, zlib.crc32(head[: fmt.RECORD_CRC_AT]))
    return head[: fmt.RECORD_CRC_AT] + crc.to_bytes(4, "little") + body


def is_erased(buf: Any, offset: int, length: int, mid: int | None) -> bool:
    """Whether the record at ``offset`` of ``buf`` is whole, ``length`` bytes and an erased
    record of memory ``mid`` (of any memory: None)."""
    try:
        header, payload = fmt.read_record(buf, offset, offset + length)
    except (CorruptionError, FormatVersionError):
        return False
    return header.length == length and "e" in payload and mid in (None, payload.get("i"))


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
        offsets, lengths, kinds, _, _, _ = _scan(dat, start, end)
        for off, length, kind in zip(offsets.tolist(), lengths.tolist(), kinds.tolist()):
            if kind == fmt.KIND_UPDATE:
                payload = fmt.read_record(dat, off, off + length)[1]
                if payload.get("i") == row[F_ID] and "m" in payload:
                    spans += [off, length]
    return spans


def _scan(dat: Any, start: int, end: int) -> tuple[Any, ...]:
    from . import _kernels

    return _kernels.scan_records(dat, start, end)


# id, time, type name, the records ``[offset, length, ...]``, the forget record's offset
Pending = tuple[int, "float | None", "str | None", list[int], int]


def forget_payload(
    mid: int, ts: float, type_name: str | None, spans: list[int], now: float
) -> dict[str, Any]:
    """The payload of the forget record that erases ``spans`` (see the module)."""
    payload: dict[str, Any] = {"i": mid, "t": now, "e": spans, "w": float(ts)}
    if type_name is not None:
        payload["y"] = type_name
    return payload


def pending_of(p: dict[str, Any], before: int) -> Pending:
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
            if len(current) == length and is_erased(bytes(at) + current, at, length, mid):
                continue
            dim = _dim_of(current)
            kind = fmt.KIND_MEMORY if i == 0 else fmt.KIND_UPDATE
            if dim is None or fmt.RECORD_HEADER_SIZE + 2 * dim >= length:
                dim = 0
            if not write_at(fd, erased_record(kind, dim, mid, length, ts, type_name), off):
                return wrote
            wrote = True
    return wrote


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
