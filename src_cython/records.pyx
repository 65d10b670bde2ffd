# cython: language_level=3
"""Compiled record kernels: CRC-32, the scan that walks and verifies the data file's
records, and the framing of new records.

Twins of fastmem._kernels.reference.crc32, scan_records and frame_records; see there for contracts.
"""
import numpy as np

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport uint32_t
from libc.string cimport memcpy
from libc.stdlib cimport free, malloc, realloc
from cpython.unicode cimport PyUnicode_AsUTF8AndSize
from cpython.exc cimport PyErr_SetFromErrno
from posix.stat cimport struct_stat
from _types cimport u8, u16, u32, u64, i64
from _bytes cimport load_le16, load_le32, load_le64, store_le16, store_le32
from _frames cimport (
    CRC_AT, FORMAT_VERSION, HEADER_SIZE, MAGIC_BYTE0, MAGIC_LE32, MAX_DIM, MAX_RAW_PAYLOAD,
    _crc_update, _framed_length, _record_length, fastmem_crc_init, fastmem_crc_use_clmul,
)

cdef extern from *:
    """
    #include <sys/stat.h>
    #include <sys/syscall.h>
    #include <unistd.h>
    /* fstat as the system call itself. Since glibc 2.33 fstat is an exported symbol
       (fstat64@GLIBC_2.33) where it used to be an inline wrapper of __fxstat, so calling it
       made the wheels manylinux_2_34 instead of 2_17. On x86_64 and aarch64 the kernel's
       struct stat is glibc's; elsewhere, the library call. */
    static int fastmem_fstat(int fd, struct stat *st) {
    #if defined(SYS_fstat) && (defined(__x86_64__) || defined(__aarch64__))
        return (int)syscall(SYS_fstat, fd, st);
    #else
        return fstat(fd, st);
    #endif
    }
    """
    int fastmem_fstat(int fd, struct_stat *st)

CONSTANTS = dict(HEADER_SIZE=HEADER_SIZE, CRC_AT=CRC_AT, RECORD_VERSION=FORMAT_VERSION,
                 MAX_DIM=MAX_DIM, MAX_RAW_PAYLOAD=MAX_RAW_PAYLOAD, MAGIC=b"\x8fFMR")

fastmem_crc_init()
HAVE_PCLMUL = bool(fastmem_crc_use_clmul(1))


def use_pclmul(bint enabled):
    """Fold the CRC with PCLMULQDQ (when the processor has it) or use the table alone;
    returns whether PCLMULQDQ is in use. The tests run both."""
    return bool(fastmem_crc_use_clmul(enabled))


def crc32(const u8[::1] data, uint32_t value=0):
    """CRC-32 (IEEE polynomial, as zlib) of ``data``, continuing from ``value``."""
    cdef Py_ssize_t n = data.shape[0]
    if n == 0:
        return value
    with nogil:
        value = _crc_update(value, &data[0], n)
    return value


# --- resynchronising after damage ------------------------------------------------------
# After a damaged region the scan looks for the next byte that starts a valid record.
# Checking each candidate's CRC from scratch costs its claimed length (up to MAX_RECORD),
# so a file packed with plausible record headers would take O(size x MAX_RECORD). Instead,
# the CRC of any byte range comes from prefix CRCs: with P(x) the CRC of [origin, x),
# crc([a, b)) = P(b) ^ x^(8(b - a)) * P(a) mod the CRC polynomial (the algebra of zlib's
# crc32_combine). Prefix CRCs are kept every STRIDE bytes in a ring that spans one
# MAX_RECORD window and are extended only forward: the resync CRCs each byte at most once
# and a candidate costs O(STRIDE) plus three carry-less products.

cdef enum:
    STRIDE = 32
    MAX_RECORD_LEN = HEADER_SIZE + 2 * MAX_DIM + MAX_RAW_PAYLOAD
    RING = MAX_RECORD_LEN // STRIDE + 8
    LO_BITS = 11

cdef u32 POLY = 0xEDB88320
cdef u32 X8_LO[1 << LO_BITS]  # x^(8 n) mod P for n < 2^LO_BITS
cdef u32 X8_HI[(MAX_RECORD_LEN >> LO_BITS) + 2]  # x^(8 n 2^LO_BITS) mod P


cdef inline u32 _multmodp(u32 a, u32 b) noexcept nogil:
    # a * b modulo the CRC polynomial, bit-reflected (bit 31 is x^0), as zlib's multmodp.
    cdef u32 m = 1u << 31, p = 0
    cdef int i
    for i in range(32):
        if a & m:
            p ^= b
        m >>= 1
        b = (b >> 1) ^ POLY if b & 1 else b >> 1
    return p


