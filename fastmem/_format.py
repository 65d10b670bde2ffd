"""The on-disk format of a fastmem store: the single source of truth.

A store is two files (``docs/format.md`` describes them for people):

``<name>.dat``
    A 64-byte file header, then an append-only log of framed records. Every change to the
    store (a new memory, an update, a forget) is a record; the index can always be rebuilt
    from this file alone.

``<name>.idx``
    A 4096-byte header, then sections: the rows (``INDEX_DTYPE``), the time order of
    the rows, the int8 embedding matrix, the table of user-defined type names, the hot
    section and the keyword section (BM25 postings), then two commit slots. A full
    checkpoint writes it whole to a temporary name and renames it over the old one; an
    incremental one appends a *delta* (what changed since the full one) and commits it by
    writing the older slot (``docs/format.md``).

Every integer and float is little-endian. No other module packs or parses these bytes.
"""

from __future__ import annotations

import struct
import zlib
from itertools import accumulate
from typing import Any, NamedTuple, TypeVar

import lz4.block
import msgpack
import numpy as np

from .errors import CorruptIndexError, CorruptionError, CorruptRecordError, FormatVersionError

try:  # CPython's BLAKE2, which hashlib hands on: importing hashlib also loads OpenSSL (~2 ms),
    # which open() would pay (an embedder's fingerprint) and nothing of fastmem's needs
    from _blake2 import blake2b
except ImportError:  # another interpreter
    from hashlib import blake2b

# The data file's version (its header): 2 added batch frames (KIND_BATCH). A version 1 file
# is read as it is and raised to 2 by the first writer that opens it (``upgrade_dat_header``).
FORMAT_VERSION = 2
DAT_VERSIONS = (1, 2)
RECORD_VERSION = 1  # the version byte of every record: the record layout is unchanged
# The index file's version: 2 added the commit slots and deltas (incremental checkpoints);
# version 1 files (no slots) are read, and replaced by version 2 at the next checkpoint.
IDX_VERSION = 2
IDX_VERSIONS = (1, 2)

# --- data file -------------------------------------------------------------------------

DAT_MAGIC = b"FMEMDATA"
# magic, version, header size, store uuid, dim (0 = not fixed yet), created (unix s),
# next id floor, end of the compacted prefix (both 0 unless written by compaction), the
# fingerprint of the embedder that wrote the vectors (zeros = not recorded), crc
DAT_HEADER = struct.Struct("<8sHH16sIdQQ4sI")
DAT_HEADER_SIZE = DAT_HEADER.size  # 64

RECORD_MAGIC = b"\x8fFMR"
# magic, format version, kind, vector dim, payload length, raw payload length, crc
RECORD_HEADER = struct.Struct("<4sBBHIII")
RECORD_HEADER_SIZE = RECORD_HEADER.size  # 20
RECORD_CRC_AT = 16  # the CRC covers bytes [0, 16) and [20, end) of the record
_Offset = TypeVar("_Offset", int, np.ndarray)  # one offset, or an array of them
RECORD_RAW_LEN_AT = 12  # the payload's length before compression (u32)


def vector_start(offset: _Offset) -> _Offset:
    """Where the vector of the record at ``offset`` starts: right after its header."""
    return offset + RECORD_HEADER_SIZE


def payload_start(offset: int, dim: int) -> int:
    """Where the payload of the record at ``offset``, whose vector has ``dim`` float16s, starts."""
    return offset + RECORD_HEADER_SIZE + 2 * dim


def record_size(dim: int, payload_len: int) -> int:
    """The bytes of a whole record: header, vector and stored payload."""
    return RECORD_HEADER_SIZE + 2 * dim + payload_len

KIND_MEMORY = 1
KIND_UPDATE = 2
KIND_FORGET = 3
RECORD_KINDS = (KIND_MEMORY, KIND_UPDATE, KIND_FORGET)
# A batch frame: written before the records of one write of several (an add_many, a forget
# of many), it says how many follow. A reader takes them only once all are there and valid
# (a write under way, or cut short by a crash, is not read in part); the scans
# (``scan_records``) give the records and leave the frame out. Its payload is not msgpack:
# the count, u64 (``BATCH_FRAME``). No vector. A frame never follows another frame directly.
KIND_BATCH = 4
BATCH_COUNT = struct.Struct("<Q")
BATCH_FRAME_SIZE = RECORD_HEADER_SIZE + BATCH_COUNT.size  # 28
MAX_BATCH = (1 << 32) - 1  # records a frame may name
# What a power loss does to the pages of an unsynced write: a page not kept reads as zeros.
# Inside the file's last batch, a damaged region that holds LOST_PAGE zero bytes (or starts
# with a frame's length of zeros: the frame's page lost) marks the batch as that write, cut
# short: the scans take none of it (docs/format.md, "Batch frame").
LOST_PAGE = 4096

