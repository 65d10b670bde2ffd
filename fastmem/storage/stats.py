"""A store's figures for operators, read from the index's columns (no record is decoded):
what ``MemoryStore.stats()``, ``largest()`` and ``info()`` return, and so what
``fastmem stats``/``inspect`` print and the MCP server's stats resource serves."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .. import _format as fmt
from .. import _kernels
from .engine import Engine
from .index import (
    F_ACCESS, F_FLAGS, F_LAST_ACCESS, F_LENGTH, F_OFFSET, F_SUMMARY_TOKENS, F_TEXT_TOKENS, MemoryIndex,
)  # fmt: skip
from ..errors import InvalidInputError, UnknownMemoryError
from ..types import RecordInfo, RecordSize, StoreStats


def _live_columns(index: MemoryIndex, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    live = (index.column("flags") & fmt.FLAG_FORGOTTEN) == 0
    return {name: index.column(name)[live] for name in names}


def stats(engine: Engine) -> StoreStats:
    """See ``MemoryStore.stats``; the caller holds the engine's lock."""
    index = engine.index
    cols = _live_columns(index, ("type", "flags", "session", "timestamp", "text_tokens"))
    codes, counts = np.unique(cols["type"], return_counts=True)
    types = {index.type_name(c): n for c, n in zip(codes.tolist(), counts.tolist())}
    known = cols["text_tokens"][cols["text_tokens"] != fmt.UNKNOWN_TOKENS]
    ts, sessions, flags = cols["timestamp"], cols["session"], cols["flags"]
    return StoreStats(
        path=engine.path,
        memories=int(index.live),
        forgotten=int(len(index) - index.live),
        pinned=int(np.count_nonzero(flags & fmt.FLAG_PINNED)),
        with_vector=int(np.count_nonzero(flags & fmt.FLAG_HAS_VECTOR)),
        dim=int(index.dim),
        types=dict(sorted(types.items(), key=lambda kv: (-kv[1], kv[0]))),
        sessions=int(len(np.unique(sessions[sessions != 0]))),
        oldest=float(ts.min()) if len(ts) else None,
        newest=float(ts.max()) if len(ts) else None,
        text_tokens=int(known.sum(dtype=np.int64)),
        dat_bytes=os.path.getsize(engine.dat_path),
        idx_bytes=os.path.getsize(engine.idx_path) if os.path.exists(engine.idx_path) else 0,
        backend=_kernels.BACKEND,
        format_version=_dat_version(engine.dat_path),
    )


def _dat_version(path: str) -> int:
    """The data file header's version: a version 1 file stays 1 until a batch is written to
    it, by this process or another (what this release writes is ``FORMAT_VERSION``)."""
    with open(path, "rb") as f:
        return fmt.unpack_dat_header(f.read(fmt.DAT_HEADER_SIZE), path).version


def sessions(engine: Engine, n: int | None) -> dict[str, int]:
    """See ``MemoryStore.sessions``; the caller holds the engine's lock. The index keeps a
    64-bit hash of each session's name: the hashes are counted from its rows, and each
    session's name is read from its newest memory (one record for each session returned).

    Raises:
        InvalidInputError: ``n`` is not an int >= 0 or None.
    """
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
        raise InvalidInputError(f"n must be an int >= 0 or None, got {n!r}")
    segs = engine.index.segments()  # views of the rows, base then tail: id order
    found = _newest_sessions(segs, n) if n is not None and n <= WALK_SESSIONS else None
    if found is None:
        found = _all_sessions(segs)[:n]
    out: dict[str, int] = {}
    for mid, count in found:
        try:
            name = engine.get(f"m{mid}").session
        except UnknownMemoryError:  # erased by another process's forget just now
            continue
        if name is not None:  # two names, one hash: summed under the newest one's name
            out[name] = out.get(name, 0) + count
    return out


