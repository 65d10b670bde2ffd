# cython: language_level=3
"""Compiled parse of the fixed headers a restart reads: the data file's header, the index
file's header, its two commit slots, the header of the delta a slot names, and the table
of the index's hot section (the newest memories' rows and records).

Twins of fastmem._format's unpack_dat_header, unpack_idx_header, current_slot,
unpack_delta_header and unpack_hot (see fastmem._kernels_py, "headers"): each returns what the Python
function returns, or None where that one raises (the caller then calls it, for the precise
error). A fresh process runs those Python functions cold, ~0.1 ms of a restart (issue 21).
The named tuple types are passed in: the compiled modules import nothing of fastmem's.
"""
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.string cimport memcmp
from _types cimport u8, u32, u64, i64
from _bytes cimport load_f64 as _f64, load_le16, load_le32, load_le64 as _le64
from _frames cimport _crc_update, fastmem_crc_init

# Kept equal to fastmem._format by tests/test_heads.py (CONSTANTS below).
cdef enum:
    DAT_HEADER_SIZE = 64
    FORMAT_VERSION = 1
    MAX_DIM = 4096
    IDX_HEADER_SIZE = 4096
    IDX_HEADER_CRC_AT = 4092
    IDX_VERSION_FIRST = 1
    IDX_VERSION_LAST = 2
    ROW_SIZE = 80
    KEYWORD_VERSION = 1
    SLOT_SIZE = 32
    SLOT_PAGE = 4096
    DELTA_HEADER_END = 92  # the header's fields; its crc follows
    HOT_MEMORIES = 128

cdef u64 MAX_ID = (<u64>1 << 63) - 1
cdef const char* DAT_MAGIC = b"FMEMDATA"
cdef const char* IDX_MAGIC = b"FMEMINDX"
cdef const char* SLOT_MAGIC = b"FMEMSLOT"
cdef const char* DELTA_MAGIC = b"FMEMDLTA"

CONSTANTS = dict(DAT_HEADER_SIZE=DAT_HEADER_SIZE, FORMAT_VERSION=FORMAT_VERSION, MAX_DIM=MAX_DIM,
                 IDX_HEADER_SIZE=IDX_HEADER_SIZE, IDX_HEADER_CRC_AT=IDX_HEADER_CRC_AT,
                 IDX_VERSIONS=tuple(range(IDX_VERSION_FIRST, IDX_VERSION_LAST + 1)),
                 ROW_SIZE=ROW_SIZE, KEYWORD_VERSION=KEYWORD_VERSION, SLOT_SIZE=SLOT_SIZE,
                 SLOT_PAGE=SLOT_PAGE, DELTA_HEADER_END=DELTA_HEADER_END, MAX_ID=MAX_ID,
                 HOT_MEMORIES=HOT_MEMORIES,
                 DAT_MAGIC=DAT_MAGIC[:8], IDX_MAGIC=IDX_MAGIC[:8], SLOT_MAGIC=SLOT_MAGIC[:8],
                 DELTA_MAGIC=DELTA_MAGIC[:8])

fastmem_crc_init()


cdef inline bint _crc_ok(const u8* p, i64 n) noexcept nogil:
    # The CRC-32 (zlib's) of p[0:n] equals the u32 stored right after it.
    return _crc_update(0, p, n) == load_le32(p + n)


cdef inline object _bytes(const u8* p, Py_ssize_t n):
    return PyBytes_FromStringAndSize(<const char*>p, n)


ctypedef object (*_Parser)(const u8* p, i64 n, i64 at, object cls)


cdef object _parse(object buf, Py_ssize_t at, object cls, _Parser parse):
    # ``parse`` over the bytes of ``buf`` (n of them), at ``at``; None for a negative one.
    cdef Py_buffer view
    if at < 0:
        return None
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        return parse(<const u8*>view.buf, view.len, at, cls)
    finally:
        PyBuffer_Release(&view)


def dat_header(object buf, object cls):
    """``cls`` (DatHeader) of the data file header at the start of ``buf``, or None."""
    return _parse(buf, 0, cls, _dat_header)


def idx_header(object buf, object cls):
    """``cls`` (IdxHeader) of the index header at the start of ``buf``, or None."""
    return _parse(buf, 0, cls, _idx_header)


def current_slot(object buf, Py_ssize_t at, object cls):
    """(which slot to write next, the newest valid ``cls`` (Slot) or None) of the two slots
    at ``at`` of ``buf``, as fastmem._format.current_slot; None for a negative ``at``."""
    return _parse(buf, at, cls, _current_slot)


def delta_header(object buf, Py_ssize_t at, object cls):
    """``cls`` (DeltaHeader) of the delta header at ``at`` of ``buf``, or None."""
    return _parse(buf, at, cls, _delta_header)


