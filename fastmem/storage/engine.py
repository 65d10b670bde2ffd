"""The storage engine of one open store: its files, its lock, its index and its writes.

An :class:`Engine` owns the data file's descriptor (and the writer lock on it), the map of
the data file, the :class:`MemoryIndex`, the group commit, the cache of decoded memories
and the log of in-place changes a compaction reads. ``MemoryStore`` checks arguments and
delegates here; ``maintenance`` rewrites files through the small interface below, never
through the engine's underscore attributes:

- ``lock`` / ``maintenance_lock``, ``check()`` / ``check_writable()``;
- ``index``, ``data()``, ``dat_end``, ``valid_end``;
- ``start_change_log()`` / ``stop_change_log()``, ``note_change(row, values)``;
- ``append_tombstones(rows, now)``, ``read_since(offset)``, ``copy_descriptor()``;
- ``swap_to(fd, committed=...)`` (a new data file, built aside and swapped in whole),
  ``abandon()``.

Two rules hold every write together. Appending records and applying them to the index is
one step (``commit_memories``): whatever fails after the append cuts the file back and
reloads the index, so no id is given twice and nothing unacknowledged stays. Moving to new
files builds the new map and index first (``handle_state.build``, as the open does) and assigns
them in one block (``_adopt``): a failure leaves the handle on its old files, or, past a
compaction's commit point, closed.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import numpy as np

from .. import _format as fmt
from .. import _kernels
from . import access_counts, erase, handle_state, writelock
from . import forkexit  # noqa: F401 - its at-fork hook
from .checkpoint import Background, frozen, remove_orphans
from .recovery import (
    COMPACT_SUFFIX,
    Retired,
    fsync_dir,
    kept_batch,
    recover,
    releaser,
    remove_quietly,
    upgrade_data_file,
)
from .index import F_FLAGS, F_ID, F_META, F_OFFSET, MemoryIndex, update_changes
from .fileio import (
    ContentCache,
    GroupCommit,
    lock_holder,
    mapped_errors,
    no_cyclic_gc,
    torn,
)
from .records import (
    Batch,
    Block,
    MemoryErased,
    decode_memory,
    f32,
    frame_batch,
    frame_changes,
    parse_id,
)
from .handle_state import DataMap, State, map_data
from .._threads import Beside, at_fork, forks
from .vectors import BlockedVectors
from ..errors import (
    CorruptionError,
    DimensionMismatchError,
    DurabilityError,
    ReadOnlyError,
    RecoveryWarning,
    StoreClosedError,
    StoreForkedError,
    StoreLockedError,
    StoreNotFoundError,
    UnknownMemoryError,
)  # fmt: skip
from ..namespaces import make_private_dirs
from ..types import Memory

__all__ = ["Engine", "no_cyclic_gc"]

GROUP_COMMIT_SECONDS = 0.005  # "batch": a write reaches the disk within this long
WRITE_BESIDE_MIN = 1 << 20  # bytes of records a batch's helper thread writes (commit_memories)
# Memories a larger batch packs and writes at a time (_commit_blocks): ~2 MB of records at
# 384 dimensions, which the allocator reuses block after block. Blocks of 8,192 (~7 MB,
# fresh pages each time) cost 4x the system time in the writes (benchmarks/add_many_big.py).
PACK_BLOCK = 2048
_engines: weakref.WeakSet[Engine] = weakref.WeakSet()  # open handles, for the fork hook


def _write_all(fd: int, data: Any) -> None:
    """Write all of ``data`` at the end of the data file (``os.write`` may write a part).
    The one place the engine's appends reach the file (a test splits a batch's write here)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


@at_fork
def _after_fork_in_child() -> None:
    # A thread of the parent may have held an engine's lock at fork time; that thread does
    # not exist here, so the lock would never be released and the child would hang
    # instead of getting StoreForkedError. A fresh lock lets every call fail clearly.
    for engine in list(_engines):
        engine.lock = threading.RLock()


