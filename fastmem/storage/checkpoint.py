"""A bulk load's checkpoints, written by a thread while the load goes on, and published
under the writer lock only for the moment of the rename.

When the rows added since the last checkpoint reach ``MemoryIndex.tail_limit()`` during a
write, the engine (``Engine.commit_memories``) does not write the index itself: it makes
the data file durable, freezes a copy of the index as it is (:func:`frozen`: the base is
shared, the tail's rows so far are views, the postings so far shared runs) and starts a
:class:`Background` thread that writes it as a full checkpoint (``MemoryIndex.save``) to a
file of its own beside the index (``<store>.idx.<pid>-<n>.tmp``), fsynced. The writes go
on meanwhile: they only append rows past the frozen ones, which the thread never reads.
The numpy and file work of a checkpoint releases the GIL, so on a machine with a free core
the load does not wait for it (~1.2 µs per memory at 1 M memories).

The writer lock is not held while the file is written (hundreds of milliseconds at a few
hundred thousand memories: every other process's writes waited for it). Once written, the
file is **published**: under the writer lock, renamed over the ``.idx`` file and the
directory synced, when nothing another process did since the freeze makes it wrong:

- the data file is still the store's (no compaction or repair replaced it);
- the index file under the name is the one the freeze saw (same inode, size and time: no
  other checkpoint, delta or erase rewrote it);
- no forget record was appended since the freeze (an erase overwrites the forgotten
  memory's records in place; the frozen copy may still hold its row, vector and terms).

Otherwise the file is removed (discarded): nothing is lost, the engine keeps its index,
which holds every row, and checkpoints again at its next write. The thread takes the lock
itself, on a descriptor of its own (``flock`` is held per open file, so it excludes this
process's own writes too), polling as writes do; when this handle holds the lock already
and needs the checkpoint finished, it publishes it there instead (the thread would wait
for it). A thread that cannot get the lock within the store's timeout discards its file.

What keeps it safe:

- **Durability.** The data file is synced before the copy is frozen, as for every
  checkpoint: the index never covers records that are not on disk. The index file is
  replaced whole by a rename, as before; a crash at any point leaves the old index or the
  new one, each consistent with the data file (the next open replays what it lacks), and
  perhaps a file aside, which the next writer's open removes once its process is gone
  (:func:`remove_orphans`).
- **This process.** Only appends may run beside the thread. Every other call (a read, a
  forget, an update, a search that counts accesses, close) and the replay of other
  processes' records first wait for it and continue on the file it published
  (``Engine.finish_checkpoint``): nothing changes a frozen row in place. A write that
  finds others' records to apply while the thread still writes lets the writer lock go
  before it waits (``Engine.writing``): no process waits for the checkpoint's write.
- **Access statistics.** The engine merges other processes' counts into the index before
  it freezes the copy, as every checkpoint does (``fastmem.storage.access_counts``). A file published and
  replaced by another process before this one adopts it held this process's accesses: the
  other process merged them, so they stop being this process's own (:meth:`Background.adopt`).
- **Continuing on the new file.** :meth:`Background.adopt` loads the file published and
  moves the rows added since the freeze into it as its tail; it gives up (the engine keeps
  its index, which still holds every row) when the file under the name is no longer that
  one, or covers other records than the frozen copy did.
"""

from __future__ import annotations

import copy
import fcntl
import itertools
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import _format as fmt
from .index import MemoryIndex
from .replay import scan_file
from ..errors import CorruptionError, FormatVersionError

__all__ = ["Background", "frozen", "remove_orphans"]

_numbers = itertools.count()  # the files aside of one process's checkpoints: one name each
_POLL_FIRST, _POLL_MAX = 0.00005, 0.002  # seconds between the thread's tries for the lock


def _aside_name(path: str) -> str:
    return f"{path}.{os.getpid()}-{next(_numbers)}.tmp"