cdef void _init_shift_tables() noexcept:
    cdef u32 x8 = 1u << 23  # x^8
    cdef u32 step, v = 1u << 31  # x^0
    cdef Py_ssize_t i
    for i in range(1 << LO_BITS):
        X8_LO[i] = v
        v = _multmodp(v, x8)
    step = v  # x^(8 2^LO_BITS)
    v = 1u << 31
    for i in range((MAX_RECORD_LEN >> LO_BITS) + 2):
        X8_HI[i] = v
        v = _multmodp(v, step)

_init_shift_tables()


cdef inline u32 _shift(u32 crc, i64 n) noexcept nogil:
    # crc * x^(8 n): the CRC of A carried over n more bytes (0 <= n <= MAX_RECORD_LEN).
    return _multmodp(_multmodp(X8_HI[n >> LO_BITS], X8_LO[n & ((1 << LO_BITS) - 1)]), crc)


cdef struct _Prefix:
    const u8* base
    i64 origin  # P(origin) = 0
    i64 filled  # checkpoints 0 .. filled - 1 are in the ring
    u32* ring  # checkpoint j (P(origin + j STRIDE)) at ring[j % RING]


cdef inline void _prefix_reset(_Prefix* pf, i64 origin) noexcept nogil:
    pf.origin = origin
    pf.filled = 1
    pf.ring[0] = 0


cdef u32 _prefix_crc(_Prefix* pf, i64 x) noexcept nogil:
    # P(x) for origin <= x; extends the checkpoints forward as needed.
    cdef i64 j = (x - pf.origin) // STRIDE, at
    while pf.filled <= j:
        at = pf.origin + (pf.filled - 1) * STRIDE
        pf.ring[pf.filled % RING] = _crc_update(pf.ring[(pf.filled - 1) % RING], pf.base + at, STRIDE)
        pf.filled += 1
    at = pf.origin + j * STRIDE
    return _crc_update(pf.ring[j % RING], pf.base + at, x - at)


cdef i64 _candidate_length(_Prefix* pf, i64 pos, i64 end) noexcept nogil:
    # _record_length(pos) computed through the prefix CRCs: the same answer, without
    # reading the candidate's bytes (beyond those not yet covered by the prefix).
    cdef const u8* p = pf.base + pos
    cdef u32 crc, body
    cdef i64 a, b
    cdef i64 length = _framed_length(p, pos, end)
    if length == 0:
        return 0
    a = pos + HEADER_SIZE
    b = pos + length
    if a < pf.origin + (pf.filled - 1) * STRIDE - (RING - 2) * <i64>STRIDE or a < pf.origin:
        _prefix_reset(pf, a)  # not reached while positions only grow; kept as a safe path
    elif a > pf.origin + (pf.filled - 1) * STRIDE:
        _prefix_reset(pf, a)  # past the window: the bytes between need no prefix
    body = _prefix_crc(pf, b)  # extends the ring to b; a stays in it (b - a < RING STRIDE)
    body ^= _shift(_prefix_crc(pf, a), b - a)
    crc = _crc_update(0, p, CRC_AT)
    crc = _shift(crc, b - a) ^ body
    if crc != load_le32(p + CRC_AT):
        return 0
    return length


cdef enum:
    KIND_BATCH = 4  # fmt.KIND_BATCH: a batch frame, its payload the count (u64)
    FRAME_SIZE = HEADER_SIZE + 8


cdef inline i64 _batch_count(const u8* base, i64 pos, i64 end) noexcept nogil:
    # fmt.batch_count: the count of the valid batch frame at pos, else 0.
    cdef const u8* p = base + pos
    cdef u32 crc
    cdef u64 count
    if pos + FRAME_SIZE > end:
        return 0
    if (load_le32(p) != MAGIC_LE32 or p[4] != FORMAT_VERSION or p[5] != KIND_BATCH
            or load_le16(p + 6) != 0 or load_le32(p + 8) != 8 or load_le32(p + 12) != 8):
        return 0
    crc = _crc_update(0, p, CRC_AT)
    crc = _crc_update(crc, p + HEADER_SIZE, 8)
    if crc != load_le32(p + CRC_AT):
        return 0
    count = load_le64(p + HEADER_SIZE)
    if count < 2 or count > 0xFFFFFFFFu:
        return 0
    return <i64>count


