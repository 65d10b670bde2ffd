"""Embedding vectors: validation, normalisation, float16 storage and int8 quantisation.

The data file keeps each vector as unit-norm float16 (exact ranking to ~1e-4 in cosine);
the index keeps an int8 copy with a per-row scale for the scan, derived from the float16
bytes alone so that a rebuilt index is identical to the one it replaces.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._format import MAX_DIM
from .errors import DimensionMismatchError, InvalidInputError, InvalidTypeError


def as_matrix(vectors: Any, dim: int, what: str = "embedding") -> np.ndarray:
    """Validate an (n, dim) batch of real vectors; returns them as float64.

    Raises:
        InvalidTypeError: not an array of real numbers.
        DimensionMismatchError: the length is not ``dim`` (when ``dim`` is set).
        InvalidInputError: a NaN, an infinity or an all-zero vector.
    """
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
    arr = arr.astype(np.float64, copy=False)
    if not np.isfinite(arr).all():
        raise InvalidInputError(f"{what} contains NaN or infinity")
    norms = np.linalg.norm(arr, axis=1)
    if not (norms > 0).all():
        raise InvalidInputError(f"{what} is all zeros; it has no direction to compare")
    return arr


def to_float16(arr: np.ndarray) -> np.ndarray:
    """Unit-normalise float64 rows, stored as little-endian float16."""
    unit = arr / np.linalg.norm(arr, axis=1, keepdims=True)
    return unit.astype("<f2")


def quantize(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int8 rows and float32 scales with ``int8 * scale ~= vectors`` (max-abs scaling)."""
    x = np.asarray(vectors, dtype=np.float32)
    if x.shape[0] == 0:
        return np.empty(x.shape, dtype=np.int8), np.empty(0, dtype=np.float32)
    peak = np.abs(x).max(axis=1)
    scales = np.where(peak > 0, peak / np.float32(127), np.float32(1)).astype(np.float32)
    q = np.rint(x / scales[:, None]).clip(-127, 127).astype(np.int8)
    return q, scales
