"""How important each memory is: base importance, decayed accesses, recency and pins, as
a :class:`~fastmem.types.ContextPolicy` weighs them. Level 2 preloads the most important
memories; eviction drops the least important ones."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _format as fmt
from .. import _kernels
from ..types import DAY, ContextPolicy
from .index import MemoryIndex

IMPORTANCE_FIELDS = ("importance", "flags", "access_count", "last_access", "timestamp")


def importance_scores(
    index: MemoryIndex, policy: ContextPolicy, now: float, rows: np.ndarray | None = None
) -> np.ndarray:
    """The importance score (float32; forgotten rows ``-inf``) of every row, or of
    ``rows``: base importance, decayed access count, recency and pins, as the policy
    weighs them, computed by the compiled kernel."""
    parts: list[tuple[int, Any]]
    if rows is None:
        parts = [(first, seg) for first, seg, _ in index.segments()]
        out = np.empty(len(index), dtype=np.float32)
    else:
        parts = [(0, index.gather(rows, IMPORTANCE_FIELDS))]
        out = np.empty(len(rows), dtype=np.float32)
    for first, cols in parts:
        _kernels.importance(
            cols["importance"], cols["flags"], cols["access_count"], cols["last_access"],
            cols["timestamp"], out[first : first + len(cols["flags"])], now,
            policy.access_half_life_days * DAY, policy.access_weight,
            policy.recency_half_life_days * DAY, policy.recency_weight, policy.pin_bonus,
            fmt.FLAG_PINNED, fmt.FLAG_FORGOTTEN,
        )  # fmt: skip
    return out
