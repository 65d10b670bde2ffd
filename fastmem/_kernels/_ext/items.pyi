# Stubs of the compiled item kernels; twins of fastmem._kernels.reference.prepare_batch / gather_vectors /
# memory_ids.
from typing import Any

import numpy as np
import numpy.typing as npt

CONSTANTS: dict[str, Any]

def prepare_batch(items: list[Any], now: float, fallback: Any) -> tuple[Any, ...]: ...
def gather_vectors(vectors: list[Any], dim: int) -> npt.NDArray[np.float32] | None: ...
def memory_ids(first: int, n: int) -> list[str]: ...
