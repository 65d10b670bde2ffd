"""A bulk load's checkpoints, written by a thread while the load goes on.

When the rows added since the last checkpoint reach ``MemoryIndex.tail_limit()`` during a
write, the engine (``Engine.commit_memories``) does not write the index itself: it makes
the data file durable, freezes a copy of the index as it is (:func:`frozen`: the base is
shared, the tail's rows so far are views, the postings so far shared runs) and starts a
:class:`Background` thread that writes it as a full checkpoint (``MemoryIndex.save``: the
whole index aside, fsynced, renamed over the ``.idx`` file, the directory synced). The
writes go on meanwhile: they only append rows past the frozen ones, which the thread never
reads. The numpy and file work of a checkpoint releases the GIL, so on a machine with a
free core the load does not wait for it (~1.2 µs per memory at 1 M memories).

What keeps it safe:

- **Durability.** The data file is synced before the copy is frozen, as for every
  checkpoint: the index never covers records that are not on disk. The index file is
  replaced whole by a rename, as before; a crash at any point leaves the old index or the
  new one, each consistent with the data file (the next open replays what it lacks).
- **Other processes.** The thread holds the engine's writer lock (a hold, as a write
  does) until the file is renamed and synced: no other process writes or checkpoints
  meanwhile, as when the checkpoint was written in the write itself.
- **This process.** Only appends may run beside the thread. Every other call (a read, a
  forget, an update, a search that counts accesses, close) and the replay of other
  processes' records first wait for it and continue on the file it wrote
  (``Engine.finish_checkpoint``): nothing changes a frozen row in place.
- **Continuing on the new file.** :meth:`Background.adopt` loads the file the thread
  wrote and moves the rows added since the freeze into it as its tail; it gives up (the
  engine keeps its index, which still holds every row) when the file under the name is no
  longer that one, or covers other records than the frozen copy did.
"""

from __future__ import annotations

import copy
import os
import threading
from collections.abc import Callable
from typing import Any

from ._index import MemoryIndex
from .errors import CorruptionError, FormatVersionError

__all__ = ["Background", "frozen"]


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
    """One checkpoint of a frozen index, written by a thread (see the module)."""

    def __init__(
        self, index: MemoryIndex, path: str, dat: Any, *, sync: bool,
        sync_dir: Callable[[str], None], release: Callable[[], None],
    ) -> None:  # fmt: skip
        self.index = index  # frozen
        self.error: BaseException | None = None
        self._written: tuple[int, int] | None = None  # (device, inode) of the file written
        self._done = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(path, dat, sync, sync_dir, release),
            name="fastmem-checkpoint", daemon=True,
        )  # fmt: skip
        self._thread.start()

    def _run(
        self, path: str, dat: Any, sync: bool, sync_dir: Callable[[str], None],
        release: Callable[[], None],
    ) -> None:  # fmt: skip
        try:
            try:
                self.index.save(path, dat, sync=sync)
            except BaseException:
                try:
                    os.remove(path + ".tmp")  # on a full disk it holds the space
                except OSError:
                    pass
                raise
            st = os.stat(path)  # still under the writer lock: the file just renamed
            self._written = (st.st_dev, st.st_ino)
            if sync:
                sync_dir(path)  # the rename itself must survive a power loss
        except BaseException as exc:  # noqa: BLE001 - raised by the call that waits for it
            self.error = exc
        finally:
            self._done.set()  # before the lock is let go: see Engine.check
            release()

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
        other records, after the lock was let go): ``current`` is then still the index."""
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
            # Last, as it moves current's rows: the arrays' pages are written already (fastmem._tail)
            new.tail.take(current.tail, k)
        elif n > k:  # room for the tail's life, as MemoryIndex.append reserves it
            new.tail.append(
                current.tail.rows[k:n], current.tail.vectors[k:n], 2 * new.tail_limit() + n
            )
        return new
