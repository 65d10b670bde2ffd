# cython: language_level=3
"""Compiled ``get``: from a memory id to its ``Memory`` in one call.

Twin of fastmem._kernels.reference.read_memory; see there for the contract. Python calls between
the id's parse, the row lookup, the record check, msgpack and the named tuple cost more
than the work itself (issue 21), so this does them all in C, for the plain case only:
anything else returns None and the caller takes the general path.
"""
cimport cython
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_FillInfo, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_INCREF, Py_XDECREF
from cpython.tuple cimport PyTuple_SET_ITEM
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.string cimport memcpy, memset
from _types cimport i8, u8, u16, u32, u64, i64, f32
from _bytes cimport load_f64 as _f64, load_le16, load_le32, load_le64 as _le64
from _frames cimport HEADER_SIZE, _record_length, fastmem_crc_init
from _quantize cimport quantize_row, to_floats_t, fastest_to_floats
from libc.stdlib cimport malloc, free

from lz4.block import decompress as _lz4_decompress

cdef extern from *:
    """
    /* A tuple subclass's instance of n items, all NULL until set (as tuple.__new__ makes
       one: tuple_subtype_new). */
    static PyObject* fastmem_alloc_tuple(PyTypeObject* t, Py_ssize_t n) { return t->tp_alloc(t, n); }
    """
    object fastmem_alloc_tuple(PyTypeObject* t, Py_ssize_t n)

cdef extern from "Python.h":
    int PyUnicode_KIND(object o)
    void* PyUnicode_DATA(object o)

# Kept equal to fastmem._format by tests/test_reader.py (CONSTANTS below).
cdef enum:
    ROW_SIZE = 80  # INDEX_DTYPE.itemsize; the fields' byte offsets in a row:
    AT_ID = 0
    AT_TS = 8
    AT_OFFSET = 24
    AT_META = 32
    AT_LENGTH = 48
    AT_IMPORTANCE = 52
    AT_FLAGS = 74
    FLAG_FORGOTTEN = 1
    FLAG_PINNED = 2
    KIND_MEMORY = 1
    MAX_DEPTH = 64  # arrays and maps in each other, the top one included; msgpack's own
                    # limit is deeper: a deeper payload takes the general path

CONSTANTS = dict(ROW_SIZE=ROW_SIZE, AT_ID=AT_ID, AT_TS=AT_TS, AT_OFFSET=AT_OFFSET,
                 AT_META=AT_META, AT_LENGTH=AT_LENGTH, AT_IMPORTANCE=AT_IMPORTANCE,
                 AT_FLAGS=AT_FLAGS, FLAG_FORGOTTEN=FLAG_FORGOTTEN, FLAG_PINNED=FLAG_PINNED,
                 KIND_MEMORY=KIND_MEMORY, MAX_DEPTH=MAX_DEPTH)

fastmem_crc_init()
cdef to_floats_t _to_floats = fastest_to_floats()

_CONVERSATION = "conversation"  # the type of a payload without "y"


class _NotPlain(Exception):
    """Raised inside the decoder: the payload is not plain msgpack (or is damaged)."""


# --- msgpack, the plain types only ------------------------------------------------------
# What msgpack.unpackb(raw, raw=False, strict_map_key=True) returns for nil, bool, int,
# float, str, bin, array and map; ext types (and msgpack's errors) raise _NotPlain.

cdef struct _In:
    const u8* p
    const u8* end


cdef inline const u8* _take(_In* s, Py_ssize_t n) except NULL:
    cdef const u8* at = s.p
    if n < 0 or s.end - s.p < n:
        raise _NotPlain()
    s.p += n
    return at


cdef inline u64 _be(const u8* p, int width) noexcept nogil:
    cdef u64 v = 0
    cdef int i
    for i in range(width):
        v = (v << 8) | p[i]
    return v


cdef object _str(_In* s, Py_ssize_t n):
    cdef const u8* p = _take(s, n)
    try:
        return PyUnicode_DecodeUTF8(<const char*>p, n, NULL)
    except UnicodeDecodeError:
        raise _NotPlain() from None


cdef Py_ssize_t _length(_In* s, u8 tag, u8 fix_base, int fix_bits, u8 t8, u8 t16, u8 t32) except -2:
    # The length of a str/bin/array/map whose first byte is tag, or -1: not this family.
    if fix_bits and (tag & (0xFF << fix_bits) & 0xFF) == fix_base:
        return tag & ((1 << fix_bits) - 1)
    if t8 and tag == t8:
        return _take(s, 1)[0]
    if tag == t16:
        return <Py_ssize_t>_be(_take(s, 2), 2)
    if tag == t32:
        return <Py_ssize_t>_be(_take(s, 4), 4)
    return -1


