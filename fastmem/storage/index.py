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

import mmap
import os
import time
import atexit  # noqa: F401 - now: weakref.finalize imports it at its first use, which
import weakref  # would wait for the import lock a background loader holds (_threads.py)
from collections.abc import Callable, Iterator
from itertools import pairwise
from typing import Any, NamedTuple

import numpy as np

from .. import _format as fmt
from .._kernels import index_open_reference as _idxopen
from .. import _kernels
from .fileio import map_data
from .keyword_index import KeywordIndex
from .replay import (  # noqa: F401 - F_* and the helpers are imported from here too
    ERASED_FIELDS, F_ACCESS, F_FLAGS, F_ID, F_IMPORTANCE, F_LAST_ACCESS, F_LENGTH, F_META,
    F_OFFSET, F_RESERVED, F_SCALE, F_SESSION, F_SUMMARY_TOKENS, F_TEXT_TOKENS, F_TS, F_TYPE,
    Column, Replayer,
    check_memory_fields, default_importance, kept_last_batch, session_hash, update_changes,
)
from .replay import scan_file as _scan_file
from .index_tail import NO_ROWS as _NO_ROWS
from .index_tail import Tail
from .._threads import Beside
from .vectors import BlockedVectors, quantize
from ..errors import CorruptIndexError
from ..types import Problem

def _write(f: Any, arr: np.ndarray) -> None:
    if arr.size:
        f.write(np.ascontiguousarray(arr).data.cast("B"))


_NO_PATCHES = np.zeros(0, dtype=np.uint32)
# An incremental checkpoint (a delta) is written when the full checkpoint holds at least
# DELTA_MIN_BASE rows (below that, writing it whole costs milliseconds), while the rows
# added and the rows changed since it are each at most an eighth of it, and the deltas
# appended so far (each holds every change since the full one) an eighth of its bytes.
# Otherwise the checkpoint is a full one. A delta costs what changed since the full
# checkpoint; a full one costs the whole index.
DELTA_MIN_BASE = 1 << 14
DELTA_SHARE = 8
DELTA_MIN_BYTES = 1 << 20  # deltas may always take this much


_COPY_PART = 16 << 20  # the base's vectors are copied this much at a time
_DROP_ALIGN = 2 << 20  # ext4 caches in folios of up to 2 MB: one straddling a range's start is kept


