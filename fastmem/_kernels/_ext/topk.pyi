# Stubs of the compiled top-k module; twins of fastmem._kernels.reference.topk_int8 and dot_half.
from typing import Any

import numpy as np
import numpy.typing as npt

SIMD_LEVELS: tuple[str, ...]
OPENMP: bool

def simd() -> str: ...
def set_simd(name: str) -> str: ...
def topk_int8(
    vectors: npt.NDArray[np.int8],
    scales: npt.NDArray[np.float32],
    flags: npt.NDArray[np.uint16],
    types: npt.NDArray[np.uint16],
    timestamps: npt.NDArray[np.float64],
    sessions: npt.NDArray[np.uint64],
    query: npt.NDArray[np.int8],
    k: int,
    type_allowed: npt.NDArray[np.uint8] | None,
    since: float,
    until: float,
    session: int,
    require_flags: int,
    exclude_flags: int,
    scales_out: npt.NDArray[np.float32] | None = None,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]: ...
def dot_half(
    buf: Any, offsets: npt.NDArray[np.int64], query: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]: ...
