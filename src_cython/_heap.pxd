# A bounded min-heap of (score, row) pairs, shared by the top-k kernels: the root is the worst
# kept pair, so a better candidate replaces it in O(log k).
from _types cimport i64, f64


cdef inline bint worse(f64 sa, i64 ra, f64 sb, i64 rb) noexcept nogil:
    # (sa, ra) ranks below (sb, rb): lower score, or the same score and a higher row.
    return sa < sb or (sa == sb and ra > rb)


cdef inline void sift_down(f64* hs, i64* hr, Py_ssize_t size, Py_ssize_t i) noexcept nogil:
    # Min-heap on rank: the root is the worst of the kept rows.
    cdef Py_ssize_t child
    cdef f64 s
    cdef i64 r
    while True:
        child = 2 * i + 1
        if child >= size:
            return
        if child + 1 < size and worse(hs[child + 1], hr[child + 1], hs[child], hr[child]):
            child += 1
        if not worse(hs[child], hr[child], hs[i], hr[i]):
            return
        s = hs[i]; hs[i] = hs[child]; hs[child] = s
        r = hr[i]; hr[i] = hr[child]; hr[child] = r
        i = child


cdef inline void sift_up(f64* hs, i64* hr, Py_ssize_t i) noexcept nogil:
    cdef Py_ssize_t parent
    cdef f64 s
    cdef i64 r
    while i > 0:
        parent = (i - 1) // 2
        if not worse(hs[i], hr[i], hs[parent], hr[parent]):
            return
        s = hs[i]; hs[i] = hs[parent]; hs[parent] = s
        r = hr[i]; hr[i] = hr[parent]; hr[parent] = r
        i = parent
