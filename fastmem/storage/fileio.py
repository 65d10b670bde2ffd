"""Parts of the storage engine (``fastmem.storage.engine``) that hold none of its state: the
mapping of file operations' ``OSError``s to fastmem errors, the background sync of
``durability="batch"`` (which keeps its error), maps of files that may be cut back, the
torn-tail test, the lock holder's pid, the cache of decoded memories and the pause of the
cycle collector."""

from __future__ import annotations

import errno
import gc
import mmap
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .. import _format as fmt
from .. import _kernels
from ..errors import DurabilityError, FastmemError, StoreFullError
from ..types import Memory

__all__ = [
    "ContentCache", "GroupCommit", "io_error", "lock_holder", "map_data", "mapped_errors",
    "no_cyclic_gc", "release_frames", "torn", "torn_tail",
]

_CACHE_ENTRY_OVERHEAD = 200  # bytes a cached memory costs beyond its text and summary


_FULL = (errno.ENOSPC, errno.EDQUOT)


def io_error(exc: OSError, path: str | None) -> OSError:
    """The fastmem error for an ``OSError`` of a file operation on ``path``: a full device
    or quota is a :class:`StoreFullError`, an I/O error a :class:`DurabilityError` (each
    keeps the ``errno`` and names the file); any other ``OSError`` is returned as it is."""
    path = exc.filename if exc.filename is not None else path
    cause = exc.strerror or os.strerror(exc.errno or 0)
    if exc.errno in _FULL:
        return StoreFullError(
            exc.errno, f"{cause} (the device or the disk quota is full): nothing of this call "
            f"was kept; free space and write again", path,
        )  # fmt: skip
    if exc.errno == errno.EIO:
        return DurabilityError(
            exc.errno, f"{cause} (an I/O error of the device): nothing of a failed write is "
            f"kept; check the device, and verify() the store", path,
        )  # fmt: skip
    return exc


@contextmanager
def mapped_errors(path: str | None) -> Iterator[None]:
    """Raise an ``OSError`` of the body as :func:`io_error` maps it (one place for all)."""
    try:
        yield
    except FastmemError:
        raise
    except OSError as exc:
        mapped = io_error(exc, path)
        if mapped is exc:
            raise
        try:
            raise mapped from exc
        finally:
            del mapped  # no cycle through this frame: the failed call's files close now


class GroupCommit:
    """Background fdatasync for ``durability="batch"``: writes reach the disk in batches."""

    def __init__(self, fd: int, interval: float) -> None:
        self._fd, self._interval = fd, interval
        self._pending = threading.Event()
        self._stopping = False
        self.error: OSError | None = None
        self.started = self.synced = 0  # fdatasync calls begun and ended (failed ones too)
        self._thread = threading.Thread(target=self._run, name="fastmem-commit", daemon=True)
        self._thread.start()

    def notify(self) -> None:
        self._pending.set()

    def _run(self) -> None:
        while True:
            self._pending.wait()
            if not self._stopping:
                time.sleep(self._interval)  # let the writes of the next few ms join this sync
            self.started += 1  # before the clear: who sees it cleared sees this sync begun
            self._pending.clear()
            try:
                os.fdatasync(self._fd)
            except OSError as exc:
                # Kept: the kernel reports a writeback error once per open file, and this
                # sync has consumed it. The engine raises it from the next write, flush,
                # checkpoint or close, and refuses writes after it.
                if self.error is None:
                    self.error = exc
            self.synced += 1
            if self._stopping:
                return

    def stop(self) -> None:
        self._stopping = True
        self._pending.set()
        if threading.current_thread() is not self._thread:  # (a collected store, freed here)
            self._thread.join()


def release_frames(exc: BaseException) -> None:
    """Drop the locals of the frames ``exc`` unwound. Its traceback keeps them alive, from
    CPython 3.12 often in a cycle only the garbage collector frees; a map among them holds a
    descriptor of its own, so a failed open or swap would keep its file open until a
    collection. Frames still running are skipped: their own code drops what they hold."""
    import traceback  # here, on a failure's way: not a cost of every import

    traceback.clear_frames(exc.__traceback__)


def lock_holder(fd: int) -> int | None:
    """The pid of the process holding the flock on ``fd``'s file, from /proc/locks (Linux),
    or None where the OS does not tell."""
    st = os.fstat(fd)
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == inode and fields[4].isdigit():
                    return int(fields[4])
    except OSError:
        pass
    return None


