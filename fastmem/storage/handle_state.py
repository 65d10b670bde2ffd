"""What an open handle works on, built from the store's files: the data file's map and its
index, loaded from the index file or rebuilt from the data file.

:func:`build` is the recovery at open (the index file's checks, a rebuild when it fails
them, a lone ``.idx.compact`` of a killed compaction renamed into place by a writer) and
the way a handle follows a data file replaced under its name (another process's compaction
or repair). It changes nothing of the handle: the engine adopts the :class:`State` it
returns whole (``Engine._adopt``), or lets go of it.
"""

from __future__ import annotations

import mmap
import os
import time
import warnings
from typing import Any, NamedTuple

from .. import _format as fmt
from .. import _kernels
from .recovery import COMPACT_SUFFIX, create_data_file, fsync_dir, map_same
from .index import MemoryIndex
from .fileio import map_data as map_exactly
from .fileio import release_frames
from ..errors import (
    CorruptionError,
    DimensionMismatchError,
    EmbedderMismatchError,
    FormatVersionError,
    RecoveryWarning,
    StoreNotFoundError,
)

DataMap: Any
try:
    from .._kernels._ext.reader import DataMap
except ImportError:  # not built: the numpy fallback, and mmap
    DataMap = None

# Address space a data file's map reserves past the file's end (or an eighth of the file,
# if more): the appends it holds are read without a new map (Engine._map).
_MAP_ROOM = 16 << 20

__all__ = ["State", "build", "check_embedder"]


class State(NamedTuple):
    """What a handle works on, built aside and adopted whole (see ``Engine._adopt``)."""

    fd: int  # the data file, locked by a writer
    map_fd: int  # the descriptor the map was made from (never the locked one)
    dat: mmap.mmap
    memindex: MemoryIndex
    dat_end: int
    valid_end: int
    uuid: bytes
    rebuilt: bool  # the index was rebuilt from the data file: worth a checkpoint
    version: int = fmt.FORMAT_VERSION  # the data file header's (1: raised before a batch frame)


def build(
    path: str, fd: int, dim: int | None, *, identity: tuple[str, int] | None, readonly: bool,
    locked: bool, retries: int = 3, st: os.stat_result | None = None,
) -> State:  # fmt: skip
    """Map the data file of the store ``path`` open as ``fd`` and load (or rebuild) its index.

    The caller keeps ``fd`` (a file found replaced meanwhile gives a state on a new
    descriptor, opened for writing unless ``readonly``). Only a caller that holds the writer
    lock (``locked``) may create the file; it may pass ``fd``'s stat taken under the lock
    (``st``: no writer can have changed the file since).

    Args:
        path: the store's path, without ``.dat`` / ``.idx``.
        fd: a descriptor of the data file.
        dim: the dimension the caller expects (``None``: any).
        identity: the embedder's ``(name, dim)``, checked against the header (``None``: none).
        readonly: how to open a data file found replaced meanwhile.
        locked: whether the caller holds the writer lock.
        retries: looks again at a data file a writer grew meanwhile, at most this often.
        st: ``fd``'s stat taken under the writer lock.

    Returns:
        The state to adopt (its map's descriptor and map are its own).

    Raises:
        StoreNotFoundError: the file is still being created (not ``locked``).
        DimensionMismatchError, EmbedderMismatchError: the store is another embedder's.
        CorruptionError: the data file cannot be read.
    """
    dat_path, idx_path = path + ".dat", path + ".idx"
    if st is None:
        st = os.fstat(fd)
    size = st.st_size
    created = size < fmt.DAT_HEADER_SIZE
    if created:
        if not locked:
            raise StoreNotFoundError(f"{dat_path} is still being created; try again")
        create_data_file(fd, size, dim or 0, identity, dat_path)
        size = fmt.DAT_HEADER_SIZE
    mapped = map_same(dat_path, fd, size, st)
    if mapped is None:  # replaced again since fd was opened: follow
        return _build_replaced(path, dim, identity=identity, readonly=readonly)
    map_fd, dat = mapped
    del mapped  # the map is ``dat`` alone: the failure path below lets go of it
    size = len(dat)  # less if a writer cut a failed write off meanwhile
    try:
        # The compiled parse answers for a valid header; the parser says what is wrong.
        header = _kernels.dat_header(dat, fmt.DatHeader)
        header = header or fmt.unpack_dat_header(dat, dat_path)
        check_embedder(path, header, identity)
        if locked and not os.path.exists(dat_path + COMPACT_SUFFIX):
            # (A compaction of this handle's own may be under way: then never.)
            _adopt_compacted_index(idx_path)
        # Without the lock, while a compaction's index waits under ``.idx.compact``
        # (between its renames of the data file and of the index; for ever if it was
        # killed there, until a writer takes the lock), the index file under the name
        # may be the old data file's: its check (the last record it covers, at its
        # offset, with its CRC) passes when the compaction only reordered the records,
        # and every offset it holds is the old file's (an erase then wrote over live
        # records). Not read then: the index is built from this data file. Only a lone
        # one: with ``.dat.compact`` beside it (a compaction writing its files, or killed
        # before its commit) the index under the name is this data file's (a compaction
        # renames a lone one into place before it writes its own; looked for second, so
        # that a commit in between counts as mid-swap).
        mid_swap = (
            not locked
            and os.path.exists(idx_path + COMPACT_SUFFIX)
            and not os.path.exists(dat_path + COMPACT_SUFFIX)
        )
        index: MemoryIndex | None
        try:
            if mid_swap:
                index, reason = None, None
            else:
                index = MemoryIndex.load(idx_path, header.uuid, header.dim, dat, size)
                reason = None
        except FileNotFoundError:
            index, reason = None, "it was missing"
        except (CorruptionError, FormatVersionError) as exc:
            if not locked and retries and os.fstat(fd).st_size != size:
                # A writer appended and checkpointed since the size was taken: the
                # index covers more than that size. Look again rather than rebuild.
                os.close(map_fd)
                return build(path, fd, dim, identity=identity, readonly=readonly, locked=locked,
                             retries=retries - 1)  # fmt: skip
            index, reason = None, str(exc)
        if not locked and os.fstat(fd).st_nlink == 0:
            # Replaced meanwhile (the index read may be the new file's): read the new one.
            os.close(map_fd)
            return _build_replaced(path, dim, identity=identity, readonly=readonly)
        started = time.perf_counter()
        if index is None:
            index = MemoryIndex(header.dim, header.uuid)
        index.set_compaction(header)
        _, valid_end, _ = index.replay(dat, index.applied, size, dat_path, map_fd)
        dat_end = size
        if reason is not None and not created:
            warnings.warn(
                f"fastmem rebuilt the index of {path} from its data file in "
                f"{time.perf_counter() - started:.3f} s ({len(index)} rows; {reason})",
                RecoveryWarning,
                stacklevel=6,  # the caller of fastmem.open (here, Engine._build, its open, ...)
            )
        if dim is not None:
            if index.dim and index.dim != dim:
                raise DimensionMismatchError(
                    f"{path} holds {index.dim}-dimensional vectors, not {dim}: open "
                    f"it with dim={index.dim} or the embedder that wrote it"
                )
            index.set_dim(dim)
    except BaseException as exc:
        os.close(map_fd)
        release_frames(exc)  # the map holds a descriptor of its own: see release_frames
        dat = index = None  # type: ignore[assignment]  # this frame is in the traceback too
        raise
    return State(fd, map_fd, dat, index, dat_end, valid_end, header.uuid, reason is not None,
                 header.version)  # fmt: skip