def remove_orphans(path: str) -> None:
    """Holding the writer lock: remove the files aside that checkpoints of processes no
    longer running left beside the index ``path`` (killed before they published)."""
    import glob  # here, where a writer opens: not a cost of every import

    for name in glob.glob(glob.escape(path) + ".*-*.tmp"):
        pid = name[len(path) + 1 :].partition("-")[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            try:
                os.remove(name)
            except OSError:
                pass
        except OSError:  # another user's process: running
            pass


def _identity(path: str) -> tuple[int, int, int, int] | None:
    """What tells one index file under ``path`` from another, or None: there is none."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def frozen(index: MemoryIndex) -> MemoryIndex:
    """A copy of ``index`` that a thread can write as a checkpoint while rows are appended
    to ``index`` (and nothing else changes it): its own tail of views of the rows so far,
    its own postings' runs and lists, the base shared."""
    index.base_rows  # noqa: B018 - a loaded delta's changed rows applied, here, not in the thread
    copied = copy.copy(index)
    tail = copied.tail = copy.copy(index.tail)
    tail.rows, tail.vectors = index.tail.rows[: tail.n], index.tail.vectors[: tail.n]
    copied.keyword = index.keyword.frozen()
    copied.user_types, copied.type_codes = list(index.user_types), dict(index.type_codes)
    copied.dirty, copied.damaged = set(index.dirty), list(index.damaged)
    return copied


class Background:
    """One checkpoint of a frozen index, written by a thread aside and published under the
    writer lock (see the module). Created by the engine while it holds the writer lock."""

    def __init__(
        self, index: MemoryIndex, path: str, dat: Any, *, sync: bool,
        sync_dir: Callable[[str], None], dat_path: str, timeout: float,
    ) -> None:  # fmt: skip
        self.index = index  # frozen
        self.error: BaseException | None = None
        self._written: tuple[int, int] | None = None  # (device, inode) of the file published
        self._path, self._aside, self._sync, self._sync_dir = path, _aside_name(path), sync, sync_dir
        # What the publication compares with (taken under the writer lock, as the freeze):
        # the index file as it is, and the data file's records from the frozen end on, read
        # through a descriptor of the thread's own, which also takes the lock.
        self._seen = _identity(path)
        self._from = index.applied
        self._fd = os.open(dat_path, os.O_RDONLY)
        self._decided = False  # published or discarded: once, by whoever holds the lock
        self._mutex = threading.Lock()
        self._saved = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(dat, timeout), name="fastmem-checkpoint", daemon=True
        )
        self._thread.start()

    def _run(self, dat: Any, timeout: float) -> None:
        try:
            try:
                self.index.save(self._path, dat, sync=self._sync, aside=self._aside)
            except BaseException:
                self._remove_aside()  # on a full disk it holds the space
                raise
            self._saved.set()
            self._publish_when_locked(timeout)
        except BaseException as exc:  # noqa: BLE001 - raised by the call that waits for it
            self.error = exc
        finally:
            self._saved.set()
            self._done.set()
            os.close(self._fd)

    def _publish_when_locked(self, timeout: float) -> None:
        """Take the writer lock (polling, as writes do) and publish; give up after ``timeout``."""
        deadline = time.monotonic() + timeout
        pause = _POLL_FIRST
        while True:
            with self._mutex:
                if self._decided:  # published by the handle, or discarded (then removed here)
                    self._remove_aside()
                    return
                try:
                    fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        self._decide(False)
                        return
                else:
                    try:
                        self._decide(True)
                    finally:
                        fcntl.flock(self._fd, fcntl.LOCK_UN)
                    return
            time.sleep(pause)
            pause = min(2 * pause, _POLL_MAX)

    def publish_locked(self) -> None:
        """The handle that started it holds the writer lock: wait for the file, publish it
        here (unless the thread did); an error is kept for :meth:`wait`'s caller."""
        self._saved.wait()
        with self._mutex:
            if self._decided or self.error is not None:
                return
            try:
                self._decide(True)
            except BaseException as exc:  # noqa: BLE001 - raised by the call that waits for it
                self.error = exc

    def discard(self) -> None:
        """Publish nothing (the handle is closing without it); the thread removes its file."""
        with self._mutex:
            self._decided = True  # the thread removes the file (or has, or never wrote it)

    def _decide(self, locked: bool) -> None:
        """Under ``_mutex``: rename the file over the index when the lock is held and the
        file is still right (see the module), else remove it."""
        self._decided = True
        if not (locked and self._still_right()):
            self._remove_aside()
            return
        try:
            os.replace(self._aside, self._path)
        except BaseException:
            self._remove_aside()
            raise
        st = os.stat(self._path)
        self._written = (st.st_dev, st.st_ino)
        if self._sync:
            self._sync_dir(self._path)  # the rename itself must survive a power loss

    def _still_right(self) -> bool:
        st = os.fstat(self._fd)
        if st.st_nlink == 0 or _identity(self._path) != self._seen:
            return False  # a compaction or repair; another checkpoint, a delta or an erase
        if st.st_size > self._from:
            kinds = scan_file(self._fd, self._from, st.st_size)[2]
            if (kinds == fmt.KIND_FORGET).any():
                return False  # may be an erase: the frozen copy may hold what it erased
        return True

    def _remove_aside(self) -> None:
        try:
            os.remove(self._aside)
        except OSError:
            pass

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self) -> None:
        self._thread.join()

    def adopt(
        self, current: MemoryIndex, path: str, uuid: bytes, dat: Any, dat_end: int
    ) -> MemoryIndex | None:
        """The index loaded from the file written, with the rows ``current`` holds past the
        frozen ones as its tail; ``None`` when that file is no longer the one under
        ``path`` as written (another process replaced it, or appended a delta covering
        other records, after the lock was let go): ``current`` is then still the index, and
        when the file was published, its accesses are no longer its own to add (below)."""
        new = self._adoptable(current, path, uuid, dat, dat_end)
        if new is None and self._written is not None:
            # Published: the file held ``current``'s accesses (reads wait for the thread,
            # so none came after the freeze), and whoever replaced it merged them from it.
            # Kept as touches, the next checkpoint would add them to that file's once more.
            current.touches.clear()
        return new

    def _adoptable(
        self, current: MemoryIndex, path: str, uuid: bytes, dat: Any, dat_end: int
    ) -> MemoryIndex | None:
        old = self.index
        first = len(old)
        if self._written is None or current.applied < old.applied or current.n_base > first:
            return None
        try:
            new = MemoryIndex.load(path, uuid, current.dim, dat, dat_end)
        except (OSError, CorruptionError, FormatVersionError):
            return None
        f = new.file
        if (
            f is None
            or (f.dev, f.ino) != self._written
            or new.covered != old.applied
            or len(new) != first
        ):
            return None
        k, n = first - current.n_base, current.tail.n
        new.keyword.continue_from(current.keyword, first)
        new.live, new.next_id, new.stats_changed = (
            current.live,
            current.next_id,
            current.stats_changed,
        )
        new.applied, new.last_offset, new.last_crc = (
            current.applied,
            current.last_offset,
            current.last_crc,
        )
        for name in current.user_types[len(new.user_types) :]:
            new.type_code(name, create=True)
        new.damaged = list(current.damaged)
        new.compacted_end, new.id_floor = current.compacted_end, current.id_floor
        if not current.tail.saved and current.tail.dim == new.tail.dim:
            # Last, as it moves current's rows: the arrays' pages are written already (fastmem.storage.index_tail)
            new.tail.take(current.tail, k)
        elif n > k:  # room for the tail's life, as MemoryIndex.append reserves it
            new.tail.append(
                current.tail.rows[k:n], current.tail.vectors[k:n], 2 * new.tail_limit() + n
            )
        return new
