# cython: language_level=3
"""Compiled keyword search: tokenizer, BM25 top-k over postings, postings merge.

Twins of fastmem._kernels.reference.tokenize_batch, bm25_topk, merge_postings, merge_postings_runs
and sort_postings; see there for the contracts (the tokenization rules are documented in
fastmem/storage/keyword_index.py).
"""
import numpy as np

from cpython.unicode cimport PyUnicode_AsUTF8AndSize

cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object o)
    void* PyUnicode_DATA(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)
from libc.math cimport log
from libc.stdlib cimport free, malloc, qsort
from libc.string cimport memcpy, memset

from _types cimport u8, u16, u32, i64, u64, f64
from _heap cimport worse, sift_down, sift_up

cdef u64 FNV_OFFSET = 0xCBF29CE484222325ULL
cdef u64 FNV_PRIME = 0x100000001B3ULL


cdef inline bint _word_byte(u8 c) noexcept nogil:
    # ASCII digits and lowercase letters, and every byte of a non-ASCII UTF-8 character.
    return (48 <= c <= 57) or (97 <= c <= 122) or c >= 128


cdef inline u8 _fold(u8 c) noexcept nogil:
    # ASCII lowercase: what str.lower() does to ASCII text (non-ASCII text is lowered first).
    return c + 32 if 65 <= c <= 90 else c


cdef int _cmp_u64(const void* a, const void* b) noexcept nogil:
    cdef u64 x = (<const u64*>a)[0]
    cdef u64 y = (<const u64*>b)[0]
    return (x > y) - (x < y)


# A memory's terms are sorted to count repeats: most memories have tens of tokens, which
# an inlined insertion sort orders several times faster than qsort's call per comparison
# (the order, hence the output, is the same: equal terms are equal numbers).
cdef enum:
    INSERTION_SORT_MAX = 64


