# Shared C types of the kernels; they mirror fastmem._format.INDEX_DTYPE and the record header.
from libc.stdint cimport int8_t, uint8_t, uint16_t, uint32_t, int32_t, int64_t, uint64_t

ctypedef int8_t i8
ctypedef uint8_t u8
ctypedef uint16_t u16
ctypedef uint32_t u32
ctypedef int32_t i32
ctypedef int64_t i64
ctypedef uint64_t u64
ctypedef float f32
ctypedef double f64
