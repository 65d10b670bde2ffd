"""The fixed headers a restart reads, parsed in C (``fastmem._ext.heads``): the compiled
parsers against their references (fastmem._format's parsers, None where those raise) on
real stores, on every damaged bit and cut of each header, and on fields out of range.
The hot section's table too (``hot_section``), against ``fmt.unpack_hot``."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

import fastmem
from fastmem import _format as fmt
from fastmem import _kernels_py as ref

ext = pytest.importorskip("fastmem._ext.heads")
TYPES = {"dat_header": fmt.DatHeader, "idx_header": fmt.IdxHeader, "current_slot": fmt.Slot,
         "delta_header": fmt.DeltaHeader}  # fmt: skip


@pytest.fixture(autouse=True)
def backend():
    """Each test here compares both backends itself: run it once."""
    return "both"


def _typed(value):
    """``value`` with each field tagged by its type (1 == 1.0 == True in Python)."""
    if isinstance(value, tuple):
        return (type(value).__name__, [_typed(v) for v in value])
    if isinstance(value, float):
        return ("float", struct.pack("<d", value))
    return (type(value).__name__, value)


def _same(name, buf, *at):
    """The compiled parser's answer, equal to the reference's (which is fmt's parser, or
    None where it raises)."""
    got = getattr(ext, name)(buf, *at, TYPES[name])
    want = getattr(ref, name)(buf, *at, TYPES[name])
    assert _typed(got) == _typed(want), (name, at)
    return got


def test_compiled_constants_match_the_format():
    c = ext.CONSTANTS
    assert (c["DAT_HEADER_SIZE"], c["FORMAT_VERSION"], c["MAX_DIM"]) == (
        fmt.DAT_HEADER_SIZE, fmt.FORMAT_VERSION, fmt.MAX_DIM)  # fmt: skip
    assert (c["IDX_HEADER_SIZE"], c["IDX_HEADER_CRC_AT"], c["IDX_VERSIONS"]) == (
        fmt.IDX_HEADER_SIZE, fmt.IDX_HEADER_CRC_AT, fmt.IDX_VERSIONS)  # fmt: skip
    assert (c["ROW_SIZE"], c["KEYWORD_VERSION"], c["MAX_ID"]) == (
        fmt.INDEX_DTYPE.itemsize, fmt.KEYWORD_VERSION, fmt.MAX_ID)  # fmt: skip
    assert (c["SLOT_SIZE"], c["SLOT_PAGE"], c["DELTA_HEADER_END"]) == (
        fmt.SLOT.size, fmt.SLOT_PAGE, fmt.DELTA_HEADER.size)  # fmt: skip
    assert (c["DAT_MAGIC"], c["IDX_MAGIC"], c["SLOT_MAGIC"], c["DELTA_MAGIC"]) == (
        fmt.DAT_MAGIC, fmt.IDX_MAGIC, fmt.SLOT_MAGIC, fmt.DELTA_MAGIC)  # fmt: skip
    assert fmt.DAT_HEADER.size == c["DAT_HEADER_SIZE"]
    assert c["HOT_MEMORIES"] == fmt.HOT_MEMORIES


@pytest.fixture(scope="module")
def store_files(tmp_path_factory):
    """The two files of a store whose index has a delta in a slot (bytes)."""
    path = str(tmp_path_factory.mktemp("heads") / "s")
    with fastmem.open(path, dim=4, embedder=None, durability="none") as store:
        store.add_many(
            [{"text": f"memory {i}", "embedding": [1.0, 0, 0, 0]} for i in range(20_000)]
        )
    with fastmem.open(path, embedder=None, durability="none") as store:
        store.add("one more, in a delta")
        store.forget("m3")
    with open(path + ".dat", "rb") as f:
        dat = f.read(4096)
    with open(path + ".idx", "rb") as f:
        idx = f.read()
    return dat, idx


def _where(idx):
    h = fmt.unpack_idx_header(idx, "")
    return fmt.slots_at(fmt.header_layout(h))


def test_the_headers_of_a_store_with_a_delta(store_files):
    dat, idx = store_files
    assert _same("dat_header", dat) == fmt.unpack_dat_header(dat, "")
    assert _same("idx_header", idx) == fmt.unpack_idx_header(idx, "")
    at = _where(idx)
    write_next, slot = _same("current_slot", idx, at)
    assert slot is not None and (write_next, slot) == fmt.current_slot(idx, at)
    delta = _same("delta_header", idx, slot.offset)
    assert delta is not None and delta == fmt.unpack_delta_header(idx, slot.offset, "")
    assert delta.patches == 1 and delta.rows == 1


def _flips(buf, start, stop):
    for pos in range(start, stop):
        for bit in range(8):
            damaged = bytearray(buf)
            damaged[pos] ^= 1 << bit
            yield bytes(damaged)


def test_every_damaged_bit_and_cut_of_the_data_header(store_files):
    dat = store_files[0]
    for damaged in _flips(dat, 0, fmt.DAT_HEADER_SIZE):
        assert _same("dat_header", damaged) is None  # the CRC or the magic catches each
    for end in range(fmt.DAT_HEADER_SIZE):
        assert _same("dat_header", dat[:end]) is None


def test_every_damaged_bit_and_cut_of_the_index_header(store_files):
    idx = store_files[1][: fmt.IDX_HEADER_SIZE]
    for damaged in _flips(idx, 0, fmt.IDX_HEADER.size):
        assert _same("idx_header", damaged) is None
    for damaged in _flips(idx, fmt.IDX_HEADER_CRC_AT - 2, fmt.IDX_HEADER_SIZE):
        assert _same("idx_header", damaged) is None
    for end in (0, 7, 8, 127, 128, 4091, 4095):
        assert _same("idx_header", idx[:end]) is None


def test_every_damaged_bit_and_cut_of_the_slots_and_the_delta_header(store_files):
    idx = store_files[1]
    at = _where(idx)
    slot = fmt.current_slot(idx, at)[1]
    assert slot is not None
    for first in (at, at + fmt.SLOT_PAGE):  # a damaged slot is skipped: the other one answers
        for damaged in _flips(idx[: at + 2 * fmt.SLOT_PAGE], first, first + fmt.SLOT.size + 4):
            _same("current_slot", damaged, at)
    for end in range(at, at + fmt.SLOT_PAGE + fmt.SLOT.size + 5, 7):
        _same("current_slot", idx[:end], at)
    off = slot.offset
    for damaged in _flips(idx[: off + 128], off, off + fmt.DELTA_HEADER.size + 4):
        assert _same("delta_header", damaged, off) is None
    for end in range(off, off + fmt.DELTA_HEADER.size + 4):
        assert _same("delta_header", idx[:end], off) is None
    for bad in (-1, -(10**6), len(idx), off + 1):
        _same("delta_header", idx, bad)
        _same("current_slot", idx, bad)


def _hot(buf, at, length):
    """The compiled hot section, equal to the reference's; as bytes and lists."""
    got = ext.hot_section(buf, at, length, fmt.HotSection)
    want = ref.hot_section(buf, at, length, fmt.HotSection)
    got, want = ([None if h is None else (type(h), bytes(h.rows), h.starts, bytes(h.records))
                  for h in (got, want)])  # fmt: skip
    assert got == want, (at, length)
    return got


