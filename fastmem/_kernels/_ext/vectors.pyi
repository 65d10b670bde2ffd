# Stubs of the compiled vector kernels; twins of fastmem._kernels.reference.to_half, quantize_half and
# to_half_quantized.
import numpy as np
import numpy.typing as npt

HAVE_F16C: bool

def use_f16c(enabled: bool) -> bool: ...
def to_half(x: npt.NDArray[np.float32]) -> tuple[npt.NDArray[np.uint16], int]: ...
def quantize_half(
    half: npt.NDArray[np.uint16],
) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.float32]]: ...
def to_half_quantized(
    x: npt.NDArray[np.float32],
) -> tuple[npt.NDArray[np.uint16], npt.NDArray[np.int8], npt.NDArray[np.float32], int]: ...
