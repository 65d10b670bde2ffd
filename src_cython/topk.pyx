# cython: language_level=3
"""Compiled filtered top-k over the int8 embedding matrix, and the float16 rescoring.

Twins of fastmem._kernels.reference.topk_int8 and dot_half; see there for the contracts.

The scan is bound by memory bandwidth (1 M x 384 bytes per query), so it is arranged to
read little besides the vectors:

* without type, time or session filters, a row's dot product comes first and its flags
  are read only when its score would enter the heap (the flags sit in 80-byte index rows:
  reading them for every row would add a fifth to the traffic); ``scales`` may be a
  contiguous copy of the scale column for the same reason;
* with such filters, the filters come first and excluded rows' vectors are never read,
  so a narrow filter makes the scan faster, never slower;
* rows are cut into chunks scanned by OpenMP threads (GIL released), each with its own
  heap; the heaps are merged by (score, row), so the result does not depend on the
  number of threads; the first scan of a freshly mapped index populates its pages a chunk
  at a time (``madvise``), cheaper than a page fault per 64 KiB;
* the dot product is the AVX-512 VNNI, AVX2 or portable variant of _dot.h, chosen at
  import by what the processor supports (``simd()``; ``FASTMEM_SIMD=none|avx2|avx512vnni``
  caps it).
"""
import os

import numpy as np
from cython.parallel import prange

from _types cimport i8, u8, u16, i32, i64, u64, f32, f64
from _heap cimport worse, sift_down, sift_up

cdef extern from "_half.h" nogil:
    f32 fm_half_to_float(u16 h)

cdef extern from "_dot.h" nogil:
    ctypedef i32 (*fm_dot_fn)(const i8* v, const i8* q, Py_ssize_t n, i32 bias)
    int fm_best_simd()
    fm_dot_fn fm_dot_for(int level)
    ctypedef void (*fm_dots_fn)(const i8* v, Py_ssize_t dim, Py_ssize_t rows, const i8* q,
                                i32 bias, i32* out)
    fm_dots_fn fm_dots_for(int level)
    int fm_max_threads()
    int fm_have_openmp()
    void fm_populate(const void* p, size_t length)

SIMD_LEVELS = ("none", "avx2", "avx512vnni")
OPENMP = bool(fm_have_openmp())
# Rows per chunk: big enough that a chunk's heap work is small beside its scan, small
# enough that two threads share the work evenly on a busy machine (dynamic schedule).
cdef Py_ssize_t CHUNK_ROWS = 16384
# Threads only for scans of at least this many bytes of vectors: waking a second thread
# costs little on an idle machine, but on a busy one the end of the parallel region waits
# until the worker gets a time slice (measured under load at 100 k x 384: 6 ms on one
# thread, 14-21 ms on two). A 1 M x 384 scan (384 MB) uses both cores.
cdef Py_ssize_t MIN_THREADED_BYTES = 64 << 20


def _set_min_threaded_bytes(Py_ssize_t nbytes):
    """For the tests: scans of at least ``nbytes`` use threads; returns the old value."""
    global MIN_THREADED_BYTES
    old, MIN_THREADED_BYTES = MIN_THREADED_BYTES, nbytes
    return old

cdef int _best = fm_best_simd()
cdef int _level = _best

# GNU OpenMP's thread pool does not survive fork(): a child that enters a parallel region
# after its parent did waits forever for threads it does not have. Forked children scan on
# one thread (the scan is bound by memory bandwidth: one thread loses little).
cdef bint _forked = False


def _after_fork_in_child():
    global _forked
    _forked = True


os.register_at_fork(after_in_child=_after_fork_in_child)


def simd():
    """The dot-product variant in use: ``"none"``, ``"avx2"`` or ``"avx512vnni"``."""
    return SIMD_LEVELS[_level]


def set_simd(str name):
    """Use the variant ``name``, or the best the processor has if it has not that one;
    returns the variant now in use (the tests run every variant the machine supports)."""
    global _level
    if name not in SIMD_LEVELS:
        raise ValueError(f"unknown SIMD level {name!r}; one of {SIMD_LEVELS}")
    _level = min(SIMD_LEVELS.index(name), _best)
    return SIMD_LEVELS[_level]


if os.environ.get("FASTMEM_SIMD"):
    set_simd(os.environ["FASTMEM_SIMD"])


cdef inline Py_ssize_t _push(f64* hs, i64* hr, Py_ssize_t size, Py_ssize_t cap,
                             f64 score, i64 row) noexcept nogil:
    # Keep (score, row) if it ranks among the best `cap`; returns the new heap size.
    if size < cap:
        hs[size] = score
        hr[size] = row
        sift_up(hs, hr, size)
        return size + 1
    if worse(hs[0], hr[0], score, row):
        hs[0] = score
        hr[0] = row
        sift_down(hs, hr, size, 0)
    return size