cdef object _unpack(_In* s, int depth):
    cdef u8 tag = _take(s, 1)[0]
    cdef Py_ssize_t n, i
    cdef u64 u
    cdef u32 bits32
    cdef float f
    cdef double d
    cdef list items
    cdef dict mapping
    if tag <= 0x7F:
        return <long>tag
    if tag >= 0xE0:
        return <long>(<signed char>tag)
    n = _length(s, tag, 0xA0, 5, 0xD9, 0xDA, 0xDB)
    if n >= 0:
        return _str(s, n)
    n = _length(s, tag, 0x90, 4, 0, 0xDC, 0xDD)
    if n >= 0:
        if depth >= MAX_DEPTH or n > s.end - s.p:  # each item takes a byte at least
            raise _NotPlain()
        items = [None] * n
        for i in range(n):
            items[i] = _unpack(s, depth + 1)
        return items
    n = _length(s, tag, 0x80, 4, 0, 0xDE, 0xDF)
    if n >= 0:
        if depth >= MAX_DEPTH:
            raise _NotPlain()
        mapping = {}
        for i in range(n):
            key = _unpack(s, depth + 1)
            if type(key) is not str and type(key) is not bytes:  # strict_map_key
                raise _NotPlain()
            mapping[key] = _unpack(s, depth + 1)
        return mapping
    n = _length(s, tag, 0, 0, 0xC4, 0xC5, 0xC6)
    if n >= 0:
        return PyBytes_FromStringAndSize(<const char*>_take(s, n), n)
    if tag == 0xC0:
        return None
    if tag == 0xC2:
        return False
    if tag == 0xC3:
        return True
    if tag == 0xCA:
        bits32 = <u32>_be(_take(s, 4), 4)
        memcpy(&f, &bits32, 4)
        return <double>f
    if tag == 0xCB:
        u = _be(_take(s, 8), 8)
        memcpy(&d, &u, 8)
        return d
    if 0xCC <= tag <= 0xCF:
        return _be(_take(s, 1 << (tag - 0xCC)), 1 << (tag - 0xCC))
    if 0xD0 <= tag <= 0xD3:
        n = 1 << (tag - 0xD0)
        u = _be(_take(s, n), n)
        if n < 8 and u >> (8 * n - 1):  # sign-extend
            u |= <u64>0xFFFFFFFFFFFFFFFF << (8 * n)
        return <long long>u
    raise _NotPlain()  # 0xC1 (never used) and the ext types


def unpack(data):
    """``msgpack.unpackb(data, raw=False, strict_map_key=True)`` for plain msgpack (see
    above); None when ``data`` is anything else (ext types, damaged, trailing bytes)."""
    cdef const u8[::1] view = data
    cdef _In s
    if view.shape[0] == 0:
        return None
    s.p, s.end = &view[0], &view[0] + view.shape[0]
    try:
        out = _unpack(&s, 0)
    except _NotPlain:
        return None
    return out if s.p == s.end else None


# --- the row ---------------------------------------------------------------------------

cdef bint _parse_id(object mid, u64* value, bint* canonical) noexcept:
    # m<digits> (ASCII, 1 to 19 of them): parse_id's ids, but for the longest.
    cdef const u8* p
    cdef Py_ssize_t n, i
    cdef u64 v = 0
    if type(mid) is not str:
        return False
    n = len(<str>mid)
    if n < 2 or n > 20 or PyUnicode_KIND(mid) != 1:
        return False
    p = <const u8*>PyUnicode_DATA(mid)
    if p[0] != c"m":
        return False
    for i in range(1, n):
        if p[i] < c"0" or p[i] > c"9":
            return False
        v = v * 10 + (p[i] - c"0")
    value[0] = v
    canonical[0] = p[1] != c"0" or n == 2  # f"m{id}" is this very string
    return True


cdef i64 _find(const u8* rows, i64 n, u64 mid, u64 first) noexcept nogil:
    # The row of id ``mid`` among ``n`` rows in id order, or -1: row ``mid - first`` when it
    # holds it (ids are dense until a compaction), else a binary search.
    cdef i64 lo = 0, hi = n, at
    if mid >= first and mid - first < <u64>n and _le64(rows + (mid - first) * ROW_SIZE + AT_ID) == mid:
        return <i64>(mid - first)
    while lo < hi:
        at = (lo + hi) // 2
        if _le64(rows + at * ROW_SIZE + AT_ID) < mid:
            lo = at + 1
        else:
            hi = at
    return lo if lo < n and _le64(rows + lo * ROW_SIZE + AT_ID) == mid else -1


