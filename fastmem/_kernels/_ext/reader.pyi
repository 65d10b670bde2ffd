# Stubs of the compiled get, newest rows and replay's plain rows; twins of
# fastmem._kernels.reference.read_memory, read_hot, memory_rows and unpack.
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
from typing_extensions import Self, disjoint_base

CONSTANTS: dict[str, int]

def unpack(data: Any) -> Any: ...
def read_memory(
    mid: Any,
    base: Any,
    tail: Any,
    tail_n: int,
    dat: Any,
    dat_end: int,
    memory: type,
    f32: Callable[[float], float],
) -> Any: ...
def read_hot(
    rows: Any,
    starts: list[int],
    records: Any,
    n: int,
    memory: type,
    f32: Callable[[float], float],
) -> list[Any] | None: ...
def memory_rows(
    buf: Any,
    offsets: npt.NDArray[np.int64] | list[int],
    lengths: npt.NDArray[np.uint32] | list[int],
    kinds: npt.NDArray[np.uint8] | list[int],
    dims: npt.NDArray[np.uint16] | list[int],
    first: int,
    stop: int,
    next_id: int,
    dim: int,
    type_codes: dict[str, int],
    defaults: dict[str, float],
    user_default: float,
    sessions: dict[Any, int],
    session_hash: Callable[[str], int],
    rows: Any,
    vectors: Any,
    quantized: npt.NDArray[np.int8] | None = None,
) -> tuple[int, list[str], int]: ...

@disjoint_base
class DataMap:
    closed: bool
    def __new__(cls, fd: int, size: int, room: int) -> Self: ...
    def grow(self, size: int) -> bool: ...
    def __len__(self) -> int: ...
    def __getitem__(self, key: Any, /) -> Any: ...
    def madvise(self, option: int, start: int = 0, length: int | None = None) -> None: ...
    def close(self) -> None: ...
    def __enter__(self) -> DataMap: ...
    def __exit__(self, *exc: object) -> None: ...
