# cython: language_level=3
"""Compiled parse of the fixed headers a restart reads: the data file's header, the index
file's header, its two commit slots, the header of the delta a slot names, and the table
of the index's hot section (the newest memories' rows and records); and ``idx_open``, the
whole open of an index file in one call (twin of fastmem._kernels.index_open_reference.open_index).

Twins of fastmem._format's unpack_dat_header, unpack_idx_header, current_slot,
unpack_delta_header and unpack_hot (see fastmem._kernels.reference, "headers"): each returns what the Python
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
    FORMAT_VERSION = 2  # the data file's; version 1 files are read too
    DAT_VERSION_FIRST = 1
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
cdef u64 MAX_DOC_TOKENS = 0x7FFFFFFF  # a live row's keyword tokens: below fmt.DOC_DEAD
cdef const char* DAT_MAGIC = b"FMEMDATA"
cdef const char* IDX_MAGIC = b"FMEMINDX"
cdef const char* SLOT_MAGIC = b"FMEMSLOT"
cdef const char* DELTA_MAGIC = b"FMEMDLTA"

CONSTANTS = dict(DAT_HEADER_SIZE=DAT_HEADER_SIZE, FORMAT_VERSION=FORMAT_VERSION,
                 DAT_VERSIONS=tuple(range(DAT_VERSION_FIRST, FORMAT_VERSION + 1)), MAX_DIM=MAX_DIM,
                 IDX_HEADER_SIZE=IDX_HEADER_SIZE, IDX_HEADER_CRC_AT=IDX_HEADER_CRC_AT,
                 IDX_VERSIONS=tuple(range(IDX_VERSION_FIRST, IDX_VERSION_LAST + 1)),
                 ROW_SIZE=ROW_SIZE, KEYWORD_VERSION=KEYWORD_VERSION, SLOT_SIZE=SLOT_SIZE,
                 SLOT_PAGE=SLOT_PAGE, DELTA_HEADER_END=DELTA_HEADER_END, MAX_ID=MAX_ID,
                 HOT_MEMORIES=HOT_MEMORIES, MAX_DOC_TOKENS=MAX_DOC_TOKENS,
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
    if not _crc_ok(p, DAT_HEADER_SIZE - 4) or not DAT_VERSION_FIRST <= load_le16(p + 8) <= FORMAT_VERSION:
        return None
    if load_le16(p + 10) != DAT_HEADER_SIZE or load_le32(p + 28) > MAX_DIM or _le64(p + 40) > MAX_ID:
        return None
    return cls(_bytes(p + 12, 16), load_le32(p + 28), _f64(p + 32), _le64(p + 40),
               _le64(p + 48), _bytes(p + 56, 4), load_le16(p + 8))


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
            or kw_postings >= (<u64>1 << 48) or _le64(p + 80) > MAX_ID + 1
            or _le64(p + 120) > live * MAX_DOC_TOKENS):  # live < 2^32: no overflow
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


# --- the whole open of an index file (twin of fastmem._kernels.index_open_reference.open_index) ----------------

cdef enum:
    SECTION_ALIGN = 64
    DELTA_HEADER_SIZE = 128
    RECORD_HEADER_SIZE = 20
    MAX_RAW_PAYLOAD = 2 << 20

cdef const char* RECORD_MAGIC = b"\x8fFMR"

CONSTANTS.update(SECTION_ALIGN=SECTION_ALIGN, DELTA_HEADER_SIZE=DELTA_HEADER_SIZE,
                 RECORD_HEADER_SIZE=RECORD_HEADER_SIZE, MAX_RAW_PAYLOAD=MAX_RAW_PAYLOAD,
                 RECORD_MAGIC=RECORD_MAGIC[:4])


cdef inline u64 _align(u64 n) noexcept nogil:
    return (n + SECTION_ALIGN - 1) // SECTION_ALIGN * SECTION_ALIGN


cdef bint _covers(object dat, i64 dat_end, u64 covered, u64 last_offset, u32 last_crc):
    # Whether the data file holds what the index covers: _idxopen.check_covers without
    # its errors (the record header is checked as fmt.parse_record_header checks it).
    cdef Py_buffer view
    cdef const u8* r
    cdef u64 length
    if covered < DAT_HEADER_SIZE or covered > <u64>dat_end:
        return False
    if covered == DAT_HEADER_SIZE:
        return True
    # dat_end >= covered > DAT_HEADER_SIZE: the subtraction cannot wrap (a sum with a
    # damaged offset near 2**64 did, passed, and read far outside the map).
    if last_offset < DAT_HEADER_SIZE or last_offset > <u64>dat_end - RECORD_HEADER_SIZE:
        return False
    PyObject_GetBuffer(dat, &view, PyBUF_SIMPLE)
    try:
        if <u64>view.len < last_offset + RECORD_HEADER_SIZE:
            return False
        r = <const u8*>view.buf + last_offset
        length = RECORD_HEADER_SIZE + 2 * <u64>load_le16(r + 6) + load_le32(r + 8)
        return (memcmp(r, RECORD_MAGIC, 4) == 0 and 1 <= r[5] <= 3 and load_le16(r + 6) <= MAX_DIM
                and load_le32(r + 12) <= MAX_RAW_PAYLOAD and load_le32(r + 8) <= load_le32(r + 12)
                and last_offset + length <= <u64>dat_end and last_offset + length == covered
                and load_le32(r + 16) == last_crc)
    finally:
        PyBuffer_Release(&view)


def idx_open(object buf, Py_ssize_t size, bytes uuid, Py_ssize_t dat_dim, object dat,
             Py_ssize_t dat_end, tuple types):
    """``Opened`` of the index file mapped as ``buf`` (``size`` bytes), as
    fastmem._kernels.index_open_reference.open_index returns it, or None where that one raises. ``types`` are
    the named tuples to make (``_idxopen.TYPES``)."""
    cdef Py_buffer view
    cdef const u8* p
    cdef const u8* d
    cdef i64 n
    cdef u64 rows, dim, types_len, hot_len, kw_terms, kw_postings, next_id
    cdef u64 at_order, at_vectors, at_types, at_hot, end, at_terms, at_offsets, at_prows
    cdef u64 at_tf, at_doc_len, slots_at, deltas_at, offset = 0, length = 0
    cdef u64 d_rows, d_patches, d_postings, d_vectors, d_doc_len, d_prows, d_pdata
    cdef u64 d_terms, d_posting_rows, d_tf, d_types, d_hot, types_at, hot_at
    cdef u64 covered, last_offset
    cdef u32 last_crc, version, kw_version
    cdef bint with_slots
    cdef i64 base_last_id = -1
    Opened, IdxHeader, IdxLayout, KeywordLayout, Slot, DeltaHeader, DeltaLayout, HotSection = types
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        p, n = <const u8*>view.buf, view.len
        if n != size:
            return None
        h = _idx_header(p, n, 0, IdxHeader)
        if h is None:
            return None
        rows, dim, types_len, hot_len = _le64(p + 32), load_le32(p + 48), load_le32(p + 76), load_le32(p + 88)
        version, kw_version = load_le32(p + 8), load_le32(p + 100)
        kw_terms, kw_postings = _le64(p + 104), _le64(p + 112)
        # fmt.idx_layout
        at_order = _align(IDX_HEADER_SIZE + rows * ROW_SIZE)
        at_vectors = _align(at_order + rows * 4)
        at_types = _align(at_vectors + rows * dim)
        at_hot = _align(at_types + types_len) if hot_len else at_types + types_len
        end = at_hot + hot_len
        keyword = None
        if kw_version:
            at_terms = _align(end)
            at_offsets = _align(at_terms + 8 * kw_terms)
            at_prows = _align(at_offsets + 8 * (kw_terms + 1))
            at_tf = _align(at_prows + 4 * kw_postings)
            at_doc_len = _align(at_tf + 2 * kw_postings)
            end = at_doc_len + 4 * rows
            keyword = KeywordLayout(at_terms, at_offsets, at_prows, at_tf, at_doc_len, end)
        layout = IdxLayout(IDX_HEADER_SIZE, at_order, at_vectors, at_types, at_hot, end, keyword)
        slots_at = (end + SLOT_PAGE - 1) // SLOT_PAGE * SLOT_PAGE
        deltas_at = slots_at + 2 * SLOT_PAGE
        with_slots = version >= 2 and <u64>size >= deltas_at
        if end != <u64>size and not with_slots:
            return None
        if len(uuid) != 16 or memcmp(p + 16, <const char*>uuid, 16) != 0:
            return None
        if dat_dim and dim != 0 and dim != <u64>dat_dim:
            return None
        covered, last_offset, last_crc, next_id = _le64(p + 56), _le64(p + 64), load_le32(p + 72), _le64(p + 80)
        types_at, hot_at = at_types, at_hot
        slot = delta = dl = None
        if with_slots:
            slot = _current_slot(p, n, slots_at, Slot)[1]
        if slot is not None:
            offset, length = slot[1], slot[2]
            if offset < deltas_at or length > <u64>size or offset > <u64>size - length:
                return None
            delta = _delta_header(p, n, offset, DeltaHeader)
            if delta is None:
                return None
            d = p + offset
            d_rows, d_patches, d_postings = _le64(d + 8), _le64(d + 68), _le64(d + 76)
            types_len, hot_len = load_le32(d + 60), load_le32(d + 64)
            # fmt.delta_layout
            d_vectors = _align(DELTA_HEADER_SIZE + d_rows * ROW_SIZE)
            d_doc_len = _align(d_vectors + d_rows * dim)
            d_prows = _align(d_doc_len + 4 * d_rows)
            d_pdata = _align(d_prows + 4 * d_patches)
            d_terms = _align(d_pdata + d_patches * ROW_SIZE)
            d_posting_rows = _align(d_terms + 8 * d_postings)
            d_tf = _align(d_posting_rows + 4 * d_postings)
            d_types = _align(d_tf + 2 * d_postings)
            d_hot = _align(d_types + types_len)
            dl = DeltaLayout(DELTA_HEADER_SIZE, d_vectors, d_doc_len, d_prows, d_pdata, d_terms,
                             d_posting_rows, d_tf, d_types, d_hot, d_hot + hot_len)
            if (d_hot + hot_len != length or _le64(d + 16) > rows + d_rows
                    or _le64(d + 84) > _le64(d + 16) * MAX_DOC_TOKENS):  # live < 2^33 here
                return None
            covered, last_offset, last_crc, next_id = _le64(d + 24), _le64(d + 32), load_le32(d + 40), _le64(d + 44)
            types_at, hot_at = offset + d_types, offset + d_hot
        if not _covers(dat, dat_end, covered, last_offset, last_crc):
            return None
        if types_at + types_len > <u64>n or hot_at + hot_len > <u64>n:
            return None
        types_bytes = _bytes(p + types_at, types_len)
        if rows:
            base_last_id = <i64>_le64(p + IDX_HEADER_SIZE + (rows - 1) * ROW_SIZE)
            if _le64(p + IDX_HEADER_SIZE + (rows - 1) * ROW_SIZE) >= next_id:
                return None
    finally:
        PyBuffer_Release(&view)
    hot = None
    if hot_len:
        hot = hot_section(buf, hot_at, hot_len, HotSection)
        if hot is None:
            return None
    return Opened(h, layout, with_slots, slot, delta, dl, types_bytes, hot, base_last_id)