def _adopt_compacted_index(idx_path: str) -> None:
    """Holding the writer lock, no compaction under way: a lone ``.idx.compact`` is the
    index of the data file under the name, whose compaction was killed between its
    renames of the data file and of the index (the recovery rule, as at open): renamed
    into place, so that the index under the name is never the old data file's. (Looked
    for first: an open makes no rename, and no write, in the usual case.)"""
    if not os.path.exists(idx_path + COMPACT_SUFFIX):
        return
    try:
        os.replace(idx_path + COMPACT_SUFFIX, idx_path)
    except FileNotFoundError:
        return
    fsync_dir(idx_path)


def _build_replaced(
    path: str, dim: int | None, *, identity: tuple[str, int] | None, readonly: bool
) -> State:
    """:func:`build` of the data file now under the name (the one ``build`` was given was
    replaced), on a descriptor of its own."""
    fd = os.open(path + ".dat", os.O_RDONLY if readonly else os.O_RDWR | os.O_APPEND)
    try:
        state = build(path, fd, dim, identity=identity, readonly=readonly, locked=False)
    except BaseException:
        os.close(fd)
        raise
    if state.fd != fd:
        os.close(fd)  # replaced yet again before its map: the state is a newer file's
    return state


def check_embedder(path: str, header: fmt.DatHeader, identity: tuple[str, int] | None) -> None:
    """Refuse an embedder whose vectors would not compare with the stored ones.

    Args:
        path: the store's path (for the message).
        header: the data file's header.
        identity: the embedder's ``(name, dim)``; ``None`` checks nothing.

    Raises:
        DimensionMismatchError: the embedder makes vectors of another dimension.
        EmbedderMismatchError: the header names another embedder.
    """
    if identity is None:
        return
    name, dim = identity
    if header.dim and dim != header.dim:
        raise DimensionMismatchError(
            f"{path} holds {header.dim}-dimensional vectors; the embedder {name!r} "
            f"makes {dim}: open it with the embedder that wrote it, or embedder=None"
        )
    if header.embedder != bytes(4) and header.embedder != fmt.embedder_fingerprint(name, dim):
        raise EmbedderMismatchError(
            f"{path} was written by another embedder than {name!r} ({dim} dims): "
            f"its vectors would not compare; open it with the embedder that wrote it, "
            f"or embedder=None"
        )


def map_data(fd: int, size: int) -> Any:
    """A read-only map of the first ``size`` bytes of the data file open as ``fd``, with room
    past them (``DataMap``; ``mmap``, of ``size`` bytes, without the compiled kernels or if
    the system refuses the room); None when the file is shorter now (cut back since ``size``
    was taken: the caller takes the size again), as ``_io.map_data``."""
    if DataMap is None or _kernels.BACKEND != "cython":
        return map_exactly(fd, size)
    try:
        dat = DataMap(fd, size, (size + max(size >> 3, _MAP_ROOM)) & -mmap.PAGESIZE)
    except OSError:  # (a limit on maps or address space)
        return map_exactly(fd, size)
    return dat if os.fstat(fd).st_size >= size else None