# --- the payload -----------------------------------------------------------------------

cdef object _memory(const u8* row, object mid, bint canonical, const u8* dat, i64 dat_end,
                    object memory, object f32):
    # The Memory of ``row`` read from ``dat``, or None (see read_memory).
    if _le64(row + AT_OFFSET) >= <u64>dat_end:
        return None
    return _memory_at(row, mid, canonical, dat, <i64>_le64(row + AT_OFFSET), dat_end, memory, f32)


cdef object _memory_at(const u8* row, object mid, bint canonical, const u8* buf, i64 offset,
                       i64 end, object memory, object f32):
    # The Memory of ``row`` read from its record at ``offset`` of ``buf`` (valid up to
    # ``end``; 0 <= offset < end), or None: fastmem._kernels.reference._plain_memory.
    cdef i64 length
    cdef const u8* p
    cdef u32 plen, rlen
    cdef u16 flags = load_le16(row + AT_FLAGS)
    cdef u64 id = _le64(row + AT_ID)
    cdef bint has_type = False
    cdef Py_ssize_t n, i
    cdef Py_UCS4 name
    cdef u8 tag
    cdef _In s
    if flags & FLAG_FORGOTTEN or _le64(row + AT_META) != 0:
        return None
    length = _record_length(buf, offset, end)
    p = buf + offset
    if length == 0 or length != load_le32(row + AT_LENGTH) or p[5] != KIND_MEMORY:
        return None
    plen, rlen = load_le32(p + 8), load_le32(p + 12)
    s.p = p + HEADER_SIZE + 2 * <i64>load_le16(p + 6)
    s.end = s.p + plen
    raw = None
    if plen != rlen:  # lz4, as fastmem._format.decode_payload
        try:
            raw = _lz4_decompress(PyBytes_FromStringAndSize(<const char*>s.p, plen),
                                  uncompressed_size=rlen)
        except Exception:
            return None
        if type(raw) is not bytes or len(<bytes>raw) != rlen:
            return None
        s.p = <const u8*>PyBytes_AS_STRING(raw)
        s.end = s.p + rlen
    stored_id = text = type_name = session = metadata = summary = None
    try:
        # The top map: get's fields kept, every other value decoded and dropped (so that
        # the bytes are checked as msgpack checks them). Later keys win, as in a dict.
        tag = _take(&s, 1)[0]
        n = _length(&s, tag, 0x80, 4, 0, 0xDE, 0xDF)
        if n < 0:
            return None
        for i in range(n):
            if s.end - s.p >= 2 and s.p[0] == 0xA1 and s.p[1] < 0x80:  # one ASCII char
                name = s.p[1]
                s.p += 2
            else:
                key = _unpack(&s, 1)
                if type(key) is str:
                    name = (<str>key)[0] if len(<str>key) == 1 else 0
                elif type(key) is bytes:
                    name = 0
                else:
                    return None
            if name == "i":
                stored_id = _unpack(&s, 1)
            elif name == "x":
                text = _unpack(&s, 1)
            elif name == "y":
                type_name, has_type = _unpack(&s, 1), True
            elif name == "s":
                session = _unpack(&s, 1)
            elif name == "m":
                metadata = _unpack(&s, 1)
            elif name == "u":
                summary = _unpack(&s, 1)
            else:
                _unpack(&s, 1)
    except _NotPlain:
        return None
    if s.p != s.end or type(stored_id) is not int or stored_id != id or type(text) is not str:
        return None
    fields = (
        mid if canonical else f"m{id}",
        text,
        type_name if has_type else _CONVERSATION,
        _f64(row + AT_TS),
        session,
        _importance(row, f32),
        True if flags & FLAG_PINNED else False,
        metadata,
        summary,
    )
    out = fastmem_alloc_tuple(<PyTypeObject*>memory, 9)
    for i in range(9):
        value = fields[i]
        Py_INCREF(value)
        PyTuple_SET_ITEM(out, i, value)
    return out


# --- importance: f32() of the row's float32, kept by its bits ---------------------------

cdef enum:
    F32_SLOTS = 64

cdef u32 _f32_bits[F32_SLOTS]
cdef PyObject* _f32_value[F32_SLOTS]
cdef object _f32_of = None  # the function whose answers are kept