# Documented limits; the scan refuses any length beyond them before reading it.
MAX_TEXT_BYTES = 1 << 20  # UTF-8 bytes of a memory's text
MAX_SUMMARY_BYTES = 1 << 16
MAX_METADATA_BYTES = 1 << 16  # metadata, msgpack-encoded
# Levels a record's payload may nest (the payload map is level 0, metadata level 1): the
# compiled packer (src_cython/records.pyx, _pack) refuses anything deeper.
MAX_PAYLOAD_DEPTH = 64
MAX_TYPE_CHARS = 64
MAX_SESSION_CHARS = 256
MAX_DIM = 4096
MAX_ID = (1 << 63) - 1  # ids are below 2^63 (a row's id field is u64; ids stay int64-safe)
MAX_TIMESTAMP = 1e11  # Unix seconds (year 5138): timestamps are in [0, MAX_TIMESTAMP]
MAX_RAW_PAYLOAD = 2 << 20  # a payload before compression
MAX_PAYLOAD = MAX_RAW_PAYLOAD  # stored payloads are never larger than raw ones
MAX_RECORD = RECORD_HEADER_SIZE + 2 * MAX_DIM + MAX_PAYLOAD
COMPRESS_MIN = 256  # shorter payloads are stored raw: lz4 saves ~15% there, at a third of add's speed

# Payload keys (msgpack map, one-letter keys; absent keys take the default in brackets).
#   memory: i id, t timestamp, x text, y type ["conversation"], s session [None],
#           p importance [default of the type], n pinned [False], m metadata [None],
#           u summary [None], k [text tokens, summary tokens] [unknown]
#   update: i id, t time of the update, and any of p, n, m
#   forget: i id, t time of the forget

# --- index file ------------------------------------------------------------------------

IDX_MAGIC = b"FMEMINDX"
IDX_HEADER_SIZE = 4096
# magic, version, header size, store uuid, rows, live rows, dim, row size, covered .dat
# offset, offset of the record that ends there, its crc, type table bytes, next id,
# hot section bytes, checkpoint time, keyword section version (0 = no section: files
# written before it existed have zeros there), its term count, posting count and the
# tokens of the live rows; the header's crc sits in its last 4 bytes.
IDX_HEADER = struct.Struct("<8sII16sQQIIQQIIQIdIQQQ")
KEYWORD_VERSION = 1  # the layout of the keyword section described in docs/format.md
DOC_DEAD = 0x80000000  # top bit of a keyword doc_len entry: the row is forgotten
HOT_MEMORIES = 128  # newest live memories copied whole into the index's hot section
IDX_HEADER_CRC_AT = IDX_HEADER_SIZE - 4
SECTION_ALIGN = 64

INDEX_DTYPE = np.dtype(
    [
        ("id", "<u8"),
        ("timestamp", "<f8"),
        ("session", "<u8"),  # 64-bit hash of the session name; 0 = no session
        ("offset", "<u8"),  # .dat offset of the memory record
        ("meta_offset", "<u8"),  # .dat offset of the update record with the metadata; 0 = none
        ("last_access", "<f8"),
        ("length", "<u4"),  # length of the memory record
        ("importance", "<f4"),
        ("scale", "<f4"),  # int8 vector * scale = the stored float16 vector (approximately)
        ("access_count", "<u4"),
        ("text_tokens", "<u4"),
        ("summary_tokens", "<u4"),
        ("type", "<u2"),
        ("flags", "<u2"),
        ("reserved", "<u4"),
    ]
)
assert INDEX_DTYPE.itemsize == 80
# The same row as a struct, for reading one row without numpy's per-field cost.
INDEX_ROW = struct.Struct("<QdQQQdIffIIIHHI")
assert INDEX_ROW.size == INDEX_DTYPE.itemsize

FLAG_FORGOTTEN = 1
FLAG_PINNED = 2
FLAG_HAS_VECTOR = 4

UNKNOWN_TOKENS = 0xFFFFFFFF

BUILTIN_TYPES = ("conversation", "tool_result", "plan", "fact")
FIRST_USER_TYPE = 16  # codes 0..15 are reserved for built-in types
TYPE_CODES = 1 << 16  # a type code is a u16: the kernels' type masks have an entry for each
MAX_USER_TYPES = TYPE_CODES - FIRST_USER_TYPE
DEFAULT_IMPORTANCE = {"fact": 0.9, "plan": 0.7, "tool_result": 0.5, "conversation": 0.3}
DEFAULT_USER_TYPE_IMPORTANCE = 0.5


