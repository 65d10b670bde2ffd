/* float32 <-> float16 (IEEE binary16, round to nearest, ties to even), as numpy converts.
 *
 * Portable scalar code for every processor, and F16C instructions chosen at run time on
 * x86-64 processors that have them (the wheel stays built for the baseline).
 */
#ifndef FASTMEM_HALF_H
#define FASTMEM_HALF_H

#include <stdint.h>
#include <string.h>

/* numpy's npy_floatbits_to_halfbits for finite input (unit vectors never overflow). */
static inline uint16_t fm_float_to_half(float value) {
    uint32_t f, f_exp, f_sig;
    uint16_t h_sgn, h_exp, h_sig;
    memcpy(&f, &value, 4);
    h_sgn = (uint16_t)((f & 0x80000000u) >> 16);
    f_exp = f & 0x7f800000u;
    if (f_exp >= 0x47800000u) {
        if (f_exp == 0x7f800000u && (f & 0x007fffffu)) return (uint16_t)(h_sgn | 0x7e00u);
        return (uint16_t)(h_sgn | 0x7c00u);
    }
    if (f_exp <= 0x38000000u) {
        if (f_exp < 0x33000000u) return h_sgn;
        f_exp >>= 23;
        f_sig = 0x00800000u + (f & 0x007fffffu);
        f_sig >>= (113 - f_exp);
        if (((f_sig & 0x00003fffu) != 0x00001000u) || (f & 0x000007ffu)) f_sig += 0x00001000u;
        h_sig = (uint16_t)(f_sig >> 13);
        return (uint16_t)(h_sgn + h_sig);
    }
    h_exp = (uint16_t)((f_exp - 0x38000000u) >> 13);
    f_sig = f & 0x007fffffu;
    if ((f_sig & 0x00003fffu) != 0x00001000u) f_sig += 0x00001000u;
    h_sig = (uint16_t)(f_sig >> 13);
    return (uint16_t)(h_sgn + h_exp + h_sig);
}

static inline float fm_half_to_float(uint16_t h) {
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ffu, f;
    float out;
    if (e == 0) {
        if (m == 0) {
            f = sign;
        } else { /* subnormal: normalise */
            e = 1;
            while (!(m & 0x400u)) { m <<= 1; e--; }
            f = sign | ((e + 112) << 23) | ((m & 0x3ffu) << 13);
        }
    } else if (e == 31) {
        f = sign | 0x7f800000u | (m << 13);
    } else {
        f = sign | ((e + 112) << 23) | (m << 13);
    }
    memcpy(&out, &f, 4);
    return out;
}

static void fm_floats_to_halves_scalar(const float* in, uint16_t* out, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) out[i] = fm_float_to_half(in[i]);
}

static void fm_halves_to_floats_scalar(const uint16_t* in, float* out, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) out[i] = fm_half_to_float(in[i]);
}

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>

__attribute__((target("avx,f16c")))
static void fm_floats_to_halves_f16c(const float* in, uint16_t* out, Py_ssize_t n) {
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128((__m128i*)(out + i), h);
    }
    for (; i < n; i++) out[i] = fm_float_to_half(in[i]);
}

__attribute__((target("avx,f16c")))
static void fm_halves_to_floats_f16c(const uint16_t* in, float* out, Py_ssize_t n) {
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i*)(in + i));
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
    }
    for (; i < n; i++) out[i] = fm_half_to_float(in[i]);
}

static int fm_have_f16c(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
}
#else
#define fm_floats_to_halves_f16c fm_floats_to_halves_scalar
#define fm_halves_to_floats_f16c fm_halves_to_floats_scalar
static int fm_have_f16c(void) { return 0; }
#endif

#endif
