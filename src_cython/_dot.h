/* Exact int8 dot products for the top-k scan, and the OpenMP thread count.
 *
 * The scan reads the whole int8 matrix once per query, so it runs at memory bandwidth
 * only with the processor's vector units. The wheel is built for the baseline (no
 * -march=native); the AVX2 and AVX-512 VNNI variants are compiled with per-function
 * target attributes and one is chosen at run time by what the processor supports. Every
 * variant returns the same exact int32 sum as the portable loop, for any int8 input.
 */
#ifndef FASTMEM_DOT_H
#define FASTMEM_DOT_H

#include <stdint.h>

#ifdef _OPENMP
#include <omp.h>
static int fm_max_threads(void) { return omp_get_max_threads(); }
static int fm_have_openmp(void) { return 1; }
#else
static int fm_max_threads(void) { return 1; }
static int fm_have_openmp(void) { return 0; }
#endif

/* Map the pages of [p, p + len) into this process ahead of reading them: one system call
 * instead of a page fault per 64 KiB (fault-around), about 40% less time when a fresh
 * process first scans a memory-mapped index. Linux 5.14+; elsewhere, or if it fails,
 * nothing happens (the reads fault the pages in as usual). */
#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
static void fm_populate(const void* p, size_t len) {
    static long page = 0;
    if (page == 0) page = sysconf(_SC_PAGESIZE);
    if (page <= 0 || len == 0) return;
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)(page - 1);
    uintptr_t e = ((uintptr_t)p + len + (uintptr_t)page - 1) & ~(uintptr_t)(page - 1);
    (void)madvise((void*)a, e - a, MADV_POPULATE_READ);
}
#else
static void fm_populate(const void* p, size_t len) { (void)p; (void)len; }
#endif

/* dot(v, q) over n entries. `bias` is 128 * sum(q), which the VNNI variant needs (it
 * multiplies unsigned bytes: sum((v ^ 0x80) * q) = sum(v * q) + 128 * sum(q)); the
 * others ignore it. */
typedef int32_t (*fm_dot_fn)(const int8_t* v, const int8_t* q, Py_ssize_t n, int32_t bias);

enum { FM_SIMD_NONE = 0, FM_SIMD_AVX2 = 1, FM_SIMD_AVX512VNNI = 2 };

static int32_t fm_dot_scalar(const int8_t* v, const int8_t* q, Py_ssize_t n, int32_t bias) {
    int32_t acc = 0;
    (void)bias;
    for (Py_ssize_t j = 0; j < n; j++) acc += (int32_t)v[j] * (int32_t)q[j];
    return acc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define FM_X86 1

/* Bytes widened to int16 and multiplied pairwise into int32 (vpmaddwd): exact for every
 * int8 pair, unlike vpmaddubsw, which saturates. */
__attribute__((target("avx2")))
static int32_t fm_dot_avx2(const int8_t* v, const int8_t* q, Py_ssize_t n, int32_t bias) {
    __m256i acc0 = _mm256_setzero_si256(), acc1 = _mm256_setzero_si256();
    Py_ssize_t j = 0;
    (void)bias;
    for (; j + 32 <= n; j += 32) {
        __m256i a0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(v + j)));
        __m256i b0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(q + j)));
        __m256i a1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(v + j + 16)));
        __m256i b1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(q + j + 16)));
        acc0 = _mm256_add_epi32(acc0, _mm256_madd_epi16(a0, b0));
        acc1 = _mm256_add_epi32(acc1, _mm256_madd_epi16(a1, b1));
    }
    acc0 = _mm256_add_epi32(acc0, acc1);
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(acc0), _mm256_extracti128_si256(acc0, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    int32_t acc = _mm_cvtsi128_si32(s);
    for (; j < n; j++) acc += (int32_t)v[j] * (int32_t)q[j];
    return acc;
}

/* vpdpbusd multiplies unsigned by signed bytes, four products summed per int32 lane
 * without saturation: flip v's sign bit (v + 128) and take 128 * sum(q) off at the end.
 * The tail is a masked load (masked-off bytes are 0 in both operands: v ^ 0x80 is then
 * 0x80, but q is 0, so they add nothing). */