cdef struct Scan:
    # One query over one matrix; columns are base pointers and byte strides.
    const i8* vectors
    Py_ssize_t dim
    const i8* query
    i32 bias
    fm_dot_fn dot
    fm_dots_fn dots
    const char* scales
    Py_ssize_t scales_stride
    const char* flags
    Py_ssize_t flags_stride
    const char* types
    Py_ssize_t types_stride
    const char* timestamps
    Py_ssize_t timestamps_stride
    const char* sessions
    Py_ssize_t sessions_stride
    const u8* allowed  # NULL: any type
    f64 since
    f64 until
    u64 session
    u16 require_flags
    u16 exclude_flags
    bint filters_first  # type, time or session filters: test them before the vector
    f32* scales_out  # NULL, or where to copy every row's scale


cdef inline bint _flags_ok(const Scan* s, Py_ssize_t row) noexcept nogil:
    cdef u16 f = (<const u16*>(s.flags + row * s.flags_stride))[0]
    return (f & s.require_flags) == s.require_flags and (f & s.exclude_flags) == 0


cdef inline bint _filters_ok(const Scan* s, Py_ssize_t row) noexcept nogil:
    cdef f64 ts = (<const f64*>(s.timestamps + row * s.timestamps_stride))[0]
    if ts < s.since or ts > s.until:
        return False
    if s.session != 0 and (<const u64*>(s.sessions + row * s.sessions_stride))[0] != s.session:
        return False
    if s.allowed != NULL and not s.allowed[(<const u16*>(s.types + row * s.types_stride))[0]]:
        return False
    return _flags_ok(s, row)


DEF BLOCK = 64  # rows whose dot products one call computes (unfiltered scan)


cdef Py_ssize_t _scan_chunk(const Scan* s, Py_ssize_t start, Py_ssize_t stop, Py_ssize_t cap,
                            f64* hs, i64* hr) noexcept nogil:
    """Rows [start, stop) into the heap (hs, hr) of capacity cap; returns its size."""
    cdef Py_ssize_t size = 0, row, block, i
    cdef f64 score
    cdef f32 scale
    cdef i32 dots[BLOCK]
    if s.scales_out != NULL and stop > start:  # the first scan of a freshly mapped base
        fm_populate(s.vectors + start * s.dim, (stop - start) * s.dim)
        fm_populate(s.scales + start * s.scales_stride, (stop - start) * s.scales_stride)
    if s.filters_first:  # row by row: an excluded row's vector is never read
        for row in range(start, stop):
            scale = (<const f32*>(s.scales + row * s.scales_stride))[0]
            if s.scales_out != NULL:
                s.scales_out[row] = scale
            if not _filters_ok(s, row):
                continue
            score = <f64>s.dot(s.vectors + row * s.dim, s.query, s.dim, s.bias) * <f64>scale
            size = _push(hs, hr, size, cap, score, row)
        return size
    for block in range(start, stop, BLOCK):
        s.dots(s.vectors + block * s.dim, s.dim, min(BLOCK, stop - block), s.query, s.bias, dots)
        for i in range(min(BLOCK, stop - block)):
            row = block + i
            scale = (<const f32*>(s.scales + row * s.scales_stride))[0]
            if s.scales_out != NULL:
                s.scales_out[row] = scale
            score = <f64>dots[i] * <f64>scale
            if size == cap and not worse(hs[0], hr[0], score, row):
                continue  # the common case: not among the best so far
            if not _flags_ok(s, row):  # flags only now: rarely read
                continue
            size = _push(hs, hr, size, cap, score, row)
    return size


