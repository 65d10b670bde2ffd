# The record frame shared by the kernels that read records (records.pyx, reader.pyx): its
# header's constants, the CRC and the check of one record. Kept equal to fastmem._format by
# tests/test_kernels.py (records.CONSTANTS).
from _types cimport u8, u32, i64
from _bytes cimport load_le16, load_le32

cdef extern from "_crc.h":
    void fastmem_crc_init() noexcept nogil
    int fastmem_crc_use_clmul(int enabled) noexcept nogil
    u32 _crc_update "fastmem_crc_update"(u32 crc, const u8* p, i64 n) noexcept nogil

cdef enum:
    HEADER_SIZE = 20
    CRC_AT = 16
    FORMAT_VERSION = 1
    MAX_DIM = 4096
    MAX_RAW_PAYLOAD = 2 << 20
    MAGIC_LE32 = 0x524D468F  # b"\x8fFMR" read as a little-endian uint32
    MAGIC_BYTE0 = 0x8F


cdef inline i64 _framed_length(const u8* p, i64 pos, i64 end) noexcept nogil:
    # The length the header at p (= buf + pos) claims, when its fields are within the
    # limits and the record fits before end; 0 otherwise. The CRC is not checked here.
    cdef u32 dim, plen, rlen
    cdef i64 length
    if pos + HEADER_SIZE > end:
        return 0
    if load_le32(p) != MAGIC_LE32 or p[4] != FORMAT_VERSION or p[5] < 1 or p[5] > 3:
        return 0
    dim = load_le16(p + 6)
    plen = load_le32(p + 8)
    rlen = load_le32(p + 12)
    if dim > MAX_DIM or rlen > MAX_RAW_PAYLOAD or plen > rlen:
        return 0
    length = HEADER_SIZE + 2 * <i64>dim + plen
    return 0 if pos + length > end else length


cdef inline i64 _record_length(const u8* buf, i64 pos, i64 end) noexcept nogil:
    # Length of the valid record at pos, or 0. Every length is checked before it is used.
    cdef const u8* p = buf + pos
    cdef u32 crc
    cdef i64 length = _framed_length(p, pos, end)
    if length == 0:
        return 0
    crc = _crc_update(0, p, CRC_AT)
    crc = _crc_update(crc, p + HEADER_SIZE, length - HEADER_SIZE)
    if crc != load_le32(p + CRC_AT):
        return 0
    return length