cdef object _importance(const u8* row, object f32):
    global _f32_of
    cdef u32 bits = load_le32(row + AT_IMPORTANCE)
    cdef u32 slot = ((bits * <u32>2654435761u) >> 26) & (F32_SLOTS - 1)
    cdef float x
    cdef int i
    if f32 is not _f32_of:  # another function: drop the last one's answers
        for i in range(F32_SLOTS):
            Py_XDECREF(_f32_value[i])
            _f32_value[i] = NULL
        _f32_of = f32
    if _f32_value[slot] != NULL and _f32_bits[slot] == bits:
        return <object>_f32_value[slot]
    memcpy(&x, &bits, 4)
    value = f32(<double>x)
    if f32 is _f32_of:
        Py_INCREF(value)
        Py_XDECREF(_f32_value[slot])
        _f32_value[slot], _f32_bits[slot] = <PyObject*>value, bits
    return value


# --- the entry point ---------------------------------------------------------------------

def read_memory(object mid, object base, object tail, Py_ssize_t tail_n, object dat,
                object dat_end, object memory, object f32):
    """The ``Memory`` of id ``mid``, or None; see fastmem._kernels.reference.read_memory."""
    cdef u64 value
    cdef bint canonical
    cdef Py_buffer base_view, tail_view, dat_view
    cdef const u8* rows
    cdef i64 n, at, end
    if not (type(memory) is type and issubclass(memory, tuple)):
        raise TypeError("memory must be a subclass of tuple")
    if not _parse_id(mid, &value, &canonical):
        return None
    PyObject_GetBuffer(base, &base_view, PyBUF_SIMPLE)
    try:
        n = base_view.len // ROW_SIZE
        rows = <const u8*>base_view.buf
        if n and value <= _le64(rows + (n - 1) * ROW_SIZE + AT_ID):
            at = _find(rows, n, value, 0)
        else:
            if tail_n <= 0:
                return None
            PyObject_GetBuffer(tail, &tail_view, PyBUF_SIMPLE)
            try:
                if tail_view.len // ROW_SIZE < tail_n:
                    raise ValueError("tail_n is more than the tail's rows")
                rows = <const u8*>tail_view.buf
                at = _find(rows, tail_n, value, _le64(rows + AT_ID))
                return _read_row(rows, at, mid, canonical, dat, dat_end, memory, f32)
            finally:
                PyBuffer_Release(&tail_view)
        return _read_row(rows, at, mid, canonical, dat, dat_end, memory, f32)
    finally:
        PyBuffer_Release(&base_view)


cdef object _read_row(const u8* rows, i64 at, object mid, bint canonical, object dat,
                      object dat_end, object memory, object f32):
    cdef Py_buffer view
    cdef i64 end
    if at < 0:
        return None
    PyObject_GetBuffer(dat, &view, PyBUF_SIMPLE)
    try:
        if not (0 < dat_end <= view.len):
            return None
        end = dat_end
        return _memory(rows + at * ROW_SIZE, mid, canonical, <const u8*>view.buf, end, memory, f32)
    finally:
        PyBuffer_Release(&view)


def read_hot(object rows, list starts, object records, Py_ssize_t n, object memory, object f32):
    """The ``Memory`` of each of the first ``n`` rows of a hot section, or None; see
    fastmem._kernels.reference.read_hot."""
    cdef Py_buffer rows_view, records_view
    cdef Py_ssize_t i
    cdef i64 at, end
    if not (type(memory) is type and issubclass(memory, tuple)):
        raise TypeError("memory must be a subclass of tuple")
    if not 0 <= n <= len(starts):
        raise ValueError("n is more than the section's rows")
    PyObject_GetBuffer(rows, &rows_view, PyBUF_SIMPLE)
    try:
        if rows_view.len < n * ROW_SIZE:
            raise ValueError("n is more than the section's rows")
        PyObject_GetBuffer(records, &records_view, PyBUF_SIMPLE)
        try:
            end = records_view.len
            out = []
            for i in range(n):
                start = starts[i]
                # Compared as a Python int first: a damaged row may name any offset up to
                # 2**64 - 1, more than ``at`` holds (that is not the plain case: None).
                if not 0 <= start < end:
                    return None
                at = start
                value = _memory_at(<const u8*>rows_view.buf + i * ROW_SIZE, None, False,
                                   <const u8*>records_view.buf, at, end, memory, f32)
                if value is None:
                    return None
                out.append(value)
            return out
        finally:
            PyBuffer_Release(&records_view)
    finally:
        PyBuffer_Release(&rows_view)