def crc32(data: Any, value: int = 0) -> int:
    """CRC-32 (IEEE, as zlib) of ``data``, continuing from ``value``."""
    return zlib.crc32(data, value)


# --- data file header ------------------------------------------------------------------


class DatHeader(NamedTuple):
    uuid: bytes
    dim: int
    created: float
    next_id: int = 0
    compacted_end: int = 0
    embedder: bytes = bytes(4)
    version: int = FORMAT_VERSION  # of the file read (1: no batch frames in it yet)


def embedder_fingerprint(name: str, dim: int) -> bytes:
    """4 bytes that differ between embedders (model name and dimension)."""
    return blake2b(f"{name}\0{dim}".encode(), digest_size=4).digest()


def pack_dat_header(
    uuid: bytes, dim: int, created: float, next_id: int = 0, compacted_end: int = 0,
    embedder: bytes = bytes(4),
) -> bytes:  # fmt: skip
    body = DAT_HEADER.pack(
        DAT_MAGIC, FORMAT_VERSION, DAT_HEADER_SIZE, uuid, dim, created, next_id, compacted_end,
        embedder, 0,
    )  # fmt: skip
    return body[:-4] + struct.pack("<I", crc32(body[:-4]))


def unpack_dat_header(buf: Any, path: str) -> DatHeader:
    if len(buf) < DAT_HEADER_SIZE or bytes(buf[:8]) != DAT_MAGIC:
        raise CorruptionError(
            f"{path} is not a fastmem data file (bad magic or too short)", path=path, offset=0
        )
    magic, version, size, uuid, dim, created, next_id, compacted_end, embedder, crc = (
        DAT_HEADER.unpack_from(buf, 0)
    )
    if crc != crc32(bytes(buf[: DAT_HEADER_SIZE - 4])):  # damage first: a flipped version is damage
        raise CorruptionError(f"{path}: the file header is damaged", path=path, offset=0)
    if version not in DAT_VERSIONS:
        raise FormatVersionError(
            f"{path} has format version {version}; this fastmem reads versions "
            f"{DAT_VERSIONS[0]} to {FORMAT_VERSION}: install a fastmem release that reads it"
        )
    if size != DAT_HEADER_SIZE or dim > MAX_DIM or next_id > MAX_ID:
        raise CorruptionError(f"{path}: the file header is damaged", path=path, offset=0)
    return DatHeader(uuid, dim, created, next_id, compacted_end, embedder, version)


def upgrade_dat_header(head: DatHeader) -> bytes:
    """The 64 bytes of ``head`` as a version ``FORMAT_VERSION`` header (the same fields)."""
    return pack_dat_header(head.uuid, head.dim, head.created, head.next_id, head.compacted_end,
                           head.embedder)  # fmt: skip


# --- records ---------------------------------------------------------------------------

_pack = msgpack.Packer(use_bin_type=True, autoreset=True).pack


def encode_payload(payload: dict[str, Any]) -> tuple[bytes, int]:
    """msgpack, then lz4 when that makes it smaller: returns (stored bytes, raw length)."""
    return compress_payload(_pack(payload))


def compress_payload(raw: bytes) -> tuple[bytes, int]:
    """lz4 for a msgpack payload of ``COMPRESS_MIN`` bytes or more when that makes it
    smaller: returns (stored bytes, raw length)."""
    if len(raw) >= COMPRESS_MIN:
        packed = lz4.block.compress(raw, store_size=False)
        if len(packed) < len(raw):
            return packed, len(raw)
    return raw, len(raw)


class RecordHeader(NamedTuple):
    kind: int
    dim: int
    payload_len: int
    raw_len: int
    crc: int
    length: int  # whole record, header included


def parse_record_header(buf: Any, offset: int, end: int, path: str = "") -> RecordHeader:
    """Check a record header's magic, kind and lengths against ``end`` (not its CRC)."""
    if offset < DAT_HEADER_SIZE or offset + RECORD_HEADER_SIZE > end:
        raise CorruptRecordError(
            f"{path}: no record fits at offset {offset}", path=path, offset=offset
        )
    magic, version, kind, dim, plen, rlen, crc = RECORD_HEADER.unpack_from(buf, offset)
    if magic != RECORD_MAGIC:
        raise CorruptRecordError(
            f"{path}: no record starts at offset {offset}", path=path, offset=offset
        )
    length = RECORD_HEADER_SIZE + 2 * dim + plen
    if (
        kind not in RECORD_KINDS
        or dim > MAX_DIM
        or rlen > MAX_RAW_PAYLOAD
        or plen > rlen
        or offset + length > end
    ):
        raise CorruptRecordError(
            f"{path}: the record header at offset {offset} is damaged", path=path, offset=offset
        )
    return RecordHeader(kind, dim, plen, rlen, crc, length)