# A few sessions (the overview's) are found by walking back from the newest rows, at most
# this many rows, then counted one by one: no sort of the whole column (tens of ms at 1M).
WALK_SESSIONS = 16
WALK_ROWS = 1 << 16
WALK_CHUNK = 4096

Segments = list[tuple[int, np.ndarray, np.ndarray]]


def _live_named(rows: np.ndarray) -> np.ndarray:
    return (rows["session"] != 0) & (rows["flags"] & fmt.FLAG_FORGOTTEN == 0)


def _newest_sessions(segs: Segments, n: int) -> list[tuple[int, int]] | None:
    """(newest memory's id, count) of the ``n`` sessions with the newest memories, newest
    first; ``None`` when ``WALK_ROWS`` rows do not hold ``n`` sessions and rows are left
    (the caller sorts the whole column)."""
    seen: dict[int, int] = {}  # hash: its newest id
    walked = 0
    for _, seg, _ in reversed(segs):
        end = len(seg)
        while end > 0 and len(seen) < n:
            if walked >= WALK_ROWS:
                return None
            start = max(0, end - WALK_CHUNK)
            part = seg[start:end]
            live = _live_named(part)
            hashes, ids = part["session"][live].tolist(), part["id"][live].tolist()
            for j in range(len(hashes) - 1, -1, -1):
                if hashes[j] not in seen:
                    seen[hashes[j]] = ids[j]
                    if len(seen) == n:
                        break
            walked, end = walked + end - start, start
    if not seen:
        return []
    counts = dict.fromkeys(seen, 0)
    for _, seg, _ in segs:
        col = seg["session"][_live_named(seg)]  # one copy, then a comparison per session
        for h in counts:
            counts[h] += int(np.count_nonzero(col == h))
    return [(mid, counts[h]) for h, mid in seen.items()]


def _all_sessions(segs: Segments) -> list[tuple[int, int]]:
    """(newest memory's id, count) of every session, newest first."""
    live = [_live_named(seg) for _, seg, _ in segs]
    hashes = np.concatenate([seg["session"][k] for (_, seg, _), k in zip(segs, live)] or [[]])
    ids = np.concatenate([seg["id"][k] for (_, seg, _), k in zip(segs, live)] or [[]])
    if not len(hashes):
        return []
    # A stable sort by hash keeps each session's rows in id order: the last row of each run
    # is the session's newest memory. No np.unique (its first call imports numpy.ma).
    order = np.argsort(hashes, kind="stable")
    runs = hashes[order]
    ends = np.flatnonzero(np.append(runs[1:] != runs[:-1], True))
    counts = np.diff(np.append(-1, ends))
    newest = ids[order[ends]]
    by_newest = np.argsort(newest)[::-1]
    return list(zip(newest[by_newest].tolist(), counts[by_newest].tolist()))


def largest(index: MemoryIndex, n: int) -> list[RecordSize]:
    """See ``MemoryStore.largest``."""
    cols = _live_columns(index, ("id", "length", "text_tokens"))
    order = np.lexsort((cols["id"], -cols["length"].astype(np.int64)))[:n]
    return [
        RecordSize(f"m{int(cols['id'][i])}", int(cols["length"][i]), int(cols["text_tokens"][i]))
        for i in order.tolist()
    ]


def record_info(row: tuple[Any, ...], importance_score: float) -> RecordInfo:
    """See ``MemoryStore.info``: a live row and its importance score."""
    known = row[F_TEXT_TOKENS] != fmt.UNKNOWN_TOKENS
    return RecordInfo(
        record_offset=int(row[F_OFFSET]),
        record_bytes=int(row[F_LENGTH]),
        text_tokens=int(row[F_TEXT_TOKENS]) if known else None,
        summary_tokens=int(row[F_SUMMARY_TOKENS]) if known else None,
        has_vector=bool(row[F_FLAGS] & fmt.FLAG_HAS_VECTOR),
        access_count=int(row[F_ACCESS]),
        last_access=float(row[F_LAST_ACCESS]) or None,
        importance_score=importance_score,
    )