_MAP_TRIES = 3  # maps of a file that another process cuts and grows again meanwhile


def map_data(fd: int, size: int, *, copy: bool = False) -> mmap.mmap | None:
    """A read-only (or ``copy``-on-write) map of the first ``size`` bytes of the file open
    as ``fd``; ``None`` when the file is shorter now: cut back since ``size`` was taken (a
    writer's failed or interrupted append, a failed delta checkpoint's bytes). The caller
    takes the size again.

    mmap checks the size with its own fstat: a file cut back since ``size`` was taken and
    grown past it again by the time this looks (a torn tail cut, then a longer record
    appended) is mapped again, now that it holds ``size`` bytes."""
    for _ in range(_MAP_TRIES):
        try:
            return mmap.mmap(fd, size, access=mmap.ACCESS_COPY if copy else mmap.ACCESS_READ)
        except ValueError:
            if os.fstat(fd).st_size < size:
                return None
    return mmap.mmap(fd, size, access=mmap.ACCESS_COPY if copy else mmap.ACCESS_READ)


PAGE = 4096  # what a power loss keeps or loses of a file's unsynced bytes: whole pages
_LOST_PAGE_MIN = 64  # zero bytes that mark a lost page (a record's own zeros are fewer)


def torn(dat: Any, start: int, end: int) -> bool:
    """Whether ``dat[start:end]``, the bytes past the last whole record, look like an
    interrupted append, not damaged records (see :func:`torn_tail`)."""
    return torn_tail(dat[start:end], start)


def torn_tail(tail: bytes, offset: int) -> bool:
    """Whether ``tail``, the bytes from ``offset`` to the end of a data file past its last
    whole record, look like an append that a crash interrupted: nothing in them was
    acknowledged. (The write of a call that returned was complete, and synced if the
    store's durability syncs: no crash leaves it in part.)

    An interrupted append leaves less than a header, zeros (blocks allocated, never
    written), a record that claims more bytes than the file has, or, after a power loss,
    the file's new size with some of the append's pages and not others: a page not kept
    reads as zeros, so a page-aligned run of zeros (the append's part of the page it
    started in, a whole page, or the last page's written part) marks it. Anything else
    may be an acknowledged record hit by bit rot, which flips bits and does not zero
    pages: it is kept for ``verify()`` to report.
    """
    if len(tail) < fmt.RECORD_HEADER_SIZE or tail.count(0) == len(tail):
        return True
    if _torn_batch(tail, offset):
        return True
    # The scans' rule for a batch's lost pages, in its readable form (compiled, it is inside
    # the scan): imported here, at a damaged tail, since import fastmem loads no reference.
    from .._kernels.reference import lost_write

    if lost_write(tail):
        return True
    if tail[:4] == fmt.RECORD_MAGIC:
        _, _, _, dim, plen, _, _ = fmt.RECORD_HEADER.unpack_from(tail, 0)
        if fmt.record_size(dim, plen) > len(tail):
            return True
    at, boundary = 0, (offset // PAGE + 1) * PAGE - offset  # the first page boundary in it
    while at < len(tail):
        stop = min(boundary, len(tail))
        if stop - at >= _LOST_PAGE_MIN and tail.count(0, at, stop) == stop - at:
            return True
        at, boundary = stop, boundary + PAGE
    return False


def _torn_batch(tail: bytes, offset: int) -> bool:
    """Whether ``tail`` is a batch frame, whole records of its batch, then nothing or bytes
    that look like an interrupted append (the rules of :func:`torn_tail`): a batch's write
    cut short by a crash. (The scans take none of a batch with nothing valid after it.)"""
    count = fmt.batch_count(tail, 0, len(tail))
    if not count:
        return False
    at = fmt.BATCH_FRAME_SIZE
    while count and at < len(tail):
        info = _kernels.check_record(tail, at, len(tail))
        if info is None or info[0] == fmt.KIND_BATCH:
            break
        at += fmt.record_size(info[1], info[2])
        count -= 1
    return count > 0 and (at == len(tail) or torn_tail(tail[at:], offset + at))


class ContentCache:
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
        size = len(memory.text) + len(memory.summary or "") + _CACHE_ENTRY_OVERHEAD
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

    def __len__(self) -> int:
        return len(self._items)


@contextmanager
def no_cyclic_gc() -> Iterator[None]:
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