def read_record(
    buf: Any, offset: int, end: int, path: str = ""
) -> tuple[RecordHeader, dict[str, Any]]:
    """Check and decode the record at ``offset`` of ``buf`` (zero-copy up to decoding).

    Raises:
        CorruptRecordError: lengths, checksum or payload are not valid.
    """
    head = parse_record_header(buf, offset, end, path)
    view = memoryview(buf)[offset : offset + head.length]
    if crc32(view[RECORD_HEADER_SIZE:], crc32(view[:RECORD_CRC_AT])) != head.crc:
        raise CorruptRecordError(
            f"{path}: the record at offset {offset} fails its checksum", path=path, offset=offset
        )
    if view[4] != RECORD_VERSION:  # checked after the CRC: a flipped version byte is damage
        raise FormatVersionError(
            f"{path}: record at offset {offset} has format version {view[4]}; "
            f"this fastmem reads version {RECORD_VERSION}: install a release that reads it"
        )
    payload = decode_payload(
        view[RECORD_HEADER_SIZE + 2 * head.dim :], head.payload_len, head.raw_len, offset, path
    )
    return head, payload


def pack_batch_frame(count: int) -> bytes:
    """The batch frame of a write of ``count`` records (2 to ``MAX_BATCH``)."""
    if not 2 <= count <= MAX_BATCH:
        raise ValueError(f"a batch frame names 2 to {MAX_BATCH} records, not {count}")
    body = BATCH_COUNT.pack(count)
    head = RECORD_HEADER.pack(RECORD_MAGIC, RECORD_VERSION, KIND_BATCH, 0, len(body), len(body), 0)
    crc = crc32(body, crc32(head[:RECORD_CRC_AT]))
    return head[:RECORD_CRC_AT] + struct.pack("<I", crc) + body


def batch_count(buf: Any, offset: int, end: int) -> int:
    """The count of the valid batch frame at ``offset`` of ``buf[:end]``, else 0."""
    if offset < 0 or offset + BATCH_FRAME_SIZE > end:
        return 0
    frame = bytes(buf[offset : offset + BATCH_FRAME_SIZE])
    if frame[:RECORD_CRC_AT] != _FRAME_HEAD or int.from_bytes(frame[16:20], "little") != crc32(
        frame[RECORD_HEADER_SIZE:], crc32(_FRAME_HEAD)
    ):
        return 0
    count = BATCH_COUNT.unpack_from(frame, RECORD_HEADER_SIZE)[0]
    return count if 2 <= count <= MAX_BATCH else 0


_FRAME_HEAD = RECORD_HEADER.pack(
    RECORD_MAGIC, RECORD_VERSION, KIND_BATCH, 0, BATCH_COUNT.size, BATCH_COUNT.size, 0
)[:RECORD_CRC_AT]


def _no_ext(code: int, data: bytes) -> Any:
    # fastmem never writes msgpack extension types: one in a payload is damage
    raise ValueError(f"msgpack extension type {code}")


def decode_payload(
    stored: Any, payload_len: int, raw_len: int, offset: int, path: str = ""
) -> dict[str, Any]:
    """msgpack (after lz4 when ``payload_len < raw_len``) of a checked record's payload."""
    try:
        if payload_len == raw_len:
            raw = stored
        else:
            raw = lz4.block.decompress(stored, uncompressed_size=raw_len)
            if len(raw) != raw_len:
                raise ValueError("decompressed size differs from the header")
        payload = msgpack.unpackb(raw, raw=False, strict_map_key=True, ext_hook=_no_ext)
    except Exception as exc:  # lz4 and msgpack raise several types for damaged bytes
        raise CorruptRecordError(
            f"{path}: the record at offset {offset} does not decode ({exc})",
            path=path,
            offset=offset,
        ) from None
    if not isinstance(payload, dict) or not isinstance(payload.get("i"), int):
        raise CorruptRecordError(
            f"{path}: the record at offset {offset} has no id", path=path, offset=offset
        )
    return payload


def record_vector(buf: Any, offset: int, dim: int, path: str = "") -> np.ndarray:
    """The float16 vector of the memory record at ``offset`` (a view of ``buf``).

    Raises:
        CorruptIndexError: the vector would lie outside ``buf`` (a damaged row's offset).
    """
    if not DAT_HEADER_SIZE <= offset <= len(buf) - RECORD_HEADER_SIZE - 2 * dim:
        raise CorruptIndexError(
            f"{path}: a row points at offset {offset}, outside the data file", path=path
        )
    return np.frombuffer(buf, dtype="<f2", count=dim, offset=vector_start(offset))