def _hot_places(idx):
    """(start, length) of the full checkpoint's hot section and of the delta's."""
    h = fmt.unpack_idx_header(idx, "")
    layout = fmt.header_layout(h)
    slot = fmt.current_slot(idx, fmt.slots_at(layout))[1]
    assert slot is not None
    delta = fmt.unpack_delta_header(idx, slot.offset, "")
    dl = fmt.delta_layout(delta, h.dim)
    return [(layout.hot, h.hot_len), (slot.offset + dl.hot, delta.hot_len)]


def test_the_hot_sections_of_a_store_with_a_delta(store_files):
    idx = store_files[1]
    for at, length in _hot_places(idx):
        got = _hot(idx, at, length)
        parsed = fmt.unpack_hot(memoryview(idx)[at : at + length], "")
        assert parsed is not None and len(parsed.starts) == fmt.HOT_MEMORIES
        assert got == (fmt.HotSection, bytes(parsed.rows), parsed.starts, bytes(parsed.records))


def test_every_damaged_bit_of_the_hot_tables_and_every_cut(store_files):
    """The count and the records' lengths (what is parsed: rows and records are checked
    where they are read); cuts of the section, and places outside the buffer."""
    idx = store_files[1]
    at, length = _hot_places(idx)[1]
    section = idx[at : at + length]
    lengths_at = 4 + fmt.HOT_MEMORIES * fmt.INDEX_DTYPE.itemsize
    for first, stop in ((0, 4), (lengths_at, lengths_at + 4 * fmt.HOT_MEMORIES)):
        for damaged in _flips(section, first, stop):
            assert _hot(damaged, 0, length) is None
    for end in range(0, length, 3):
        _hot(section[:end], 0, end)  # a cut inside the records: refused; a cut table, too
        _hot(section, 0, end)
    for bad in ((-1, length), (1, length), (0, length + 1), (len(idx), 4), (0, 0), (0, 3)):
        _hot(section, *bad)