CONSTANTS.update(KIND_BATCH=KIND_BATCH, BATCH_FRAME_SIZE=FRAME_SIZE)

cdef enum:
    LOST_PAGE = 4096  # fmt.LOST_PAGE: zeros that mark a page a power loss did not keep


cdef inline i64 _next_valid(_Prefix* pf, const u8* base, i64 pos, i64 end) noexcept nogil:
    # The first offset after pos where a valid record or batch frame starts, else end.
    cdef i64 nxt = pos + 1
    while nxt < end:
        if base[nxt] == MAGIC_BYTE0 and (_candidate_length(pf, nxt, end)
                                         or _batch_count(base, nxt, end)):
            return nxt
        nxt += 1
    return end


cdef inline bint _zeros_at(const u8* base, i64 pos, i64 end, i64 n) noexcept nogil:
    # Whether the n bytes at pos (before end) are all zeros.
    cdef i64 i
    if pos + n > end:
        return False
    for i in range(pos, pos + n):
        if base[i]:
            return False
    return True


cdef bint _zero_page_in(const u8* base, i64 pos, i64 end) noexcept nogil:
    # Whether base[pos:end] holds LOST_PAGE zero bytes in a row.
    cdef i64 run = 0
    while pos < end:
        run = run + 1 if base[pos] == 0 else 0
        if run >= LOST_PAGE:
            return True
        pos += 1
    return False


cdef bint _lost_rest(_Prefix* pf, const u8* base, i64 at, i64 end, int kind) noexcept nogil:
    # fastmem._kernels.reference._lost_rest: base[at:end], from a damaged record of a batch of
    # records of kind (0: the first met) to the end, is the rest of the file's last write
    # with pages lost (each damaged region that records follow holds a page of zeros or
    # starts with a frame's length of them; no frame, no record of another kind after).
    cdef i64 pos = at, nxt, length
    _prefix_reset(pf, at)
    while pos < end:
        nxt = _next_valid(pf, base, pos, end)
        if nxt >= end:
            return True
        if not (_zeros_at(base, pos, nxt, FRAME_SIZE) or _zero_page_in(base, pos, nxt)):
            return False
        pos = nxt
        while True:
            length = _record_length(base, pos, end)
            if length == 0:
                break
            if kind == 0:
                kind = base[pos + 5]
            if base[pos + 5] != kind:
                return False
            pos += length
        if pos < end and _batch_count(base, pos, end):
            return False
    return True


