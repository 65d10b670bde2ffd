"""Files around a store's two: the compaction's recovery rule, directory syncs, indexes
built from a data file alone, and letting go of replaced files without stalling callers.

Used by the storage engine (``fastmem.storage.engine``) and by maintenance (``fastmem.storage.maintenance``).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _format as fmt
from .index import MemoryIndex
from .fileio import map_data, torn_tail
from .._threads import Background, at_fork
from ..errors import CorruptionError, DimensionMismatchError

if TYPE_CHECKING:  # loaded by the release thread's start (releaser), not by the import
    import queue
from ..types import Problem

COMPACT_SUFFIX = ".compact"  # <name>.dat.compact, <name>.idx.compact: a compaction's new files


# --- files: the recovery rule, directory syncs, indexes built from a data file ------------


def build_index(
    dat: Any, end: int, path: str, fd: int | None = None
) -> tuple[MemoryIndex, list[Problem], int]:
    """An index built from a data file alone (its header's compaction fields included), the
    problems met and the number of valid records read. ``fd``: as ``MemoryIndex.replay``
    takes it, from a caller without the writer lock."""
    header = fmt.unpack_dat_header(dat, path)
    index = MemoryIndex(header.dim, header.uuid)
    index.set_compaction(header)
    problems, _, records = index.replay(dat, fmt.DAT_HEADER_SIZE, end, path, fd)
    kept = kept_batch(index, dat, end, fd)
    if kept is not None:  # its whole records are read as any others
        more, _, n = index.replay(dat, kept + fmt.BATCH_FRAME_SIZE, end, path, fd)
        problems = [p for p in problems if p.offset != kept] + more
        records += n
    return index, problems, records


def kept_batch(index: MemoryIndex, dat: Any, end: int, fd: int | None = None) -> int | None:
    """The frame's offset when the data file ends with a batch that its scan took none of
    (a record in it is not valid, nothing valid after it) and whose bytes do not look like
    an interrupted append (``torn_tail``): bit rot in an acknowledged batch, whose whole
    records are the store's. Its damaged region is taken off ``index.damaged``; the caller
    replays from past the frame. None otherwise. ``fd``: read the bytes with ``pread``."""
    if not index.damaged or index.damaged[-1][1] != end:
        return None
    start = index.damaged[-1][0]
    tail = os.pread(fd, end - start, start) if fd is not None else bytes(dat[start:end])
    if len(tail) != end - start or not fmt.batch_count(tail, 0, len(tail)) or torn_tail(tail, start):
        return None
    index.damaged.pop()
    return start


def remove_quietly(path: str) -> None:
    """Remove ``path`` if it exists; a failure to remove it is not the caller's error."""
    try:
        os.remove(path)
    except OSError:
        pass


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


def open_same(path: str, fd: int, st: os.stat_result | None = None) -> int | None:
    """A read-only descriptor of the file open as ``fd`` (whose stat is ``st``, when the
    caller has it), opened anew through ``path``: a map made from it keeps a duplicate of
    it, which must not share ``fd``'s open file description (a writer's lock is on it, and
    would outlive close()). ``None`` when ``path`` names another file now (a compaction or
    repair replaced it since ``fd`` was opened: the caller follows again)."""
    new = os.open(path, os.O_RDONLY)
    a, b = st or os.fstat(fd), os.fstat(new)
    if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino):
        return new
    os.close(new)
    return None


def map_same(
    path: str, fd: int, size: int, st: os.stat_result | None = None
) -> tuple[int, mmap.mmap] | None:
    """A read-only map of the first ``size`` bytes of the file open as ``fd`` (fewer when a
    writer cut a failed or interrupted write off since ``size`` was taken), made through a
    descriptor of its own (see :func:`open_same`; ``st``: ``fd``'s stat, when the caller
    has it), returned with it; ``None`` when ``path`` names another file now."""
    map_fd = open_same(path, fd, st)
    if map_fd is None:
        return None
    try:
        while (dat := map_data(map_fd, size)) is None:
            size = os.fstat(map_fd).st_size
    except BaseException:
        os.close(map_fd)
        raise
    return map_fd, dat


def fsync_dir(path: str) -> None:
    """Make the entries of ``path``'s directory durable (a rename, a new file)."""
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- letting go of replaced files -----------------------------------------------------------


class Retired:
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


_releaser: queue.SimpleQueue[Any] | None = None
_releaser_lock = threading.Lock()


@at_fork
def _after_fork_in_child() -> None:
    global _releaser, _releaser_lock
    _releaser, _releaser_lock = None, threading.Lock()  # the parent's thread, maybe its lock


def releaser() -> queue.SimpleQueue[Any]:
    """The queue of this process's release thread (started once, by the first reader, so
    that a reader meeting a swap only puts its old files there)."""
    global _releaser
    import queue

    with _releaser_lock:
        if _releaser is None:  # none yet (a fork's hook drops the parent's: below)
            work: queue.SimpleQueue[Any] = queue.SimpleQueue()
            Background(lambda: _release_loop(work), "fastmem-release")
            _releaser = work
        return _releaser


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


def create_data_file(fd: int, size: int, dim: int, identity: tuple[str, int] | None, path: str) -> None:
    """Write a new data file's header to ``fd`` (``size`` bytes long: empty, or what an
    interrupted creation left), for vectors of ``dim`` (0: fixed later) and the embedder
    ``identity`` (name, dimension), and make it durable.

    Raises:
        CorruptionError: the file holds something that is not a fastmem data file.
        DimensionMismatchError: ``dim`` is not the embedder's.
    """
    head = os.pread(fd, size, 0)
    if head[:8] != fmt.DAT_MAGIC[: len(head[:8])]:
        raise CorruptionError(f"{path} is not a fastmem data file", path=path, offset=0)
    os.ftruncate(fd, 0)  # a creation that was interrupted: start it again
    fingerprint = bytes(4)
    if identity is not None:
        dim = dim or identity[1]
        if dim != identity[1]:
            raise DimensionMismatchError(f"dim={dim}, but the embedder makes {identity[1]}")
        fingerprint = fmt.embedder_fingerprint(*identity)
    header = fmt.pack_dat_header(os.urandom(16), dim, time.time(), embedder=fingerprint)
    os.write(fd, header)
    os.fsync(fd)
    fsync_dir(path)


def upgrade_data_file(fd: int, path: str) -> None:
    """Holding the writer lock: raise the header of the data file open as ``fd`` (opened
    with ``O_APPEND``) to ``FORMAT_VERSION``, with the same fields, and make it durable:
    before the first batch frame is written, so that a release that reads version 1 only
    refuses the file (``FormatVersionError``) instead of misreading its frames. The 64
    bytes are written in place, in the first sector (one write: a power loss leaves the
    old header or the new one, and either reads the same records)."""
    head = fmt.unpack_dat_header(os.pread(fd, fmt.DAT_HEADER_SIZE, 0), path)
    if head.version == fmt.FORMAT_VERSION:
        return
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_APPEND)  # else pwrite appends (Linux)
    try:
        if os.pwrite(fd, fmt.upgrade_dat_header(head), 0) != fmt.DAT_HEADER_SIZE:
            raise OSError(errno.EIO, "the data file's header was written in part", path)
    finally:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags)
    os.fsync(fd)