def _drop_cached(fd: int, at: int, size: int) -> None:
    """Drop the cached pages of ``fd``'s bytes ``at:at + size``, the first rounded down to a
    2 MB block. The kernel drops only clean pages (a dirty one is written back first) that
    no process maps; advice, so a failure changes nothing."""
    if hasattr(os, "posix_fadvise"):
        start = at - at % _DROP_ALIGN
        try:
            os.posix_fadvise(fd, start, at + size - start, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass


def _pwrite(fd: int, data: Any, offset: int) -> None:
    view = memoryview(data)
    while view:
        done = os.pwrite(fd, view, offset)
        view, offset = view[done:], offset + done
_BUILTIN_CODES = {name: code for code, name in enumerate(fmt.BUILTIN_TYPES)}


# The engine checkpoints while writing (the tail then starts again) once the rows added
# since the last one are this many and as many as it holds: a bulk load holds about half
# its rows in memory (issue 21: peak RSS). The checkpoint is written by a thread while rows
# are still added (fastmem.storage.checkpoint), up to twice this limit.
CHECKPOINT_TAIL_ROWS = 1 << 18
# An append of this many rows or more (a bulk write) reserves room for the tail's whole
# life at once (twice the limit: see above): np.zeros maps pages that cost memory only when
# first written, and doubling instead copies every row again and again (at 1 M memories it
# was ~1/5 of add_many).
_BULK_ROWS = 256
Quantized = tuple[np.ndarray, np.ndarray]  # int8 rows and their scales (quantize_rows)
QuantizedBlock = Quantized | Callable[[], Quantized]  # a large batch's, or made on demand


def quantize_rows(vectors16: np.ndarray, has: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The index's int8 rows and scales of float16 rows; rows where ``has`` is False (no
    vector) get zeros and scale 0."""
    if has.all():
        return quantize(vectors16)
    q = np.zeros(vectors16.shape, dtype=np.int8)
    scales = np.zeros(len(vectors16), dtype=np.float32)
    q[has], scales[has] = quantize(vectors16[has])
    return q, scales


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
        # The base rows once checked and patched (``_views``), for ``_kernels.read_memory``
        # to read straight; empty before.
        self.checked_rows = memoryview(b"")
        # A contiguous copy of the base rows' scales, which never change: the vector scan
        # reads one per row, and from the 80-byte rows they would cost a fifth more memory
        # traffic than the vectors. Made by the first scan (fastmem.recall.vector_search).
        self.base_scales: np.ndarray | None = None
        self.hot: fmt.HotSection | None = None  # valid while nothing is applied after it
        self.tail = Tail(dim)
        # The postings, made at their first use (``keyword``): a restart that answers from
        # the hot section never needs them (~0.04 ms of a fresh process's open, issue 21).
        self._keyword: KeywordIndex | None = None
        # What the first use makes them of: the checkpoint's section (its map, header and
        # layout) and the delta's rows after it (``KeywordIndex.load_tail``'s arguments).
        self._keyword_section: tuple[Any, fmt.IdxHeader, fmt.IdxLayout] | None = None
        self._keyword_tail: tuple[Any, ...] | None = None
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
        # (id, timestamp, records) of the erasing forgets replayed: the next writer makes
        # sure those records are erased (fastmem.storage.erase.redo).
        self.erase_pending: list[Any] = []
        self.erased_base: set[int] = set()  # base rows whose vectors ``erase`` zeroed
        # This process's accesses since the index was loaded, by memory id: (count, last
        # time), added to other processes' at a checkpoint (``merge_statistics``).
        self.touches: dict[int, tuple[int, float]] = {}
        self.file_closer: weakref.finalize | None = None  # closes the mapped file's descriptor
        # Incremental checkpoints: the file this index was loaded from (None: a full
        # checkpoint is due), the base rows changed since it was written (the loaded
        # delta's patches, then this process's changes) and the delta's patches, applied
        # to the mapped rows on their first use (a restart from the hot section never pays).
        self.file: _LoadedFile | None = None
        self._mapped_fd = -1  # the loaded file's descriptor (kept open by file_closer)
        self.patched = _NO_PATCHES  # replaced, never changed in place
        self.dirty: set[int] = set()
        self._patches: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def keyword(self) -> KeywordIndex:
        """The keyword postings (made at the first use from what ``load`` found)."""
        kw = self._keyword
        if kw is None:
            if self._keyword_section is None:
                kw = KeywordIndex()
            else:
                mm, h, layout = self._keyword_section
                section = fmt.keyword_views(mm, h, layout)
                kw = KeywordIndex.from_section(section, h.keyword_live_tokens)
            if self._keyword_tail is not None:
                kw.load_tail(*self._keyword_tail)
            self._keyword, self._keyword_section, self._keyword_tail = kw, None, None
        return kw

    @keyword.setter
    def keyword(self, kw: KeywordIndex) -> None:
        self._keyword, self._keyword_section, self._keyword_tail = kw, None, None

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
            mm = None
            while mm is None:  # None: a failed delta's bytes were cut off meanwhile
                st = os.fstat(fd)
                size = st.st_size
                if size < fmt.IDX_HEADER_SIZE:
                    raise CorruptIndexError(f"{path} is shorter than its header", path=path)
                mm = map_data(fd, size, copy=True)
        except BaseException:
            os.close(fd)
            raise
        # The descriptor stays open as long as the map: a compaction that replaces the file
        # closes it last, where freeing the file's cached pages need not hold the GIL.
        closer = weakref.finalize(mm, os.close, fd)
        # The compiled twin answers for a valid file in one call; the reference says what
        # is wrong with another (fastmem._kernels.index_open_reference, issue 21).
        opened = _kernels.idx_open(mm, size, uuid, dat_dim, dat, dat_end, _idxopen.TYPES)
        h, layout, with_slots, slot, delta, dl, types, hot, base_last_id = (
            opened or _idxopen.open_index(mm, size, path, uuid, dat_dim, dat, dat_end)
        )
        state = h if delta is None else delta
        index = cls(h.dim, uuid)
        index.file_closer = closer
        index._mapped_fd = fd
        index.n_base = h.rows
        index._base_spec = (mm, layout, h.dim)
        index._base_spec_path = path
        for name in fmt.unpack_types(types, path):
            index._add_type(name)
        index.hot = hot
        index._base_bytes = memoryview(mm)[layout.rows : layout.rows + h.rows * fmt.INDEX_DTYPE.itemsize]
        index._base_last_id = base_last_id
        if h.keyword_version:
            index._keyword_section = (mm, h, layout)
        elif h.rows:  # written before indexes had postings: tokenize the base meanwhile
            index.keyword = KeywordIndex.build_in_background(
                np.frombuffer(mm, fmt.INDEX_DTYPE, h.rows, layout.rows), dat, path
            )
        index.live, index.next_id = state.live, state.next_id
        index.covered = index.applied = state.covered
        index.last_offset, index.last_crc = state.last_offset, state.last_crc
        if delta is not None and dl is not None and slot is not None:
            if not h.keyword_version:
                raise CorruptIndexError(f"{path}: a delta on an index without postings", path=path)
            index._load_delta(mm, slot.offset, delta, dl, path)
        if with_slots:  # the file's identity, from the stat above (the same descriptor)
            index.file = _LoadedFile(st.st_dev, st.st_ino, layout, slot, size)
        return index

    def _load_delta(self, mm: Any, at: int, h: fmt.DeltaHeader, dl: fmt.DeltaLayout, path: str) -> None:
        """Take the delta at ``at``: its rows become the tail (views of the map, copied
        when the tail first grows), its postings the keyword tail; its patches wait for
        the first use of the base rows."""
        t, d = h.rows, self.dim
        tail = self.tail
        tail.rows = np.frombuffer(mm, fmt.INDEX_DTYPE, t, at + dl.rows)
        tail.vectors = np.frombuffer(mm, np.int8, t * d, at + dl.vectors).reshape(t, d)
        tail.n = tail.saved = t
        if t:
            ids = tail.rows["id"]
            if int(ids[0]) <= self._base_last_id or (t > 1 and not (ids[1:] > ids[:-1]).all()):
                raise CorruptIndexError(f"{path}: the delta's rows are out of order", path=path)
            if int(ids[-1]) >= self.next_id:
                raise CorruptIndexError(f"{path}: the id counter is behind the rows", path=path)
        self._keyword_tail = (
            np.frombuffer(mm, "<u4", t, at + dl.doc_len),
            (np.frombuffer(mm, "<u8", h.postings, at + dl.terms),
             np.frombuffer(mm, "<u4", h.postings, at + dl.posting_rows),
             np.frombuffer(mm, "<u2", h.postings, at + dl.tf)),
            h.live_tokens,
        )  # fmt: skip
        if h.patches:
            rows = np.frombuffer(mm, "<u4", h.patches, at + dl.patch_rows)
            if not _increasing_below(rows, self.n_base):
                raise CorruptIndexError(f"{path}: the delta's changed rows are damaged", path=path)
            data = np.frombuffer(mm, fmt.INDEX_DTYPE, h.patches, at + dl.patch_data)
            self.patched = rows
            self._patches = (rows, data)

    def _apply_patches(self) -> None:
        """Write the delta's changed rows over the mapped base rows (copy-on-write: the
        file is not changed) and mark the forgotten ones in the keyword token counts."""
        patches, self._patches = self._patches, None
        if patches is None or self._base_spec is None:
            return
        rows, data = patches
        mm, layout, _ = self._base_spec
        np.frombuffer(mm, fmt.INDEX_DTYPE, self.n_base, layout.rows)[rows] = data
        dead = rows[(data["flags"] & fmt.FLAG_FORGOTTEN) != 0]
        self.keyword.mark_dead(dead)

    def _views(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        if self._base is None:
            self._apply_patches()
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
            self.checked_rows = self._base_bytes
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
        if self.hot is None or self.applied != self.covered or self.tail.n != self.tail.saved:
            return None
        return self.hot, len(self.hot.starts)

    def _hot(self, dat: Any) -> bytes:
        """The hot section: the newest live memories' rows and records."""
        hot_rows, hot_records = [], []
        for g in self.by_time(newest_first=True):
            row = self.row(g)
            at, end = row[F_OFFSET], row[F_OFFSET] + row[F_LENGTH]
            if hasattr(dat, "madvise") and at < end <= len(dat):  # (a damaged row: read as before)
                # This record alone: a miss in the map would read 8 MB around it (read_ahead_kb)
                dat.madvise(mmap.MADV_WILLNEED, at - at % mmap.PAGESIZE, end - at + at % mmap.PAGESIZE)
            hot_rows.append(fmt.INDEX_ROW.pack(*row))
            hot_records.append(bytes(dat[at:end]))
            if len(hot_rows) == fmt.HOT_MEMORIES:
                break
        return fmt.pack_hot(hot_rows, hot_records)

    def save(self, path: str, dat: Any, *, sync: bool, aside: str | None = None) -> None:
        """Write the whole index to ``path`` + ``.tmp``, then rename it over ``path`` (a
        full checkpoint; its commit slots are empty). The postings are merged by the
        process's helper thread while this one writes the rows and vectors (the merge lets
        the GIL go; ~0.3 s of a 1 M store's close), and the header, which holds their
        sizes, is written last. ``aside``: write to that name instead and leave it there
        (the caller renames it: fastmem.storage.checkpoint publishes it under the writer lock)."""
        self._views()  # the delta's changed rows, applied
        merging = Beside(self.keyword.section)
        fd = -1
        try:
            n = len(self)
            tail_n = self.tail.n
            types = fmt.pack_types(self.user_types)
            hot = self._hot(dat)
            layout = fmt.idx_layout(n, self.dim, len(types), len(hot))  # up to the postings
            order = self._order()
            tmp = aside or path + ".tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb", closefd=False) as f:
                f.write(bytes(layout.rows))  # the header's place
                _write(f, self.base_rows)
                _write(f, self.tail.rows[:tail_n])
                f.write(bytes(layout.order - f.tell()))
                _write(f, order)
                del order
                f.write(bytes(layout.vectors - f.tell()))
                if self.base_vectors.shape[1] == self.dim:
                    self._write_base_vectors(f)
                else:  # the base was written before the dimension was known
                    f.write(bytes(len(self.base_rows) * self.dim))
                _write(f, self.tail.vectors[:tail_n])
                f.write(bytes(layout.types - f.tell()))
                f.write(types)
                f.write(bytes(layout.hot - f.tell()))
                f.write(hot)
                keyword = merging.result()
                postings = (len(keyword.terms), len(keyword.rows))
                layout = fmt.idx_layout(n, self.dim, len(types), len(hot), postings)
                fmt.write_keyword_section(f, layout, keyword)
                del keyword
                f.write(bytes(fmt.deltas_at(layout) - f.tell()))  # two empty commit slots
                f.seek(0)
                f.write(fmt.pack_idx_header(
                    fmt.IdxHeader(self.uuid, n, self.live, self.dim, self.applied, self.last_offset,
                                  self.last_crc, len(types), self.next_id, time.time(), len(hot),
                                  fmt.KEYWORD_VERSION, *postings, self.keyword.live_tokens)
                ))  # fmt: skip
            if sync:
                os.fsync(fd)
        finally:
            # An error above (from the start: the file's creation too): the merge is not
            # wanted, but one under way works on the live postings (section() consolidates
            # them) and its result may hold the mapped file: neither may outlive this call
            # (the fault sweep found both, the second only when the merge was slow).
            merging.cancel()
            if fd >= 0:
                os.close(fd)
        if aside is None:
            os.replace(tmp, path)

    def _write_base_vectors(self, f: Any) -> None:
        """The base's int8 vectors (they never change), copied file to file by the kernel
        when it can (copy_file_range): read through the map, every page of them would
        count in this process's memory until the checkpoint ends (~400 MB at 1 M).

        The old file is being replaced: its cached pages of each part copied are dropped as
        the copy goes (a later read of them, if any, reads the disk), so that the new
        file's pages reuse memory freed a moment before. New memory costs ~2 s per GiB on
        a VM that hands free memory back to its host (issue 21). Pages that a process maps
        stay (the kernel skips them)."""
        size = self.base_vectors.nbytes
        if size and self._base_spec is not None and self._mapped_fd >= 0:
            f.flush()
            src, dst, start = self._base_spec[1].vectors, f.fileno(), f.tell()
            try:
                done = 0
                while done < size:
                    part = min(size - done, _COPY_PART)
                    n = os.copy_file_range(self._mapped_fd, dst, part, src + done, start + done)
                    if n <= 0:
                        break
                    _drop_cached(self._mapped_fd, src + done, n)
                    done += n
            except OSError:
                done = -1  # not supported here (another file system...): through the map
            if done == size:
                for g in self.erased_base:  # zeroed here, not in the file copied (erase)
                    os.pwrite(dst, bytes(self.dim), start + g * self.dim)
                f.seek(start + size)
                return
            f.seek(start)
        _write(f, self.base_vectors)

    def _order(self) -> np.ndarray:
        """The time order of every row (rows are in id order), as ``<u4``: the base's own
        order and the tail's merged, without sorting the base again (a full sort of 1 M
        timestamps was ~0.1-0.2 s of a close); sorted whole when the base's order is not
        sorted by time (a damaged file's: this checkpoint writes it right)."""
        nb = self.n_base
        tail_ts = self.tail.rows["timestamp"][: self.tail.n]
        if nb and len(tail_ts):
            base_ts, base_order = self.base_rows["timestamp"], self.base_order
            base_sorted = base_ts[base_order]
            if bool(np.all(base_sorted[1:] >= base_sorted[:-1])):
                tail_order = self._tail_sorted()
                out = np.empty(nb + len(tail_ts), dtype="<u4")
                if tail_ts.min() >= base_sorted[-1]:  # all newer (memories added as they happen)
                    out[:nb] = base_order
                    out[nb:] = tail_order + nb
                    return out
                # Each tail row goes after the base rows as old or older (a tie: the base's
                # row has the smaller id), as a stable sort of all the rows orders them.
                at = np.searchsorted(base_sorted, tail_ts[tail_order], side="right")
                at += np.arange(len(tail_order))
                base_at = np.ones(len(out), dtype=bool)
                base_at[at] = False
                out[at] = tail_order + nb
                out[base_at] = base_order
                return out
        ts = self.column("timestamp")
        return np.argsort(ts, kind="stable").astype("<u4")

    def save_delta(self, path: str, dat: Any, *, sync: bool) -> bool:
        """Append what changed since the full checkpoint to the index file this index was
        loaded from, and commit it by writing the older of its two slots. Returns False,
        having written nothing, when a full checkpoint is due instead: no such file (or
        another under the name), a new dimension, or a delta too large for its base."""
        loaded = self.file
        if loaded is None or self._base_spec is None or self._base_spec[2] != self.dim:
            return False
        if not self.keyword.delta_ready():
            return False
        if self.n_base < DELTA_MIN_BASE:
            return False
        limit = self.n_base // DELTA_SHARE
        self._views()  # the loaded delta's changed rows, applied to the base
        # Sorted and unique without np.union1d/np.unique: they import numpy.ma (~0.1 s) on
        # their first call in a process, which would be the close of a restarted agent.
        patched = np.sort(np.concatenate([self.patched, np.fromiter(self.dirty, np.uint32, len(self.dirty))]))
        patched = patched[np.concatenate(([True], patched[1:] != patched[:-1]))] if len(patched) else patched
        if self.tail.n > limit or len(patched) > limit:
            return False
        t = self.tail.n
        terms, post_rows, tf = self.keyword.tail_postings()
        types = fmt.pack_types(self.user_types)
        hot = self._hot(dat)
        h = fmt.DeltaHeader(t, self.live, self.applied, self.last_offset, self.last_crc,
                            self.next_id, time.time(), len(types), len(hot), len(patched),
                            len(terms), self.keyword.live_tokens)  # fmt: skip
        dl = fmt.delta_layout(h, self.dim)
        start = fmt.deltas_at(loaded.layout)
        fd = os.open(path, os.O_RDWR)
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != (loaded.dev, loaded.ino):
                return False  # another process wrote a full checkpoint since
            at = max(start, -(-st.st_size // fmt.SECTION_ALIGN) * fmt.SECTION_ALIGN)
            if at - start + dl.size > max(DELTA_MIN_BYTES, fmt.slots_at(loaded.layout) // DELTA_SHARE):
                return False  # the deltas appended so far would outweigh the base
            slots = os.pread(fd, 2 * fmt.SLOT_PAGE, fmt.slots_at(loaded.layout))
            which, newest = fmt.current_slot(slots, 0)
            parts = [
                (dl.rows, self.tail.rows[:t]), (dl.vectors, self.tail.vectors[:t]),
                (dl.doc_len, self.keyword.tail_len[: self.keyword.tail_n]),
                (dl.patch_rows, patched.astype("<u4")),
                (dl.patch_data, self.base_rows[patched] if len(patched) else _NO_ROWS),
                (dl.terms, terms), (dl.posting_rows, post_rows), (dl.tf, tf),
                (dl.types, np.frombuffer(types, np.uint8)), (dl.hot, np.frombuffer(hot, np.uint8)),
            ]
            named = False
            try:
                _pwrite(fd, fmt.pack_delta_header(h), at)
                for offset, arr in parts:
                    if arr.size:
                        _pwrite(fd, np.ascontiguousarray(arr).data.cast("B"), at + offset)
                if sync:
                    os.fdatasync(fd)  # the delta is on disk before a slot names it
                generation = 1 if newest is None else newest.generation + 1
                slot = fmt.pack_slot(fmt.Slot(generation, at, dl.size))
                _pwrite(fd, slot, fmt.slots_at(loaded.layout) + which * fmt.SLOT_PAGE)
                named = True
                if sync:
                    os.fdatasync(fd)
            except BaseException:
                # Give back the space it took (a full disk) unless the slot names it now: a
                # reader may be loading it (a read past the end of a map is SIGBUS).
                if not named:
                    try:
                        os.ftruncate(fd, st.st_size)
                    except OSError:
                        pass
                raise
        finally:
            os.close(fd)
        return True

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
            if self._patches is not None:
                self._apply_patches()
            return fmt.INDEX_ROW.unpack_from(self._base_bytes, g * fmt.INDEX_DTYPE.itemsize)
        return self.tail.rows[g - nb].item()

    def set_field(self, g: int, name: str, value: Any) -> None:
        rows, i = self._locate(g)
        rows[name][i] = value
        self.pinned = None
        if g < self.n_base:
            self.dirty.add(g)

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
        touches = self.touches
        for g in rows:
            seg, i = (self.base_rows, g) if g < nb else (self.tail.rows, g - nb)
            seg["access_count"][i] = min(int(seg["access_count"][i]) + 1, 0xFFFFFFFF)
            seg["last_access"][i] = now
            if g < nb:
                self.dirty.add(g)
            mid = int(seg["id"][i])
            count, _ = touches.get(mid, (0, 0.0))
            touches[mid] = (count + 1, now)
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

    def find_row(self, mid: int) -> tuple[int, tuple[Any, ...] | None]:
        """``(find(mid), row(...))``, or ``(-1, None)``: ``get``'s lookup in one call. Once
        the base is checked (its views built), a dense id is read straight from its row,
        without the numpy scalars ``find`` compares (the same answer: row ``mid`` holds
        ``mid``)."""
        checked = self._base is not None and self._patches is None
        if checked and 0 <= mid < self.n_base and mid <= self._base_last_id:
            row = fmt.INDEX_ROW.unpack_from(self._base_bytes, mid * fmt.INDEX_DTYPE.itemsize)
            if row[F_ID] == mid:
                return mid, row
        g = self.find(mid)
        return g, (self.row(g) if g >= 0 else None)

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

    def append(
        self, rows: np.ndarray, vectors16: np.ndarray | BlockedVectors | None,
        texts: list[str], *,
        quantized: Quantized | list[QuantizedBlock] | None = None,
        terms: tuple[np.ndarray, ...] | list[tuple[np.ndarray, ...]] | None = None,
        staged: bool = False, forgotten: int | None = None,
    ) -> None:  # fmt: skip
        """Add rows (``INDEX_DTYPE``, ids above every existing one), their float16 vectors
        (rows without ``FLAG_HAS_VECTOR`` get zeros) and their texts (for keyword search).

        ``quantized`` (:func:`quantize_rows` of the vectors) and ``terms``
        (``keyword_index.tokenize`` of the texts, or a list of it for consecutive blocks of
        them), when given, were made before the writer lock.
        After :meth:`stage` of the same rows and vectors, ``staged=True`` takes them.
        ``forgotten=0``: no row is forgotten (a replay's plain rows; spares the flags' scan,
        which on a few rows costs more than the rest of the append)."""
        self.pinned = None
        if forgotten == 0:
            dead = np.zeros(len(rows), dtype=bool)
        else:
            dead = (rows["flags"] & fmt.FLAG_FORGOTTEN) != 0
        if isinstance(terms, list):  # a large batch's, a block of texts each (keyword_terms)
            lo = 0
            for block in terms:
                hi = lo + len(block[3])  # (its doc_len: one per text)
                self.keyword.add(len(self) + lo, texts[lo:hi], dead[lo:hi], block)
                lo = hi
        else:
            self.keyword.add(len(self), texts, dead, terms)
        if isinstance(quantized, list) and not staged and vectors16 is not None and self.dim:
            # A large batch's int8 rows, in blocks (vectors_for): each copied into the tail
            # as it is, no copy of them all made first (the caller holds the thread lock:
            # no reader sees the rows before the last). The list is consumed: each block is
            # let go once copied.
            lo, reserve = 0, 2 * self.tail_limit() + len(rows)
            for b in range(len(quantized)):
                part = quantized[b]
                quantized[b] = None  # type: ignore[call-overload]
                q, scales = part() if callable(part) else part  # (made again: vectors_for)
                hi = lo + len(q)
                rows["scale"][lo:hi] = scales
                self.tail.stage(rows[lo:hi], q, reserve)
                self.tail.publish(hi - lo)
                lo = hi
                del part, q, scales
        else:
            if not staged:
                self.stage(rows, vectors16, quantized)
            self.tail.publish(len(rows))
        self.live += len(rows) if forgotten == 0 else int(np.count_nonzero(~dead))
        self.next_id = max(self.next_id, int(rows["id"][-1]) + 1)

    def stage(
        self, rows: np.ndarray, vectors16: np.ndarray | BlockedVectors | None,
        quantized: Quantized | list[QuantizedBlock] | None = None,
    ) -> None:  # fmt: skip
        """Copy rows and their int8 vectors into the tail's room past its rows (sets the
        rows' scales), changing nothing a reader sees: :meth:`append` with ``staged=True``
        adds them. The copies can then run while the rows' records are being written."""
        if vectors16 is not None and self.dim:
            if isinstance(quantized, list):  # in blocks (vectors_for): one array of them here
                made = [block() if callable(block) else block for block in quantized]
                quantized = np.concatenate([q for q, _ in made]), np.concatenate(
                    [scales for _, scales in made]
                )
            if quantized is None:
                has = (rows["flags"] & fmt.FLAG_HAS_VECTOR) != 0
                quantized = quantize_rows(np.asarray(vectors16), has)
            q, rows["scale"] = quantized
        else:
            q = np.zeros((len(rows), self.dim), dtype=np.int8)
        bulk = len(rows) >= _BULK_ROWS
        self.tail.stage(rows, q, 2 * self.tail_limit() + len(rows) if bulk else 0)

    def tail_limit(self) -> int:
        """The tail's row count at which the engine checkpoints."""
        return max(CHECKPOINT_TAIL_ROWS, self.n_base)

    def note_applied(self, offset: int, length: int, crc: int) -> None:
        """Record that the record at ``offset`` is reflected in the rows."""
        self.applied = offset + length
        self.last_offset, self.last_crc = offset, crc

    def replay(
        self, dat: Any, start: int, end: int, path: str, fd: int | None = None
    ) -> tuple[list[Problem], int, int]:
        """Apply the valid records of ``dat[start:end]`` (scanned by the compiled kernel).

        ``fd``, the data file's descriptor, is given by a caller that may not hold the
        writer lock: the bytes after the compacted prefix are then scanned as
        :func:`scan_file` reads them, not through ``dat`` (a writer may cut them meanwhile).

        Returns the problems found, the end of the last valid record (a damaged tail after
        it is not applied) and how many valid records there were.
        """
        problems: list[Problem] = []
        valid_end, count = start, 0
        erased: set[int] = set()  # ids of erased memory records (Replayer.erased)
        if start < min(self.compacted_end, end):
            # The compacted prefix is in (session, time, id) order: its rows are sorted
            # by id before they are appended; ids after it start from the floor.
            prefix_end = min(self.compacted_end, end)
            valid_end, count = self._replay(dat, start, prefix_end, path, problems, True, erased)
            start = prefix_end
        self.next_id = max(self.next_id, self.id_floor)  # ids of compacted-away memories
        if start < end:
            last_end, n = self._replay(dat, start, end, path, problems, False, erased, fd=fd)
            valid_end, count = max(valid_end, last_end), count + n
        return problems, valid_end, count

    def _replay(
        self, dat: Any, start: int, end: int, path: str, problems: list[Problem], sort: bool,
        erased: set[int], fd: int | None = None,
    ) -> tuple[int, int]:
        scanned: tuple[Column, ...]
        if fd is None:
            scanned = _kernels.scan_records(dat, start, end)
        else:  # without the writer lock: a last batch as a writer takes it (kept_last_batch)
            scanned = kept_last_batch(fd, scan_file(fd, start, end), end)
        offsets, lengths, kinds, dims, bad_starts, bad_ends = scanned
        if len(bad_starts):
            spans = list(zip(np.asarray(bad_starts).tolist(), np.asarray(bad_ends).tolist()))
            problems += [Problem("dat", s, f"{e - s} damaged bytes") for s, e in spans]
            self.damaged += spans
        n = len(offsets)
        if not n:
            return start, 0
        Replayer(self, dat, path, problems, sort, erased).run(offsets, lengths, kinds, dims)
        return max(int(offsets[n - 1]) + int(lengths[n - 1]), start), n



def scan_file(fd: int, start: int, end: int) -> tuple[Column, ...]:
    """``replay.scan_file`` as a replay without the writer lock takes it: the columns of a
    few records (the usual catch-up on another process's add) as lists, no arrays made."""
    return _scan_file(fd, start, end, lists=True)


class _LoadedFile(NamedTuple):
    """The version-2 index file an index was loaded from: a delta may be added to it
    while it is still the file under the index's name (the same device and inode)."""

    dev: int
    ino: int
    layout: fmt.IdxLayout  # of its full checkpoint
    slot: fmt.Slot | None  # the slot loaded
    size: int


def _increasing_below(values: np.ndarray, limit: int) -> bool:
    """Whether ``values`` (at least one) increase strictly and stay below ``limit``. A few
    are checked in Python: numpy's first reduction in a process costs ~50-70 µs, and a
    restart's delta usually holds a few changed rows."""
    if len(values) <= 64:
        v = values.tolist()
        return v[-1] < limit and all(a < b for a, b in pairwise(v))
    return int(values[-1]) < limit and bool((values[1:] > values[:-1]).all())


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
