/* CRC-32 over the IEEE polynomial (equal to zlib.crc32), slicing by 8 bytes: the record
   checksum of every kernel that reads or writes records (src_cython/_frames.pxd). Each
   extension that includes this header holds its own 8 KB table, filled at its import by
   fastmem_crc_init(). */
#ifndef FASTMEM_CRC_H
#define FASTMEM_CRC_H
#include <stdint.h>

static uint32_t fastmem_crc_table[8][256];

static void fastmem_crc_init(void) {
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

static inline uint32_t fastmem_load_le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static inline uint32_t fastmem_crc_update(uint32_t crc, const uint8_t *p, int64_t n) {
    const uint32_t (*t)[256] = (const uint32_t (*)[256])fastmem_crc_table;
    uint32_t a, b;
    crc = ~crc;
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