# --- erased records (forget's erase: the bytes written over a forgotten memory's record) ---

_FLOAT = struct.Struct(">d")
# (msgpack bin code, length field, header bytes, most bytes): any of them may carry a given
# padding (msgpack readers take a wider header than needed), so every size can be met.
_BIN = ((0xC4, struct.Struct(">B"), 2, 0xFF), (0xC5, struct.Struct(">H"), 3, 0xFFFF),
        (0xC6, struct.Struct(">I"), 5, 0xFFFFFFFF))  # fmt: skip


def _erased_payload(mid: int, ts: float | None, type_name: str | None, size: int) -> bytes | None:
    """``{"i": mid, "t": ts, "y": type_name, "e": zeros}`` (``t``, ``y`` left out when
    None) packed into exactly ``size`` bytes, or None when it does not fit."""
    keys = 2 + (ts is not None) + (type_name is not None)
    body = bytes([0x80 | keys]) + b"\xa1i" + msgpack.packb(mid)
    if ts is not None:
        body += b"\xa1t\xcb" + _FLOAT.pack(ts)
    if type_name is not None:
        body += b"\xa1y" + msgpack.packb(type_name)
    body += b"\xa1e"
    room = size - len(body)
    for code, length, width, most in _BIN:
        pad = room - width
        if 0 <= pad <= most:
            return body + bytes([code]) + length.pack(pad) + bytes(pad)
    return None


def erased_record(
    kind: int, dim: int, mid: int, length: int, ts: float | None, type_name: str | None
) -> bytes:
    """The erased record that replaces a record of ``kind`` with a ``dim``-float16 vector and
    ``length`` bytes, for memory ``mid``. A memory's keeps its timestamp and type name
    (``ts``, ``type_name``; None for ``conversation``): the index's time order and type
    table stay as they were."""
    size = length - RECORD_HEADER_SIZE - 2 * dim
    payload = None
    if kind == KIND_MEMORY:
        payload = _erased_payload(mid, ts, type_name, size)
        payload = payload or _erased_payload(mid, None, type_name, size)
    payload = payload or _erased_payload(mid, None, None, size)
    if payload is None:  # a stored payload is never this short (add writes more)
        raise ValueError(f"a record of {length} bytes cannot hold an erased record")
    head = RECORD_HEADER.pack(RECORD_MAGIC, RECORD_VERSION, kind, dim, size, size, 0)
    body = bytes(2 * dim) + payload
    crc = crc32(body, crc32(head[:RECORD_CRC_AT]))
    return head[:RECORD_CRC_AT] + crc.to_bytes(4, "little") + body


def is_erased(buf: Any, offset: int, length: int, mid: int | None) -> bool:
    """Whether the record at ``offset`` of ``buf`` is whole, ``length`` bytes and an erased
    record of memory ``mid`` (of any memory: None)."""
    try:
        header, payload = read_record(buf, offset, offset + length)
    except (CorruptionError, FormatVersionError):
        return False
    return header.length == length and "e" in payload and mid in (None, payload.get("i"))


# --- index file ------------------------------------------------------------------------


class IdxHeader(NamedTuple):
    uuid: bytes
    rows: int
    live: int
    dim: int
    covered: int
    last_offset: int
    last_crc: int
    types_len: int
    next_id: int
    checkpoint_time: float
    hot_len: int = 0
    keyword_version: int = 0  # 0: the file has no keyword section
    keyword_terms: int = 0
    keyword_postings: int = 0
    keyword_live_tokens: int = 0  # sum of the live rows' token counts (BM25's average length)
    version: int = IDX_VERSION  # of the file read (pack_idx_header writes IDX_VERSION)


def _align(n: int) -> int:
    return (n + SECTION_ALIGN - 1) // SECTION_ALIGN * SECTION_ALIGN


class KeywordLayout(NamedTuple):
    """Byte offsets of the keyword section's arrays (see ``docs/format.md``)."""

    terms: int  # T x u64: the distinct term hashes, ascending
    offsets: int  # (T + 1) x u64: term i's postings are [offsets[i], offsets[i + 1])
    rows: int  # P x u32: the rows holding each term, ascending within a term
    tf: int  # P x u16: how often the term occurs in that row (capped at 65535)
    doc_len: int  # n x u32: tokens in each row's text; DOC_DEAD set when forgotten
    end: int


class IdxLayout(NamedTuple):
    rows: int  # byte offset of each section
    order: int
    vectors: int
    types: int
    hot: int
    size: int  # whole file
    keyword: KeywordLayout | None = None


