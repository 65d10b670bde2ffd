# cython: language_level=3
"""Compiled filtered top-k over the int8 embedding matrix (brute force, GIL released).

Twin of fastmem._kernels_py.topk_int8; see there for the contract.
"""
import numpy as np

from _types cimport i8, u8, u16, i32, i64, u64, f32, f64


cdef inline bint _worse(f64 sa, i64 ra, f64 sb, i64 rb) noexcept nogil:
    # (sa, ra) ranks below (sb, rb): lower score, or the same score and a higher row.
    return sa < sb or (sa == sb and ra > rb)


cdef inline void _sift_down(f64* hs, i64* hr, Py_ssize_t size, Py_ssize_t i) noexcept nogil:
    # Min-heap on rank: the root is the worst of the kept rows.
    cdef Py_ssize_t child
    cdef f64 s
    cdef i64 r
    while True:
        child = 2 * i + 1
        if child >= size:
            return
        if child + 1 < size and _worse(hs[child + 1], hr[child + 1], hs[child], hr[child]):
            child += 1
        if not _worse(hs[child], hr[child], hs[i], hr[i]):
            return
        s = hs[i]; hs[i] = hs[child]; hs[child] = s
        r = hr[i]; hr[i] = hr[child]; hr[child] = r
        i = child


cdef inline void _sift_up(f64* hs, i64* hr, Py_ssize_t i) noexcept nogil:
    cdef Py_ssize_t parent
    cdef f64 s
    cdef i64 r
    while i > 0:
        parent = (i - 1) // 2
        if not _worse(hs[i], hr[i], hs[parent], hr[parent]):
            return
        s = hs[i]; hs[i] = hs[parent]; hs[parent] = s
        r = hr[i]; hr[i] = hr[parent]; hr[parent] = r
        i = parent


def topk_int8(
    const i8[:, ::1] vectors,
    const f32[:] scales,
    const u16[:] flags,
    const u16[:] types,
    const f64[:] timestamps,
    const u64[:] sessions,
    const i8[::1] query,
    Py_ssize_t k,
    const u8[::1] type_allowed,
    f64 since,
    f64 until,
    u64 session,
    u16 require_flags,
    u16 exclude_flags,
):
    """Filtered top-k by ``scale[row] * (vectors[row] . query)``; see the reference."""
    cdef Py_ssize_t n = vectors.shape[0], dim = vectors.shape[1]
    if query.shape[0] != dim:
        raise ValueError("query length differs from the matrix")
    if scales.shape[0] < n or flags.shape[0] < n or types.shape[0] < n \
            or timestamps.shape[0] < n or sessions.shape[0] < n:
        raise ValueError("a column is shorter than the matrix")
    if type_allowed is not None and type_allowed.shape[0] < 65536:
        raise ValueError("type_allowed must have 65536 entries")
    if k <= 0 or n == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float64)
    cdef Py_ssize_t cap = min(k, n)
    cdef f64[::1] heap_scores = np.empty(cap, dtype=np.float64)
    cdef i64[::1] heap_rows = np.empty(cap, dtype=np.int64)
    cdef f64* hs = &heap_scores[0]
    cdef i64* hr = &heap_rows[0]
    cdef Py_ssize_t size = 0, row, j
    cdef bint filter_types = type_allowed is not None
    cdef const u8* allowed = &type_allowed[0] if filter_types else NULL
    cdef const i8* q = &query[0]
    cdef const i8* v
    cdef i32 dot
    cdef f64 score
    cdef u16 f
    with nogil:
        for row in range(n):
            f = flags[row]
            if (f & require_flags) != require_flags or (f & exclude_flags) != 0:
                continue
            if timestamps[row] < since or timestamps[row] > until:
                continue
            if session != 0 and sessions[row] != session:
                continue
            if filter_types and not allowed[types[row]]:
                continue
            v = &vectors[row, 0]
            dot = 0
            for j in range(dim):
                dot += <i32>v[j] * <i32>q[j]
            score = <f64>dot * <f64>scales[row]
            if size < cap:
                hs[size] = score
                hr[size] = row
                _sift_up(hs, hr, size)
                size += 1
            elif _worse(hs[0], hr[0], score, row):
                hs[0] = score
                hr[0] = row
                _sift_down(hs, hr, size, 0)
    rows = np.asarray(heap_rows[:size]).copy()
    scores = np.asarray(heap_scores[:size]).copy()
    best = np.lexsort((rows, -scores))
    return rows[best], scores[best]
