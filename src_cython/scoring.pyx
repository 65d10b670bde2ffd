# cython: language_level=3
"""Compiled importance scoring: one pass over the index rows, GIL released.

Twin of fastmem._kernels_py.importance; see there for the formula.
"""
from libc.math cimport exp2, INFINITY

from _types cimport u16, u32, f32, f64


def importance(
    const f32[:] base,
    const u16[:] flags,
    const u32[:] access_count,
    const f64[:] last_access,
    const f64[:] timestamps,
    f32[:] out,
    f64 now,
    f64 access_half_life,
    f64 access_weight,
    f64 recency_half_life,
    f64 recency_weight,
    f64 pin_bonus,
    u16 pinned_flag,
    u16 exclude_flags,
):
    """Write every row's importance into ``out``; see the reference for the formula."""
    cdef Py_ssize_t n = base.shape[0], row
    if flags.shape[0] < n or access_count.shape[0] < n or last_access.shape[0] < n \
            or timestamps.shape[0] < n or out.shape[0] < n:
        raise ValueError("a column is shorter than base")
    if not (access_half_life > 0 and recency_half_life > 0):
        raise ValueError("half-lives must be > 0")
    cdef f64 decayed, age, score
    cdef f64 inv_access = 1.0 / access_half_life, inv_recency = 1.0 / recency_half_life
    with nogil:
        for row in range(n):
            if flags[row] & exclude_flags:
                out[row] = -INFINITY
                continue
            score = base[row]
            if access_count[row]:
                age = now - last_access[row]
                if age < 0:
                    age = 0
                decayed = access_count[row] * exp2(-age * inv_access)
                score += access_weight * decayed / (1.0 + decayed)
            age = now - timestamps[row]
            if age < 0:
                age = 0
            score += recency_weight * exp2(-age * inv_recency)
            if flags[row] & pinned_flag:
                score += pin_bonus
            out[row] = <f32>score