def idx_layout(
    rows: int, dim: int, types_len: int, hot_len: int = 0, keyword: tuple[int, int] | None = None
) -> IdxLayout:
    """Byte offsets of the index sections: each starts on a 64-byte boundary.

    ``keyword`` is ``(terms, postings)`` of the keyword section, ``None`` when absent.
    """
    at_rows = IDX_HEADER_SIZE
    at_order = _align(at_rows + rows * INDEX_DTYPE.itemsize)
    at_vectors = _align(at_order + rows * 4)
    at_types = _align(at_vectors + rows * dim)
    at_hot = _align(at_types + types_len) if hot_len else at_types + types_len
    end = at_hot + hot_len
    if keyword is None:
        return IdxLayout(at_rows, at_order, at_vectors, at_types, at_hot, end)
    terms, postings = keyword
    at_terms = _align(end)
    at_offsets = _align(at_terms + 8 * terms)
    at_posting_rows = _align(at_offsets + 8 * (terms + 1))
    at_tf = _align(at_posting_rows + 4 * postings)
    at_doc_len = _align(at_tf + 2 * postings)
    kw = KeywordLayout(at_terms, at_offsets, at_posting_rows, at_tf, at_doc_len, at_doc_len + 4 * rows)
    return IdxLayout(at_rows, at_order, at_vectors, at_types, at_hot, kw.end, kw)


def header_layout(h: IdxHeader) -> IdxLayout:
    """The layout an index header describes."""
    keyword = (h.keyword_terms, h.keyword_postings) if h.keyword_version else None
    return idx_layout(h.rows, h.dim, h.types_len, h.hot_len, keyword)


class KeywordSection(NamedTuple):
    """The persisted postings (CSR over term hashes) and per-row token counts."""

    terms: np.ndarray  # <u8
    offsets: np.ndarray  # <u8
    rows: np.ndarray  # <u4
    tf: np.ndarray  # <u2
    doc_len: np.ndarray  # <u4


def keyword_views(buf: Any, h: IdxHeader, layout: IdxLayout) -> KeywordSection:
    """The keyword section's arrays as views of ``buf`` (nothing is read yet).

    The kernels bound-check rows and offsets as they use them (``CorruptIndexError``
    there); checking 20 M postings here would cost every open that searches."""
    kw = layout.keyword
    assert kw is not None
    t, p = h.keyword_terms, h.keyword_postings
    return KeywordSection(
        np.frombuffer(buf, "<u8", t, kw.terms),
        np.frombuffer(buf, "<u8", t + 1, kw.offsets),
        np.frombuffer(buf, "<u4", p, kw.rows),
        np.frombuffer(buf, "<u2", p, kw.tf),
        np.frombuffer(buf, "<u4", h.rows, kw.doc_len),
    )


def write_keyword_section(f: Any, layout: IdxLayout, section: KeywordSection) -> None:
    """Write the keyword section at the current position of ``f`` (at the layout's end of
    the previous section)."""
    kw = layout.keyword
    assert kw is not None
    for at, arr, dtype in (
        (kw.terms, section.terms, "<u8"),
        (kw.offsets, section.offsets, "<u8"),
        (kw.rows, section.rows, "<u4"),
        (kw.tf, section.tf, "<u2"),
        (kw.doc_len, section.doc_len, "<u4"),
    ):
        f.write(bytes(at - f.tell()))
        if arr.size:
            f.write(np.ascontiguousarray(arr, dtype=dtype).data.cast("B"))


def pack_idx_header(h: IdxHeader) -> bytes:
    fixed = IDX_HEADER.pack(
        IDX_MAGIC, IDX_VERSION, IDX_HEADER_SIZE, h.uuid, h.rows, h.live, h.dim,
        INDEX_DTYPE.itemsize, h.covered, h.last_offset, h.last_crc, h.types_len, h.next_id,
        h.hot_len, h.checkpoint_time, h.keyword_version, h.keyword_terms, h.keyword_postings,
        h.keyword_live_tokens,
    )  # fmt: skip
    body = fixed + bytes(IDX_HEADER_CRC_AT - len(fixed))
    return body + struct.pack("<I", crc32(body))


