"""Access statistics of several processes, added up at a checkpoint.

Counts and last-access times live only in the index. Each process counts its own accesses
that no index file holds yet (``MemoryIndex.touches``: since it loaded the file, or since a
file it wrote); a checkpoint over a file another process wrote since then takes that
file's statistics and adds its own (:func:`merge`), so no process's checkpoint overwrites
another's. Every write of the index file merges first: a checkpoint, the one a thread writes
during a bulk load (merged before its copy is frozen), and a compaction's (before its
snapshot). A handle that moves to an index it did not write (another process's compaction
followed, a rebuild, a reload) takes its accesses along (:func:`carry`).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .index import MemoryIndex
from ..errors import CorruptionError, FormatVersionError

__all__ = ["Touches", "carry", "merge", "merge_from_file"]

# A process's accesses that no index file holds yet: id -> (count, last access)
Touches = dict[int, tuple[int, float]]


def merge_from_file(index: MemoryIndex, path: str, uuid: bytes, dat: Any, dat_end: int) -> None:
    """Before a checkpoint (the writer lock held): when the index file at ``path`` is not the
    one ``index`` was loaded from (another process checkpointed since: another inode, or a
    delta appended), add its statistics and ``index``'s own accesses up (:func:`merge`)."""
    loaded = index.file
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    here = (st.st_dev, st.st_ino, st.st_size)
    if loaded is not None and here == (loaded.dev, loaded.ino, loaded.size):
        return  # the file it loaded: its statistics are in this index already
    try:
        disk = MemoryIndex.load(path, uuid, index.dim, dat, dat_end)
    except (CorruptionError, FormatVersionError, OSError):
        return  # nothing to take from a file a rebuild replaces
    try:
        merge(index, disk)
    finally:
        if disk.file_closer is not None:
            disk.file_closer()


def merge(index: MemoryIndex, disk: MemoryIndex) -> None:
    """Take the access statistics of ``disk`` (the index file as other processes'
    checkpoints left it since this index was loaded) and add this process's accesses
    since (``touches``): counts add up, the last access is the later one. Rows that
    ``disk`` does not hold keep their own."""
    if not len(index) or not len(disk):
        return
    ids, theirs = index.column("id"), disk.column("id")
    at = np.minimum(np.searchsorted(theirs, ids), len(theirs) - 1)
    found = theirs[at] == ids
    count = disk.column("access_count")[at].astype(np.int64)
    last = disk.column("last_access")[at]
    if index.touches:
        mine = np.fromiter(index.touches, dtype=np.uint64, count=len(index.touches))
        values = list(index.touches.values())
        where = np.minimum(np.searchsorted(ids, mine), len(ids) - 1)
        ok = ids[where] == mine
        count[where[ok]] += np.array([v[0] for v in values], dtype=np.int64)[ok]
        last[where[ok]] = np.maximum(last[where[ok]], np.array([v[1] for v in values])[ok])
    count = np.minimum(count, 0xFFFFFFFF)
    nb = index.n_base
    for seg, lo in ((index.base_rows, 0), (index.tail.rows[: index.tail.n], nb)):
        part = slice(lo, lo + len(seg))
        take = found[part]
        new_count = np.where(take, count[part], seg["access_count"]).astype(np.uint32)
        new_last = np.where(take, last[part], seg["last_access"])
        differs = (new_count != seg["access_count"]) | (new_last != seg["last_access"])
        changed = np.nonzero(differs)[0]
        if len(changed):
            seg["access_count"][changed] = new_count[changed]
            seg["last_access"][changed] = new_last[changed]
            if lo == 0:
                index.dirty.update(changed.tolist())
            index.stats_changed = True


def carry(old: MemoryIndex | None, new: MemoryIndex, saved: Touches | None = None) -> None:
    """Add the accesses ``old`` counted that no index file holds yet (its ``touches``) to
    ``new``, an index the handle continues on that was loaded or built without them (another
    process's compaction followed, a rebuild from the data file): its rows' counts add up,
    the last access is the later one, and ``new`` keeps them as its own ``touches`` for the
    next checkpoint's merge. Ids ``new`` does not hold (compacted away) are left out.
    ``saved``: ``old``'s touches as this handle's compaction read them into ``new``; only
    the accesses counted since go along."""
    if old is None or old is new or not old.touches:
        return
    saved = saved or {}
    nb = new.n_base
    for mid, (count, last) in old.touches.items():
        count -= saved.get(mid, (0, 0.0))[0]
        g = new.find(mid) if count > 0 else -1
        if g < 0:
            continue
        seg, i = (new.base_rows, g) if g < nb else (new.tail.rows, g - nb)
        seg["access_count"][i] = min(int(seg["access_count"][i]) + count, 0xFFFFFFFF)
        seg["last_access"][i] = max(float(seg["last_access"][i]), last)
        if g < nb:
            new.dirty.add(g)
        had, at = new.touches.get(mid, (0, 0.0))
        new.touches[mid] = (had + count, max(at, last))
        new.stats_changed = True