# --- replay: other processes' memory records into index rows ---------------------------

cdef enum:
    AT_SESSION = 16
    AT_TEXT_TOKENS = 64
    AT_TYPE = 72
    AT_SCALE = 56
    FLAG_HAS_VECTOR = 4
    MAX_TYPE_CHARS = 64
    MAX_SESSION_CHARS = 256

cdef double MAX_TIMESTAMP = 1e11
cdef u64 MAX_MEMORY_ID = (<u64>1 << 63) - 1
cdef u64 NO_TOKENS = 0xFFFFFFFF
cdef str _FIELDS = "itxkysupnm"  # a plain memory payload's keys; any other: not plain


cdef inline void _put64(u8* p, u64 v) noexcept nogil:
    memcpy(p, &v, 8)  # the index is little-endian, as every host fastmem builds on


cdef inline void _put32(u8* p, u32 v) noexcept nogil:
    memcpy(p, &v, 4)


cdef inline void _put16(u8* p, u16 v) noexcept nogil:
    memcpy(p, &v, 2)


cdef inline bint _is_number(object v, double lo, double hi, double* out):
    # A float, or an int that is not a bool, from lo to hi (NaN is not).
    cdef double d
    if type(v) is float:
        d = <double>v
    elif type(v) is int:
        if not (lo <= v <= hi):
            return False
        d = <double>v
    else:
        return False
    if not (lo <= d <= hi):
        return False
    out[0] = d
    return True


cdef object _plain_payload(const u8* p, i64 length):
    # The decoded payload (a dict) of the memory record at p, or None: not plain.
    cdef u32 plen = load_le32(p + 8), rlen = load_le32(p + 12)
    cdef _In s
    s.p = p + HEADER_SIZE + 2 * <i64>load_le16(p + 6)
    s.end = s.p + plen
    if s.end != p + length or s.p >= s.end:
        return None
    raw = None
    if plen != rlen:  # lz4, as fastmem._format.decode_payload
        try:
            raw = _lz4_decompress(PyBytes_FromStringAndSize(<const char*>s.p, plen),
                                  uncompressed_size=rlen)
        except Exception:
            return None
        if type(raw) is not bytes or len(<bytes>raw) != rlen or rlen == 0:
            return None
        s.p = <const u8*>PyBytes_AS_STRING(raw)
        s.end = s.p + rlen
    try:
        payload = _unpack(&s, 0)
    except _NotPlain:
        return None
    if s.p != s.end or type(payload) is not dict:
        return None
    return payload


def memory_rows(object buf, object offsets, object lengths, object kinds, object dims,
                Py_ssize_t first, Py_ssize_t stop, object next_id, Py_ssize_t dim,
                dict type_codes, dict defaults, double user_default, dict sessions,
                object session_hash, object rows, object vectors, i8[:, ::1] quantized=None):
    """Index rows of the plain memory records among the scanned records ``first:stop``; see
    fastmem._kernels.reference.memory_rows for the contract. The scan's columns ``offsets``,
    ``lengths``, ``kinds`` and ``dims`` are arrays (int64, uint32, uint8, uint16) or, for a
    few records, lists of ints: a catch-up on one record another process added makes no
    arrays for them (each array, and each typed view of one, costs a microsecond or more
    on the cold caches a read after a wait finds)."""
    cdef const i64[::1] offsets_view
    cdef const u32[::1] lengths_view
    cdef const u8[::1] kinds_view
    cdef const u16[::1] dims_view
    cdef const i64* offsets_at = NULL
    cdef const u32* lengths_at = NULL
    cdef const u8* kinds_at = NULL
    cdef const u16* dims_at = NULL
    cdef u8* columns = NULL  # the lists' values, copied: 15 bytes a record
    cdef Py_ssize_t n, i
    if type(offsets) is list:
        n = len(<list>offsets)
        if type(lengths) is not list or type(kinds) is not list or type(dims) is not list \
                or len(<list>lengths) != n or len(<list>kinds) != n or len(<list>dims) != n:
            raise ValueError("first:stop is not a range of the scanned records")
        if n:
            columns = <u8*>malloc(n * 15)
            if columns == NULL:
                raise MemoryError()
            offsets_at = <const i64*>columns
            lengths_at = <const u32*>(columns + 8 * n)
            dims_at = <const u16*>(columns + 12 * n)
            kinds_at = <const u8*>(columns + 14 * n)
            try:
                for i in range(n):
                    (<i64*>offsets_at)[i] = (<list>offsets)[i]
                    (<u32*>lengths_at)[i] = (<list>lengths)[i]
                    (<u16*>dims_at)[i] = (<list>dims)[i]
                    (<u8*>kinds_at)[i] = (<list>kinds)[i]
            except BaseException:
                free(columns)
                raise
    else:
        offsets_view, lengths_view, kinds_view, dims_view = offsets, lengths, kinds, dims
        n = offsets_view.shape[0]
        if lengths_view.shape[0] != n or kinds_view.shape[0] != n or dims_view.shape[0] != n:
            raise ValueError("first:stop is not a range of the scanned records")
        if n:
            offsets_at, lengths_at = &offsets_view[0], &lengths_view[0]
            kinds_at, dims_at = &kinds_view[0], &dims_view[0]
    try:
        return _memory_rows(buf, offsets_at, lengths_at, kinds_at, dims_at, n, first, stop,
                            next_id, dim, type_codes, defaults, user_default, sessions,
                            session_hash, rows, vectors, quantized)
    finally:
        free(columns)


