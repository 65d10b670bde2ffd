# Stubs of the compiled record kernels; twins of fastmem._kernels.reference.
from typing import Any

import numpy as np
import numpy.typing as npt

CONSTANTS: dict[str, Any]
HAVE_PCLMUL: bool

def use_pclmul(enabled: bool) -> bool: ...

def crc32(data: Any, value: int = 0) -> int: ...
def scan_records(
    buf: Any, start: int, end: int
) -> tuple[
    npt.NDArray[np.int64],
    npt.NDArray[np.uint32],
    npt.NDArray[np.uint8],
    npt.NDArray[np.uint16],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
]: ...
def frame_records(
    kind: int,
    payloads: list[bytes],
    raw_lens: npt.NDArray[np.uint32],
    vectors: npt.NDArray[np.uint16] | None,
    has_vector: npt.NDArray[np.uint8] | None,
) -> tuple[bytes, npt.NDArray[np.uint32], npt.NDArray[np.uint32]]: ...
def check_record(buf: Any, offset: int, end: int) -> tuple[int, int, int, int] | None: ...
def record_payload(buf: Any, offset: int, end: int) -> tuple[int, int, bytes, int] | None: ...
def file_size(fd: int) -> int: ...
def pack_memories(
    payloads: list[dict[str, Any]],
    first_id: int,
    text_tokens: npt.NDArray[np.uint32],
    summary_tokens: npt.NDArray[np.uint32],
) -> tuple[list[bytes], npt.NDArray[np.uint32]]: ...