cdef object _dat_header(const u8* p, i64 n, i64 at, object cls):
    if n < DAT_HEADER_SIZE or memcmp(p, DAT_MAGIC, 8) != 0:
        return None
    if not _crc_ok(p, DAT_HEADER_SIZE - 4) or load_le16(p + 8) != FORMAT_VERSION:
        return None
    if load_le16(p + 10) != DAT_HEADER_SIZE or load_le32(p + 28) > MAX_DIM or _le64(p + 40) > MAX_ID:
        return None
    return cls(_bytes(p + 12, 16), load_le32(p + 28), _f64(p + 32), _le64(p + 40),
               _le64(p + 48), _bytes(p + 56, 4))


cdef object _idx_header(const u8* p, i64 n, i64 at, object cls):
    cdef u32 version, kw_version
    cdef u64 rows, live, kw_terms, kw_postings
    if n < IDX_HEADER_SIZE or memcmp(p, IDX_MAGIC, 8) != 0:
        return None
    version = load_le32(p + 8)
    if not _crc_ok(p, IDX_HEADER_CRC_AT) or not IDX_VERSION_FIRST <= version <= IDX_VERSION_LAST:
        return None
    rows, live = _le64(p + 32), _le64(p + 40)
    kw_version, kw_terms, kw_postings = load_le32(p + 100), _le64(p + 104), _le64(p + 112)
    if (load_le32(p + 12) != IDX_HEADER_SIZE or load_le32(p + 52) != ROW_SIZE
            or load_le32(p + 48) > MAX_DIM or live > rows or rows >= (<u64>1 << 32)
            or (kw_version != 0 and kw_version != KEYWORD_VERSION) or kw_terms > kw_postings
            or kw_postings >= (<u64>1 << 48) or _le64(p + 80) > MAX_ID + 1):
        return None
    return cls(_bytes(p + 16, 16), rows, live, load_le32(p + 48), _le64(p + 56),
               _le64(p + 64), load_le32(p + 72), load_le32(p + 76), _le64(p + 80),
               _f64(p + 92), load_le32(p + 88), kw_version, kw_terms, kw_postings,
               _le64(p + 120), version)


cdef bint _slot_ok(const u8* p, i64 at, i64 n) noexcept nogil:
    return at + SLOT_SIZE + 4 <= n and memcmp(p + at, SLOT_MAGIC, 8) == 0 and _crc_ok(p + at, SLOT_SIZE)


cdef object _current_slot(const u8* p, i64 n, i64 at, object cls):
    # The newest valid slot's generation wins; on a tie the second, as the max of
    # (generation, index) in the Python parser.
    cdef bint ok0 = _slot_ok(p, at, n), ok1 = _slot_ok(p, at + SLOT_PAGE, n)
    cdef int newest
    if not ok0 and not ok1:
        return 0, None
    if ok0 and ok1:
        newest = 0 if _le64(p + at + 8) > _le64(p + at + SLOT_PAGE + 8) else 1
    else:
        newest = 0 if ok0 else 1
    p += at + newest * SLOT_PAGE
    return 1 - newest, cls(_le64(p + 8), _le64(p + 16), _le64(p + 24))


cdef object _delta_header(const u8* p, i64 n, i64 at, object cls):
    if n < at + DELTA_HEADER_END + 4:
        return None
    p += at
    if memcmp(p, DELTA_MAGIC, 8) != 0 or not _crc_ok(p, DELTA_HEADER_END):
        return None
    if (_le64(p + 16) > MAX_ID or _le64(p + 8) >= (<u64>1 << 32)
            or _le64(p + 68) >= (<u64>1 << 32) or _le64(p + 76) >= (<u64>1 << 48)):
        return None
    return cls(_le64(p + 8), _le64(p + 16), _le64(p + 24), _le64(p + 32), load_le32(p + 40),
               _le64(p + 44), _f64(p + 52), load_le32(p + 60), load_le32(p + 64),
               _le64(p + 68), _le64(p + 76), _le64(p + 84))


def hot_section(object buf, Py_ssize_t at, Py_ssize_t length, object cls):
    """``cls`` (HotSection) of the hot section at ``buf[at:at + length]``: its rows and
    records as memoryviews of ``buf``, where each record starts; None for an empty section
    and for one the parser refuses (or one not wholly inside ``buf``)."""
    cdef Py_buffer view
    cdef const u8* p
    cdef u64 count, total = 0, i
    cdef Py_ssize_t rows_end
    cdef list starts
    if at < 0 or length < 4:
        return None
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        if length > view.len - at:
            return None
        p = <const u8*>view.buf + at
        count = load_le32(p)
        rows_end = 4 + <Py_ssize_t>count * ROW_SIZE
        if count > HOT_MEMORIES or rows_end + 4 * <Py_ssize_t>count > length:
            return None
        starts = []
        for i in range(count):
            starts.append(total)
            total += load_le32(p + rows_end + 4 * i)
        if total != <u64>(length - rows_end - 4 * <Py_ssize_t>count):
            return None
    finally:
        PyBuffer_Release(&view)
    whole = memoryview(buf)
    return cls(whole[at + 4 : at + rows_end], starts,
               whole[at + rows_end + 4 * <Py_ssize_t>count : at + length])