cdef inline void _insertion_sort(u64* a, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i, j
    cdef u64 v
    for i in range(1, n):
        v = a[i]
        j = i
        while j > 0 and a[j - 1] > v:
            a[j] = a[j - 1]
            j -= 1
        a[j] = v


def tokenize_batch(list texts, u32 first=0):
    """(terms u64, docs u32, tf u16, doc_len u32) of the texts' lowercase forms; docs count
    from ``first``."""
    cdef Py_ssize_t n = len(texts), i, cap = 0, longest = 0, out = 0
    cdef u32 count
    cdef u64* buf
    cdef u64* t_out
    cdef u32* d_out
    cdef u16* f_out
    cdef u32* l_out
    cdef const u8** data = <const u8**>malloc((n + 1) * sizeof(void*))
    cdef Py_ssize_t* lengths = <Py_ssize_t*>malloc((n + 1) * sizeof(Py_ssize_t))
    if data == NULL or lengths == NULL:
        free(data)
        free(lengths)
        raise MemoryError()
    try:
        utf8 = _utf8_forms(texts, data, lengths)  # keeps the lowered forms alive
        for i in range(n):
            cap += (lengths[i] + 1) // 2  # at most one token per two bytes (a byte and a separator)
            longest = lengths[i] if lengths[i] > longest else longest
        terms = np.empty(cap, dtype=np.uint64)
        docs = np.empty(cap, dtype=np.uint32)
        tfs = np.empty(cap, dtype=np.uint16)
        lens = np.empty(n, dtype=np.uint32)
        t_out, d_out, f_out, l_out = _u64p(terms), _u32p(docs), _u16p(tfs), _u32p(lens)
        buf = <u64*>malloc(((longest + 1) // 2 + 1) * sizeof(u64))
        if buf == NULL:
            raise MemoryError()
        with nogil:
            for i in range(n):
                out += _text_terms(data[i], lengths[i], first + <u32>i, buf, t_out + out, d_out + out,
                                   f_out + out, &count)
                l_out[i] = count
        free(buf)
    finally:
        free(data)
        free(lengths)
    return terms[:out], docs[:out], tfs[:out], lens


cdef list _utf8_forms(list texts, const u8** data, Py_ssize_t* lengths):
    # Each text's lowercase UTF-8 bytes into data and lengths (ASCII strings: their own
    # buffer, no copy; ASCII is folded in _text_terms); returns the strings that hold them.
    cdef list utf8 = []
    cdef Py_ssize_t i = 0, length
    for obj in texts:
        if type(obj) is not str:
            raise TypeError("tokenize_batch takes a list of str")
        if PyUnicode_IS_ASCII(obj):  # its own bytes (a macro: no method call per text)
            data[i] = <const u8*>PyUnicode_DATA(obj)
            lengths[i] = PyUnicode_GET_LENGTH(obj)
        else:
            obj = (<str>obj).lower()  # Unicode case rules: Python's
            data[i] = <const u8*>PyUnicode_AsUTF8AndSize(obj, &length)
            lengths[i] = length
        utf8.append(obj)  # held here: the list may change while the GIL is let go
        i += 1
    return utf8


cdef inline u64* _u64p(object a):
    cdef u64[::1] v = a
    return &v[0] if v.shape[0] else NULL


cdef inline u32* _u32p(object a):
    cdef u32[::1] v = a
    return &v[0] if v.shape[0] else NULL


cdef inline u16* _u16p(object a):
    cdef u16[::1] v = a
    return &v[0] if v.shape[0] else NULL


cdef u8 WORD[256]  # each byte's folded form when it is a word byte (_word_byte), else 0
cdef int _c
for _c in range(256):
    WORD[_c] = _fold(_c) if _word_byte(_fold(_c)) else 0


cdef Py_ssize_t _text_terms(const u8* p, Py_ssize_t length, u32 doc, u64* buf, u64* t_out,
                            u32* d_out, u16* f_out, u32* tokens) noexcept nogil:
    # One text's distinct terms, ascending, with their counts, at t_out, d_out (``doc``)
    # and f_out; returns how many; its token count into ``tokens``. buf: room for
    # (length + 1) // 2 terms.
    cdef Py_ssize_t j = 0, count = 0, out = 0, run
    cdef u64 h
    cdef u8 ch
    while j < length:
        # One table load per byte instead of the fold's and the ranges' compares.
        ch = WORD[p[j]]
        j += 1
        if ch == 0:
            continue
        h = FNV_OFFSET
        while True:
            h = (h ^ ch) * FNV_PRIME
            if j == length:
                break
            ch = WORD[p[j]]
            j += 1  # past the separator too, when this is one
            if ch == 0:
                break
        buf[count] = h
        count += 1
    tokens[0] = <u32>count
    if count <= INSERTION_SORT_MAX:
        _insertion_sort(buf, count)
    else:
        qsort(buf, count, sizeof(u64), _cmp_u64)
    j = 0
    while j < count:
        run = j + 1
        while run < count and buf[run] == buf[j]:
            run += 1
        t_out[out] = buf[j]
        d_out[out] = doc
        f_out[out] = <u16>(run - j if run - j < 65535 else 65535)
        out += 1
        j = run
    return out


cdef u32 DEAD = 0x80000000u  # doc_len's top bit: the row is forgotten
cdef u32 LEN_MASK = 0x7FFFFFFFu


def bm25_topk(
    const u32[:] post_rows,
    const u16[:] post_tf,
    const i64[:, ::1] ranges,
    const u32[:] base_len,
    const u32[:] tail_len,
    tuple base_cols,
    tuple tail_cols,
    Py_ssize_t k,
    const u8[:] type_allowed,
    f64 since,
    f64 until,
    u64 session,
    f64 n_live,
    f64 avgdl,
    f64 k1,
    f64 b,
    f64[::1] scratch,
):
    """Compiled twin of fastmem._kernels.reference.bm25_topk."""
    cdef const u16[:] btype = base_cols[0]
    cdef const f64[:] bstamp = base_cols[1]
    cdef const u64[:] bsess = base_cols[2]
    cdef const u16[:] ttype = tail_cols[0]
    cdef const f64[:] tstamp = tail_cols[1]
    cdef const u64[:] tsess = tail_cols[2]
    cdef Py_ssize_t n_base = base_len.shape[0], n_tail = tail_len.shape[0]
    cdef Py_ssize_t n = n_base + n_tail
    cdef Py_ssize_t q = ranges.shape[0], j, a, e, x, size = 0, touched_n = 0, total = 0, i
    cdef Py_ssize_t n_post = post_rows.shape[0]
    cdef i64 r
    cdef u32 dl_raw
    cdef f64 idf, df, s, tf, norm
    cdef u16 code
    cdef f64 stamp
    cdef u64 sess
    cdef bint filter_types = type_allowed is not None
    cdef bint check_since = not (since == -float("inf"))
    cdef bint check_until = not (until == float("inf"))
    if btype.shape[0] != n_base or bstamp.shape[0] != n_base or bsess.shape[0] != n_base \
            or ttype.shape[0] != n_tail or tstamp.shape[0] != n_tail or tsess.shape[0] != n_tail:
        raise ValueError("the row columns have different lengths")
    if scratch.shape[0] < n:
        raise ValueError("scratch is shorter than the rows")
    if post_tf.shape[0] != n_post or ranges.shape[1] != 2:
        raise ValueError("postings and their term frequencies differ in length")
    if filter_types and type_allowed.shape[0] < 65536:
        raise ValueError("type_allowed must have 65536 entries")
    for j in range(q):
        a, e = ranges[j, 0], ranges[j, 1]
        if a < 0 or e < a or e > n_post:
            raise ValueError("a posting range is out of bounds")
        total += e - a
        for x in range(a, e):
            if post_rows[x] >= n:
                raise ValueError("a posting points past the rows")
    if total == 0 or k <= 0 or n_live <= 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
    cdef i64* touched = <i64*>malloc(min(total, n) * sizeof(i64))
    cdef f64* hs = <f64*>malloc(min(k, n) * sizeof(f64))
    cdef i64* hr = <i64*>malloc(min(k, n) * sizeof(i64))
    if touched == NULL or hs == NULL or hr == NULL:
        free(touched); free(hs); free(hr)
        raise MemoryError()
    try:
        with nogil:
            for j in range(q):
                a, e = ranges[j, 0], ranges[j, 1]
                df = 0
                for x in range(a, e):
                    r = post_rows[x]
                    dl_raw = base_len[r] if r < n_base else tail_len[r - n_base]
                    if post_tf[x] and not (dl_raw & DEAD):
                        df += 1
                if df == 0:
                    continue
                idf = log(1.0 + (n_live - df + 0.5) / (df + 0.5))
                for x in range(a, e):
                    r = post_rows[x]
                    dl_raw = base_len[r] if r < n_base else tail_len[r - n_base]
                    if post_tf[x] == 0 or (dl_raw & DEAD):
                        continue
                    tf = post_tf[x]
                    norm = k1 * (1.0 - b + b * <f64>(dl_raw & LEN_MASK) / avgdl)
                    s = idf * (tf * (k1 + 1.0)) / (tf + norm)
                    if scratch[r] == 0.0:
                        touched[touched_n] = r
                        touched_n += 1
                    scratch[r] += s
            for i in range(touched_n):
                r = touched[i]
                s = scratch[r]
                if s == 0.0:
                    continue  # a row listed twice under one term (a damaged file): taken
                scratch[r] = 0.0
                if filter_types:
                    code = btype[r] if r < n_base else ttype[r - n_base]
                    if not type_allowed[code]:
                        continue
                if check_since or check_until:
                    stamp = bstamp[r] if r < n_base else tstamp[r - n_base]
                    if (check_since and not stamp >= since) or (check_until and not stamp <= until):
                        continue
                if session:
                    sess = bsess[r] if r < n_base else tsess[r - n_base]
                    if sess != session:
                        continue
                if size < k:
                    hs[size] = s
                    hr[size] = r
                    size += 1
                    sift_up(hs, hr, size - 1)
                elif worse(hs[0], hr[0], s, r):
                    hs[0] = s
                    hr[0] = r
                    sift_down(hs, hr, size, 0)
        out_rows = np.empty(size, dtype=np.int64)
        out_scores = np.empty(size, dtype=np.float64)
        for i in range(size - 1, -1, -1):  # pop the worst into the back: best first
            out_rows[i] = hr[0]
            out_scores[i] = hs[0]
            hs[0] = hs[i]
            hr[0] = hr[i]
            sift_down(hs, hr, i, 0)
        return out_rows, out_scores
    finally:
        for i in range(touched_n):  # leave scratch zeroed even after an error
            scratch[touched[i]] = 0.0
        free(touched); free(hs); free(hr)


def merge_postings(b_terms, b_offsets, b_rows, b_tf, t_terms, t_rows, t_tf):
    """Compiled twin of fastmem._kernels.reference.merge_postings: one run merged."""
    return merge_postings_runs(b_terms, b_offsets, b_rows, b_tf, [(t_terms, t_rows, t_tf)])


def merge_postings_runs(
    const u64[:] b_terms,
    const u64[:] b_offsets,
    const u32[:] b_rows,
    const u16[:] b_tf,
    list runs,
):
    """Compiled twin of fastmem._kernels.reference.merge_postings_runs: every run merged in one
    pass, where merging them one after another moves the postings merged so far again
    for each run (~0.55 s of a 1 M store's closing checkpoint)."""
    cdef Py_ssize_t nt = b_terms.shape[0], p = b_rows.shape[0], k = len(runs)
    cdef Py_ssize_t i = 0, out_t = 0, out_p = 0, total = 0, x, a, e, r, j, m
    cdef u64 term
    cdef bint have
    cdef const u64[::1] v_t
    cdef const u32[::1] v_r
    cdef const u16[::1] v_f
    if b_offsets.shape[0] != nt + 1 or b_tf.shape[0] != p:
        raise ValueError("postings arrays have inconsistent lengths")
    if b_offsets[0] != 0 or b_offsets[nt] != <u64>p:
        raise ValueError("the posting offsets do not span the postings")
    for x in range(nt):
        if b_offsets[x] > b_offsets[x + 1] or (x and b_terms[x - 1] >= b_terms[x]):
            raise ValueError("the posting offsets or terms are out of order")
    keep = []  # the runs' contiguous arrays, alive while their pointers are read
    for run in runs:
        t, rr, f = (np.ascontiguousarray(run[0], dtype=np.uint64),
                    np.ascontiguousarray(run[1], dtype=np.uint32),
                    np.ascontiguousarray(run[2], dtype=np.uint16))
        if len(rr) != len(t) or len(f) != len(t):
            raise ValueError("postings arrays have inconsistent lengths")
        v_t = t
        for x in range(1, len(t)):
            if v_t[x - 1] > v_t[x]:
                raise ValueError("the new postings are not sorted by term")
        keep.append((t, rr, f))
        total += len(t)
    terms = np.empty(nt + total, dtype=np.uint64)
    offsets = np.empty(nt + total + 1, dtype=np.uint64)
    rows = np.empty(p + total, dtype=np.uint32)
    tfs = np.empty(p + total, dtype=np.uint16)
    cdef u64[::1] o_terms = terms
    cdef u64[::1] o_off = offsets
    cdef u32[::1] o_rows = rows
    cdef u16[::1] o_tf = tfs
    cdef const u64** rt = <const u64**>malloc(max(k, 1) * sizeof(u64*))
    cdef const u32** rr_ = <const u32**>malloc(max(k, 1) * sizeof(u32*))
    cdef const u16** rf = <const u16**>malloc(max(k, 1) * sizeof(u16*))
    cdef Py_ssize_t* rn = <Py_ssize_t*>malloc(max(k, 1) * sizeof(Py_ssize_t))
    cdef Py_ssize_t* rj = <Py_ssize_t*>malloc(max(k, 1) * sizeof(Py_ssize_t))
    if not (rt and rr_ and rf and rn and rj):
        free(rt); free(rr_); free(rf); free(rn); free(rj)
        raise MemoryError()
    try:
        for r in range(k):
            rn[r], rj[r] = len(keep[r][0]), 0
            if rn[r]:
                v_t, v_r, v_f = keep[r]
                rt[r], rr_[r], rf[r] = &v_t[0], &v_r[0], &v_f[0]
        with nogil:
            o_off[0] = 0
            while True:
                # The smallest term at the heads (a few runs: a scan beats a heap).
                have = i < nt
                if have:
                    term = b_terms[i]
                for r in range(k):
                    if rj[r] < rn[r] and (not have or rt[r][rj[r]] < term):
                        term = rt[r][rj[r]]
                        have = True
                if not have:
                    break
                if i < nt and b_terms[i] == term:  # the base's postings first, then each run's
                    a, e = b_offsets[i], b_offsets[i + 1]
                    for x in range(a, e):
                        o_rows[out_p] = b_rows[x]
                        o_tf[out_p] = b_tf[x]
                        out_p += 1
                    i += 1
                for r in range(k):
                    j, m = rj[r], rn[r]
                    while j < m and rt[r][j] == term:
                        o_rows[out_p] = rr_[r][j]
                        o_tf[out_p] = rf[r][j]
                        out_p += 1
                        j += 1
                    rj[r] = j
                o_terms[out_t] = term
                out_t += 1
                o_off[out_t] = out_p
    finally:
        free(rt); free(rr_); free(rf); free(rn); free(rj)
    return terms[:out_t], offsets[: out_t + 1], rows, tfs


# Grouping by term (below) gives up, for the radix sort, past this share of distinct terms:
# its table then no longer fits the cache, and the distinct terms' own sort costs more.
cdef enum:
    GROUP_MIN = 4096  # postings: fewer are radix-sorted (the table's setup is not worth it)
    GROUP_MAX_SHARE = 8  # at most one distinct term per 8 postings


def sort_postings(const u64[:] terms, const u32[:] rows, const u16[:] tf):
    """Compiled twin of fastmem._kernels.reference.sort_postings (stable).

    A bulk load's postings repeat their words (~18 per memory from a vocabulary of tens of
    thousands): they are grouped by term in a hash table and placed by a counting sort over
    the distinct terms (two passes over the postings, the distinct terms sorted on their
    own), ~4x faster at 1 M postings than the 8 passes of the LSD radix sort that orders
    any other input (issue 21). Both keep the rows of a term in their order."""
    cdef Py_ssize_t n = terms.shape[0]
    if rows.shape[0] != n or tf.shape[0] != n:
        raise ValueError("postings arrays have inconsistent lengths")
    if n >= GROUP_MIN:
        grouped = _group_postings(terms, rows, tf)
        if grouped is not None:
            return grouped
    return _radix_postings(terms, rows, tf)


cdef object _group_postings(const u64[:] terms, const u32[:] rows, const u16[:] tf):
    # sort_postings by a hash table of the distinct terms; None when there are more than
    # n / GROUP_MAX_SHARE of them.
    cdef Py_ssize_t n = terms.shape[0], i, limit = n // GROUP_MAX_SHARE, m = 0, pos
    cdef Py_ssize_t cap = 1024, slot, r
    cdef int shift = 64 - 10
    cdef u64 key, MIX = 0x9E3779B97F4A7C15ULL
    cdef u32 id_
    cdef bint too_many = False
    cdef u64* keys = <u64*>malloc((limit + 1) * sizeof(u64))  # each distinct term, by id
    cdef i64* starts = <i64*>malloc((limit + 1) * sizeof(i64))  # postings per id, then next place
    cdef u32* ids = <u32*>malloc(n * sizeof(u32))  # each posting's term id
    cdef u32* table = <u32*>malloc(cap * sizeof(u32))  # id + 1 per slot; 0: empty
    cdef u32* grown
    try:
        if keys == NULL or starts == NULL or ids == NULL or table == NULL:
            raise MemoryError()
        with nogil:
            memset(table, 0, cap * sizeof(u32))
            for i in range(n):
                key = terms[i]
                slot = <Py_ssize_t>((key * MIX) >> shift)
                while True:
                    id_ = table[slot]
                    if id_ == 0 or keys[id_ - 1] == key:
                        break
                    slot = (slot + 1) & (cap - 1)
                if id_ == 0:  # a new term
                    if m == limit:
                        too_many = True
                        break
                    keys[m], starts[m] = key, 0
                    m += 1
                    id_ = <u32>m
                    table[slot] = id_
                    if 2 * m > cap:  # keep the table at most half full: rebuild it twice as big
                        grown = <u32*>malloc(2 * cap * sizeof(u32))
                        if grown == NULL:
                            too_many = True  # the radix sort needs no table
                            break
                        free(table)
                        table, cap, shift = grown, 2 * cap, shift - 1
                        memset(table, 0, cap * sizeof(u32))
                        for r in range(m):
                            slot = <Py_ssize_t>((keys[r] * MIX) >> shift)
                            while table[slot] != 0:
                                slot = (slot + 1) & (cap - 1)
                            table[slot] = <u32>(r + 1)
                ids[i] = id_ - 1
                starts[id_ - 1] += 1
        if too_many:
            return None
        distinct = np.empty(m, dtype=np.uint64)
        if m:
            memcpy(_u64_data(distinct), keys, m * sizeof(u64))
        order = np.argsort(distinct)  # distinct keys: any sort gives the one order
        out_t = np.empty(n, dtype=np.uint64)
        out_r = np.empty(n, dtype=np.uint32)
        out_f = np.empty(n, dtype=np.uint16)
        _place(order, keys, starts, ids, terms, rows, tf, out_t, out_r, out_f)
        return out_t, out_r, out_f
    finally:
        free(keys); free(starts); free(ids); free(table)


cdef void _place(const i64[::1] order, const u64* keys, i64* starts, const u32* ids,
                 const u64[:] terms, const u32[:] rows, const u16[:] tf, u64[::1] out_t,
                 u32[::1] out_r, u16[::1] out_f) noexcept:
    # The counting sort's placing pass: starts[id] holds each term's count, turned into
    # where its postings go (terms in ``order``), each posting then put at its term's next
    # place, in input order (stable).
    cdef Py_ssize_t m = order.shape[0], n = out_t.shape[0], r, i
    cdef i64 pos = 0, c, p
    cdef u32 id_
    with nogil:
        for r in range(m):
            c = starts[order[r]]
            starts[order[r]] = pos
            pos += c
        for i in range(n):
            id_ = ids[i]
            p = starts[id_]
            starts[id_] = p + 1
            out_t[p] = keys[id_]
            out_r[p] = rows[i]
            out_f[p] = tf[i]


cdef inline void* _u64_data(object a):
    cdef u64[::1] view = a
    return &view[0]


cdef object _radix_postings(const u64[:] terms, const u32[:] rows, const u16[:] tf):
    # sort_postings by an LSD radix sort on the terms' 8 bytes.
    cdef Py_ssize_t n = terms.shape[0], i, d, pos, c
    cdef int pass_
    cdef u64 key
    cdef Py_ssize_t[8][256] counts
    cdef bint in_tmp = False
    out_t = np.empty(n, dtype=np.uint64)
    out_r = np.empty(n, dtype=np.uint32)
    out_f = np.empty(n, dtype=np.uint16)
    tmp_t = np.empty(n, dtype=np.uint64)
    tmp_r = np.empty(n, dtype=np.uint32)
    tmp_f = np.empty(n, dtype=np.uint16)
    cdef u64[::1] v_ot = out_t, v_tt = tmp_t
    cdef u32[::1] v_or = out_r, v_tr = tmp_r
    cdef u16[::1] v_of = out_f, v_tf = tmp_f
    if n == 0:
        return out_t, out_r, out_f
    cdef u64* at = &v_ot[0]
    cdef u64* bt = &v_tt[0]
    cdef u32* ar = &v_or[0]
    cdef u32* br = &v_tr[0]
    cdef u16* af = &v_of[0]
    cdef u16* bf = &v_tf[0]
    cdef u64* st
    cdef u32* sr
    cdef u16* sf
    with nogil:
        for pass_ in range(8):
            for d in range(256):
                counts[pass_][d] = 0
        for i in range(n):
            key = terms[i]
            at[i] = key
            ar[i] = rows[i]
            af[i] = tf[i]
            for pass_ in range(8):
                counts[pass_][(key >> (8 * pass_)) & 255] += 1
        for pass_ in range(8):
            if counts[pass_][(at[0] >> (8 * pass_)) & 255] == n:
                continue  # every key has the same byte here: the pass would move nothing
            pos = 0
            for d in range(256):
                c = counts[pass_][d]
                counts[pass_][d] = pos
                pos += c
            for i in range(n):  # stable scatter from a* into b*, then swap the roles
                d = (at[i] >> (8 * pass_)) & 255
                pos = counts[pass_][d]
                counts[pass_][d] = pos + 1
                bt[pos] = at[i]
                br[pos] = ar[i]
                bf[pos] = af[i]
            st = at; at = bt; bt = st
            sr = ar; ar = br; br = sr
            sf = af; af = bf; bf = sf
            in_tmp = not in_tmp
    if in_tmp:
        return tmp_t, tmp_r, tmp_f
    return out_t, out_r, out_f
