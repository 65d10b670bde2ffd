# cython: language_level=3
"""Compiled vector preparation: unit float16 rows for the data file, int8 + scale rows for
the index.

Twins of fastmem._kernels.reference.to_half and quantize_half; see there for the contract. Both
round exactly as numpy does (float -> half and rint: nearest, ties to even), so the two
backends give identical bytes. float <-> half uses F16C instructions when the processor
has them (chosen at run time: the build stays portable), else portable C.
"""
import numpy as np

from libc.math cimport sqrt, isfinite
from libc.stdlib cimport malloc, free
from _types cimport i8, u16, i64, f32, f64
from _quantize cimport quantize_row, to_floats_t

cdef extern from "_half.h" nogil:
    void fm_floats_to_halves_scalar(const f32* inp, u16* out, Py_ssize_t n)
    void fm_halves_to_floats_scalar(const u16* inp, f32* out, Py_ssize_t n)
    void fm_floats_to_halves_f16c(const f32* inp, u16* out, Py_ssize_t n)
    void fm_halves_to_floats_f16c(const u16* inp, f32* out, Py_ssize_t n)
    int fm_have_f16c()

ctypedef void (*to_halves_t)(const f32*, u16*, Py_ssize_t) noexcept nogil

HAVE_F16C = bool(fm_have_f16c())
cdef to_halves_t to_halves = fm_floats_to_halves_scalar
cdef to_floats_t to_floats = fm_halves_to_floats_scalar


def use_f16c(bint enabled):
    """Use the F16C conversions (when the processor has them) or the portable ones;
    returns whether F16C is in use. The tests run both."""
    global to_halves, to_floats
    if enabled and HAVE_F16C:
        to_halves, to_floats = fm_floats_to_halves_f16c, fm_halves_to_floats_f16c
        return True
    to_halves, to_floats = fm_floats_to_halves_scalar, fm_halves_to_floats_scalar
    return False

use_f16c(True)


def to_half(const f32[:, ::1] x):
    """Rows divided by their norm, rounded to float16; see fastmem._kernels.reference.to_half."""
    out = np.zeros((x.shape[0], x.shape[1]), dtype=np.uint16)
    return out, _unit_halves(x, out, None, None)


def to_half_quantized(const f32[:, ::1] x):
    """to_half and quantize_half of its rows in one pass over them (each half row is
    quantized while it is in the L1 cache, and the float32 rows are read once); see
    fastmem._kernels.reference.to_half_quantized."""
    cdef Py_ssize_t n = x.shape[0], dim = x.shape[1]
    # Not zeroed first: every row is written (a batch's ~6 MB, zeroed for nothing).
    out = np.empty((n, dim), dtype=np.uint16)
    q_out = np.empty((n, dim), dtype=np.int8)
    s_out = np.empty(n, dtype=np.float32)
    bad = _unit_halves(x, out, q_out, s_out)
    if bad >= 0:  # the rows from the bad one on, as the reference leaves them
        out[bad:] = 0
        q_out[bad:] = 0
        s_out[bad:] = 1
    return out, q_out, s_out, bad


cdef i64 _unit_halves(const f32[:, ::1] x, u16[:, ::1] h, i8[:, ::1] q, f32[::1] scales) except -2:
    # The unit float16 rows of x into h, and with q (not None) their int8 rows and scales
    # as quantize_half makes them; returns the first bad row (NaN, infinity, all zeros),
    # -1 if none: the rows from it on are left as they were.
    cdef Py_ssize_t n = x.shape[0], dim = x.shape[1], i
    cdef f64 acc, inv
    cdef i64 bad = -1
    cdef bint quantized = q is not None
    cdef f64 sums[8]
    cdef Py_ssize_t k, rows
    if dim == 0:  # no row has a norm
        return 0 if n else -1
    cdef f32* unit = <f32*>malloc(dim * sizeof(f32))
    if unit == NULL:
        raise MemoryError()
    try:
        with nogil:
            i = 0
            while i < n and bad < 0:
                # Each row's squares are summed strictly in index order (the reference's
                # order: the same bits); eight rows at a time, so that eight sums are under
                # way at once instead of one add waiting for the one before (four: ~0.08
                # µs a row more, at 384 floats).
                rows = 8 if i + 8 <= n else 1  # a batch's last < 8 rows: one by one
                if rows == 8:
                    _sum_squares8(&x[i, 0], dim, sums)
                else:
                    sums[0] = _sum_squares(&x[i, 0], dim)
                for k in range(rows):
                    acc = sums[k]  # a NaN or an infinity anywhere makes the sum one too
                    if acc == 0.0 or not isfinite(acc):
                        bad = i + k
                        break
                    inv = 1.0 / sqrt(acc)
                    _scaled(&x[i + k, 0], dim, inv, unit)
                    to_halves(unit, &h[i + k, 0], dim)
                    if quantized:
                        scales[i + k] = quantize_row(&h[i + k, 0], dim, unit, &q[i + k, 0], to_floats)
                i += rows
    finally:
        free(unit)
    return bad


cdef inline f64 _sum_squares(const f32* row, Py_ssize_t dim) noexcept nogil:
    cdef f64 acc = 0.0
    cdef Py_ssize_t j
    for j in range(dim):
        acc = acc + <f64>row[j] * <f64>row[j]
    return acc


cdef inline void _sum_squares8(const f32* row, Py_ssize_t dim, f64* sums) noexcept nogil:
    # Rows row, row + dim, ..., row + 7 dim (C order), each summed in index order.
    cdef f64 a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0, a4 = 0.0, a5 = 0.0, a6 = 0.0, a7 = 0.0
    cdef Py_ssize_t j
    for j in range(dim):
        a0 = a0 + <f64>row[j] * <f64>row[j]
        a1 = a1 + <f64>row[dim + j] * <f64>row[dim + j]
        a2 = a2 + <f64>row[2 * dim + j] * <f64>row[2 * dim + j]
        a3 = a3 + <f64>row[3 * dim + j] * <f64>row[3 * dim + j]
        a4 = a4 + <f64>row[4 * dim + j] * <f64>row[4 * dim + j]
        a5 = a5 + <f64>row[5 * dim + j] * <f64>row[5 * dim + j]
        a6 = a6 + <f64>row[6 * dim + j] * <f64>row[6 * dim + j]
        a7 = a7 + <f64>row[7 * dim + j] * <f64>row[7 * dim + j]
    sums[0], sums[1], sums[2], sums[3] = a0, a1, a2, a3
    sums[4], sums[5], sums[6], sums[7] = a4, a5, a6, a7


cdef inline void _scaled(const f32* row, Py_ssize_t dim, f64 inv, f32* unit) noexcept nogil:
    cdef Py_ssize_t j
    for j in range(dim):
        unit[j] = <f32>(<f64>row[j] * inv)


def quantize_half(const u16[:, ::1] half):
    """int8 rows and float32 scales with ``int8 * scale ~= float16 rows``; see the reference."""
    cdef Py_ssize_t n = half.shape[0], dim = half.shape[1], i
    q_out = np.zeros((n, dim), dtype=np.int8)
    s_out = np.ones(n, dtype=np.float32)
    if dim == 0:
        return q_out, s_out
    cdef i8[:, ::1] q = q_out
    cdef f32[::1] scales = s_out
    cdef f32* v = <f32*>malloc(dim * sizeof(f32))
    if v == NULL:
        raise MemoryError()
    try:
        with nogil:
            for i in range(n):
                scales[i] = quantize_row(&half[i, 0], dim, v, &q[i, 0], to_floats)
    finally:
        free(v)
    return q_out, s_out
