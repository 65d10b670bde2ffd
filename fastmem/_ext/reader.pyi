# Stubs of the compiled get and newest rows; twins of fastmem._kernels_py.read_memory,
# read_hot and unpack.
from collections.abc import Callable
from typing import Any

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
