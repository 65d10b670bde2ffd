"""A store's figures for operators: what ``fastmem stats`` prints and the MCP server's
stats resource serves. Read from the index's columns (no record is decoded), so it costs
milliseconds even at a million memories."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from . import _format as fmt
from . import _kernels
from .store import MemoryStore

__all__ = ["store_stats", "largest", "record_info"]


def _live_columns(store: MemoryStore, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    index = store._index
    flags = index.column("flags")
    live = (flags & fmt.FLAG_FORGOTTEN) == 0
    return {name: index.column(name)[live] for name in names}


def store_stats(store: MemoryStore) -> dict[str, Any]:
    """A JSON-able dict of the store's figures: counts by type, pins, sessions, time span,
    tokens, vectors and file sizes."""
    with store._lock:
        store._check()
        index = store._index
        cols = _live_columns(store, ("type", "flags", "session", "timestamp", "text_tokens"))
        types: dict[str, int] = {}
        codes, counts = np.unique(cols["type"], return_counts=True)
        for code, count in zip(codes.tolist(), counts.tolist()):
            types[index.type_name(code)] = count
        known = cols["text_tokens"][cols["text_tokens"] != fmt.UNKNOWN_TOKENS]
        ts = cols["timestamp"]
        sessions = cols["session"]
        dat = os.path.getsize(store.dat_path)
        idx = os.path.getsize(store.idx_path) if os.path.exists(store.idx_path) else 0
        return {
            "path": store.path,
            "memories": int(index.live),
            "forgotten": int(len(index) - index.live),  # tombstoned, until compact()
            "pinned": int(np.count_nonzero(cols["flags"] & fmt.FLAG_PINNED)),
            "with_vector": int(np.count_nonzero(cols["flags"] & fmt.FLAG_HAS_VECTOR)),
            "dim": int(index.dim),
            "types": dict(sorted(types.items(), key=lambda kv: (-kv[1], kv[0]))),
            "sessions": int(len(np.unique(sessions[sessions != 0]))),
            "oldest": float(ts.min()) if len(ts) else None,
            "newest": float(ts.max()) if len(ts) else None,
            "text_tokens": int(known.sum(dtype=np.int64)),
            "dat_bytes": dat,
            "idx_bytes": idx,
            "backend": _kernels.BACKEND,
        }


def largest(store: MemoryStore, n: int) -> list[tuple[str, int, int]]:
    """The ``n`` live memories with the largest records: (id, record bytes, text tokens),
    largest first (ties: the older id first)."""
    with store._lock:
        store._check()
        cols = _live_columns(store, ("id", "length", "text_tokens"))
        order = np.lexsort((cols["id"], -cols["length"].astype(np.int64)))[:n]
        return [
            (f"m{int(cols['id'][i])}", int(cols["length"][i]), int(cols["text_tokens"][i]))
            for i in order
        ]


def record_info(store: MemoryStore, mid: str) -> dict[str, Any]:
    """Where and how a memory is stored, from its index row: the record's offset and size
    in the data file, token counts, access statistics, whether it has a vector, and its
    current importance score (the one eviction and the level-2 preload rank by)."""
    from ._index import (F_ACCESS, F_FLAGS, F_LAST_ACCESS, F_LENGTH, F_OFFSET,
                         F_SUMMARY_TOKENS, F_TEXT_TOKENS)  # fmt: skip
    with store._lock:
        store._check()
        g, row = store._live_row(mid)
        score = float(store.importance_scores()[g])
        known = row[F_TEXT_TOKENS] != fmt.UNKNOWN_TOKENS
        return {
            "record_offset": int(row[F_OFFSET]),
            "record_bytes": int(row[F_LENGTH]),
            "text_tokens": int(row[F_TEXT_TOKENS]) if known else None,
            "summary_tokens": int(row[F_SUMMARY_TOKENS]) if known else None,
            "has_vector": bool(row[F_FLAGS] & fmt.FLAG_HAS_VECTOR),
            "access_count": int(row[F_ACCESS]),
            "last_access": float(row[F_LAST_ACCESS]) or None,
            "importance_score": score,
        }
