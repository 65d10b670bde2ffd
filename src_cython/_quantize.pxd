# The index's int8 quantization of float16 rows, in one place for every kernel that makes
# it (vectors.quantize_half, reader.memory_rows): the same bits as
# fastmem._kernels.reference.quantize_half, whichever kernel quantized a row.
from _types cimport i8, u16, f32

cdef extern from "_half.h" nogil:
    void fm_halves_to_floats_scalar(const u16* inp, f32* out, Py_ssize_t n)
    void fm_halves_to_floats_f16c(const u16* inp, f32* out, Py_ssize_t n)
    int fm_have_f16c()

ctypedef void (*to_floats_t)(const u16*, f32*, Py_ssize_t) noexcept nogil


cdef inline to_floats_t fastest_to_floats() noexcept nogil:
    # The F16C conversion when the processor has it (the same values: both are exact).
    return fm_halves_to_floats_f16c if fm_have_f16c() else fm_halves_to_floats_scalar


cdef inline f32 quantize_row(const u16* half, Py_ssize_t dim, f32* v, i8* q,
                             to_floats_t to_floats) noexcept nogil:
    # One row of quantize_half into q (v: dim floats of scratch); returns its scale.
    cdef Py_ssize_t j
    cdef f32 peak, inv, r, scale = 1
    cdef u16 peak_bits = 0, b
    # 1.5 * 2**23: adding then subtracting it rounds a float below 2**22 to the nearest
    # integer, ties to even, as numpy's rint does (no -ffast-math, no FMA contraction).
    cdef f32 magic = 12582912.0
    to_floats(half, v, dim)
    # Finite halves order by magnitude as their bits do: an integer max, which compiles
    # without branches (float compares here mispredict on every sign).
    for j in range(dim):
        b = half[j] & 0x7FFF
        peak_bits = b if b > peak_bits else peak_bits
    to_floats(&peak_bits, &peak, 1)
    if peak > 0:
        scale = peak / <f32>127
        inv = <f32>127 / peak
    else:
        inv = 1
    for j in range(dim):
        r = (v[j] * inv + magic) - magic
        q[j] = <i8>(127 if r > 127 else (-127 if r < -127 else r))
    return scale