cdef object _memory_rows(object buf, const i64* offsets, const u32* lengths, const u8* kinds,
                         const u16* dims, Py_ssize_t n, Py_ssize_t first, Py_ssize_t stop,
                         object next_id, Py_ssize_t dim, dict type_codes, dict defaults,
                         double user_default, dict sessions, object session_hash, object rows,
                         object vectors, i8[:, ::1] quantized):
    # memory_rows over the columns' n values at these addresses.
    cdef Py_buffer view, rows_view, vec_view
    cdef bint quantizing = quantized is not None
    cdef f32* scratch = NULL
    cdef f32 scale
    cdef Py_ssize_t j, count = 0, k, vectored = 0
    cdef i64 off, length, end
    cdef const u8* p
    cdef const u16* half
    cdef u8* row
    cdef u16* vec
    cdef u64 mid, low = 0, text_tokens, summary_tokens, hashed
    cdef double ts, importance
    cdef u16 flags, code, d
    cdef list texts = []
    cdef Py_ssize_t stop_at = -1
    if not (0 <= first <= stop <= n):
        raise ValueError("first:stop is not a range of the scanned records")
    if type(next_id) is not int or next_id < 0:
        raise ValueError("next_id is not an id")
    if quantizing and (quantized.shape[0] < stop - first or quantized.shape[1] != dim):
        raise ValueError("quantized is not stop - first rows of dim int8")
    if next_id <= MAX_MEMORY_ID:
        low = next_id
    else:  # no id is left: no record is the plain case (the rows are still checked)
        low, stop_at = MAX_MEMORY_ID, first
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    PyObject_GetBuffer(rows, &rows_view, PyBUF_SIMPLE)
    try:
        PyObject_GetBuffer(vectors, &vec_view, PyBUF_SIMPLE)
        try:
            if rows_view.len < (stop - first) * ROW_SIZE or vec_view.len < (stop - first) * 2 * dim:
                raise ValueError("rows or vectors hold fewer than stop - first rows")
            end = view.len
            if quantizing and dim:
                scratch = <f32*>malloc(dim * sizeof(f32))
                if scratch == NULL:
                    raise MemoryError()
            for j in range(first, stop if stop_at < 0 else stop_at):
                off, length, d = offsets[j], lengths[j], dims[j]
                if kinds[j] != KIND_MEMORY or off < 0 or length < HEADER_SIZE + 2 * <i64>d \
                        or off > end - length:
                    break
                p = <const u8*>view.buf + off
                if p[5] != KIND_MEMORY or load_le16(p + 6) != d or (d and d != dim):
                    break
                if d:
                    half = <const u16*>(p + HEADER_SIZE)  # the record's vector: finite?
                    for k in range(d):
                        if (load_le16(<const u8*>(half + k)) & 0x7C00) == 0x7C00:
                            break
                    else:
                        k = -1
                    if k >= 0:
                        break
                payload = _plain_payload(p, length)
                if payload is None:
                    break
                if not _plain_fields(<dict>payload):
                    break
                value = (<dict>payload).get("i")
                if type(value) is not int or not (low <= value <= MAX_MEMORY_ID):
                    break
                mid = value
                value = (<dict>payload).get("t")
                if type(value) is not float or not (0.0 <= <double>value <= MAX_TIMESTAMP):
                    break
                ts = value
                text = (<dict>payload).get("x")
                if type(text) is not str:
                    break
                value = (<dict>payload).get("k")
                if value is None:
                    text_tokens = summary_tokens = NO_TOKENS
                else:
                    if type(value) is not list or len(<list>value) != 2:
                        break
                    a, b = (<list>value)[0], (<list>value)[1]
                    if type(a) is not int or type(b) is not int or not (0 <= a <= NO_TOKENS) \
                            or not (0 <= b <= NO_TOKENS):
                        break
                    text_tokens, summary_tokens = a, b
                type_name = (<dict>payload).get("y", _CONVERSATION)
                if type(type_name) is not str or not 0 < len(<str>type_name) <= MAX_TYPE_CHARS:
                    break
                value = type_codes.get(type_name)
                if type(value) is not int or not (0 <= value <= 0xFFFF):
                    break  # a type this index has no code for yet: the general way makes one
                code = value
                session = (<dict>payload).get("s")
                if session is None:
                    hashed = 0
                else:
                    if type(session) is not str or not 0 < len(<str>session) <= MAX_SESSION_CHARS:
                        break
                    value = sessions.get(session)
                    if value is None:
                        value = session_hash(session)
                        sessions[session] = value
                    hashed = value
                value = (<dict>payload).get("u")
                if value is not None and type(value) is not str:
                    break
                value = (<dict>payload).get("m")
                if value is not None and type(value) is not dict:
                    break
                value = (<dict>payload).get("n", False)
                if type(value) is not bool:
                    break
                flags = FLAG_PINNED if value else 0
                if d:
                    flags |= FLAG_HAS_VECTOR
                value = (<dict>payload).get("p")
                if value is None:
                    if "p" in <dict>payload:
                        break
                    importance = defaults.get(type_name, user_default)
                elif not _is_number(value, 0.0, 1.0, &importance):
                    break
                row = <u8*>rows_view.buf + count * ROW_SIZE
                memset(row, 0, ROW_SIZE)
                _put64(row + AT_ID, mid)
                memcpy(row + AT_TS, &ts, 8)
                _put64(row + AT_SESSION, hashed)
                _put64(row + AT_OFFSET, <u64>off)
                _put32(row + AT_LENGTH, <u32>length)
                (<float*>(row + AT_IMPORTANCE))[0] = <float>importance
                _put32(row + AT_TEXT_TOKENS, <u32>text_tokens)
                _put32(row + AT_TEXT_TOKENS + 4, <u32>summary_tokens)
                _put16(row + AT_TYPE, code)
                _put16(row + AT_FLAGS, flags)
                if dim:
                    vec = <u16*>vec_view.buf + count * dim
                    if d:
                        memcpy(vec, p + HEADER_SIZE, 2 * dim)
                        vectored += 1
                    else:
                        memset(vec, 0, 2 * dim)
                if quantizing:  # as quantize_half, while the row is in the L1 cache
                    if d:
                        scale = quantize_row(vec, dim, scratch, &quantized[count, 0], _to_floats)
                        memcpy(row + AT_SCALE, &scale, 4)
                    elif dim:
                        memset(&quantized[count, 0], 0, dim)  # (and scale 0, as memset it)
                texts.append(text)
                low = mid + 1
                count += 1
        finally:
            free(scratch)
            PyBuffer_Release(&vec_view)
    finally:
        PyBuffer_Release(&rows_view)
        PyBuffer_Release(&view)
    return count, texts, vectored


