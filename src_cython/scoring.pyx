# cython: language_level=3
"""Compiled importance scoring: one pass over the index rows, GIL released, cut into
chunks shared by OpenMP threads on large stores.

Twin of fastmem._kernels.reference.importance; see there for the formula.
"""
import os

from cython.parallel import prange
from libc.math cimport exp2, INFINITY

from _types cimport u16, u32, f32, f64

cdef extern from "_dot.h" nogil:
    int fm_max_threads()

# Rows per chunk when two or more threads share the pass (smaller stores: one thread).
cdef Py_ssize_t CHUNK_ROWS = 65536
# Threads from this many rows: below, one thread is done before a busy machine would
# schedule the second (see MIN_THREADED_BYTES in topk.pyx).
cdef Py_ssize_t MIN_THREADED_ROWS = 262144


def _set_min_threaded_rows(Py_ssize_t rows):
    """For the tests: passes over at least ``rows`` rows use threads; returns the old value."""
    global MIN_THREADED_ROWS
    old, MIN_THREADED_ROWS = MIN_THREADED_ROWS, rows
    return old

# GNU OpenMP's thread pool does not survive fork(): a child that enters a parallel region
# after its parent did waits forever for threads it does not have. Forked children scan on
# one thread (the scan is bound by memory bandwidth: one thread loses little).
cdef bint _forked = False


def _after_fork_in_child():
    global _forked
    _forked = True


os.register_at_fork(after_in_child=_after_fork_in_child)


cdef struct Scoring:
    # The columns as base pointers; strides in bytes, in the order of the fields.
    const char* base
    const char* flags
    const char* access_count
    const char* last_access
    const char* timestamps
    char* out
    Py_ssize_t strides[6]
    f64 now
    f64 access_weight
    f64 recency_weight
    f64 pin_bonus
    f64 inv_access
    f64 inv_recency
    u16 pinned_flag
    u16 exclude_flags


cdef void _score_rows(const Scoring* p, Py_ssize_t start, Py_ssize_t stop) noexcept nogil:
    cdef Py_ssize_t row
    cdef f64 decayed, age, score
    cdef u16 f
    cdef u32 count
    for row in range(start, stop):
        f = (<const u16*>(p.flags + row * p.strides[1]))[0]
        if f & p.exclude_flags:
            (<f32*>(p.out + row * p.strides[5]))[0] = -INFINITY
            continue
        score = (<const f32*>(p.base + row * p.strides[0]))[0]
        count = (<const u32*>(p.access_count + row * p.strides[2]))[0]
        if count:
            age = p.now - (<const f64*>(p.last_access + row * p.strides[3]))[0]
            if age < 0:
                age = 0
            decayed = count * exp2(-age * p.inv_access)
            score += p.access_weight * decayed / (1.0 + decayed)
        age = p.now - (<const f64*>(p.timestamps + row * p.strides[4]))[0]
        if age < 0:
            age = 0
        score += p.recency_weight * exp2(-age * p.inv_recency)
        if f & p.pinned_flag:
            score += p.pin_bonus
        (<f32*>(p.out + row * p.strides[5]))[0] = <f32>score


def importance(
    const f32[:] base,
    const u16[:] flags,
    const u32[:] access_count,
    const f64[:] last_access,
    const f64[:] timestamps,
    f32[:] out,
    f64 now,
    f64 access_half_life,
    f64 access_weight,
    f64 recency_half_life,
    f64 recency_weight,
    f64 pin_bonus,
    u16 pinned_flag,
    u16 exclude_flags,
):
    """Write every row's importance into ``out``; see the reference for the formula."""
    cdef Py_ssize_t n = base.shape[0]
    if flags.shape[0] < n or access_count.shape[0] < n or last_access.shape[0] < n \
            or timestamps.shape[0] < n or out.shape[0] < n:
        raise ValueError("a column is shorter than base")
    if not (access_half_life > 0 and recency_half_life > 0):
        raise ValueError("half-lives must be > 0")
    if n == 0:
        return
    cdef Scoring p
    p.base, p.flags = <const char*>&base[0], <const char*>&flags[0]
    p.access_count, p.last_access = <const char*>&access_count[0], <const char*>&last_access[0]
    p.timestamps, p.out = <const char*>&timestamps[0], <char*>&out[0]
    p.strides[0], p.strides[1], p.strides[2] = base.strides[0], flags.strides[0], \
        access_count.strides[0]
    p.strides[3], p.strides[4], p.strides[5] = last_access.strides[0], timestamps.strides[0], \
        out.strides[0]
    p.now, p.access_weight, p.recency_weight, p.pin_bonus = now, access_weight, \
        recency_weight, pin_bonus
    p.inv_access, p.inv_recency = 1.0 / access_half_life, 1.0 / recency_half_life
    p.pinned_flag, p.exclude_flags = pinned_flag, exclude_flags
    cdef Py_ssize_t chunks = max(1, (n + CHUNK_ROWS - 1) // CHUNK_ROWS), c
    cdef int threads = 1
    if not _forked and n >= MIN_THREADED_ROWS:
        threads = max(1, min(fm_max_threads(), chunks))
    with nogil:
        if threads == 1:
            _score_rows(&p, 0, n)
        else:  # rows are independent: the result does not depend on the threads
            for c in prange(chunks, schedule="static", num_threads=threads):
                _score_rows(&p, c * CHUNK_ROWS, min(n, (c + 1) * CHUNK_ROWS))
