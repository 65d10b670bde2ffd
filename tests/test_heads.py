"""The fixed headers a restart reads, parsed in C (``fastmem._kernels._ext.heads``): the compiled
parsers against their references (fastmem._format's parsers, None where those raise) on
real stores, on every damaged bit and cut of each header, and on fields out of range.
The hot section's table too (``hot_section``), against ``fmt.unpack_hot``.

And the whole open of an index file in one call (``idx_open``) against its reference
(``fastmem._kernels.index_open_reference.open_index``): the same ``Opened`` for valid files (with and without a
delta, without rows, version 1), and None exactly where the reference raises: every flipped
bit of the index header, the slots and the delta header, every cut, another store's or
dimension's data file, a data file that does not hold what the index covers, a damaged hot
section and a base whose last id is past the counter. A load of each damaged file fails
with the reference's error on either backend."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import fastmem
from fastmem import _format as fmt
from fastmem._kernels import index_open_reference as _idxopen
from fastmem import _kernels
from fastmem._kernels import reference as ref
from fastmem.storage.index import MemoryIndex
from fastmem.errors import CorruptionError, FormatVersionError

ext = pytest.importorskip("fastmem._kernels._ext.heads")
TYPES = {"dat_header": fmt.DatHeader, "idx_header": fmt.IdxHeader, "current_slot": fmt.Slot,
         "delta_header": fmt.DeltaHeader}  # fmt: skip


@pytest.fixture(autouse=True)
def backend():
    """Each test here compares both backends itself: run it once."""
    return "both"


def _typed(value):
    """``value`` with each field tagged by its type (1 == 1.0 == True in Python); views as
    bytes."""
    if isinstance(value, tuple):
        return (type(value).__name__, [_typed(v) for v in value])
    if isinstance(value, list):
        return [_typed(v) for v in value]
    if isinstance(value, memoryview):
        return ("bytes", bytes(value))
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
    assert c["DAT_VERSIONS"] == fmt.DAT_VERSIONS
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
    assert c["MAX_DOC_TOKENS"] == fmt.DOC_DEAD - 1


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
        store.forget("m3", erase=False)  # a tombstone in the delta (an erase rewrites the index)
    with open(path + ".dat", "rb") as f:
        dat = f.read(4096)
    with open(path + ".idx", "rb") as f:
        idx = f.read()
    return dat, idx


def _where(idx):
    h = fmt.unpack_idx_header(idx, "")
    return fmt.slots_at(fmt.header_layout(h))


def test_a_version_1_data_file_header_reads_the_same_and_says_so():
    v1 = (Path(__file__).parent / "fixtures" / "v1" / "store.dat").read_bytes()
    assert _same("dat_header", v1) == fmt.unpack_dat_header(v1, "")
    assert _same("dat_header", v1).version == 1


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


# --- the whole open of an index file (idx_open) -------------------------------------------

FIXTURES = Path(__file__).parent / "fixtures"


def _opens(idx, dat, uuid, dim, dat_end=None):
    """The compiled open's answer, equal to the reference's; and the class the reference
    raises (None when it opens)."""
    dat_end = len(dat) if dat_end is None else dat_end
    got = ext.idx_open(idx, len(idx), uuid, dim, dat, dat_end, _idxopen.TYPES)
    try:
        want, error = _idxopen.open_index(idx, len(idx), "idx", uuid, dim, dat, dat_end), None
    except (CorruptionError, FormatVersionError) as exc:
        want, error = None, type(exc)
    assert _typed(got) == _typed(want)
    assert _typed(ref.idx_open(idx, len(idx), uuid, dim, dat, dat_end, ())) == _typed(want)
    return got, error


def _store(path: str, *, delta: bool, rows: int = 3000) -> tuple[bytes, bytes, bytes, int]:
    """The files of a store (index, data) and its uuid and dimension."""
    with fastmem.open(path, dim=4, embedder=None, durability="none") as store:
        if rows:
            store.add_many([{"text": f"memory {i}", "embedding": [1.0, i, 0, 0], "type": "note"}
                            for i in range(rows)])  # fmt: skip
    if delta:
        with fastmem.open(path, embedder=None, durability="none") as store:
            store.add("one more, in a delta", embedding=[0, 1.0, 0, 0], type="plan")
            store.forget("m3", erase=False)  # a tombstone in the delta (an erase rewrites the index)
    dat, idx = Path(path + ".dat").read_bytes(), Path(path + ".idx").read_bytes()
    header = fmt.unpack_dat_header(dat, "")
    return idx, dat, header.uuid, header.dim


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """Stores with a delta, without one and without rows."""
    root = tmp_path_factory.mktemp("idxopen")
    return {name: _store(str(root / name), delta=delta, rows=rows)
            for name, delta, rows in (("delta", True, 20_000), ("full", False, 3000), ("empty", False, 0))}  # fmt: skip


@pytest.mark.parametrize("name", ["delta", "full", "empty"])
def test_valid_files_open_the_opens(stores, name):
    idx, dat, uuid, dim = stores[name]
    opened, error = _opens(idx, dat, uuid, dim)
    assert error is None and opened is not None
    assert (opened.delta is not None) == (name == "delta")
    assert len(opened.hot.starts) == (0 if name == "empty" else fmt.HOT_MEMORIES)
    assert opened.base_last_id == {"delta": 19_999, "full": 2999, "empty": -1}[name]
    assert fmt.unpack_types(opened.types, "") == ([] if name == "empty" else ["note"])
    assert _opens(idx, dat, uuid, 0)[1] is None  # a data file whose dimension is not set yet


def test_the_version_1_fixture_opens_the_opens():
    idx, dat = (
        (FIXTURES / "v1" / "store.idx").read_bytes(),
        (FIXTURES / "v1" / "store.dat").read_bytes(),
    )
    header = fmt.unpack_dat_header(dat, "")
    opened, error = _opens(idx, dat, header.uuid, header.dim)
    assert error is None and not opened.with_slots and opened.header.keyword_version == 0


def test_every_flipped_bit_of_the_index_header(stores):
    idx, dat, uuid, dim = stores["delta"]
    for damaged in _flips(idx, 0, fmt.IDX_HEADER.size):
        assert _opens(damaged, dat, uuid, dim)[0] is None
    for damaged in _flips(idx, fmt.IDX_HEADER_CRC_AT, fmt.IDX_HEADER_SIZE):
        assert _opens(damaged, dat, uuid, dim)[0] is None


def test_every_flipped_bit_of_the_slots_and_the_delta_header(stores):
    idx, dat, uuid, dim = stores["delta"]
    at = fmt.slots_at(fmt.header_layout(fmt.unpack_idx_header(idx, "")))
    for first in (at, at + fmt.SLOT_PAGE):  # a damaged slot is skipped: the other (none) answers
        for damaged in _flips(idx, first, first + fmt.SLOT.size + 4):
            _opens(damaged, dat, uuid, dim)
    slot = fmt.current_slot(idx, at)[1]
    for damaged in _flips(idx, slot.offset, slot.offset + fmt.DELTA_HEADER.size + 4):
        assert _opens(damaged, dat, uuid, dim)[0] is None


def test_every_cut_of_the_file(stores):
    for name in ("delta", "full"):
        idx, dat, uuid, dim = stores[name]
        for end in [*range(0, len(idx), 509), *range(len(idx) - 300, len(idx))]:
            assert _opens(idx[:end], dat, uuid, dim)[0] is None


def test_another_store_another_dimension_and_a_stale_index(stores):
    idx, dat, uuid, dim = stores["delta"]
    assert _opens(idx, dat, bytes(16), dim)[0] is None
    assert _opens(idx, dat, uuid[:8], dim)[0] is None
    assert _opens(idx, dat, uuid, dim + 1)[0] is None
    covered = fmt.unpack_delta_header(idx, fmt.current_slot(idx, fmt.slots_at(fmt.header_layout(
        fmt.unpack_idx_header(idx, ""))))[1].offset, "").covered  # fmt: skip
    for end in (covered - 1, covered - 20, fmt.DAT_HEADER_SIZE, fmt.DAT_HEADER_SIZE - 1):
        assert _opens(idx, dat, uuid, dim, dat_end=end)[0] is None
    longer = dat + bytes(100)
    assert _opens(idx, longer, uuid, dim, dat_end=len(longer))[1] is None


def test_every_flipped_bit_of_the_last_covered_record_header(stores):
    idx, dat, uuid, dim = stores["delta"]
    opened = _opens(idx, dat, uuid, dim)[0]
    last = opened.delta.last_offset
    flips = [
        _opens(idx, damaged, uuid, dim)[1]
        for damaged in _flips(dat, last, last + fmt.RECORD_HEADER_SIZE)
    ]
    assert set(flips) == {None, fastmem.CorruptIndexError}  # the version byte is not checked here


def test_a_damaged_hot_section_and_a_last_id_past_the_counter(stores):
    idx, dat, uuid, dim = stores["full"]
    h = fmt.unpack_idx_header(idx, "")
    layout = fmt.header_layout(h)
    for pos in range(layout.hot, layout.hot + 4):  # the count
        for damaged in _flips(idx, pos, pos + 1):
            assert _opens(damaged, dat, uuid, dim)[0] is None
    bad = bytearray(idx)
    struct.pack_into("<Q", bad, layout.rows + (h.rows - 1) * fmt.INDEX_DTYPE.itemsize, h.next_id)
    assert _opens(bytes(bad), dat, uuid, dim)[1] is fastmem.CorruptIndexError


@pytest.mark.parametrize("kernels", ["cython", "python"])
def test_a_load_fails_with_the_reference_error_on_either_backend(tmp_path, stores, kernels):
    idx, dat, uuid, dim = stores["delta"]
    (tmp_path / "s.dat").write_bytes(dat)
    at = fmt.slots_at(fmt.header_layout(fmt.unpack_idx_header(idx, "")))
    slot = fmt.current_slot(idx, at)[1]
    cases = [
        (0, 0),
        (9, 0),
        (fmt.IDX_HEADER_CRC_AT, 3),
        (slot.offset + 20, 1),
        (slot.offset + 40, 5),
    ]
    was = _kernels.use(kernels)
    try:
        for pos, bit in cases:
            damaged = bytearray(idx)
            damaged[pos] ^= 1 << bit
            path = str(tmp_path / "s.idx")
            Path(path).write_bytes(damaged)
            with pytest.raises((CorruptionError, FormatVersionError)) as got:
                MemoryIndex.load(path, uuid, dim, dat, len(dat))
            with pytest.raises(type(got.value)) as want:
                _idxopen.open_index(bytes(damaged), len(damaged), path, uuid, dim, dat, len(dat))
            assert str(want.value) == str(got.value)
    finally:
        _kernels.use(was)
