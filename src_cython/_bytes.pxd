# Little-endian loads from a byte buffer, independent of the host's byte order and alignment.
from libc.string cimport memcpy
from _types cimport u8, u16, u32, u64


cdef inline u16 load_le16(const u8* p) noexcept nogil:
    return <u16>p[0] | (<u16>p[1] << 8)


cdef inline u32 load_le32(const u8* p) noexcept nogil:
    return <u32>p[0] | (<u32>p[1] << 8) | (<u32>p[2] << 16) | (<u32>p[3] << 24)


cdef inline void store_le16(u8* p, u16 v) noexcept nogil:
    p[0] = v & 0xFF
    p[1] = v >> 8


cdef inline void store_le32(u8* p, u32 v) noexcept nogil:
    p[0] = v & 0xFF
    p[1] = (v >> 8) & 0xFF
    p[2] = (v >> 16) & 0xFF
    p[3] = v >> 24


cdef inline u64 load_le64(const u8* p) noexcept nogil:
    return <u64>load_le32(p) | (<u64>load_le32(p + 4) << 32)


cdef inline double load_f64(const u8* p) noexcept nogil:
    cdef u64 u = load_le64(p)
    cdef double d
    memcpy(&d, &u, 8)
    return d
