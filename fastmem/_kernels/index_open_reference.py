"""The checks an index file passes when a store opens it, before any of its rows is read.

Its header; its size against the layout the header gives; the store it belongs to and the
dimension; the newest commit slot, the header and layout of the delta it names; that the
file covers no more than the data file holds (the record it says it ends with is there);
where its type table is; its hot section's table; and the base's last id against the id
counter. ``open_index`` is the readable reference and raises each check's own error.
``heads.idx_open`` is its compiled twin (``_kernels.idx_open``): it returns the same
``Opened`` for a valid file in one call, or None where this raises, and the caller then
runs this for the error. Run cold in a fresh process, these checks in Python cost
~0.04 ms of a restart (issue 21).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .. import _format as fmt
from ..errors import CorruptIndexError, CorruptionError, CorruptRecordError, FormatVersionError


class Opened(NamedTuple):
    """What the open of an index file found (``open_index``)."""

    header: fmt.IdxHeader
    layout: fmt.IdxLayout  # of the full checkpoint
    with_slots: bool  # a version-2 file long enough for its commit slots
    slot: fmt.Slot | None  # the newest valid slot; None without one
    delta: fmt.DeltaHeader | None  # the delta the slot names
    delta_layout: fmt.DeltaLayout | None
    types: Any  # the type table's bytes (the delta's when there is one)
    hot: fmt.HotSection | None  # None when the section is empty
    base_last_id: int  # the last base row's id; -1 without base rows


def open_index(
    buf: Any, size: int, path: str, uuid: bytes, dat_dim: int, dat: Any, dat_end: int
) -> Opened:
    """Check the index file mapped as ``buf`` (``size`` bytes) against its data file
    (``dat``, whose records end at ``dat_end``; ``dat_dim`` its dimension, 0 when unset).

    Raises:
        CorruptIndexError: damaged, from another store, or stale (covers data the data
            file does not have).
        FormatVersionError: an index format this fastmem does not read.
    """
    h = fmt.unpack_idx_header(buf, path)
    layout = fmt.header_layout(h)
    # Version 2 files end with the commit slots and deltas (see docs/format.md); a file
    # written without them (or by version 1) ends where its sections do.
    with_slots = h.version >= 2 and size >= fmt.deltas_at(layout)
    if layout.size != size and not with_slots:
        raise CorruptIndexError(f"{path} has {size} bytes, its header says {layout.size}")
    if h.uuid != uuid:
        raise CorruptIndexError(f"{path} belongs to another data file", path=path)
    if dat_dim and h.dim not in (0, dat_dim):
        raise CorruptIndexError(f"{path} disagrees with its data file on the dimension")
    slot = fmt.current_slot(buf, fmt.slots_at(layout))[1] if with_slots else None
    delta = dl = None
    if slot is not None:
        if not fmt.deltas_at(layout) <= slot.offset <= size - slot.length:
            raise CorruptIndexError(f"{path}: the commit slot points outside the file", path=path)
        delta = fmt.unpack_delta_header(buf, slot.offset, path)
        dl = fmt.delta_layout(delta, h.dim)
        if (
            dl.size != slot.length
            or delta.live > h.rows + delta.rows
            or delta.live_tokens > delta.live * (fmt.DOC_DEAD - 1)
        ):
            raise CorruptIndexError(f"{path}: the delta's header is damaged", path=path)
    state = h if delta is None else delta
    check_covers(path, dat, dat_end, state.covered, state.last_offset, state.last_crc)
    types_at, types_len, hot_at, hot_len = layout.types, h.types_len, layout.hot, h.hot_len
    if slot is not None and delta is not None and dl is not None:
        types_at, types_len = slot.offset + dl.types, delta.types_len
        hot_at, hot_len = slot.offset + dl.hot, delta.hot_len
    types = buf[types_at : types_at + types_len]
    fmt.unpack_types(types, path)  # here for its error (the open's order of checks)
    hot = fmt.unpack_hot(memoryview(buf)[hot_at : hot_at + hot_len], path)
    base_last_id = -1
    if h.rows:
        base_last_id = fmt.INDEX_ROW.unpack_from(
            buf, layout.rows + (h.rows - 1) * fmt.INDEX_DTYPE.itemsize
        )[0]
        if base_last_id >= state.next_id:
            raise CorruptIndexError(f"{path}: the id counter is behind the rows", path=path)
    return Opened(h, layout, with_slots, slot, delta, dl, types, hot, base_last_id)


def check_covers(
    path: str, dat: Any, dat_end: int, covered: int, last_offset: int, last_crc: int
) -> None:
    """Refuse an index (or delta) that covers data the data file does not hold (stale)."""
    if not fmt.DAT_HEADER_SIZE <= covered <= dat_end:
        raise CorruptIndexError(f"{path} covers more than its data file holds (stale)")
    if covered > fmt.DAT_HEADER_SIZE:
        try:
            last = fmt.parse_record_header(dat, last_offset, dat_end, path)
        except CorruptRecordError:
            last = None
        if (
            last is None
            or last_offset + last.length != covered
            or (
                last.crc != last_crc
                and not _erased(path, dat, last_offset, last.length, covered, dat_end)
            )
        ):
            raise CorruptIndexError(f"{path} does not match its data file (stale)")


def _erased(path: str, dat: Any, offset: int, length: int, covered: int, dat_end: int) -> bool:
    """Whether the record at ``offset`` was erased in place since the index was written (its
    CRC changed with it): the forget record after it, which the index does not cover, is
    replayed onto the index's row (fastmem.storage.erase). Also while the erase is under way (in
    another process, or killed there): the record is half overwritten and fails its CRC, but
    the forget record naming it was written first, after ``covered``."""
    try:
        header, payload = fmt.read_record(dat, offset, offset + length)
    except (CorruptionError, FormatVersionError):
        return _erase_named(path, dat, offset, length, covered, dat_end)
    return header.length == length and "e" in payload


def _erase_named(path: str, dat: Any, offset: int, length: int, covered: int, dat_end: int) -> bool:
    """Whether a forget record in bytes ``covered:dat_end`` of the data file erases the
    record ``offset``, ``length`` (its payload's ``e``: offsets and lengths). Read only when
    the last record an index covers fails its CRC: the records since its checkpoint, a few
    as a rule, walked header by header. Read with ``pread`` from the data file beside the
    index at ``path`` (when its header is ``dat``'s): past its last whole record a writer may
    cut the file, and reading a mapped page wholly past its end raises SIGBUS. Damage met on
    the way ends the walk: the index is then taken for stale and rebuilt from the data file,
    which is slower, never wrong."""
    import os

    if not path.endswith(".idx"):
        return False
    head_size = fmt.DAT_HEADER_SIZE  # a record's bytes are checked as if at the file's start
    try:  # (read only, as every read of fastmem's: outside the fault seam of writes)
        with open(path[: -len(".idx")] + ".dat", "rb", buffering=0) as f:
            fd = f.fileno()
            if os.pread(fd, head_size, 0) != bytes(dat[:head_size]):
                return False  # not the data file mapped (replaced meanwhile)
            at = covered
            while at + fmt.RECORD_HEADER_SIZE <= dat_end:
                start = os.pread(fd, fmt.BATCH_FRAME_SIZE, at)
                if fmt.batch_count(start, 0, len(start)):
                    at += fmt.BATCH_FRAME_SIZE
                    continue
                padded = bytes(head_size) + start[: fmt.RECORD_HEADER_SIZE]
                try:
                    header = fmt.parse_record_header(padded, head_size, head_size + dat_end - at)
                except CorruptRecordError:
                    return False
                if header.kind == fmt.KIND_FORGET and _names(fd, at, header.length, offset, length):
                    return True
                at += header.length
    except OSError:
        pass
    return False


def _names(fd: int, at: int, size: int, offset: int, length: int) -> bool:
    """Whether the forget record at ``at`` (``size`` bytes) erases ``offset``, ``length``."""
    import os

    buf = bytes(fmt.DAT_HEADER_SIZE) + os.pread(fd, size, at)
    try:
        _, payload = fmt.read_record(buf, fmt.DAT_HEADER_SIZE, len(buf))
    except (CorruptionError, FormatVersionError):
        return False
    spans = payload.get("e") if isinstance(payload, dict) else None
    return type(spans) is list and any(
        spans[i : i + 2] == [offset, length] for i in range(0, len(spans) - 1, 2)
    )


# The named tuples the compiled twin makes, in its order (heads.idx_open's ``types``).
TYPES = (Opened, fmt.IdxHeader, fmt.IdxLayout, fmt.KeywordLayout, fmt.Slot, fmt.DeltaHeader,
         fmt.DeltaLayout, fmt.HotSection)  # fmt: skip
