"""Access statistics of several processes, added up at a checkpoint.

Counts and last-access times live only in the index. Each process counts its own accesses
since it loaded the index file (``MemoryIndex.touches``); a checkpoint over a file another
process wrote since then takes that file's statistics and adds its own (:func:`merge`), so
no process's checkpoint overwrites another's.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ._index import MemoryIndex
from .errors import CorruptionError, FormatVersionError

__all__ = ["merge", "merge_from_file"]


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
