/* CRC-32 over the IEEE polynomial (equal to zlib.crc32): the record checksum of every
   kernel that reads or writes records (src_cython/_frames.pxd). Slicing by 8 bytes, and on
   x86-64 CPUs with PCLMULQDQ and SSE4.1 (checked at run time: wheels stay portable) runs
   of 64 bytes or more folded with carry-less multiplies, 5-10 times faster: get checks a
   whole record (~1 KB with a 384-dim vector) every call. Each extension that includes this
   header holds its own 8 KB table, filled at its import by fastmem_crc_init(). */
#ifndef FASTMEM_CRC_H
#define FASTMEM_CRC_H
#include <stdint.h>

static uint32_t fastmem_crc_table[8][256];

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FASTMEM_CRC_CLMUL 1
#include <immintrin.h>

static int fastmem_crc_clmul = 0; /* set by fastmem_crc_init() when the CPU has the instructions */

/* The CRC (not inverted: zlib's ~crc in, ~result out) of len bytes, len >= 64 and a
   multiple of 16: fold 4 x 128 bits at a time, then to 128, 64 and 32 bits (Barrett).
   The folding method and constants of Gopal et al., "Fast CRC Computation for Generic
   Polynomials Using PCLMULQDQ Instruction" (Intel, 2009), for the bit-reflected
   polynomial 0xEDB88320, as in Linux's crc32-pclmul and zlib-ng/Chromium. */
__attribute__((target("pclmul,sse4.1")))
static uint32_t fastmem_crc_fold(uint32_t crc, const uint8_t *buf, int64_t len) {
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596LL, 0x0154442bd4LL);
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);
    const __m128i k5k0 = _mm_set_epi64x(0, 0x0163cd6124LL);
    const __m128i poly = _mm_set_epi64x(0x01f7011641LL, 0x01db710641LL);
    const __m128i mask32 = _mm_setr_epi32(~0, 0, ~0, 0);
    __m128i x0, x1, x2, x3, x4, x5, x6, x7, x8;
    x1 = _mm_loadu_si128((const __m128i *)(buf + 0x00));
    x2 = _mm_loadu_si128((const __m128i *)(buf + 0x10));
    x3 = _mm_loadu_si128((const __m128i *)(buf + 0x20));
    x4 = _mm_loadu_si128((const __m128i *)(buf + 0x30));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)crc));
    x0 = k1k2;
    buf += 64;
    len -= 64;
    while (len >= 64) {
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x6 = _mm_clmulepi64_si128(x2, x0, 0x00);
        x7 = _mm_clmulepi64_si128(x3, x0, 0x00);
        x8 = _mm_clmulepi64_si128(x4, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x2 = _mm_clmulepi64_si128(x2, x0, 0x11);
        x3 = _mm_clmulepi64_si128(x3, x0, 0x11);
        x4 = _mm_clmulepi64_si128(x4, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x5), _mm_loadu_si128((const __m128i *)(buf + 0x00)));
        x2 = _mm_xor_si128(_mm_xor_si128(x2, x6), _mm_loadu_si128((const __m128i *)(buf + 0x10)));
        x3 = _mm_xor_si128(_mm_xor_si128(x3, x7), _mm_loadu_si128((const __m128i *)(buf + 0x20)));
        x4 = _mm_xor_si128(_mm_xor_si128(x4, x8), _mm_loadu_si128((const __m128i *)(buf + 0x30)));
        buf += 64;
        len -= 64;
    }
    /* four lanes into one */
    x0 = k3k4;
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x3), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x4), x5);
    while (len >= 16) {
        x2 = _mm_loadu_si128((const __m128i *)buf);
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
        buf += 16;
        len -= 16;
    }
    /* 128 bits to 64 */
    x2 = _mm_clmulepi64_si128(x1, x0, 0x10);
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), x2);
    x0 = k5k0;
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_and_si128(x1, mask32);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    /* Barrett reduction to 32 bits */
    x0 = poly;
    x2 = _mm_and_si128(x1, mask32);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x10);
    x2 = _mm_and_si128(x2, mask32);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}
#endif

static void fastmem_crc_init(void) {
#ifdef FASTMEM_CRC_CLMUL
    __builtin_cpu_init();
    fastmem_crc_clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#endif
    uint32_t c, i, j;
    for (i = 0; i < 256; i++) {
        c = i;
        for (j = 0; j < 8; j++)
            c = (c >> 1) ^ ((c & 1) ? 0xEDB88320u : 0);
        fastmem_crc_table[0][i] = c;
    }
    for (i = 0; i < 256; i++)
        for (j = 1; j < 8; j++)
            fastmem_crc_table[j][i] = (fastmem_crc_table[j - 1][i] >> 8)
                ^ fastmem_crc_table[0][fastmem_crc_table[j - 1][i] & 0xFF];
}

/* Whether runs are folded with the instructions: 0 turns them off (the tests run the
   table alone too), 1 back on where the CPU has them. Returns whether they are in use. */
static int fastmem_crc_use_clmul(int enabled) {
#ifdef FASTMEM_CRC_CLMUL
    fastmem_crc_clmul = enabled && __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
    return fastmem_crc_clmul;
#else
    (void)enabled;
    return 0;
#endif
}

static inline uint32_t fastmem_load_le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static inline uint32_t fastmem_crc_update(uint32_t crc, const uint8_t *p, int64_t n) {
    const uint32_t (*t)[256] = (const uint32_t (*)[256])fastmem_crc_table;
    uint32_t a, b;
    crc = ~crc;
#ifdef FASTMEM_CRC_CLMUL
    if (n >= 64 && fastmem_crc_clmul) {
        int64_t folded = n & ~(int64_t)15;
        crc = fastmem_crc_fold(crc, p, folded);
        p += folded;
        n -= folded;
    }
#endif
    while (n >= 8) {
        a = fastmem_load_le32(p) ^ crc;
        b = fastmem_load_le32(p + 4);
        crc = t[7][a & 0xFF] ^ t[6][(a >> 8) & 0xFF] ^ t[5][(a >> 16) & 0xFF] ^ t[4][a >> 24]
            ^ t[3][b & 0xFF] ^ t[2][(b >> 8) & 0xFF] ^ t[1][(b >> 16) & 0xFF] ^ t[0][b >> 24];
        p += 8;
        n -= 8;
    }
    while (n > 0) {
        crc = (crc >> 8) ^ t[0][(crc ^ *p) & 0xFF];
        p++;
        n--;
    }
    return ~crc;
}
#endif