@given(st.integers(0, fmt.HOT_MEMORIES + 2),
       st.lists(st.integers(0, 70), min_size=0, max_size=fmt.HOT_MEMORIES + 2),
       st.integers(-3, 3), st.integers(0, 2**32 - 1))  # fmt: skip
def test_hot_sections_with_any_count_and_lengths(count, lengths, extra, big):
    """Counts past the limit, too few lengths, records one byte short or long, a length
    near 2**32 (the sum must not wrap)."""
    rows = bytes(range(256)) * (count * fmt.INDEX_DTYPE.itemsize // 256 + 1)
    table = lengths[:count] + [big] * (count > len(lengths) and count - len(lengths) > 0)
    body = struct.pack("<I", count) + rows[: count * fmt.INDEX_DTYPE.itemsize]
    body += b"".join(struct.pack("<I", n) for n in table)
    body += bytes(max(0, sum(lengths[:count]) + extra))
    _hot(body, 0, len(body))
    _hot(b"pad" + body, 3, len(body))


def _crc_tail(body):
    return body + struct.pack("<I", zlib.crc32(body))


@given(st.integers(0, 3), st.integers(0, 2**16 - 1), st.integers(0, 2**32 - 1),
       st.integers(0, 2**64 - 1), st.floats(allow_nan=True))  # fmt: skip
def test_data_headers_with_any_field_values(version, size, dim, next_id, created):
    body = struct.pack("<8sHH16sIdQQ4s", fmt.DAT_MAGIC, version, size, b"u" * 16, dim, created,
                       next_id, 7, b"abcd")  # fmt: skip
    _same("dat_header", _crc_tail(body))
    _same("dat_header", _crc_tail(struct.pack("<8sHH16sIdQQ4s", fmt.DAT_MAGIC, 1, 64, b"u" * 16,
                                              min(dim, 4096), created, min(next_id, 2**62), 7, b"abcd")))  # fmt: skip


_u64 = st.integers(0, 2**64 - 1)
_u32 = st.integers(0, 2**32 - 1)
_small = st.integers(0, 70) | st.sampled_from(
    [2**32 - 1, 2**32, 2**48 - 1, 2**48, 2**63, 2**63 + 1]
)


@given(st.integers(0, 3), st.sampled_from([4096, 4095, 0]), _small, _small, st.integers(0, 5000),
       st.sampled_from([80, 79]), st.integers(0, 2), _small, _small, _small | _u64, _u64, _u32)  # fmt: skip
def test_index_headers_with_any_field_values(version, size, rows, live, dim, row_size, kw_version,
                                             kw_terms, kw_postings, next_id, covered, types_len):  # fmt: skip
    rows, live = min(rows, 2**64 - 1), min(live, 2**64 - 1)
    fixed = struct.pack("<8sII16sQQIIQQIIQIdIQQQ", fmt.IDX_MAGIC, version, size, b"u" * 16, rows,
                        live, dim, row_size, covered, 5, 6, types_len, min(next_id, 2**64 - 1), 9,
                        1.5, kw_version, kw_terms, kw_postings, 11)  # fmt: skip
    body = fixed + bytes(fmt.IDX_HEADER_CRC_AT - len(fixed))
    _same("idx_header", _crc_tail(body))


@given(st.lists(st.tuples(_u64, _u64, _u64, st.booleans(), st.booleans()), min_size=2, max_size=2),
       st.integers(0, 100))  # fmt: skip
def test_slot_pairs(slots, at):
    buf = bytearray(at + 2 * fmt.SLOT_PAGE)
    for i, (generation, offset, length, valid, magic) in enumerate(slots):
        body = struct.pack(
            "<8sQQQ", fmt.SLOT_MAGIC if magic else b"FMEMSLOX", generation, offset, length
        )
        packed = _crc_tail(body)
        if not valid:
            packed = packed[:-1] + bytes([packed[-1] ^ 1])
        buf[at + i * fmt.SLOT_PAGE : at + i * fmt.SLOT_PAGE + len(packed)] = packed
    _same("current_slot", bytes(buf), at)
    if slots[0][0] == slots[1][0]:  # a tie: the second slot, as max((generation, index))
        assert fmt.current_slot(bytes(buf), at) == _same("current_slot", bytes(buf), at)


@given(_small, _small | _u64, _small, _small, st.floats(allow_nan=True))
def test_delta_headers_with_any_field_values(rows, live, patches, postings, when):
    body = struct.pack("<8sQQQQIQdIIQQQ", fmt.DELTA_MAGIC, min(rows, 2**64 - 1), live, 3, 4, 5, 6,
                       when, 7, 8, min(patches, 2**64 - 1), min(postings, 2**64 - 1), 9)  # fmt: skip
    buf = b"pad" + _crc_tail(body)
    _same("delta_header", buf, 3)