def topk_int8(
    const i8[:, ::1] vectors,
    const f32[:] scales,
    const u16[:] flags,
    const u16[:] types,
    const f64[:] timestamps,
    const u64[:] sessions,
    const i8[::1] query,
    Py_ssize_t k,
    const u8[::1] type_allowed,
    f64 since,
    f64 until,
    u64 session,
    u16 require_flags,
    u16 exclude_flags,
    f32[::1] scales_out=None,
):
    """Filtered top-k by ``scale[row] * (vectors[row] . query)``; see the reference."""
    cdef Py_ssize_t n = vectors.shape[0], dim = vectors.shape[1]
    if query.shape[0] != dim:
        raise ValueError("query length differs from the matrix")
    if scales.shape[0] < n or flags.shape[0] < n or types.shape[0] < n \
            or timestamps.shape[0] < n or sessions.shape[0] < n:
        raise ValueError("a column is shorter than the matrix")
    if type_allowed is not None and type_allowed.shape[0] < 65536:
        raise ValueError("type_allowed must have 65536 entries")
    if scales_out is not None and scales_out.shape[0] < n:
        raise ValueError("scales_out is shorter than the matrix")
    if n and scales_out is not None and k <= 0:
        np.asarray(scales_out)[:n] = np.asarray(scales)[:n]
    if k <= 0 or n == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float64)
    cdef Scan s
    cdef i32 qsum = 0
    cdef Py_ssize_t j
    for j in range(dim):
        qsum += query[j]
    s.vectors = &vectors[0, 0] if dim else NULL
    s.dim = dim
    s.query = &query[0] if dim else NULL
    s.bias = 128 * qsum
    s.dot = fm_dot_for(_level)
    s.dots = fm_dots_for(_level)
    s.scales, s.scales_stride = <const char*>&scales[0], scales.strides[0]
    s.flags, s.flags_stride = <const char*>&flags[0], flags.strides[0]
    s.types, s.types_stride = <const char*>&types[0], types.strides[0]
    s.timestamps, s.timestamps_stride = <const char*>&timestamps[0], timestamps.strides[0]
    s.sessions, s.sessions_stride = <const char*>&sessions[0], sessions.strides[0]
    s.allowed = &type_allowed[0] if type_allowed is not None else NULL
    s.since, s.until, s.session = since, until, session
    s.require_flags, s.exclude_flags = require_flags, exclude_flags
    s.filters_first = type_allowed is not None or session != 0 or since > -np.inf \
        or until < np.inf
    s.scales_out = &scales_out[0] if scales_out is not None else NULL
    cdef Py_ssize_t cap = min(k, n)
    # Large k: larger chunks, so that the heaps to merge stay a small part of the rows.
    cdef Py_ssize_t rows_per_chunk = max(CHUNK_ROWS, 8 * cap)
    cdef Py_ssize_t chunks = max(1, (n + rows_per_chunk - 1) // rows_per_chunk)
    cdef int threads = 1
    if not _forked and n * max(dim, 1) >= MIN_THREADED_BYTES:
        threads = max(1, min(fm_max_threads(), chunks))
    cdef f64[::1] heap_scores = np.empty(chunks * cap, dtype=np.float64)
    cdef i64[::1] heap_rows = np.empty(chunks * cap, dtype=np.int64)
    cdef Py_ssize_t[::1] sizes = np.zeros(chunks, dtype=np.intp)
    cdef Py_ssize_t c, start, stop
    with nogil:
        if threads == 1:
            for c in range(chunks):
                start = c * rows_per_chunk
                stop = min(n, start + rows_per_chunk)
                sizes[c] = _scan_chunk(&s, start, stop, cap, &heap_scores[c * cap],
                                       &heap_rows[c * cap])
        else:
            for c in prange(chunks, schedule="dynamic", num_threads=threads):
                start = c * rows_per_chunk
                stop = min(n, start + rows_per_chunk)
                sizes[c] = _scan_chunk(&s, start, stop, cap, &heap_scores[c * cap],
                                       &heap_rows[c * cap])
    # Merge the chunks' heaps: the best `cap` of all by (score desc, row asc).
    keep = np.zeros(chunks * cap, dtype=bool)
    keep.reshape(chunks, cap)[np.arange(cap) < np.asarray(sizes)[:, None]] = True
    rows = np.asarray(heap_rows)[keep]
    scores = np.asarray(heap_scores)[keep]
    best = np.lexsort((rows, -scores))[:cap]
    return rows[best], scores[best]


def dot_half(const u8[::1] buf, const i64[::1] offsets, const f64[::1] query):
    """``query . float16 vector at buf[offset:]`` for each offset; see the reference."""
    cdef Py_ssize_t dim = query.shape[0], m = offsets.shape[0], size = buf.shape[0], i, j
    cdef f64[::1] out = np.zeros(m, dtype=np.float64)
    for i in range(m):
        if offsets[i] < 0 or offsets[i] > size - 2 * dim:
            raise ValueError("a vector lies outside the buffer")
    cdef const u8* base = &buf[0] if size else NULL
    cdef const u8* v
    cdef f64 acc
    with nogil:
        for i in range(m):
            v = base + offsets[i]
            acc = 0.0
            for j in range(dim):  # little-endian halves, in order: the reference's sum
                acc = acc + <f64>fm_half_to_float(v[2 * j] | (v[2 * j + 1] << 8)) * query[j]
            out[i] = acc
    return np.asarray(out)