def unpack_idx_header(buf: Any, path: str) -> IdxHeader:
    """Parse and check an index header; ``CorruptIndexError`` for any damage."""
    if len(buf) < IDX_HEADER_SIZE or bytes(buf[:8]) != IDX_MAGIC:
        raise CorruptIndexError(f"{path} is not a fastmem index", path=path, offset=0)
    (_, version, size, uuid, rows, live, dim, row_size, covered, last_offset, last_crc,
     types_len, next_id, hot_len, when, kw_version, kw_terms, kw_postings, kw_tokens,
     ) = IDX_HEADER.unpack_from(buf, 0)  # fmt: skip
    (crc,) = struct.unpack_from("<I", buf, IDX_HEADER_CRC_AT)
    if crc != crc32(memoryview(buf)[:IDX_HEADER_CRC_AT]):  # damage first: a flipped version is damage
        raise CorruptIndexError(f"{path}: the index header is damaged", path=path, offset=0)
    if version not in IDX_VERSIONS:
        raise FormatVersionError(
            f"{path} has index format version {version}; this fastmem reads {IDX_VERSIONS}"
        )
    if (
        size != IDX_HEADER_SIZE
        or row_size != INDEX_DTYPE.itemsize
        or dim > MAX_DIM
        or live > rows
        or rows >= 1 << 32
        or kw_version not in (0, KEYWORD_VERSION)
        or kw_terms > kw_postings
        or kw_postings >= 1 << 48
        or next_id > MAX_ID + 1
        or kw_tokens > live * (DOC_DEAD - 1)  # each live row counts < DOC_DEAD
    ):
        raise CorruptIndexError(f"{path}: the index header is damaged", path=path, offset=0)
    return IdxHeader(
        uuid, rows, live, dim, covered, last_offset, last_crc, types_len, next_id, when, hot_len,
        kw_version, kw_terms, kw_postings, kw_tokens, version,
    )


# --- commit slots and deltas (index version 2) ----------------------------------------
#
# After the sections of a full checkpoint come two commit slots, each on its own page,
# then deltas appended back to back. A delta holds everything that differs from the full
# checkpoint (the rows added since, with their vectors, token counts and postings; the
# changed rows of the full checkpoint; the type table and hot section), so the newest
# valid slot names the one delta a reader needs. Bytes a slot names are never written
# again: a reader that mapped them keeps reading what it read, and a slot torn by a crash
# fails its CRC, leaving the other slot (an older delta, still whole) or none.

SLOT_PAGE = 4096
SLOT_MAGIC = b"FMEMSLOT"
SLOT = struct.Struct("<8sQQQ")  # magic, generation, delta offset, delta length; then a crc
DELTA_MAGIC = b"FMEMDLTA"
# magic, rows added since the full checkpoint, live rows, covered .dat offset, the record
# ending there and its crc, next id, checkpoint time, type table bytes, hot section bytes,
# changed rows of the full checkpoint, keyword postings of the added rows, live tokens;
# then a crc of these bytes
DELTA_HEADER = struct.Struct("<8sQQQQIQdIIQQQ")
DELTA_HEADER_SIZE = 128  # the header, its crc and zeros: the arrays start aligned


class Slot(NamedTuple):
    generation: int
    offset: int
    length: int


class DeltaHeader(NamedTuple):
    rows: int
    live: int
    covered: int
    last_offset: int
    last_crc: int
    next_id: int
    checkpoint_time: float
    types_len: int
    hot_len: int
    patches: int
    postings: int
    live_tokens: int


class DeltaLayout(NamedTuple):
    """Byte offsets of a delta's arrays, from the delta's start (see ``docs/format.md``)."""

    rows: int  # rows x INDEX_DTYPE: the rows added since the full checkpoint
    vectors: int  # rows x dim int8
    doc_len: int  # rows x u32: their keyword token counts (DOC_DEAD when forgotten)
    patch_rows: int  # patches x u32: changed rows of the full checkpoint, ascending
    patch_data: int  # patches x INDEX_DTYPE: their current values
    terms: int  # postings x u64: term hash of each posting, ascending
    posting_rows: int  # postings x u32: global row (ascending within a term)
    tf: int  # postings x u16
    types: int
    hot: int
    size: int


def slots_at(layout: IdxLayout) -> int:
    """Where the two commit slots of a version-2 file start: the page after the sections."""
    return (layout.size + SLOT_PAGE - 1) // SLOT_PAGE * SLOT_PAGE


def deltas_at(layout: IdxLayout) -> int:
    return slots_at(layout) + 2 * SLOT_PAGE


def pack_slot(slot: Slot) -> bytes:
    body = SLOT.pack(SLOT_MAGIC, *slot)
    return body + struct.pack("<I", crc32(body))


def unpack_slot(buf: Any, at: int) -> Slot | None:
    """The slot at ``at`` of ``buf``; ``None`` when empty or damaged (a torn write)."""
    if len(buf) < at + SLOT.size + 4:
        return None
    magic, generation, offset, length = SLOT.unpack_from(buf, at)
    (crc,) = struct.unpack_from("<I", buf, at + SLOT.size)
    if magic != SLOT_MAGIC or crc != crc32(memoryview(buf)[at : at + SLOT.size]):
        return None
    return Slot(generation, offset, length)


