"""Embedding vectors: validation, float16 storage and int8 quantisation.

The data file keeps each vector as unit-norm float16 (its ranking matches float32 to
~1e-4 in cosine); the index keeps an int8 copy with a per-row scale for the scan, derived
from the float16 bytes alone, so that a rebuilt index is identical to the one it replaces.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .. import _kernels
from .._format import MAX_DIM
from ..errors import DimensionMismatchError, InvalidInputError, InvalidTypeError


def to_float16(vectors: Any, dim: int, what: str = "embedding") -> np.ndarray:
    """Validate an (n, length) batch of real vectors; returns them unit-norm, as float16.

    Raises:
        InvalidTypeError: not an array of real numbers.
        DimensionMismatchError: the length is not ``dim`` (when ``dim`` is set).
        InvalidInputError: a NaN, an infinity or an all-zero vector (``.row`` says which).
    """
    half, bad = _kernels.to_half(_float32_rows(vectors, dim, what))
    _check_bad(bad, what)
    return half.view("<f2")


def to_float16_quantized(
    vectors: Any, dim: int, what: str = "embedding"
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`to_float16` and :func:`quantize` of its result in one pass over the rows:
    ``(float16 rows, int8 rows, scales)``; raises as :func:`to_float16` does."""
    half, q, scales, bad = _kernels.to_half_quantized(_float32_rows(vectors, dim, what))
    _check_bad(bad, what)
    return half.view("<f2"), q, scales


def _check_bad(bad: int, what: str) -> None:
    if bad >= 0:
        error = InvalidInputError(f"{what} contains NaN or infinity, or is all zeros")
        error.row = bad  # type: ignore[attr-defined]
        raise error


def _float32_rows(vectors: Any, dim: int, what: str) -> np.ndarray:
    """The checked rows of :func:`to_float16`, as one C-ordered float32 array."""
    try:
        arr = np.asarray(vectors)
    except (TypeError, ValueError) as exc:
        raise InvalidTypeError(f"{what} must be an array of real numbers ({exc})") from None
    if arr.dtype.kind not in "fiu" or arr.dtype == np.bool_:
        raise InvalidTypeError(f"{what} must hold real numbers, not {arr.dtype}")
    if arr.ndim != 2:
        raise InvalidInputError(f"{what} must be one flat vector, got shape {arr.shape[1:]}")
    if not 0 < arr.shape[1] <= MAX_DIM:
        raise DimensionMismatchError(
            f"{what} has length {arr.shape[1]}; lengths from 1 to {MAX_DIM} are supported"
        )
    if dim and arr.shape[1] != dim:
        raise DimensionMismatchError(
            f"{what} has length {arr.shape[1]} but this store's vectors have {dim}: "
            f"use the embedding model the store was created with"
        )
    with np.errstate(over="ignore"):  # beyond float32's range: an infinity, refused below
        return np.ascontiguousarray(arr, dtype=np.float32)


def quantize(vectors16: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int8 rows and float32 scales with ``int8 * scale ~= vectors16`` (max-abs scaling)."""
    return _kernels.quantize_half(np.ascontiguousarray(vectors16).view(np.uint16))


class BlockedVectors:
    """The float16 rows of a large batch as the blocks they were made in: each an array,
    or a function that makes it again (from the caller's float32 rows: keeping every
    block's float16 rows would hold a copy of the whole batch, in fresh pages). One block
    made again is kept until another is asked for. ``vectors[lo:hi]`` is a view of one
    block when the rows lie in one (a copy otherwise); ``shape`` and ``len`` are the whole's.
    """

    __slots__ = ("_last", "blocks", "dtype", "shape", "starts")

    def __init__(
        self, blocks: list[np.ndarray | Callable[[], np.ndarray]], sizes: list[int], dim: int
    ) -> None:
        self.blocks = blocks
        self.starts = [0]
        self._last: tuple[int, np.ndarray] | None = None
        for size in sizes:
            self.starts.append(self.starts[-1] + size)
        self.shape = (self.starts[-1], dim)
        self.dtype = np.dtype("<f2")

    def __len__(self) -> int:
        return self.shape[0]

    def block(self, b: int) -> np.ndarray:
        """Block ``b``'s float16 rows (made again if it was not kept)."""
        block = self.blocks[b]
        if not callable(block):
            return block
        if self._last is None or self._last[0] != b:
            self._last = None  # (freed before the next is made: its pages are reused)
            self._last = (b, block())
        return self._last[1]

    def __getitem__(self, rows: slice) -> np.ndarray:
        if not isinstance(rows, slice):
            raise TypeError("BlockedVectors takes a slice of rows")
        lo, hi, step = rows.indices(self.shape[0])
        if step != 1:
            raise ValueError("BlockedVectors takes consecutive rows")
        from bisect import bisect_right  # here: import fastmem does not need it

        parts = []
        b = bisect_right(self.starts, lo) - 1
        while lo < hi:
            end = min(hi, self.starts[b + 1])
            parts.append(self.block(b)[lo - self.starts[b] : end - self.starts[b]])
            lo, b = end, b + 1
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.zeros((0, self.shape[1]), self.dtype)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = np.concatenate([self.block(b) for b in range(len(self.blocks))])
        return whole if dtype is None else whole.astype(dtype)
