# cython: language_level=3
"""Compiled vector preparation: unit float16 for the data file, int8 + scale for the index.

Twins of fastmem._kernels_py.to_half and quantize_half; see there for the contract. Both
round exactly as numpy does (float -> half round-to-nearest-even, rint half-to-even), so
the compiled and reference kernels give identical bytes.
"""
import numpy as np

from libc.string cimport memcpy
from libc.math cimport sqrt, isfinite, nearbyintf, ldexpf, fabsf
from _types cimport i8, u16, u32, i64, f32, f64

cdef f32 HALF_TO_FLOAT[65536]


cdef void _init_half_table() noexcept:
    cdef u32 h, e, m
    cdef f32 v
    for h in range(65536):
        e = (h >> 10) & 0x1F
        m = h & 0x3FF
        if e == 0:
            v = ldexpf(<f32>m, -24)
        elif e == 31:
            v = <f32>np.inf if m == 0 else <f32>np.nan
        else:
            v = ldexpf(<f32>(m | 0x400), <int>e - 25)
        HALF_TO_FLOAT[h] = -v if h & 0x8000 else v

_init_half_table()


cdef inline u16 _float_to_half(f32 value) noexcept nogil:
    # IEEE round-to-nearest-even, as numpy's npy_floatbits_to_halfbits (finite inputs).
    cdef u32 f
    memcpy(&f, &value, 4)
    cdef u32 f_exp = f & 0x7F800000u, f_sig
    cdef u16 h_sgn = <u16>((f & 0x80000000u) >> 16), h_exp, h_sig
    if f_exp >= 0x47800000u:  # overflow (cannot happen for unit vectors)
        return h_sgn | 0x7C00u
    if f_exp <= 0x38000000u:  # subnormal half or zero
        if f_exp < 0x33000000u:
            return h_sgn
        f_exp >>= 23
        f_sig = 0x00800000u + (f & 0x007FFFFFu)
        f_sig >>= (113 - f_exp)
        if ((f_sig & 0x00003FFFu) != 0x00001000u) or (f & 0x000007FFu):
            f_sig += 0x00001000u
        h_sig = <u16>(f_sig >> 13)
        return <u16>(h_sgn + h_sig)
    h_exp = <u16>((f_exp - 0x38000000u) >> 13)
    f_sig = f & 0x007FFFFFu
    if (f_sig & 0x00003FFFu) != 0x00001000u:
        f_sig += 0x00001000u
    h_sig = <u16>(f_sig >> 13)
    return <u16>(h_sgn + h_exp + h_sig)


def to_half(const f32[:, ::1] x):
    """Unit-normalise rows (norm summed in double, in order) and round them to float16.

    Returns ``(half bits uint16 (n, dim), first bad row or -1)``; a row is bad when it
    holds a NaN or an infinity or is all zeros.
    """
    cdef Py_ssize_t n = x.shape[0], dim = x.shape[1], i, j
    out = np.empty((n, dim), dtype=np.uint16)
    cdef u16[:, ::1] h = out
    cdef f64 acc, norm
    cdef i64 bad = -1
    with nogil:
        for i in range(n):
            acc = 0.0
            for j in range(dim):
                if not isfinite(x[i, j]):
                    bad = i
                    break
                acc = acc + <f64>x[i, j] * <f64>x[i, j]
            if bad >= 0:
                break
            if acc == 0.0 or not isfinite(acc):
                bad = i
                break
            norm = sqrt(acc)
            for j in range(dim):
                h[i, j] = _float_to_half(<f32>(<f64>x[i, j] / norm))
    return out, bad


def quantize_half(const u16[:, ::1] half):
    """int8 rows and float32 scales with ``int8 * scale ~= float16 rows`` (max-abs scaling)."""
    cdef Py_ssize_t n = half.shape[0], dim = half.shape[1], i, j
    q_out = np.empty((n, dim), dtype=np.int8)
    s_out = np.empty(n, dtype=np.float32)
    cdef i8[:, ::1] q = q_out
    cdef f32[::1] scales = s_out
    cdef f32 peak, scale, v
    with nogil:
        for i in range(n):
            peak = 0
            for j in range(dim):
                v = fabsf(HALF_TO_FLOAT[half[i, j]])
                if v > peak:
                    peak = v
            scale = peak / <f32>127 if peak > 0 else <f32>1
            scales[i] = scale
            for j in range(dim):
                v = nearbyintf(HALF_TO_FLOAT[half[i, j]] / scale)
                q[i, j] = <i8>(127 if v > 127 else (-127 if v < -127 else v))
    return q_out, s_out