def current_slot(buf: Any, at: int) -> tuple[int, Slot | None]:
    """Of the two slots at ``at`` of ``buf``: (which one to write next, 0 or 1; the newest
    valid one, or ``None``)."""
    slots = [unpack_slot(buf, at + i * SLOT_PAGE) for i in (0, 1)]
    valid = [(s.generation, i) for i, s in enumerate(slots) if s is not None]
    if not valid:
        return 0, None
    _, newest = max(valid)
    return 1 - newest, slots[newest]


def delta_layout(h: DeltaHeader, dim: int) -> DeltaLayout:
    at_rows = DELTA_HEADER_SIZE
    at_vectors = _align(at_rows + h.rows * INDEX_DTYPE.itemsize)
    at_doc_len = _align(at_vectors + h.rows * dim)
    at_patch_rows = _align(at_doc_len + 4 * h.rows)
    at_patch_data = _align(at_patch_rows + 4 * h.patches)
    at_terms = _align(at_patch_data + h.patches * INDEX_DTYPE.itemsize)
    at_posting_rows = _align(at_terms + 8 * h.postings)
    at_tf = _align(at_posting_rows + 4 * h.postings)
    at_types = _align(at_tf + 2 * h.postings)
    at_hot = _align(at_types + h.types_len)
    return DeltaLayout(at_rows, at_vectors, at_doc_len, at_patch_rows, at_patch_data, at_terms,
                       at_posting_rows, at_tf, at_types, at_hot, at_hot + h.hot_len)  # fmt: skip


def pack_delta_header(h: DeltaHeader) -> bytes:
    body = DELTA_HEADER.pack(DELTA_MAGIC, *h)
    body += struct.pack("<I", crc32(body))
    return body + bytes(DELTA_HEADER_SIZE - len(body))


def unpack_delta_header(buf: Any, at: int, path: str) -> DeltaHeader:
    """Parse and check the header of the delta at ``at`` (``CorruptIndexError``)."""
    end = at + DELTA_HEADER.size
    if len(buf) < end + 4 or bytes(buf[at : at + 8]) != DELTA_MAGIC:
        raise CorruptIndexError(f"{path}: no delta where the commit slot points", path=path)
    (crc,) = struct.unpack_from("<I", buf, end)
    if crc != crc32(memoryview(buf)[at:end]):
        raise CorruptIndexError(f"{path}: the delta's header is damaged", path=path)
    h = DeltaHeader(*DELTA_HEADER.unpack_from(buf, at)[1:])
    if h.live > MAX_ID or h.rows >= 1 << 32 or h.patches >= 1 << 32 or h.postings >= 1 << 48:
        raise CorruptIndexError(f"{path}: the delta's header is damaged", path=path)
    return h


class HotSection(NamedTuple):
    """The newest live memories at the checkpoint, newest first: their rows and records."""

    rows: memoryview  # count rows of INDEX_DTYPE bytes
    starts: list[int]  # where each record starts in ``records``
    records: memoryview  # the records, byte for byte as in .dat


def pack_hot(rows: list[bytes], records: list[bytes]) -> bytes:
    """count (u32), the rows (80 bytes each), the record lengths (u32 each), the records."""
    lengths = struct.pack(f"<{len(records)}I", *map(len, records))
    return b"".join([struct.pack("<I", len(rows)), *rows, lengths, *records])


def unpack_hot(buf: memoryview, path: str) -> HotSection | None:
    if len(buf) == 0:
        return None
    if len(buf) < 4:
        raise CorruptIndexError(f"{path}: the hot section is damaged", path=path)
    (count,) = struct.unpack_from("<I", buf, 0)
    at = 4 + count * INDEX_DTYPE.itemsize
    if count > HOT_MEMORIES or at + 4 * count > len(buf):
        raise CorruptIndexError(f"{path}: the hot section is damaged", path=path)
    lengths = struct.unpack_from(f"<{count}I", buf, at)
    records = buf[at + 4 * count :]
    if sum(lengths) != len(records):
        raise CorruptIndexError(f"{path}: the hot section is damaged", path=path)
    return HotSection(buf[4:at], list(accumulate(lengths, initial=0))[:count], records)


def pack_types(names: list[str]) -> bytes:
    return _pack(names) if names else b""


def unpack_types(buf: Any, path: str) -> list[str]:
    if len(buf) == 0:
        return []
    try:
        names = msgpack.unpackb(buf, raw=False)
    except Exception:
        names = None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise CorruptIndexError(f"{path}: the type table is damaged", path=path)
    return names
