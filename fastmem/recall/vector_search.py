"""Exact vector search: an int8 scan of the index picks candidates, float16 rescores them.

The index keeps every vector as int8 with a per-row scale (``vectors.quantize``); the
compiled scan (``_kernels.topk_int8``: both cores, SIMD, filters without copying) ranks
all rows by ``scale * (int8 . int8 query)``. The best ``4k + 32`` of them are rescored
with the exact cosine against the float16 vectors in the data file (``dot_half``), so
the hits and their scores are those of an exact float16 search unless a true top-k row
falls outside the candidates (the int8 error is ~1% of a cosine; recall@10 measured
against exact float32 is in benchmarks/RESULTS-search.md).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import _format as fmt
from .. import _kernels
from ..storage.index import MemoryIndex


def candidate_count(k: int, n: int) -> int:
    """How many int8 candidates a top-``k`` search rescores."""
    return min(4 * k + 32, n)


def scan(
    index: MemoryIndex,
    q8: np.ndarray,
    want: int,
    allowed: np.ndarray | None = None,
    since: float = -math.inf,
    until: float = math.inf,
    session: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Global rows of the ``want`` best int8 scores of live rows with a vector that pass
    the filters, and the scores, best first (ties: the lower row)."""
    rows, scores = [], []
    for first, seg_rows, seg_vectors in index.segments():
        if seg_vectors.shape[1] != index.dim:
            continue  # written before the store had vectors
        # The scan reads one scale per row: from a contiguous copy of the base's, which
        # the first scan makes as it goes (the base's scales never change).
        scales, scales_out = seg_rows["scale"], None
        if first < index.n_base:
            if index.base_scales is None:
                scales_out = np.empty(len(seg_rows), dtype=np.float32)
            else:
                scales = index.base_scales
        r, s = _kernels.topk_int8(
            seg_vectors, scales, seg_rows["flags"], seg_rows["type"], seg_rows["timestamp"],
            seg_rows["session"], q8, want, allowed, since, until, session,
            fmt.FLAG_HAS_VECTOR, fmt.FLAG_FORGOTTEN, scales_out,
        )  # fmt: skip
        if scales_out is not None:
            index.base_scales = scales_out
        rows.append(r + first)
        scores.append(s)
    if not rows:
        return np.zeros(0, np.int64), np.zeros(0)
    if len(rows) == 1:
        return rows[0], scores[0]
    r, s = np.concatenate(rows), np.concatenate(scores)
    best = np.lexsort((r, -s))[:want]
    return r[best], s[best]


def rescore(index: MemoryIndex, data: Any, rows: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Exact cosines of ``rows``' float16 vectors (read from the data file ``data``) with
    ``query`` (float64, unit norm)."""
    offsets = index.gather(rows, ("offset",))["offset"].astype(np.int64)
    return _kernels.dot_half(data, fmt.vector_start(offsets), query)