cdef bint _plain_fields(dict payload):
    # Every key one of _FIELDS (as a one-character str), "i", "t" and "x" among them.
    for key in payload:
        if type(key) is not str or len(<str>key) != 1 or (<str>key) not in _FIELDS:
            return False
    return "i" in payload and "t" in payload and "x" in payload


# --- the data file's map, with room past its end ------------------------------------------

cdef extern from *:
    """
    #if defined(__unix__) || defined(__APPLE__)
    #include <errno.h>
    #include <sys/mman.h>
    /* A read-only shared map of the first len bytes of the file open as fd, which may be
       shorter: NULL (errno set) if the system refuses. */
    static char* fastmem_map_room(int fd, size_t len) {
        void* p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
        return p == MAP_FAILED ? NULL : (char*)p;
    }
    static int fastmem_unmap(char* p, size_t len) { return munmap(p, len); }
    static int fastmem_advise(char* p, size_t len, int advice) { return madvise(p, len, advice); }
    static int fastmem_map_errno(void) { return errno; }
    #else
    static char* fastmem_map_room(int fd, size_t len) { (void)fd; (void)len; return NULL; }
    static int fastmem_unmap(char* p, size_t len) { (void)p; (void)len; return 0; }
    static int fastmem_advise(char* p, size_t len, int advice) { (void)p; (void)len; (void)advice; return 0; }
    static int fastmem_map_errno(void) { return 38; /* ENOSYS */ }
    #endif
    """
    char* fastmem_map_room(int fd, size_t len) nogil
    int fastmem_unmap(char* p, size_t len) nogil
    int fastmem_advise(char* p, size_t len, int advice) nogil
    int fastmem_map_errno() nogil


