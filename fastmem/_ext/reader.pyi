# Stubs of the compiled get; twins of fastmem._kernels_py.read_memory and unpack.
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
