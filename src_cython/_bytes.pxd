# Little-endian loads from a byte buffer, independent of the host's byte order and alignment.
from _types cimport u8, u16, u32


cdef inline u16 load_le16(const u8* p) noexcept nogil:
    return <u16>p[0] | (<u16>p[1] << 8)


cdef inline u32 load_le32(const u8* p) noexcept nogil:
    return <u32>p[0] | (<u32>p[1] << 8) | (<u32>p[2] << 16) | (<u32>p[3] << 24)