@cython.auto_pickle(False)  # a map of a file descriptor: never pickled
cdef class DataMap:
    """A read-only map of a data file that reaches past the file's end, of which the first
    ``len()`` bytes are shown: as ``mmap.mmap(fd, size, access=ACCESS_READ)`` to its readers
    (bytes from a slice, an int from an index, a read-only buffer, ``madvise``, ``close``),
    but :meth:`grow` shows more of it when the file has grown, where ``mmap`` must map the
    file again. A read right after another process's add paid ~20 µs for that: the new map,
    then unmapping the old one (the engine's catch-up, ``Engine.check``).

    Only bytes that were in the file when they were shown are read through it: a page wholly
    past the file's end raises SIGBUS when touched (as a page of an ``mmap`` whose file was
    cut since), and nothing past ``len()`` is reachable from Python.

    Args:
        fd: the data file's descriptor (the map keeps the file, not the descriptor).
        size: the bytes shown (the file's size, as the caller took it).
        room: the bytes mapped, ``size`` or more.

    Raises:
        ValueError: ``room`` is less than ``size``, or not positive.
        OSError: the system refused the map (on Windows, always: map with ``mmap`` there).
    """

    cdef char* addr
    cdef Py_ssize_t size, room
    cdef Py_ssize_t exports

    def __cinit__(self, int fd, Py_ssize_t size, Py_ssize_t room):
        if size < 0 or room < size or room <= 0:
            raise ValueError("a map's room is positive and at least its size")
        self.addr = fastmem_map_room(fd, <size_t>room)
        if self.addr == NULL:
            raise OSError(fastmem_map_errno(), "mmap of the data file failed")
        self.size, self.room, self.exports = size, room, 0

    def __dealloc__(self):
        if self.addr != NULL:
            with nogil:
                fastmem_unmap(self.addr, <size_t>self.room)
            self.addr = NULL

    cdef inline void _open(self) except *:
        if self.addr == NULL:
            raise ValueError("mmap closed or invalid")

    def grow(self, Py_ssize_t size):
        """Show the first ``size`` bytes of the file, at least those shown now: True, or
        False when they are more than the map's room (and nothing changes)."""
        self._open()
        if size < self.size or size > self.room:
            return False
        self.size = size
        return True

    @property
    def closed(self):
        return self.addr == NULL

    def __len__(self):
        self._open()
        return self.size

    def __getitem__(self, item):
        cdef Py_ssize_t i, start, stop, step
        self._open()
        if isinstance(item, slice):
            start, stop, step = item.indices(self.size)
            if step == 1:
                return PyBytes_FromStringAndSize(self.addr + start, stop - start if stop > start else 0)
            return bytes(memoryview(self)[item])
        i = item.__index__()
        if i < 0:
            i += self.size
        if not 0 <= i < self.size:
            raise IndexError("mmap index out of range")
        return (<u8*>self.addr)[i]

    def __getbuffer__(self, Py_buffer* buffer, int flags):
        self._open()
        PyBuffer_FillInfo(buffer, self, self.addr, self.size, 1, flags)
        self.exports += 1

    def __releasebuffer__(self, Py_buffer* buffer):
        self.exports -= 1

    def madvise(self, int option, Py_ssize_t start=0, object length=None):
        """As ``mmap.madvise``, over the bytes shown."""
        cdef Py_ssize_t n
        self._open()
        if not 0 <= start < self.size:
            raise ValueError("madvise start out of bounds")
        n = self.size - start if length is None else min(<Py_ssize_t>length, self.size - start)
        if n < 0:
            raise ValueError("madvise length invalid")
        if fastmem_advise(self.addr + start, <size_t>n, option) != 0:
            raise OSError(fastmem_map_errno(), "madvise failed")

    def close(self):
        """Unmap it (as ``mmap.close``: refused while a buffer of it is held)."""
        if self.exports:
            raise BufferError("cannot close exported pointers exist")
        if self.addr != NULL:
            with nogil:
                fastmem_unmap(self.addr, <size_t>self.room)
            self.addr = NULL

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
