"""The index: one fixed-size row per memory, its int8 vector, and the time order.

A ``MemoryIndex`` is two segments. The *base* is the last checkpoint, memory-mapped
copy-on-write from the ``.idx`` file (opening it reads the header and the hot section's
table, nothing in proportion to the store); the *tail* holds the rows added since, in
growable arrays. Rows are numbered globally
(base first) and are in id order, which is also the order of their records in ``.dat``.
Cheap changes (importance, pins, forgets) are made in place in either segment; they are
already records in ``.dat``, so a crash before the next checkpoint loses nothing.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import time
import atexit  # noqa: F401 - now: weakref.finalize imports it at its first use, which
import weakref  # would wait for the import lock a background loader holds (_threads.py)
from collections.abc import Iterator
from typing import Any

import numpy as np

from . import _format as fmt
from . import _kernels
from ._keyword import KeywordIndex
from ._vectors import quantize
from .errors import CorruptIndexError, CorruptRecordError
from .types import Problem

# Positions of INDEX_DTYPE's fields in a row tuple (``MemoryIndex.row``).
(F_ID, F_TS, F_SESSION, F_OFFSET, F_META, F_LAST_ACCESS, F_LENGTH, F_IMPORTANCE, F_SCALE,
 F_ACCESS, F_TEXT_TOKENS, F_SUMMARY_TOKENS, F_TYPE, F_FLAGS, F_RESERVED) = range(15)  # fmt: skip
assert fmt.INDEX_DTYPE.names is not None and fmt.INDEX_DTYPE.names[F_FLAGS] == "flags"


def session_hash(session: str | None) -> int:
    """64-bit hash of a session name (0 = no session); collisions are checked on read."""
    if session is None:
        return 0
    h = int.from_bytes(hashlib.blake2b(session.encode(), digest_size=8).digest(), "little")
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


def _write(f: Any, arr: np.ndarray) -> None:
    if arr.size:
        f.write(np.ascontiguousarray(arr).data.cast("B"))


_NO_ROWS = np.zeros(0, dtype=fmt.INDEX_DTYPE)
_BUILTIN_CODES = {name: code for code, name in enumerate(fmt.BUILTIN_TYPES)}


class _Tail:
    """Rows added since the last checkpoint, in arrays that double when full."""

    def __init__(self, dim: int) -> None:
        self.n = 0
        self.rows = _NO_ROWS  # allocated by the first append: an open needs none
        self.vectors = np.zeros((0, dim), dtype=np.int8)

    def append(self, rows: np.ndarray, vectors: np.ndarray) -> None:
        end = self.n + len(rows)
        if end > len(self.rows):
            cap = max(end, 2 * len(self.rows), 64)
            grown = np.zeros(cap, dtype=fmt.INDEX_DTYPE)
            grown[: self.n] = self.rows[: self.n]
            self.rows = grown
            gv = np.zeros((cap, self.vectors.shape[1]), dtype=np.int8)
            gv[: self.n] = self.vectors[: self.n]
            self.vectors = gv
        self.rows[self.n : end] = rows
        self.vectors[self.n : end] = vectors
        self.n = end

    def set_dim(self, dim: int) -> None:
        """Called once, when the first vector fixes the dimension (no row has one yet)."""
        self.vectors = np.zeros((len(self.rows), dim), dtype=np.int8)


class MemoryIndex:
    """Rows, vectors and time order of a store's memories; see the module docstring."""

    def __init__(self, dim: int, uuid: bytes) -> None:
        self.dim = dim
        self.uuid = uuid
        # The base: the checkpoint's sections, as numpy views of the map made on first use
        # (a restart that answers from the hot section never needs them).
        self.n_base = 0
        self._base: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        # The pinned live rows, most important first, once a context has asked: reset by
        # every change of a row or of the row count (a context scans no flags while unset).
        self.pinned: list[int] | None = None
        self._base_spec: tuple[mmap.mmap, fmt.IdxLayout, int] | None = None
        self._base_spec_path = ""
        self._base_bytes = memoryview(b"")
        self._base_last_id = -1
        # A contiguous copy of the base rows' scales, which never change: the vector scan
        # reads one per row, and from the 80-byte rows they would cost a fifth more memory
        # traffic than the vectors. Made by the first scan (fastmem._vsearch).
        self.base_scales: np.ndarray | None = None
        self.hot: fmt.HotSection | None = None  # valid while nothing is applied after it
        self.tail = _Tail(dim)
        self.keyword = KeywordIndex()
        self._tail_order: np.ndarray | None = None
        self.user_types: list[str] = []
        self.type_codes = dict(_BUILTIN_CODES)
        self.live = 0
        self.next_id = 0
        self.covered = fmt.DAT_HEADER_SIZE  # .dat offset up to which the base is complete
        self.applied = fmt.DAT_HEADER_SIZE  # .dat offset up to which records are applied
        self.last_offset = 0  # the last applied record: where it starts, and its crc
        self.last_crc = 0
        self.stats_changed = False  # access statistics changed since the checkpoint
        # From the data file's header (compaction): records before ``compacted_end`` are
        # memory records in (session, time, id) order; ids start again from ``id_floor``.
        self.compacted_end = 0
        self.id_floor = 0
        self.damaged: list[tuple[int, int]] = []  # (start, end) of the damaged regions replayed
        self.file_closer: weakref.finalize | None = None  # closes the mapped file's descriptor

    def set_compaction(self, header: fmt.DatHeader) -> None:
        """Take the data file header's compaction fields (see ``replay``)."""
        self.compacted_end, self.id_floor = header.compacted_end, header.next_id

    # --- loading and saving ------------------------------------------------------------

    @classmethod
    def load(cls, path: str, uuid: bytes, dat_dim: int, dat: Any, dat_end: int) -> MemoryIndex:
        """Map a checkpoint copy-on-write and check it against the data file.

        Raises:
            CorruptIndexError: damaged, from another store, or stale (covers data the
                data file does not have).
            FileNotFoundError: no index file.
        """
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if size < fmt.IDX_HEADER_SIZE:
                raise CorruptIndexError(f"{path} is shorter than its header", path=path)
            mm = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
        except BaseException:
            os.close(fd)
            raise
        # The descriptor stays open as long as the map: a compaction that replaces the file
        # closes it last, where freeing the file's cached pages need not hold the GIL.
        closer = weakref.finalize(mm, os.close, fd)
        h = fmt.unpack_idx_header(mm, path)
        layout = fmt.header_layout(h)
        if layout.size != size:
            raise CorruptIndexError(f"{path} has {size} bytes, its header says {layout.size}")
        if h.uuid != uuid:
            raise CorruptIndexError(f"{path} belongs to another data file", path=path)
        if dat_dim and h.dim not in (0, dat_dim):
            raise CorruptIndexError(f"{path} disagrees with its data file on the dimension")
        if not fmt.DAT_HEADER_SIZE <= h.covered <= dat_end:
            raise CorruptIndexError(f"{path} covers more than its data file holds (stale)")
        if h.covered > fmt.DAT_HEADER_SIZE:
            try:
                last = fmt.parse_record_header(dat, h.last_offset, dat_end, path)
            except CorruptRecordError:
                last = None
            if last is None or h.last_offset + last.length != h.covered or last.crc != h.last_crc:
                raise CorruptIndexError(f"{path} does not match its data file (stale)")
        index = cls(h.dim, uuid)
        index.file_closer = closer
        index.n_base = h.rows
        index._base_spec = (mm, layout, h.dim)
        index._base_spec_path = path
        for name in fmt.unpack_types(mm[layout.types : layout.types + h.types_len], path):
            index._add_type(name)
        index.hot = fmt.unpack_hot(memoryview(mm)[layout.hot : layout.hot + h.hot_len], path)
        index._base_bytes = memoryview(mm)[layout.rows : layout.rows + h.rows * fmt.INDEX_DTYPE.itemsize]
        if h.rows:
            index._base_last_id = fmt.INDEX_ROW.unpack_from(index._base_bytes, (h.rows - 1) * fmt.INDEX_DTYPE.itemsize)[F_ID]
            if index._base_last_id >= h.next_id:
                raise CorruptIndexError(f"{path}: the id counter is behind the rows", path=path)
        if h.keyword_version:
            index.keyword = KeywordIndex.from_section(
                fmt.keyword_views(mm, h, layout), h.keyword_live_tokens
            )
        elif h.rows:  # written before indexes had postings: tokenize the base meanwhile
            index.keyword = KeywordIndex.build_in_background(
                np.frombuffer(mm, fmt.INDEX_DTYPE, h.rows, layout.rows), dat, path
            )
        index.live, index.next_id = h.live, h.next_id
        index.covered = index.applied = h.covered
        index.last_offset, index.last_crc = h.last_offset, h.last_crc
        return index

    def _views(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        if self._base is None:
            n = self.n_base
            if self._base_spec is None:
                rows = np.zeros(0, dtype=fmt.INDEX_DTYPE)
                order, vectors = np.zeros(0, dtype="<u4"), np.zeros((0, self.dim), dtype=np.int8)
            else:  # the base's own dimension: 0 when it was written before the first vector
                mm, layout, dim = self._base_spec
                rows = np.frombuffer(mm, fmt.INDEX_DTYPE, n, layout.rows)
                order = np.frombuffer(mm, "<u4", n, layout.order)
                vectors = np.frombuffer(mm, np.int8, n * dim, layout.vectors).reshape(n, dim)
                _check_base(rows, order, self._base_spec_path)
            self._base = (rows, order, vectors, rows["id"])
        return self._base

    @property
    def base_rows(self) -> np.ndarray:
        return self._views()[0]

    @property
    def base_order(self) -> np.ndarray:
        return self._views()[1]

    @property
    def base_vectors(self) -> np.ndarray:
        return self._views()[2]

    def hot_rows(self) -> tuple[fmt.HotSection, int] | None:
        """The hot section and how many memories it holds, if it is still current."""
        if self.hot is None or self.applied != self.covered or self.tail.n:
            return None
        return self.hot, len(self.hot.starts)

    def save(self, path: str, dat: Any, *, sync: bool) -> None:
        """Write the whole index to ``path`` + ``.tmp``, then rename it over ``path``."""
        n = len(self)
        tail_n = self.tail.n
        types = fmt.pack_types(self.user_types)
        hot_rows, hot_records = [], []
        for g in self.by_time(newest_first=True):
            row = self.row(g)
            hot_rows.append(fmt.INDEX_ROW.pack(*row))
            hot_records.append(bytes(dat[row[F_OFFSET] : row[F_OFFSET] + row[F_LENGTH]]))
            if len(hot_rows) == fmt.HOT_MEMORIES:
                break
        hot = fmt.pack_hot(hot_rows, hot_records)
        keyword = self.keyword.section()
        layout = fmt.idx_layout(n, self.dim, len(types), len(hot), (len(keyword.terms), len(keyword.rows)))
        ts = self.column("timestamp")
        order = np.argsort(ts, kind="stable").astype("<u4")  # rows are in id order
        header = fmt.pack_idx_header(
            fmt.IdxHeader(self.uuid, n, self.live, self.dim, self.applied, self.last_offset,
                          self.last_crc, len(types), self.next_id, time.time(), len(hot),
                          fmt.KEYWORD_VERSION, len(keyword.terms), len(keyword.rows),
                          self.keyword.live_tokens)
        )  # fmt: skip
        tmp = path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "wb", closefd=False) as f:
                f.write(header)
                _write(f, self.base_rows)
                _write(f, self.tail.rows[:tail_n])
                f.write(bytes(layout.order - f.tell()))
                _write(f, order)
                f.write(bytes(layout.vectors - f.tell()))
                if self.base_vectors.shape[1] == self.dim:
                    _write(f, self.base_vectors)
                else:  # the base was written before the dimension was known
                    f.write(bytes(len(self.base_rows) * self.dim))
                _write(f, self.tail.vectors[:tail_n])
                f.write(bytes(layout.types - f.tell()))
                f.write(types)
                f.write(bytes(layout.hot - f.tell()))
                f.write(hot)
                fmt.write_keyword_section(f, layout, keyword)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)

    # --- rows ------------------------------------------------------------------------

    def __len__(self) -> int:
        return self.n_base + self.tail.n

    def segments(self) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """(first global row, rows, int8 vectors) of the base and the tail."""
        segs = []
        if len(self.base_rows):
            segs.append((0, self.base_rows, self.base_vectors))
        if self.tail.n:
            segs.append(
                (len(self.base_rows), self.tail.rows[: self.tail.n], self.tail.vectors[: self.tail.n])
            )
        return segs

    def column(self, name: str) -> np.ndarray:
        """One field of every row, base then tail (a copy)."""
        return np.concatenate([self.base_rows[name], self.tail.rows[name][: self.tail.n]])

    def gather(self, rows: np.ndarray, names: tuple[str, ...]) -> dict[str, np.ndarray]:
        """The fields ``names`` of ``rows`` (global row numbers, any order), base and tail
        alike: what a ranking needs of a few hundred rows without a tuple per row."""
        rows = np.asarray(rows, dtype=np.int64)
        nb = self.n_base
        in_base = rows < nb
        if in_base.all():
            return {name: self.base_rows[name][rows] for name in names}
        base, tail = rows[in_base], rows[~in_base] - nb
        out = {}
        for name in names:
            column = np.empty(len(rows), dtype=fmt.INDEX_DTYPE[name])
            column[in_base] = self.base_rows[name][base]
            column[~in_base] = self.tail.rows[name][tail]
            out[name] = column
        return out

    def _locate(self, g: int) -> tuple[np.ndarray, int]:
        nb = self.n_base
        return (self.base_rows, g) if g < nb else (self.tail.rows, g - nb)

    def row(self, g: int) -> tuple[Any, ...]:
        """Row ``g`` as a tuple in ``INDEX_DTYPE`` order (``F_*`` name the positions)."""
        nb = self.n_base
        if g < nb:
            return fmt.INDEX_ROW.unpack_from(self._base_bytes, g * fmt.INDEX_DTYPE.itemsize)
        return self.tail.rows[g - nb].item()

    def set_field(self, g: int, name: str, value: Any) -> None:
        rows, i = self._locate(g)
        rows[name][i] = value
        self.pinned = None

    def change(self, g: int, changes: dict[int, Any]) -> None:
        """Set row ``g``'s fields given by position (``F_*``), as ``update_changes`` makes."""
        names = fmt.INDEX_DTYPE.names
        assert names is not None
        for field, value in changes.items():
            self.set_field(g, names[field], value)

    def unit_vectors(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The int8 vectors of ``rows`` (sorted or not) dequantized and normalised, as float32
        ``(len(rows), dim)``, and which rows have a vector (the others are zeros)."""
        rows = np.asarray(rows, dtype=np.int64)
        out = np.zeros((len(rows), self.dim), dtype=np.float32)
        has = np.zeros(len(rows), dtype=bool)
        if not self.dim or not len(rows):
            return out, has
        nb = self.n_base
        for in_seg, seg_rows, seg_vectors, first in (
            (rows < nb, self.base_rows, self.base_vectors, 0),
            (rows >= nb, self.tail.rows, self.tail.vectors, nb),
        ):
            if not in_seg.any() or seg_vectors.shape[1] != self.dim:
                continue
            local = rows[in_seg] - first
            flags = seg_rows["flags"][local]
            with np.errstate(over="ignore", invalid="ignore"):  # a damaged row's scale
                out[in_seg] = seg_vectors[local].astype(np.float32) * seg_rows["scale"][local, None]
            has[in_seg] = (flags & fmt.FLAG_HAS_VECTOR) != 0
        with np.errstate(over="ignore", invalid="ignore"):
            norms = np.linalg.norm(out, axis=1)
        has &= np.isfinite(norms) & (norms > 0)
        out[has] /= norms[has, None]
        out[~has] = 0.0
        return out, has

    def touch(self, rows: list[int], now: float) -> None:
        """Count an access to each row: statistics kept in the index only (a crash before
        the next checkpoint loses them, never a memory)."""
        nb = self.n_base
        for g in rows:
            seg, i = (self.base_rows, g) if g < nb else (self.tail.rows, g - nb)
            seg["access_count"][i] = min(int(seg["access_count"][i]) + 1, 0xFFFFFFFF)
            seg["last_access"][i] = now
        if rows:
            self.stats_changed = True

    def forget(self, g: int, flags: int) -> None:
        """Mark row ``g`` (whose flags are ``flags``) forgotten."""
        self.set_field(g, "flags", flags | fmt.FLAG_FORGOTTEN)
        self.keyword.forget(g)  # after the flags: a background keyword build reads them
        self.live -= 1

    def find(self, mid: int) -> int:
        """Global row of the memory with id ``mid``, or -1."""
        nb = self.n_base
        if nb and mid <= self._base_last_id:
            ids = self._views()[3]
            if mid < nb and ids[mid] == mid:  # ids are dense until something is compacted
                return mid
            i = int(np.searchsorted(ids, mid))
            return i if i < nb and ids[i] == mid else -1
        n = self.tail.n
        if n:
            ids = self.tail.rows["id"][:n]
            i = mid - int(ids[0])
            if 0 <= i < n and ids[i] == mid:
                return nb + i
            i = int(np.searchsorted(ids, mid))
            if i < n and ids[i] == mid:
                return nb + i
        return -1

    def _tail_sorted(self) -> np.ndarray:
        if self._tail_order is None or len(self._tail_order) != self.tail.n:
            ts = self.tail.rows["timestamp"][: self.tail.n]
            self._tail_order = np.argsort(ts, kind="stable")
        return self._tail_order

    def by_time(self, newest_first: bool) -> Iterator[int]:
        """Global rows of live memories by (timestamp, id), merging base and tail."""
        nb = self.n_base
        base_ts, tail_ts = self.base_rows["timestamp"], self.tail.rows["timestamp"]
        base_order, tail_order = self.base_order, self._tail_sorted()
        b_flags, t_flags = self.base_rows["flags"], self.tail.rows["flags"]
        nt = len(tail_order)
        step = -1 if newest_first else 1
        bi, ti = (nb - 1, nt - 1) if newest_first else (0, 0)
        while 0 <= bi < nb or 0 <= ti < nt:
            if not 0 <= ti < nt:
                take_base = True
            elif not 0 <= bi < nb:
                take_base = False
            else:  # base rows have the smaller ids, so the tail wins a tie when newest first
                tb, tt = base_ts[base_order[bi]], tail_ts[tail_order[ti]]
                take_base = tb > tt if newest_first else tb <= tt
            if take_base:
                b = int(base_order[bi])
                if b >= nb:
                    raise CorruptIndexError("the index's time order points past its rows")
                bi += step
                if not b_flags[b] & fmt.FLAG_FORGOTTEN:
                    yield b
            else:
                t = int(tail_order[ti])
                ti += step
                if not t_flags[t] & fmt.FLAG_FORGOTTEN:
                    yield nb + t

    # --- types -------------------------------------------------------------------------

    def _add_type(self, name: str) -> int:
        code = fmt.FIRST_USER_TYPE + len(self.user_types)
        self.user_types.append(name)
        self.type_codes[name] = code
        return code

    def drop_types_since(self, n_types: int) -> None:
        """Forget the type names added after the first ``n_types`` (a write that failed)."""
        del self.user_types[n_types:]
        limit = fmt.FIRST_USER_TYPE + n_types
        self.type_codes = {name: code for name, code in self.type_codes.items() if code < limit}

    def type_code(self, name: str, create: bool) -> int:
        """The code of a type name, assigning the next free one when ``create``; -1 if none."""
        code = self.type_codes.get(name)
        if code is None:
            if not create:
                return -1
            if len(self.user_types) >= fmt.MAX_USER_TYPES:
                raise CorruptIndexError("too many distinct memory types")
            code = self._add_type(name)
        return code

    def type_name(self, code: int) -> str:
        if code < len(fmt.BUILTIN_TYPES):
            return fmt.BUILTIN_TYPES[code]
        i = code - fmt.FIRST_USER_TYPE
        if 0 <= i < len(self.user_types):
            return self.user_types[i]
        raise CorruptIndexError(f"unknown type code {code} in the index")

    # --- changes -----------------------------------------------------------------------

    def set_dim(self, dim: int) -> None:
        if self.dim != dim:
            self.dim = dim
            self.tail.set_dim(dim)

    def append(self, rows: np.ndarray, vectors16: np.ndarray | None, texts: list[str]) -> None:
        """Add rows (``INDEX_DTYPE``, ids above every existing one), their float16 vectors
        (rows without ``FLAG_HAS_VECTOR`` get zeros) and their texts (for keyword search)."""
        self.pinned = None
        self.keyword.add(len(self), texts, (rows["flags"] & fmt.FLAG_FORGOTTEN) != 0)
        if vectors16 is not None and self.dim:
            has = (rows["flags"] & fmt.FLAG_HAS_VECTOR) != 0
            if has.all():
                q, rows["scale"] = quantize(vectors16)
            else:
                q = np.zeros((len(rows), self.dim), dtype=np.int8)
                q[has], rows["scale"][has] = quantize(vectors16[has])
        else:
            q = np.zeros((len(rows), self.dim), dtype=np.int8)
        self.tail.append(rows, q)
        self.live += int(np.count_nonzero((rows["flags"] & fmt.FLAG_FORGOTTEN) == 0))
        self.next_id = max(self.next_id, int(rows["id"][-1]) + 1)

    def note_applied(self, offset: int, length: int, crc: int) -> None:
        """Record that the record at ``offset`` is reflected in the rows."""
        self.applied = offset + length
        self.last_offset, self.last_crc = offset, crc

    def replay(self, dat: Any, start: int, end: int, path: str) -> tuple[list[Problem], int, int]:
        """Apply the valid records of ``dat[start:end]`` (scanned by the compiled kernel).

        Returns the problems found, the end of the last valid record (a damaged tail after
        it is not applied) and how many valid records there were.
        """
        problems: list[Problem] = []
        valid_end, count = start, 0
        if start < min(self.compacted_end, end):
            # The compacted prefix is in (session, time, id) order: its rows are sorted
            # by id before they are appended; ids after it start from the floor.
            prefix_end = min(self.compacted_end, end)
            valid_end, count = self._replay(dat, start, prefix_end, path, problems, sort=True)
            start = prefix_end
        self.next_id = max(self.next_id, self.id_floor)  # ids of compacted-away memories
        if start < end:
            last_end, n = self._replay(dat, start, end, path, problems, sort=False)
            valid_end, count = max(valid_end, last_end), count + n
        return problems, valid_end, count

    def _replay(
        self, dat: Any, start: int, end: int, path: str, problems: list[Problem], sort: bool
    ) -> tuple[int, int]:
        offsets, lengths, kinds, dims, bad_starts, bad_ends = _kernels.scan_records(
            dat, start, end
        )
        problems += [
            Problem("dat", int(s), f"{int(e) - int(s)} damaged bytes") for s, e in zip(bad_starts, bad_ends)
        ]
        self.damaged += [(int(s), int(e)) for s, e in zip(bad_starts, bad_ends)]
        _Replayer(self, dat, path, problems, sort).run(offsets, lengths, kinds, dims)
        valid_end = int(offsets[-1] + lengths[-1]) if len(offsets) else start
        return max(valid_end, start), len(offsets)


_FLUSH_ROWS = 65536  # rows a replay turns into arrays at once


def _check_base(rows: np.ndarray, order: np.ndarray, path: str) -> None:
    """Check the time order of a checkpoint's rows before anything indexes with it.

    The sections have no checksum (the header has): damage there must still surface as
    ``CorruptIndexError``, not as an ``IndexError``. The order is the one section whose
    values are used as positions unchecked; every other field is checked where it is used
    (offsets and lengths by the record readers, type codes by ``type_name``, timestamps by
    the context's headers). One contiguous reduction, on the first use of the base
    (~0.1 ms per million rows; an open that answers from the hot section never pays it).
    """
    if len(order) and int(order.max()) >= len(rows):
        raise CorruptIndexError(
            f"{path}: the time order points past the rows; delete the .idx file to rebuild it",
            path=path,
        )


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


class _Replayer:
    """Turns checked records into index rows, batching new rows for ``append``."""

    def __init__(
        self, index: MemoryIndex, dat: Any, path: str, problems: list[Problem], sort: bool = False
    ) -> None:
        self.index, self.dat, self.path, self.problems = index, dat, path, problems
        self.sort = sort  # records come in any id order: sort the rows once, at the end
        self.rows: list[list[Any]] = []
        self.pending: dict[int, int] = {}  # id -> position in self.rows
        self.vec_rows: list[int] = []
        self.texts: list[str] = []  # of the rows in self.rows
        self.sessions: dict[str | None, int] = {None: 0}  # names repeat: hash each once

    def run(self, offsets: np.ndarray, lengths: np.ndarray, kinds: np.ndarray, dims: np.ndarray) -> None:
        apply = {
            fmt.KIND_MEMORY: self._memory,
            fmt.KIND_UPDATE: self._update,
            fmt.KIND_FORGET: self._forget,
        }
        dat, raw_len_at = self.dat, fmt.RECORD_RAW_LEN_AT
        for off, length, kind, dim in zip(offsets.tolist(), lengths.tolist(), kinds.tolist(), dims.tolist()):
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
        changes = update_changes(flags, p, off)
        if row is None:
            self.index.change(g, changes)
        else:
            for field, value in changes.items():
                row[field] = value

    def _forget(self, off: int, length: int, dim: int, p: dict[str, Any]) -> None:
        _check_change_fields(p)
        row, g = self._target(p["i"])
        flags = row[F_FLAGS] if row is not None else self.index.row(g)[F_FLAGS]
        if flags & fmt.FLAG_FORGOTTEN:
            raise ValueError(f"memory {p['i']} is forgotten twice")
        if row is None:
            self.index.forget(g, flags)
        else:
            row[F_FLAGS] = flags | fmt.FLAG_FORGOTTEN