class Engine:
    """The files, lock, index and write path of one open store (see the module)."""

    def __init__(
        self, base: str, *, readonly: bool, durability: str, timeout: float,
        dim: int | None, identity: tuple[str, int] | None, cache_bytes: int,
    ) -> None:  # fmt: skip
        self.path = base
        self.dat_path, self.idx_path = base + ".dat", base + ".idx"
        self.readonly = readonly
        self.durability = durability
        self.timeout = timeout  # how long a write waits for another process's
        self.identity = identity
        self.lock = threading.RLock()
        self.maintenance_lock = threading.Lock()  # one compaction or repair at a time
        self.epoch = 0  # counts files or row numberings adopted: row numbers change with it
        self.cache = ContentCache(cache_bytes)
        self.closed = True
        self._changes: list[tuple[int, int, int]] | None = None  # see note_change
        self._generation = forks()  # a handle is its process's: StoreForkedError in a child
        self._commit: GroupCommit | None = None
        self._dat: mmap.mmap | None = None
        self._map_fd = -1
        self._fd = -1
        self._holds = 0  # holds of the writer lock by this handle's threads (see write_lock)
        self._holds_mutex = threading.Lock()
        self._damage_reported = -1  # the offset of damaged tail bytes already warned about
        # A failed sync (or a failed cut of a failed write): every later write raises it and
        # the handle writes nothing more; only a new open knows what reached the file.
        self.failed: DurabilityError | None = None
        self._failure_reported = False
        self._cut_pending: int | None = None  # a failed write's start, not yet cut back to
        self._background: Background | None = None  # a bulk load's checkpoint being written
        if readonly:
            self._open_for_reading(dim)
        else:
            self._open_for_writing(dim)
        self.closed = False
        _engines.add(self)

    # --- opening and swapping ---------------------------------------------------------

    def _open_for_reading(self, dim: int | None) -> None:
        releaser()  # ready before a compaction elsewhere needs it
        try:
            fd = os.open(self.dat_path, os.O_RDONLY)
        except FileNotFoundError:
            raise StoreNotFoundError(f"no fastmem store at {self.dat_path}") from None
        try:
            state = self._build(fd, dim, locked=False)
        except BaseException:
            os.close(fd)
            raise
        if state.fd != fd:
            os.close(fd)  # the file was replaced meanwhile: the state is the new one's
        self._adopt(state)

    def _open_for_writing(self, dim: int | None) -> None:
        """Under the writer lock, briefly: apply the recovery rule, create the data file if
        needed, load the index, cut an interrupted write, checkpoint a rebuilt index."""
        releaser()  # other processes may compact: this one follows, as readers do
        flags = os.O_RDWR | os.O_CREAT | os.O_APPEND
        try:  # the folder is looked at only when this fails: a restart saves its stat
            fd = os.open(self.dat_path, flags, 0o600)
        except OSError:
            parent = os.path.dirname(os.path.abspath(self.dat_path))
            if os.path.isdir(parent):
                raise  # the folder is there: the file's own error
            make_private_dirs(parent)  # a new store in a folder not made yet
            fd = os.open(self.dat_path, flags, 0o600)
        self._fd = fd
        try:
            st = self._flock()
            recover(self.dat_path, self.idx_path)
            remove_orphans(self.idx_path)
            state = self._build(self._fd, dim, locked=True, st=st)
            self._fd = -1  # adopted below, with the rest of the state
            self._adopt(state)
            self._cut_torn_tail()
            erase.finish(self)
            # An index loaded from its file (under the lock) exists: no stat for it.
            if self._rebuilt or (self.index.file is None and not os.path.exists(self.idx_path)):
                self.checkpoint()
        except BaseException:
            self.abandon()
            raise
        fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _build(
        self, fd: int, dim: int | None, *, locked: bool, st: os.stat_result | None = None
    ) -> State:
        """The state of the data file open as ``fd``, changing nothing of the handle's
        (``handle_state.build``: the index loaded or rebuilt, a replaced file followed)."""
        return handle_state.build(self.path, fd, dim, identity=self.identity, readonly=self.readonly,
                            locked=locked, st=st)  # fmt: skip

    def _adopt(self, state: State, saved: access_counts.Touches | None = None) -> Retired:
        """Continue on ``state``, all at once; returns the old files' objects to release.
        The accesses no index file holds yet go along, less ``saved`` (those this handle's
        own compaction wrote into the new index)."""
        old = getattr(self, "index", None)
        access_counts.carry(old, state.memindex, saved)
        retired = Retired([old, self._dat, self.cache], [])
        if self._fd >= 0 and self._fd != state.fd:
            retired.fds.append(self._fd)
        if self._map_fd >= 0:
            retired.fds.append(self._map_fd)
        self._fd, self._map_fd, self._dat, self.index = state.fd, state.map_fd, state.dat, state.memindex
        self.dat_end, self.valid_end, self.uuid = state.dat_end, state.valid_end, state.uuid
        self._rebuilt, self.dat_version = state.rebuilt, state.version
        self.cache = ContentCache(self.cache.max_bytes)  # rows are numbered anew
        self.epoch += 1
        return retired

    def swap_to(self, fd: int, *, committed: bool, saved: access_counts.Touches | None = None) -> Retired:
        """Continue on the data file open as ``fd`` (the one now under the store's name),
        which the engine owns from here on. The new state is built before anything is
        changed: if that fails, ``fd`` is closed and the handle stays on its old files,
        unless ``committed`` (a compaction renamed the new files into place: the old ones
        are no longer the store), in which case the handle is closed; either way the
        error is raised. ``saved``: the accesses the new index holds (see ``_adopt``).
        Returns the old files' objects, for the caller to release."""
        self._stop_commit()
        try:
            state = self._build(fd, None, locked=committed)
        except BaseException:
            os.close(fd)
            if committed:
                self.abandon()
            raise
        if state.fd != fd:
            os.close(fd)
        return self._adopt(state, saved)

    # --- the writer lock ------------------------------------------------------------------

    def _flock(self) -> os.stat_result:
        """Take the OS lock on the data file, waiting up to ``timeout``; when the file was
        replaced meanwhile (a compaction elsewhere), continue on the new one and lock it.
        Returns the locked file's stat (taken once locked: the open reads its size).
        The engine's thread lock is held only for each try, never while waiting: this
        handle's reads go on while its write waits. While it waits, the write applies what
        others append, and holds the gate (``writelock.gate``) once it has it."""
        started = time.monotonic()
        deadline = started + self.timeout
        pause = writelock.POLL_FIRST
        gate = -1  # the descriptor the gate is held on
        try:
            while True:
                with self.lock:  # the descriptor may be swapped by a reader thread otherwise
                    if self._fd < 0:
                        raise StoreClosedError(f"the store {self.path} is closed; open it again")
                    try:
                        if gate < 0 and writelock.GATE is not None and time.monotonic() - started >= writelock.GATE_AFTER:
                            if not writelock.gate(self._fd, True):
                                raise BlockingIOError
                            gate, pause = self._fd, writelock.POLL_FIRST  # next: the lock, soon
                        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        holder = lock_holder(self._fd) if time.monotonic() >= deadline else -1
                        if holder == -1 and gate < 0 and self._dat is not None and self._background is None:
                            # Catch up with what others appended while waiting, not once the
                            # lock is taken: the holder of the lock replays only the last
                            # writes. Not once next in line (holding the gate): replaying a
                            # large batch there left the lock idle, every other write waiting.
                            self.check(appending=True)
                    else:
                        st = os.fstat(self._fd)
                        if st.st_nlink:
                            return st
                        # A compaction or repair replaced the file: lock the new one.
                        fcntl.flock(self._fd, fcntl.LOCK_UN)
                        fd = os.open(self.dat_path, os.O_RDWR | os.O_APPEND)
                        if gate >= 0:
                            writelock.gate(gate, False)
                            gate = -1
                        if self._dat is None:  # opening: nothing is built on the old file yet
                            os.close(self._fd)
                            self._fd = fd
                        else:
                            self.swap_to(fd, committed=False).release(drop_cache=False)
                        continue
                if holder != -1:
                    raise StoreLockedError(
                        f"{self.dat_path} has been locked for writing for {self.timeout:g} s by "
                        f"{'another process' if holder is None else f'process {holder}'}: "
                        f"pass a longer timeout= to wait for it"
                    )
                now = time.monotonic()
                time.sleep(min(pause, max(0.0, deadline - now)))
                # Next in line (the gate): soon; else less often, then more often with age.
                pause = min(2 * pause, writelock.POLL_OLD if gate >= 0 else writelock.poll_max(now - started))
        finally:
            if gate >= 0:
                writelock.gate(gate, False)

    @contextmanager
    def write_lock(self) -> Iterator[None]:
        """Hold the writer lock (flock, so a killed process never leaves it behind) for
        one write, or for a compaction's whole run; re-entrant across this handle's
        threads, released when the last hold ends. Other processes' writes wait for it."""
        with self.failures():
            with self._holds_mutex:
                if self._holds == 0:
                    self._flock()
                self._holds += 1
            try:
                yield
            finally:
                self._release_hold()

    def _release_hold(self) -> None:
        with self._holds_mutex:
            self._holds -= 1
            # A failed write not cut back keeps the lock: no other process may apply it.
            if self._holds == 0 and self._fd >= 0 and self._cut_pending is None:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    @contextmanager
    def writing(self, appending: bool = False) -> Iterator[None]:
        """One write: the writer lock taken, the view brought up to the end of the data file
        (others' records applied first: ids stay unique), the thread lock held (see ``check``)."""
        with self.failures():
            with self.lock:
                self.check_writable(appending)  # fail fast, before waiting for the lock
            while True:
                with self.write_lock(), self.lock:
                    if not self._checkpoint_behind():
                        self.check_writable(appending)  # brings the view up to the end of the file
                        self._read_compacted_index()
                        self._cut_torn_tail()
                        erase.finish(self)
                        yield
                        return
                # Others' records to apply first, and this handle's checkpoint still being
                # written: wait for it without the lock (others write meanwhile).
                with self.lock:
                    self.check_writable(appending)

    def _read_compacted_index(self) -> None:
        """Holding the writer lock: an index built from the data file while a compaction's
        index waited under ``.idx.compact`` (``_build``) is built again from that index,
        renamed into place first when its compaction was killed between its renames (no
        compaction of this handle's own under way). Else this handle's checkpoints, erases
        and access statistics would read the old data file's index under the name, and the
        lone ``.idx.compact`` would be renamed over what they wrote at the next open."""
        index_waits = self.index.file is None and os.path.exists(self.idx_path + COMPACT_SUFFIX)
        if index_waits and not os.path.exists(self.dat_path + COMPACT_SUFFIX):
            self.reload()

    def _checkpoint_behind(self) -> bool:
        """Whether a checkpoint's thread still writes while others' records wait to be
        applied (they must be applied after it: ``check``)."""
        background = self._background
        return (
            background is not None
            and not background.done()
            and _kernels.file_size(self._fd) != self.dat_end
        )

    def failures(self, path: str | None = None) -> Any:
        """Around a public write: a file operation's ``OSError`` raised as a :class:`StoreFullError`
        or :class:`DurabilityError` naming the file (``path``, or else the data file)."""
        return mapped_errors(path or self.dat_path)

    # --- failed syncs are sticky ------------------------------------------------------------

    def _sync_failed(self, exc: OSError, path: str, what: str) -> DurabilityError:
        """Remember a failed sync (the first one) and return the error to raise."""
        code = exc.errno if exc.errno is not None else errno.EIO
        err = DurabilityError(
            code,
            f"{what} failed ({os.strerror(code)}): what was written since the last sync may "
            f"not be on the disk, and a later sync would not say so; this handle writes "
            f"nothing more: open the store again (it reads what actually reached the file)",
            path,
        )
        if self.failed is None:
            self.failed = err
            self._failure_reported = False
        return DurabilityError(code, err.strerror, path)  # raised, it keeps frames that hold the store

    def sync(self, fd: int, path: str | None = None, what: str = "fdatasync") -> None:
        """``fdatasync(fd)``; a failure is sticky (see ``DurabilityError``)."""
        try:
            os.fdatasync(fd)
        except OSError as exc:
            raise self._sync_failed(exc, path or self.dat_path, what) from exc

    def sync_dir(self, path: str) -> None:
        """The directory sync of a rename or a new file of the store; a failure is sticky."""
        try:
            fsync_dir(path)
        except OSError as exc:
            raise self._sync_failed(exc, os.path.dirname(os.path.abspath(path)), "the directory's fsync") from exc

    def _stop_commit(self) -> None:
        """Stop the group commit (its last sync), keeping its error if it had one."""
        commit, self._commit = self._commit, None
        if commit is not None:
            commit.stop()
            self._harvest(commit)

    def _harvest(self, commit: GroupCommit | None = None) -> None:
        commit = commit or self._commit
        if commit is not None and commit.error is not None and self.failed is None:
            self._sync_failed(commit.error, self.dat_path, "the background (group commit) fdatasync")

    def raise_failed(self) -> None:
        """Raise the remembered failure, if there is one (a fresh copy each time)."""
        self._harvest()
        failed = self.failed
        if failed is not None:
            self._failure_reported = True
            raise DurabilityError(failed.errno, failed.strerror, failed.filename)

    def _cut_torn_tail(self) -> None:
        """Holding the writer lock: cut an interrupted write (a process killed while
        appending, or a power loss during an unsynced append) from the end of the data file:
        nothing in it was acknowledged, so nothing is warned about. Damaged records that are
        not a torn append are kept, and reported once, for verify()."""
        if self.valid_end == self.dat_end:
            return
        size = self.dat_end
        if torn(self.data(), self.valid_end, size):
            os.ftruncate(self._fd, self.valid_end)
            self.dat_end = self.valid_end
            return
        kept = kept_batch(self.index, self.data(), size)
        if kept is not None:
            # A batch at the end damaged otherwise than by a crash (bit rot): it was
            # acknowledged, and its whole records are the store's as any others are (read
            # from past its frame; a handle without the lock keeps them too, see
            # replay.kept_last_batch).
            end = self.index.replay(self.data(), kept + fmt.BATCH_FRAME_SIZE, size, self.dat_path)[1]
            self.valid_end = max(self.valid_end, end)
        if self._damage_reported != self.valid_end:
            self._damage_reported = self.valid_end
            warnings.warn(
                f"fastmem found {size - self.valid_end} damaged bytes at the end of "
                f"{self.dat_path} (offset {self.valid_end}); they are kept, and verify() "
                f"reports them",
                RecoveryWarning,
                stacklevel=5,
            )

    # --- guards -----------------------------------------------------------------------

    def check(self, appending: bool = False) -> None:
        """Raise unless the handle may be used now, then apply the records other processes
        have appended since the last call: every call sees every write committed before it.
        On a store nobody else wrote to, one fstat. (One method, not two: it runs before
        every call, and get takes ~3 us.) Waits for a checkpoint's thread unless appending."""
        if self._generation != forks():
            raise StoreForkedError(
                f"the store {self.path} was opened before fork(); open it again in this process"
            )
        if self.closed:
            raise StoreClosedError(f"the store {self.path} is closed; open it again")
        if self._background is not None and (not appending or self._background.done()):
            self.finish_checkpoint()
        if self._cut_pending is not None and not self._retry_cut():
            return  # the file ends with a failed write: nothing past dat_end is read
        size = _kernels.file_size(self._fd)  # fstat's size, or -1: replaced by a compaction
        if self._background is not None and (size != self.dat_end or self.valid_end != size):
            self.finish_checkpoint()  # it let the lock go just now: before others' records
        if size < 0:  # or repair: open the new file
            flags = os.O_RDONLY if self.readonly else os.O_RDWR | os.O_APPEND
            self.swap_to(os.open(self.dat_path, flags), committed=False).release(drop_cache=False)
            return
        if size == self.dat_end and self.valid_end == size:
            return
        dat = self._map(size) if size >= self.valid_end else None
        if dat is None:  # a writer cut records off (a failed write), maybe just now: start again
            self._adopt(self._build(self._fd, None, locked=False)).release(drop_cache=False)
            return
        self._dat, self.dat_end = dat, size
        self.valid_end = self.index.replay(dat, self.valid_end, size, self.dat_path, self._map_fd)[1]
        if self.readonly:  # only a writer finishes erases (erase.finish)
            self.index.erase_pending.clear()

    def check_writable(self, appending: bool = False) -> None:
        self.check(appending)
        if self.readonly:
            raise ReadOnlyError(f"{self.path} was opened with readonly=True")
        self.raise_failed()

    def data(self) -> mmap.mmap:
        """The data file's map, shown further or made again when the file has grown past it."""
        assert self._dat is not None
        if len(self._dat) < self.dat_end:
            dat = self._map(self.dat_end)
            self._dat = dat or mmap.mmap(self._map_fd, self.dat_end, access=mmap.ACCESS_READ)
        return self._dat

    def _map(self, size: int) -> Any:
        """The data file's map of its first ``size`` bytes: the map there is, shown further
        when it has room for them (no system call: see ``DataMap``), else a new one with
        room past them; None when the file is shorter than ``size`` now (cut back since the
        size was taken)."""
        dat: Any = self._dat
        if type(dat) is DataMap and dat.grow(size):
            return dat
        return map_data(self._map_fd, size)

    # --- writing ------------------------------------------------------------------------

    def commit_memories(
        self, batch: Batch, vectors16: np.ndarray | BlockedVectors | None,
        change: tuple[int, dict[str, Any]] | None = None,
    ) -> list[str]:
        """Append the prepared memories as one write and apply them to the index, as one step:
        on any failure the file is cut back and the index as it was (nothing was acknowledged,
        the next ids are the same). Returns their ids. ``change``: an update record of live row
        ``g``, ``(g, payload)``, written last in the same write (``supersedes``'s link)."""
        index = self.index
        n = len(batch)
        if vectors16 is not None:
            if not index.dim:
                index.set_dim(vectors16.shape[1])
            elif vectors16.shape[1] != index.dim:  # another process set the dimension first
                raise DimensionMismatchError(
                    f"{self.path} holds {index.dim}-dimensional vectors, not {vectors16.shape[1]}"
                )
        first_id = index.next_id
        n_types = len(index.user_types)
        if n > PACK_BLOCK and change is None:  # (a link is add's: one memory)
            return self._commit_blocks(batch, vectors16, first_id, n_types)
        frame = self._batch_frame(n + (change is not None))  # (first: it may write the header)
        rows, data, lengths, crcs = frame_batch(batch, index, first_id, vectors16)
        if change is not None:
            update, _, update_crc = frame_changes(fmt.KIND_UPDATE, [change[1]])
            data += update
        if frame:
            data = frame + data
        start = self.dat_end
        rows["length"] = lengths
        rows["offset"] = start + len(frame) + np.concatenate(([0], np.cumsum(lengths[:-1], dtype=np.uint64)))
        # A large batch is written by the helper thread while this one copies its rows into the
        # tail, unread until added (Tail.stage): ~1.3 s each at 1 M, now side by side.
        writing = Beside(self._append, data) if len(data) >= WRITE_BESIDE_MIN else None
        try:
            if writing is None:
                self._append(data)
            else:
                index.stage(rows, vectors16, batch.quantized)
                writing.result()
        except BaseException:
            if writing is not None:
                writing.cancel()  # a write under way ends first; written, it is cut back
            self._unwrite(start, n_types)
            raise
        try:
            index.append(rows, vectors16, batch.texts, quantized=batch.quantized, terms=batch.terms,
                         staged=writing is not None)  # fmt: skip
            if change is None:
                index.note_applied(int(rows["offset"][-1]), int(lengths[-1]), int(crcs[-1]))
            else:
                (g, payload), at = change, start + len(data) - len(update)
                self.note_change(g, index.row(g))
                index.change(g, update_changes(index.row(g)[F_FLAGS], payload, at))
                index.note_applied(at, len(update), int(update_crc[0]))
        except BaseException:
            self._undo_append(start)
            raise
        return self._committed(first_id, n)

    def _commit_blocks(
        self, batch: Batch, vectors16: np.ndarray | BlockedVectors | None, first_id: int,
        n_types: int,
    ) -> list[str]:
        """``commit_memories`` of a batch of more than ``PACK_BLOCK`` memories: packed and
        written a block at a time, after one batch frame, under the one lock hold (readers
        take all of it or none); its packed bytes never exist whole (a million memories'
        are ~1 GB, whose fresh pages cost more system time than the packing takes). Then
        applied to the index, as one step."""
        index, n, start = self.index, len(batch), self.dat_end
        rows = np.zeros(n, dtype=fmt.INDEX_DTYPE)
        last: list[int] = []  # offset, length and CRC of the last record written

        def blocks() -> Iterator[bytes]:
            yield self._batch_frame(n)
            at = start + fmt.BATCH_FRAME_SIZE
            for lo in range(0, n, PACK_BLOCK):
                hi = min(n, lo + PACK_BLOCK)
                block, data, lengths, crcs = frame_batch(
                    Block(batch, lo, hi), index, first_id + lo, None if vectors16 is None else vectors16[lo:hi]
                )  # fmt: skip
                block["length"] = lengths
                block["offset"] = at + np.concatenate(([0], np.cumsum(lengths[:-1], dtype=np.uint64)))
                rows[lo:hi] = block
                last[:] = [int(block["offset"][-1]), int(lengths[-1]), int(crcs[-1])]
                at += len(data)
                yield data

        try:
            self._append_blocks(blocks())
        except BaseException:
            self._unwrite(start, n_types)
            raise
        try:
            index.append(rows, vectors16, batch.texts, quantized=batch.quantized, terms=batch.terms)
            index.note_applied(*last)
        except BaseException:
            self._undo_append(start)
            raise
        return self._committed(first_id, n)

    def _unwrite(self, start: int, n_types: int) -> None:
        """A batch's write failed: none of it in the file (the types it named dropped), or
        what it wrote cut back."""
        if self.dat_end == start:
            self.index.drop_types_since(n_types)
        else:
            self._undo_append(start)

    def _committed(self, first_id: int, n: int) -> list[str]:
        """A batch in the file and the index: valid to its end, a checkpoint beside at the
        tail's limit; its ids."""
        self.valid_end = self.dat_end
        if self.index.tail.n >= self.index.tail_limit():
            self._checkpoint_beside()
        return _kernels.memory_ids(first_id, n)

    def _checkpoint_beside(self) -> None:
        """At the tail's limit: checkpoint from a thread while writes go on (fastmem.storage.checkpoint);
        at twice the limit, wait for the last one first (a load's memory stays bounded)."""
        if self._background is not None and self.index.tail.n < 2 * self.index.tail_limit():
            return
        self.finish_checkpoint()  # (when one runs)
        if self.index.tail.n < self.index.tail_limit():
            return
        # Other processes' access statistics first, as every checkpoint takes them (_stats)
        access_counts.merge_from_file(self.index, self.idx_path, self.uuid, self.data(), self.dat_end)
        if sync := self.durability != "none":
            self.sync(self._fd)  # the index must never cover data that is not on disk
        self._background = Background(frozen(self.index), self.idx_path, self.data(), sync=sync,
                                      sync_dir=self.sync_dir, dat_path=self.dat_path,
                                      timeout=self.timeout)  # fmt: skip

    def finish_checkpoint(self) -> None:
        """Wait for a checkpoint's thread and continue on the file it wrote (if it is still
        the index); raise its error (nothing is lost: the index still holds every row)."""
        background, self._background = self._background, None
        if background is None:
            return
        if self._holds:  # this handle holds the writer lock: the thread would wait for it
            background.publish_locked()
        background.wait()
        if background.error is not None:
            with self.failures(self.idx_path):
                raise background.error
        new = background.adopt(self.index, self.idx_path, self.uuid, self.data(), self.dat_end)
        self.index = new if new is not None else self.index

    def _cut_back(self, start: int) -> None:
        """Cut a failed write's bytes off. When even that fails, the handle keeps the writer
        lock (no other process may apply those records) and refuses writes; the cut is
        tried again on the next call and when it closes."""
        try:
            os.ftruncate(self._fd, start)
        except OSError as exc:
            self._cut_pending = start
            if self.failed is None:
                self.failed = DurabilityError(
                    exc.errno or errno.EIO,
                    f"a failed write could not be cut off ({os.strerror(exc.errno or errno.EIO)}):"
                    f" this handle keeps the writer lock and writes nothing more; close it (the"
                    f" cut is tried again) and open the store again",
                    self.dat_path,
                )
            self.raise_failed()  # the worse news than the write's own error (its context)

    def _retry_cut(self) -> bool:
        """Try again to cut a failed write off; whether the file is whole now."""
        try:
            os.ftruncate(self._fd, self._cut_pending)  # type: ignore[arg-type]
        except OSError:
            return False
        self._cut_pending = None
        return True

    def _undo_append(self, start: int) -> None:
        """A write whose records were appended but could not be applied: cut them off and
        continue on the index as the files say (it may have been changed half-way)."""
        try:
            self._cut_pending = start
            os.ftruncate(self._fd, start)
            self._cut_pending = None
            self.dat_end = start
            self._adopt(self._build(self._fd, None, locked=True)).release(drop_cache=False)
        except BaseException:
            # Neither the file nor the index can be trusted to match now: stop here.
            self.abandon()
            raise

    def _append(self, data: bytes, durable: bool = False) -> int:
        """Append whole records; on failure (of the write, or of the sync that makes it
        durable) the file is cut back and nothing is applied: nothing was acknowledged."""
        return self._append_blocks((data,), durable)

    def _append_blocks(self, blocks: Iterable[bytes], durable: bool = False) -> int:
        """``_append`` of the bytes ``blocks`` yields, one after the other (a large batch,
        packed a block at a time); a failure in making a block cuts back what was written."""
        start = self.dat_end
        written = 0
        try:
            for data in blocks:
                _write_all(self._fd, data)
                written += len(data)
            if self.durability == "always" or (durable and self.durability == "batch"):
                self.sync(self._fd)
        except BaseException:
            self._cut_back(start)
            raise
        self.dat_end = start + written
        if self.durability == "batch":
            if self._commit is None:
                self._commit = GroupCommit(self._fd, GROUP_COMMIT_SECONDS)
            self._commit.notify()
        return start

    def _batch_frame(self, count: int) -> bytes:
        """The batch frame to write before a write of ``count`` records (none for one):
        readers then take all of them or none (docs/format.md). A version 1 data file's
        header is raised to the current version first (holding the lock)."""
        if count < 2:
            return b""
        if self.dat_version < fmt.FORMAT_VERSION:
            upgrade_data_file(self._fd, self.dat_path)
            self.dat_version = fmt.FORMAT_VERSION
        return fmt.pack_batch_frame(count)

    def append_change(self, kind: int, payload: dict[str, Any]) -> int:
        """Append one update or forget record; returns its offset."""
        data, _, crcs = frame_changes(kind, [payload])
        offset = self._append(data)
        self.index.note_applied(offset, len(data), int(crcs[0]))
        self.valid_end = self.dat_end
        return offset

    def append_tombstones(self, rows: list[int], now: float, payloads: list[Any] | None = None) -> list[str]:
        """Forget ``rows`` with one write (a tombstone each, or the forget records ``payloads``:
        an erase's, durable before they are applied, else cut off); returns their ids."""
        index = self.index
        ids = index.column("id")[rows].tolist()
        flags = index.column("flags")
        data, lengths, crcs = frame_changes(fmt.KIND_FORGET, payloads or [{"i": mid, "t": now} for mid in ids])
        frame = self._batch_frame(len(ids))
        start = self._append(frame + data if frame else data, durable=payloads is not None)
        last = start + len(frame) + int(lengths[:-1].sum())
        for g in rows:
            self.note_change(g, index.row(g))
            if not flags[g] & fmt.FLAG_FORGOTTEN:  # (an erase of a memory forgotten before)
                index.forget(g, int(flags[g]))
        index.note_applied(last, int(lengths[-1]), int(crcs[-1]))
        self.valid_end = self.dat_end
        return [f"m{mid}" for mid in ids]

    def reload(self) -> None:
        """Holding the writer lock: read the rows again from the files (an erase finished)."""
        self._adopt(self._build(self._fd, None, locked=True)).release(drop_cache=False)

    # --- the change log a compaction reads ------------------------------------------------

    def start_change_log(self) -> list[tuple[int, int, int]]:
        self._changes = []
        return self._changes

    def stop_change_log(self) -> None:
        self._changes = None

    def note_change(self, g: int, row: tuple[Any, ...]) -> None:
        """Before row ``g`` changes in place: while a compaction runs, it reads the rows
        without the lock and takes their values from before the change here."""
        if self._changes is not None:
            self._changes.append((g, row[F_FLAGS], row[F_META]))

    def read_since(self, offset: int) -> bytes:
        """The data file's bytes from ``offset`` to its end (records appended meanwhile)."""
        return os.pread(self._fd, self.dat_end - offset, offset)

    def copy_descriptor(self) -> int:
        """A descriptor of the data file of its own (the caller closes it), kept across compactions."""
        return os.dup(self._fd)

    # --- reading ------------------------------------------------------------------------

    def get(self, mid: str) -> Memory:
        """``MemoryStore.get`` (after ``check()``): in one compiled call in the plain case,
        else by ``live_row`` and ``decode``, which return the same memory or raise."""
        index = self.index
        tail = index.tail
        memory = _kernels.read_memory(mid, index.checked_rows, tail.rows, tail.n, self.data(),
                                      self.dat_end, Memory, f32)  # fmt: skip
        if memory is None:
            row = self.live_row(mid)[1]
            try:
                memory = self.decode(row, self.data(), row[F_OFFSET], self.dat_end)
            except CorruptionError as exc:
                self._erased_meanwhile(row[F_ID], exc)
        return memory

    def _erased_meanwhile(self, mid: int, exc: CorruptionError) -> NoReturn:
        """A record that failed its checks may be one another process is erasing at this
        moment (its forget record is written first): caught up, the memory is forgotten
        (``MemoryErased``, which the reads of many memories skip or make again); else the
        damage (``exc``) is raised."""
        self.check()
        row = self.index.find_row(mid)[1]
        if row is None or row[F_FLAGS] & fmt.FLAG_FORGOTTEN:
            raise MemoryErased(f"no memory has the id 'm{mid}' (forgotten)") from exc
        raise exc

    def live_row(self, mid: str) -> tuple[int, tuple[Any, ...]]:
        g, row = self.index.find_row(parse_id(mid))
        if row is None or row[F_FLAGS] & fmt.FLAG_FORGOTTEN:
            raise UnknownMemoryError(f"no memory has the id {mid!r} (never added, or forgotten)")
        return g, row

    def rows_of(self, ids: set[str]) -> set[int]:
        """The index rows of the memory ids that exist (others are left out silently)."""
        rows = set()
        for mid in ids:
            try:
                g = self.index.find(parse_id(mid))
            except UnknownMemoryError:  # not an id fastmem makes: nothing to leave out
                continue
            if g >= 0:
                rows.add(g)
        return rows

    def memory(self, g: int) -> Memory:
        row = self.index.row(g)
        try:
            return self.decode(row, self.data(), row[F_OFFSET], self.dat_end)
        except CorruptionError as exc:
            self._erased_meanwhile(row[F_ID], exc)

    def cached_memory(self, g: int) -> Memory:
        memory = self.cache.get(g)
        if memory is None:
            memory = self.memory(g)
            self.cache.put(g, memory)
        return memory

    def decode(self, row: tuple[Any, ...], buf: Any, offset: int, end: int) -> Memory:
        """The memory of ``row`` from its record at ``offset`` of ``buf`` (the data file's
        map, or the index's hot section), with its metadata update's (``decode_memory``)."""
        def update() -> Any:
            return fmt.read_record(self.data(), row[F_META], self.dat_end, self.dat_path)[1]

        return decode_memory(row, buf, offset, end, update if row[F_META] else None, self.dat_path,
                             self.idx_path, precise=buf is self._dat)  # fmt: skip

    def vector(self, row: tuple[Any, ...]) -> np.ndarray | None:
        """The stored vector of a live row (float32), or ``None`` when it has none."""
        if not row[F_FLAGS] & fmt.FLAG_HAS_VECTOR:
            return None
        buf, offset = self.data(), row[F_OFFSET]
        self.decode(row, buf, offset, self.dat_end)  # checks the record is this memory's
        return fmt.record_vector(buf, offset, self.index.dim, self.dat_path).astype(np.float32)

    def hot_recent(self, n: int) -> list[Memory] | None:
        """The ``n`` newest memories from the copy the last checkpoint kept in the index (a
        restart reads a few contiguous pages instead of a row and a record per memory);
        ``None`` when that copy cannot answer."""
        current = self.index.hot_rows()
        if current is None:
            return None
        hot, count = current
        if not (n <= count or count == self.index.live):
            return None
        memories = _kernels.read_hot(hot.rows, hot.starts, hot.records, min(n, count), Memory, f32)
        if memories is not None:  # the plain case, in one call
            return memories
        size = fmt.INDEX_DTYPE.itemsize
        records, end = hot.records, len(hot.records)
        try:
            return [
                self.decode(fmt.INDEX_ROW.unpack_from(hot.rows, i * size), records, hot.starts[i], end)
                for i in range(min(n, count))
            ]
        except CorruptionError:
            return None  # verify() reports it; the rows and the data file still answer

    # --- durability and closing ---------------------------------------------------------

    def flush(self) -> None:
        if not self.readonly:
            self.raise_failed()  # the group commit's: its sync consumed the kernel's report
            with self.failures():
                self.sync(self._fd)

    def checkpoint(self, full: bool = False) -> None:
        """Write the index file (atomically) and continue from it; ``full``: never a delta."""
        self.finish_checkpoint()
        access_counts.merge_from_file(self.index, self.idx_path, self.uuid, self.data(), self.dat_end)
        sync = self.durability != "none"
        if sync:
            self.sync(self._fd)  # the index must never cover data that is not on disk
        with self.failures(self.idx_path):
            try:
                # A delta when the index file can take one (what changed since the full
                # checkpoint, appended); else the whole index, written aside and renamed.
                if full or not self.index.save_delta(self.idx_path, self.data(), sync=sync):
                    self.index.save(self.idx_path, self.data(), sync=sync)
            except BaseException:
                remove_quietly(self.idx_path + ".tmp")  # on a full disk it holds the space
                raise
        if sync:
            self.sync_dir(self.idx_path)  # the rename itself must survive a power loss
        # Continue from the file just written: the tail's memory is released.
        self.index = MemoryIndex.load(self.idx_path, self.uuid, self.index.dim, self.data(), self.dat_end)

    def needs_checkpoint(self) -> bool:
        """Whether closing should write the index: records it does not cover (this
        process's or others'), access statistics (they live only there), or keyword
        postings built for an index that lacked them."""
        index = self.index
        return not self.readonly and (
            index.applied != index.covered or index.stats_changed or index.keyword.built_unsaved
        )

    def close(self, before: Callable[[], Any] | None = None) -> None:
        """Make everything durable, checkpoint when something changed, close the files;
        idempotent. ``before()`` runs first, as a write (the store's eviction policy)."""
        with self.lock:
            if self.closed or self._generation != forks():
                self.closed = True
                return
        try:
            if not self.readonly:
                with self.failures():
                    self._close_writer(before)
        finally:
            with self.lock:
                self.abandon()

    def _close_writer(self, before: Callable[[], Any] | None) -> None:
        self._stop_commit()  # its last sync: every write so far is on disk
        if self.failed is not None and self._failure_reported:
            return  # a caller was told; the next open reads what reached the file
        try:
            with self.writing():
                if before is not None:
                    before()
                if self.needs_checkpoint():
                    self.checkpoint()
        except StoreLockedError:
            # Another process held the lock for the whole timeout. Nothing is lost: the
            # records are on disk, and the next open replays what the index file lacks.
            pass

    def collected(self) -> None:
        """The store was collected unclosed: let go of the files and lock (see abandon)."""
        if not self.closed and self._generation == forks():
            warnings.warn(f"the fastmem store {self.path} was not closed: released when collected", ResourceWarning, 2)
            self.abandon()

    def abandon(self) -> None:
        """Close the handle without a checkpoint (its files are no longer the store, or can
        no longer be trusted to match its state); the next open recovers from the files."""
        self.closed = True
        self._stop_commit()
        if self._background is not None:  # nothing published or adopted
            self._background.discard()
            self._background.wait()
            self._background = None
        if self._cut_pending is not None and self._fd >= 0:
            self._retry_cut()  # best effort: the lock goes with the descriptor below
        self._dat = None
        self.index = None  # type: ignore[assignment]
        if self._map_fd >= 0:
            os.close(self._map_fd)
            self._map_fd = -1
        if self._fd >= 0:
            os.close(self._fd)  # releases the writer lock
            self._fd = -1