def scan_records(const u8[::1] buf, Py_ssize_t start, Py_ssize_t end):
    """Walk the records in ``buf[start:end]``; see fastmem._kernels.reference.scan_records."""
    if not (0 <= start <= end <= buf.shape[0]):
        raise ValueError("scan range out of bounds")
    cdef list bad = []
    cdef i64 pos = start, length, nxt
    cdef i64 s = start, e = end
    cdef const u8* base = &buf[0] if buf.shape[0] else NULL
    # Records go into arrays that grow (with the GIL) as they fill; the byte work lets it go.
    cdef Py_ssize_t cap = 4096, count = 0
    offsets = np.empty(cap, dtype=np.int64)
    lengths = np.empty(cap, dtype=np.int64)
    cdef i64[::1] offs = offsets
    cdef i64[::1] lens = lengths
    cdef i64 bad_start, bad_end
    # The batch being walked: its frame's offset, the records it still names, and where
    # its records start in offs (dropped again when the file ends before its last one).
    cdef i64 frame_at = -1, remaining = 0
    cdef Py_ssize_t mark = 0
    cdef bint nested
    cdef int kind
    cdef _Prefix prefix, lost  # lost: the prefix CRCs of _lost_rest's walks
    prefix.base = lost.base = base
    prefix.ring = <u32*>malloc(RING * sizeof(u32))
    if prefix.ring == NULL:
        raise MemoryError()
    lost.ring = <u32*>malloc(RING * sizeof(u32))
    if lost.ring == NULL:
        free(prefix.ring)
        raise MemoryError()
    _prefix_reset(&prefix, s)
    try:
        while pos < e:
            bad_start = -1
            with nogil:
                while pos < e and count < cap:
                    length = _record_length(base, pos, e)
                    if length == 0 and remaining:
                        remaining = 0
                        nested = _batch_count(base, pos, e) != 0
                        nxt = _next_valid(&prefix, base, pos, e)
                        kind = base[offs[mark] + 5] if count > mark else 0  # the batch's
                        if nxt >= e or not nested and (
                                _lost_rest(&lost, base, pos, e, kind)
                                or _zeros_at(base, pos, e, FRAME_SIZE)
                                and _lost_rest(&lost, base, pos, e, 0)):
                            # nothing valid after (the batch is the file's tail), or the file's
                            # last write with pages lost: none of it
                            count = mark
                            bad_start, bad_end, pos = frame_at, e, e
                            break
                        if nested and count == mark:  # two frames in a row: the first is damage
                            bad_start, bad_end = frame_at, pos
                            break
                        if nested:  # a frame where a record of the batch should be: damage
                            bad_start, bad_end, pos = pos, nxt, nxt
                            break
                        continue  # damage inside a batch, records after it: the others are kept
                    if length == 0:
                        remaining = _batch_count(base, pos, e)
                        if remaining:
                            frame_at, mark = pos, count
                            pos += FRAME_SIZE
                            continue
                        bad_start = pos
                        if (_zeros_at(base, pos, e, FRAME_SIZE)
                                and _lost_rest(&lost, base, pos, e, 0)):
                            pos = e  # a batch whose frame's page was lost: the file's last write
                        else:
                            pos = _next_valid(&prefix, base, pos, e)
                        bad_end = pos
                        break
                    offs[count] = pos
                    lens[count] = length
                    count += 1
                    pos += length
                    if remaining:
                        remaining -= 1
            if bad_start >= 0:
                bad.append((bad_start, bad_end))
            if count == cap:
                cap *= 2
                offsets = np.resize(offsets, cap)
                lengths = np.resize(lengths, cap)
                offs = offsets
                lens = lengths
        if remaining:  # the file ends where the batch's next record would start
            count = mark
            bad.append((frame_at, e))
    finally:
        free(prefix.ring)
        free(lost.ring)
    offsets = offsets[:count].copy()
    lengths = lengths[:count].astype(np.uint32)
    arr = np.frombuffer(buf, dtype=np.uint8)
    kinds = arr[offsets + 5] if offsets.size else np.empty(0, dtype=np.uint8)
    dims = (arr[offsets + 6].astype(np.uint16) | (arr[offsets + 7].astype(np.uint16) << 8)
            if offsets.size else np.empty(0, dtype=np.uint16))
    return (
        offsets,
        lengths,
        kinds.astype(np.uint8),
        dims.astype(np.uint16),
        np.array([b[0] for b in bad], dtype=np.int64),
        np.array([b[1] for b in bad], dtype=np.int64),
    )