__attribute__((target("avx512f,avx512bw,avx512vnni")))
static int32_t fm_dot_avx512vnni(const int8_t* v, const int8_t* q, Py_ssize_t n, int32_t bias) {
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    __m512i acc0 = _mm512_setzero_si512(), acc1 = _mm512_setzero_si512();
    Py_ssize_t j = 0;
    for (; j + 128 <= n; j += 128) {
        __m512i a0 = _mm512_xor_si512(_mm512_loadu_si512((const void*)(v + j)), flip);
        __m512i a1 = _mm512_xor_si512(_mm512_loadu_si512((const void*)(v + j + 64)), flip);
        acc0 = _mm512_dpbusd_epi32(acc0, a0, _mm512_loadu_si512((const void*)(q + j)));
        acc1 = _mm512_dpbusd_epi32(acc1, a1, _mm512_loadu_si512((const void*)(q + j + 64)));
    }
    for (; j < n; j += 64) {
        __mmask64 m = (n - j >= 64) ? ~(__mmask64)0 : (((__mmask64)1 << (n - j)) - 1);
        __m512i a = _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, (const void*)(v + j)), flip);
        acc0 = _mm512_dpbusd_epi32(acc0, a, _mm512_maskz_loadu_epi8(m, (const void*)(q + j)));
    }
    return _mm512_reduce_add_epi32(_mm512_add_epi32(acc0, acc1)) - bias;
}

static int fm_best_simd(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
            && __builtin_cpu_supports("avx512vnni"))
        return FM_SIMD_AVX512VNNI;
    if (__builtin_cpu_supports("avx2")) return FM_SIMD_AVX2;
    return FM_SIMD_NONE;
}
#else
#define FM_X86 0
static int fm_best_simd(void) { return FM_SIMD_NONE; }
#endif

/* The dot products of `rows` consecutive rows of `dim` bytes from `v` into `out`: one
 * indirect call per block rather than per row, and the row loop inlines the variant. */
typedef void (*fm_dots_fn)(const int8_t* v, Py_ssize_t dim, Py_ssize_t rows, const int8_t* q,
                           int32_t bias, int32_t* out);

static void fm_dots_scalar(const int8_t* v, Py_ssize_t dim, Py_ssize_t rows, const int8_t* q,
                           int32_t bias, int32_t* out) {
    for (Py_ssize_t r = 0; r < rows; r++) out[r] = fm_dot_scalar(v + r * dim, q, dim, bias);
}

#if FM_X86
__attribute__((target("avx2")))
static void fm_dots_avx2(const int8_t* v, Py_ssize_t dim, Py_ssize_t rows, const int8_t* q,
                         int32_t bias, int32_t* out) {
    for (Py_ssize_t r = 0; r < rows; r++) out[r] = fm_dot_avx2(v + r * dim, q, dim, bias);
}

__attribute__((target("avx512f,avx512bw,avx512vnni")))
static void fm_dots_avx512vnni(const int8_t* v, Py_ssize_t dim, Py_ssize_t rows,
                               const int8_t* q, int32_t bias, int32_t* out) {
    for (Py_ssize_t r = 0; r < rows; r++) out[r] = fm_dot_avx512vnni(v + r * dim, q, dim, bias);
}
#endif

/* The variant for `level` (at most fm_best_simd()). */
static fm_dot_fn fm_dot_for(int level) {
#if FM_X86
    if (level == FM_SIMD_AVX512VNNI) return fm_dot_avx512vnni;
    if (level == FM_SIMD_AVX2) return fm_dot_avx2;
#endif
    (void)level;
    return fm_dot_scalar;
}

static fm_dots_fn fm_dots_for(int level) {
#if FM_X86
    if (level == FM_SIMD_AVX512VNNI) return fm_dots_avx512vnni;
    if (level == FM_SIMD_AVX2) return fm_dots_avx2;
#endif
    (void)level;
    return fm_dots_scalar;
}

#endif
