# Stubs of the compiled keyword kernels; twins of fastmem._kernels.reference's of the same names.
import numpy as np
import numpy.typing as npt

def tokenize_batch(
    texts: list[str], first: int = 0
) -> tuple[
    npt.NDArray[np.uint64], npt.NDArray[np.uint32], npt.NDArray[np.uint16], npt.NDArray[np.uint32]
]: ...
def bm25_topk(
    post_rows: npt.NDArray[np.uint32],
    post_tf: npt.NDArray[np.uint16],
    ranges: npt.NDArray[np.int64],
    base_len: npt.NDArray[np.uint32],
    tail_len: npt.NDArray[np.uint32],
    base_cols: tuple[npt.NDArray[np.uint16], npt.NDArray[np.float64], npt.NDArray[np.uint64]],
    tail_cols: tuple[npt.NDArray[np.uint16], npt.NDArray[np.float64], npt.NDArray[np.uint64]],
    k: int,
    type_allowed: npt.NDArray[np.uint8] | None,
    since: float,
    until: float,
    session: int,
    n_live: float,
    avgdl: float,
    k1: float,
    b: float,
    scratch: npt.NDArray[np.float64],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]: ...
def merge_postings(
    b_terms: npt.NDArray[np.uint64],
    b_offsets: npt.NDArray[np.uint64],
    b_rows: npt.NDArray[np.uint32],
    b_tf: npt.NDArray[np.uint16],
    t_terms: npt.NDArray[np.uint64],
    t_rows: npt.NDArray[np.uint32],
    t_tf: npt.NDArray[np.uint16],
) -> tuple[
    npt.NDArray[np.uint64], npt.NDArray[np.uint64], npt.NDArray[np.uint32], npt.NDArray[np.uint16]
]: ...
def merge_postings_runs(
    b_terms: npt.NDArray[np.uint64],
    b_offsets: npt.NDArray[np.uint64],
    b_rows: npt.NDArray[np.uint32],
    b_tf: npt.NDArray[np.uint16],
    runs: list[tuple[npt.NDArray[np.uint64] | npt.NDArray[np.uint32] | npt.NDArray[np.uint16], ...]],
) -> tuple[
    npt.NDArray[np.uint64], npt.NDArray[np.uint64], npt.NDArray[np.uint32], npt.NDArray[np.uint16]
]: ...
def sort_postings(
    terms: npt.NDArray[np.uint64], rows: npt.NDArray[np.uint32], tf: npt.NDArray[np.uint16]
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint32], npt.NDArray[np.uint16]]: ...