def frame_records(int kind, list payloads, const u32[::1] raw_lens, const u16[:, ::1] vectors,
                  const u8[::1] has_vector):
    """Frame whole records: header, float16 vector (as uint16 bits), stored payload, CRC.

    See fastmem._kernels.reference.frame_records.
    """
    cdef Py_ssize_t n = len(payloads), i, dim = vectors.shape[1] if vectors is not None else 0
    if raw_lens.shape[0] != n or (vectors is not None and (vectors.shape[0] != n or has_vector is None
                                                            or has_vector.shape[0] != n)):
        raise ValueError("payloads, raw_lens, vectors and has_vector differ in length")
    if dim > MAX_DIM:
        raise ValueError("vectors are longer than MAX_DIM")
    lengths = np.empty(n, dtype=np.uint32)
    crcs = np.empty(n, dtype=np.uint32)
    cdef u32[::1] lens_v = lengths
    cdef u32[::1] crcs_v = crcs
    cdef Py_ssize_t total = 0, vbytes, plen
    cdef bytes p
    for i in range(n):
        p = payloads[i]
        plen = len(p)
        if plen > raw_lens[i] or raw_lens[i] > MAX_RAW_PAYLOAD:
            raise ValueError("a payload is longer than its raw length or MAX_RAW_PAYLOAD")
        vbytes = 2 * dim if dim and has_vector[i] else 0
        lens_v[i] = HEADER_SIZE + vbytes + plen
        total += lens_v[i]
    out = PyBytes_FromStringAndSize(NULL, total)
    cdef u8* o = <u8*>PyBytes_AS_STRING(out)
    cdef u32 crc
    for i in range(n):
        p = payloads[i]
        plen = len(p)
        vbytes = lens_v[i] - HEADER_SIZE - plen
        store_le32(o, MAGIC_LE32)
        o[4] = FORMAT_VERSION
        o[5] = kind
        store_le16(o + 6, vbytes // 2)
        store_le32(o + 8, plen)
        store_le32(o + 12, raw_lens[i])
        if vbytes:
            memcpy(o + HEADER_SIZE, &vectors[i, 0], vbytes)
        memcpy(o + HEADER_SIZE + vbytes, PyBytes_AS_STRING(p), plen)
        crc = _crc_update(0, o, CRC_AT)
        crc = _crc_update(crc, o + HEADER_SIZE, vbytes + plen)
        store_le32(o + CRC_AT, crc)
        crcs_v[i] = crc
        o += lens_v[i]
    return out, lengths, crcs


cdef object _record_info(object buf, object offset, object end, bint with_payload):
    # check_record, or record_payload when with_payload: the payload bytes in place of
    # their length. Py_buffer directly: a typed memoryview costs more than the check here.
    cdef Py_buffer view
    cdef i64 length, at, stop
    cdef const u8* p
    cdef u32 dim
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        # Python ints first: an offset from a damaged index row may not fit in 64 bits
        if not (0 <= offset < end <= view.len):
            return None
        at, stop = offset, end
        p = <const u8*>view.buf
        with nogil:
            length = _record_length(p, at, stop)
        if length == 0:
            return None
        p += at
        dim = load_le16(p + 6)
        if with_payload:
            return (p[5], dim, PyBytes_FromStringAndSize(<const char*>p + HEADER_SIZE + 2 * dim,
                                                         load_le32(p + 8)), load_le32(p + 12))
        return p[5], dim, load_le32(p + 8), load_le32(p + 12)
    finally:
        PyBuffer_Release(&view)


def check_record(object buf, object offset, object end):
    """``(kind, dim, payload_len, raw_len)`` of the valid record at ``offset``, else None."""
    return _record_info(buf, offset, end, False)


def record_payload(object buf, object offset, object end):
    """``(kind, dim, payload, raw_len)`` of the valid record at ``offset`` (``payload``: its
    stored payload bytes, a copy), else None: ``check_record`` and the slice in one call."""
    return _record_info(buf, offset, end, True)


def file_size(int fd):
    """The size of the file open as ``fd``, or -1 when no name links to it any more (a
    compaction or repair replaced it): what the engine reads of ``os.fstat`` before every
    call, without building an ``os.stat_result`` (which costs more than the system call)."""
    cdef struct_stat st
    # The GIL is kept: fstat of a local file returns at once, and releasing it costs more.
    if fastmem_fstat(fd, &st) != 0:
        PyErr_SetFromErrno(OSError)
    return -1 if st.st_nlink == 0 else st.st_size


# --- msgpack payloads ---------------------------------------------------------------
# The same bytes as msgpack.packb(obj, use_bin_type=True) for the plain types a payload
# holds (dict, list, tuple, str, bytes, int, float, bool, None): the packer of add_many's
# hot loop, without a Python call per value. Other types raise TypeError, as there.

cdef struct _Buf:
    u8* data
    Py_ssize_t size
    Py_ssize_t cap


cdef int _reserve(_Buf* b, Py_ssize_t extra) except -1:
    cdef Py_ssize_t cap
    cdef u8* grown
    if b.size + extra <= b.cap:
        return 0
    cap = max(2 * b.cap, b.size + extra, 256)
    grown = <u8*>realloc(b.data, cap)
    if grown == NULL:
        raise MemoryError()
    b.data, b.cap = grown, cap
    return 0


cdef inline int _put_be(_Buf* b, u8 tag, unsigned long long v, int width) except -1:
    cdef int i
    _reserve(b, 1 + width)
    b.data[b.size] = tag
    for i in range(width):
        b.data[b.size + 1 + i] = (v >> (8 * (width - 1 - i))) & 0xFF
    b.size += 1 + width
    return 0


cdef inline int _put_byte(_Buf* b, u8 v) except -1:
    _reserve(b, 1)
    b.data[b.size] = v
    b.size += 1
    return 0


cdef int _put_len(_Buf* b, Py_ssize_t n, u8 fix, int fix_max, u8 t8, u8 t16, u8 t32) except -1:
    if n < fix_max:
        return _put_byte(b, fix | n)
    if t8 and n < 0x100:
        return _put_be(b, t8, n, 1)
    if n < 0x10000:
        return _put_be(b, t16, n, 2)
    if n <= 0xFFFFFFFF:
        return _put_be(b, t32, n, 4)
    raise ValueError("too long for msgpack")


cdef int _put_raw(_Buf* b, const char* p, Py_ssize_t n) except -1:
    _reserve(b, n)
    memcpy(b.data + b.size, p, n)
    b.size += n
    return 0


cdef int _pack(_Buf* b, object o, int depth) except -1:
    cdef long long i
    cdef unsigned long long u
    cdef double d
    cdef Py_ssize_t n
    cdef const char* s
    if depth > 64:
        raise ValueError("payload nests deeper than 64")
    if o is None:
        return _put_byte(b, 0xC0)
    if o is True:
        return _put_byte(b, 0xC3)
    if o is False:
        return _put_byte(b, 0xC2)
    if isinstance(o, int):
        if o < 0:
            i = o
            if i >= -32:
                return _put_byte(b, <u8>(i & 0xFF))
            if i >= -0x80:
                return _put_be(b, 0xD0, <unsigned long long>i, 1)
            if i >= -0x8000:
                return _put_be(b, 0xD1, <unsigned long long>i, 2)
            if i >= -0x80000000:
                return _put_be(b, 0xD2, <unsigned long long>i, 4)
            return _put_be(b, 0xD3, <unsigned long long>i, 8)
        u = o
        if u < 0x80:
            return _put_byte(b, <u8>u)
        if u <= 0xFF:
            return _put_be(b, 0xCC, u, 1)
        if u <= 0xFFFF:
            return _put_be(b, 0xCD, u, 2)
        if u <= 0xFFFFFFFF:
            return _put_be(b, 0xCE, u, 4)
        return _put_be(b, 0xCF, u, 8)
    if isinstance(o, float):
        d = o
        memcpy(&u, &d, 8)
        return _put_be(b, 0xCB, u, 8)
    if isinstance(o, str):
        s = PyUnicode_AsUTF8AndSize(o, &n)
        _put_len(b, n, 0xA0, 32, 0xD9, 0xDA, 0xDB)
        return _put_raw(b, s, n)
    if isinstance(o, bytes):
        n = len(<bytes>o)
        _put_len(b, n, 0, 0, 0xC4, 0xC5, 0xC6)
        return _put_raw(b, PyBytes_AS_STRING(o), n)
    if isinstance(o, dict):
        _put_len(b, len(<dict>o), 0x80, 16, 0, 0xDE, 0xDF)
        for key, value in (<dict>o).items():
            _pack(b, key, depth + 1)
            _pack(b, value, depth + 1)
        return 0
    if isinstance(o, (list, tuple)):
        _put_len(b, len(o), 0x90, 16, 0, 0xDC, 0xDD)
        for value in o:
            _pack(b, value, depth + 1)
        return 0
    raise TypeError(f"can not serialize {type(o).__name__!r} object")


def pack_memories(list payloads, unsigned long long first_id, const u32[::1] text_tokens,
                  const u32[::1] summary_tokens):
    """msgpack bytes of each memory payload with its id and token counts, and their lengths;
    see fastmem._kernels.reference.pack_memories."""
    cdef Py_ssize_t n = len(payloads), j
    if text_tokens.shape[0] != n or summary_tokens.shape[0] != n:
        raise ValueError("payloads and token counts differ in length")
    cdef _Buf b
    cdef list out = []
    cdef dict p
    lengths = np.empty(n, dtype=np.uint32)
    cdef u32[::1] lens = lengths
    b.data, b.size, b.cap = NULL, 0, 0
    try:
        for j in range(n):
            p = payloads[j]
            b.size = 0
            _put_len(&b, len(p) + ("i" not in p) + ("k" not in p), 0x80, 16, 0, 0xDE, 0xDF)
            for key, value in p.items():
                _pack(&b, key, 1)
                if key == "i":
                    _pack(&b, first_id + j, 1)
                elif key == "k":
                    _pack_counts(&b, text_tokens[j], summary_tokens[j])
                else:
                    _pack(&b, value, 1)
            if "i" not in p:
                _pack(&b, "i", 1)
                _pack(&b, first_id + j, 1)
            if "k" not in p:
                _pack(&b, "k", 1)
                _pack_counts(&b, text_tokens[j], summary_tokens[j])
            out.append(PyBytes_FromStringAndSize(<char*>b.data, b.size))
            lens[j] = <u32>b.size
    finally:
        free(b.data)
    return out, lengths


cdef int _pack_counts(_Buf* b, u32 text, u32 summary) except -1:
    _put_byte(b, 0x92)  # a list of two
    _pack(b, text, 1)
    return _pack(b, summary, 1)
