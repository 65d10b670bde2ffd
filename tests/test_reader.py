"""``get``'s read in one call (``read_memory``) and its msgpack decoder (``unpack``): the
compiled kernel against the reference, both against a brute-force reader written from the
format's description, and ``MemoryStore.get`` against the general path it stands in for."""

from __future__ import annotations

import math
import re
import struct
import warnings
import zlib

import lz4.block
import msgpack
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import fastmem
from fastmem import _format as fmt
from fastmem._kernels import reference as ref
from fastmem.storage.records import f32
from fastmem.errors import CorruptRecordError, UnknownMemoryError
from fastmem.types import Memory

ext = pytest.importorskip("fastmem._kernels._ext.reader")


@pytest.fixture(autouse=True)
def backend():
    """Each test here compares both backends itself: run it once."""
    return "both"


def test_compiled_constants_match_the_format():
    c = ext.CONSTANTS
    names = fmt.INDEX_DTYPE.names
    assert names is not None
    assert c["ROW_SIZE"] == fmt.INDEX_DTYPE.itemsize
    for at, name in (("AT_ID", "id"), ("AT_TS", "timestamp"), ("AT_OFFSET", "offset"),
                     ("AT_META", "meta_offset"), ("AT_LENGTH", "length"),
                     ("AT_IMPORTANCE", "importance"), ("AT_FLAGS", "flags")):  # fmt: skip
        assert c[at] == fmt.INDEX_DTYPE.fields[name][1]
    assert (c["FLAG_FORGOTTEN"], c["FLAG_PINNED"]) == (fmt.FLAG_FORGOTTEN, fmt.FLAG_PINNED)
    assert c["KIND_MEMORY"] == fmt.KIND_MEMORY
    assert c["MAX_DEPTH"] == ref._MAX_DEPTH


# --- unpack ------------------------------------------------------------------------------


def _typed(obj):
    """``obj`` with every value tagged by its type (1 == 1.0 == True in Python), NaN by its
    bits, so that equal results mean the same objects."""
    if isinstance(obj, dict):
        return ("dict", [(_typed(k), _typed(v)) for k, v in obj.items()])
    if isinstance(obj, list):
        return ("list", [_typed(v) for v in obj])
    if isinstance(obj, float):
        return ("float", struct.pack("<d", obj))
    return (type(obj).__name__, obj)


def _same_unpack(data):
    got = ext.unpack(data)
    assert _typed(got) == _typed(ref.unpack(data))
    return got


_scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats()
            | st.text(max_size=40) | st.binary(max_size=40))  # fmt: skip
_plain = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=5)
    | st.dictionaries(st.text(max_size=5) | st.binary(max_size=5), inner, max_size=5),
    max_leaves=30,
)


@given(_plain, st.booleans())
def test_unpack_equals_msgpack_for_plain_values(obj, single_float):
    try:
        data = msgpack.packb(obj, use_bin_type=True, use_single_float=single_float)
    except OverflowError:  # a float beyond float32's range
        assume(False)
    want = msgpack.unpackb(data, raw=False, strict_map_key=True)
    got = _same_unpack(data)
    assert _typed(got) == _typed(want) or obj is None  # an encoded None reads as "not plain"


@given(_plain, st.data())
def test_unpack_of_damaged_and_truncated_bytes(obj, data):
    packed = bytearray(msgpack.packb(obj, use_bin_type=True))
    for _ in range(data.draw(st.integers(0, 3))):
        packed[data.draw(st.integers(0, len(packed) - 1))] ^= 1 << data.draw(st.integers(0, 7))
    for end in range(len(packed) + 1):
        _same_unpack(bytes(packed[:end]))
    _same_unpack(bytes(packed) + b"\x00")  # trailing bytes


@given(st.binary(max_size=64))
def test_unpack_of_random_bytes(data):
    _same_unpack(data)


def _nested(depth):
    obj = 1
    for _ in range(depth):
        obj = [obj]
    return obj


@pytest.mark.parametrize("data, plain", [
    (msgpack.packb({"a": msgpack.ExtType(5, b"xy")}), False),  # an ext type
    (msgpack.packb({"a": msgpack.Timestamp(1, 2)}), False),  # msgpack's own ext: not plain
    (msgpack.packb({1: "a"}), False),  # an int key (strict_map_key)
    (msgpack.packb({b"k": "a"}, use_bin_type=True), True),  # bytes keys are allowed
    (b"\xc1", False),  # the byte msgpack never uses
    (b"\xa2\xff\xfe", False),  # not UTF-8
    (b"\xa3\xed\xa0\x80", False),  # a surrogate in UTF-8
    (b"\x82\xa1a\x01\xa1a\x02", True),  # a repeated key: the last one wins, as msgpack
    (b"\xd0\x05", True), (b"\xd3" + b"\xff" * 8, True), (b"\xcf" + b"\xff" * 8, True),
    (b"\xca\x3f\xc0\x00\x00", True),  # float32
    (b"\xdc\x00\x02\x01\x02", True), (b"\xdd\x00\x00\x00\x01\xc0", True),  # array16/32
    (b"\xde\x00\x01\xa1a\xc3", True), (b"\xdf\x00\x00\x00\x00", True),  # map16/32
    (b"\xd9\x01x", True), (b"\xc4\x01\x00", True), (b"\xc6\x00\x00\x00\x01\x00", True),
    (b"\xdd\xff\xff\xff\xff", False),  # an array longer than the bytes
    (msgpack.packb(_nested(64)), True), (msgpack.packb(_nested(65)), False),
    (msgpack.packb([{"a": _nested(63)}]), False),
])  # fmt: skip
def test_unpack_edges(data, plain):
    got = _same_unpack(data)
    assert (got is not None) == plain
    if plain:
        assert _typed(got) == _typed(msgpack.unpackb(data, raw=False, strict_map_key=True))


# --- read_memory on rows and records made by hand ----------------------------------------


def _brute_memory(mid, base, tail, tail_n, dat, dat_end):
    """The memory ``read_memory`` reads, from the format's description: a linear search of
    the rows, the header taken apart by struct, the CRC by zlib, msgpack for the payload."""
    if type(mid) is not str or not re.fullmatch(r"m[0-9]{1,19}", mid, re.ASCII):
        return None
    want = int(mid[1:])
    rows = [struct.unpack_from("<QdQQQdIffIIIHHI", base, k * 80) for k in range(len(base) // 80)]
    if not rows or want > rows[-1][0]:
        rows = [struct.unpack_from("<QdQQQdIffIIIHHI", tail, k * 80) for k in range(tail_n)]
    found = [r for r in rows if r[0] == want]
    if not found or not 0 < dat_end <= len(dat):
        return None
    rid, ts, _, off, meta, _, length, importance, _, _, _, _, _, flags, _ = found[0]
    if flags & 1 or meta or not off + 20 <= dat_end:
        return None
    magic, version, kind, dim, plen, rlen, crc = struct.unpack_from("<4sBBHIII", dat, off)
    stop = off + 20 + 2 * dim + plen
    if (magic, version, kind) != (b"\x8fFMR", 1, 1) or dim > 4096 or rlen > 2 << 20 or plen > rlen:
        return None
    if stop > dat_end or stop - off != length:
        return None
    if zlib.crc32(bytes(dat[off + 20 : stop]), zlib.crc32(bytes(dat[off : off + 16]))) != crc:
        return None
    raw = bytes(dat[stop - plen : stop])
    try:
        if plen != rlen:
            raw = lz4.block.decompress(raw, uncompressed_size=rlen)
        p = msgpack.unpackb(raw, raw=False, strict_map_key=True, ext_hook=_refuse)
    except Exception:
        return None
    if len(raw) != rlen or not _plain_value(p, 0) or type(p) is not dict:
        return None
    if type(p.get("i")) is not int or p["i"] != rid or type(p.get("x")) is not str:
        return None
    return Memory(f"m{rid}", p["x"], p.get("y", "conversation"), ts, p.get("s"), f32(importance),
                  bool(flags & 2), p.get("m"), p.get("u"))  # fmt: skip


def _refuse(code, data):
    raise ValueError(code)


def _plain_value(obj, depth):
    if isinstance(obj, list | dict):
        if depth >= 64:
            return False
        if isinstance(obj, dict):
            return all(isinstance(k, str | bytes) and _plain_value(v, depth + 1) for k, v in obj.items())
        return all(_plain_value(v, depth + 1) for v in obj)
    return obj is None or isinstance(obj, bool | int | float | str | bytes)


def _same_memory(mid, base, tail, tail_n, dat, dat_end):
    args = (mid, base, tail, tail_n, dat, dat_end, Memory, f32)
    got, want = ext.read_memory(*args), ref.read_memory(*args)
    brute = _brute_memory(*args[:6])
    assert (got is None) == (want is None) == (brute is None)
    if got is not None:  # equal, NaN importances included
        assert type(got) is type(want) is Memory
        assert _typed(list(got)) == _typed(list(want)) == _typed(list(brute))
    return got


def _store_bytes(payloads, *, ids=None, dim=0, flags=None, meta=None, raw_lens=None,
                 importance=0.5, kind=1):  # fmt: skip
    """Index rows and a data file holding one memory record per payload (msgpack bytes or
    a dict to pack)."""
    packed = [p if isinstance(p, bytes) else msgpack.packb(p, use_bin_type=True) for p in payloads]
    n = len(packed)
    ids = list(range(n)) if ids is None else ids
    lens = np.array(raw_lens or [len(p) for p in packed], dtype=np.uint32)
    vectors = np.arange(n * dim, dtype=np.uint16).reshape(n, dim) if dim else None
    has = np.ones(n, dtype=np.uint8) if dim else None
    framed, lengths, _ = ref.frame_records(kind, packed, lens, vectors, has)
    dat = bytes(fmt.DAT_HEADER_SIZE) + framed
    rows = np.zeros(n, dtype=fmt.INDEX_DTYPE)
    rows["id"] = ids
    rows["timestamp"] = 1_700_000_000.25 + np.arange(n)
    rows["offset"] = fmt.DAT_HEADER_SIZE + np.concatenate(([0], np.cumsum(lengths)))[:-1]
    rows["length"] = lengths
    rows["importance"] = importance
    rows["flags"] = flags or 0
    rows["meta_offset"] = meta or 0
    return rows, dat


def _payload(i, **fields):
    return {"i": i, "t": 1.5, "x": f"text {i}", "k": [3, 0], **fields}


def test_read_memory_of_plain_payloads():
    payloads = [
        _payload(0),
        _payload(1, y="fact", s="s-1", u="sum", m={"k": [1, 2.5, None, b"\x00"], "n": {"a": True}}),
        _payload(2, x="é" * 40, y=None),  # a None type is kept, as the general path keeps it
    ]
    rows, dat = _store_bytes(payloads, dim=3, flags=[0, fmt.FLAG_PINNED, 0], importance=0.3)
    for mid, want in (("m0", payloads[0]), ("m1", payloads[1]), ("m2", payloads[2])):
        m = _same_memory(mid, rows.tobytes(), rows, 0, dat, len(dat))
        assert m is not None and (m.text, m.summary, m.metadata) == (want["x"], want.get("u"), want.get("m"))
    m = _same_memory("m1", rows.tobytes(), rows, 0, dat, len(dat))
    assert (m.id, m.type, m.session, m.pinned, m.importance) == ("m1", "fact", "s-1", True, 0.3)
    assert _same_memory("m2", rows.tobytes(), rows, 0, dat, len(dat)).type is None
    assert _same_memory("m0", rows.tobytes(), rows, 0, dat, len(dat)).type == "conversation"
    # the same rows as the tail (the base empty or holding lower ids)
    for mid in ("m0", "m1", "m2", "m3"):
        _same_memory(mid, b"", rows, 3, dat, len(dat))
        _same_memory(mid, rows[:1].tobytes(), rows[1:], 2, dat, len(dat))


@pytest.mark.parametrize("mid", ["m1", "m01", "m0001", "m" + "0" * 18 + "1", "m" + "9" * 19,
                                 "m" + "1" * 20, "m", "1", "M1", "m-1", "m+1", "m 1", "m1 ",
                                 "m１", "m١", "m1.0", 1, None, b"m1"])  # fmt: skip
def test_read_memory_of_ids(mid):
    rows, dat = _store_bytes([_payload(0), _payload(1)])
    m = _same_memory(mid, rows.tobytes(), rows, 0, dat, len(dat))
    assert (m is not None) == (mid in ("m1", "m01", "m0001", "m" + "0" * 18 + "1"))
    if m is not None:
        assert m.id == "m1"


def test_read_memory_of_sparse_ids():
    # After a compaction ids have gaps: the binary search, in the base and in the tail.
    ids = [3, 7, 8, 20, 21, 40]
    rows, dat = _store_bytes([_payload(i) for i in ids], ids=ids)
    for split in range(len(ids) + 1):
        base, tail = rows[:split].tobytes(), rows[split:].copy()
        for want in range(45):
            m = _same_memory(f"m{want}", base, tail, len(ids) - split, dat, len(dat))
            assert (m is not None) == (want in ids)


def test_read_memory_of_rows_it_leaves_to_the_general_path():
    rows, dat = _store_bytes([_payload(0), _payload(1), _payload(2)],
                             flags=[fmt.FLAG_FORGOTTEN, 0, 0], meta=[0, 70, 0])  # fmt: skip
    assert _same_memory("m0", rows.tobytes(), rows, 0, dat, len(dat)) is None  # forgotten
    assert _same_memory("m1", rows.tobytes(), rows, 0, dat, len(dat)) is None  # metadata record
    assert _same_memory("m2", rows.tobytes(), rows, 0, dat, len(dat)) is not None
    for end in (0, -1, len(dat) + 1, 2**70):  # a data file end past the map, or none
        assert _same_memory("m2", rows.tobytes(), rows, 0, dat, end) is None


@pytest.mark.parametrize("payload", [
    {"i": 0, "x": "a", "m": msgpack.ExtType(1, b"")},
    {"i": 0, "x": "a", "m": msgpack.Timestamp(5)},
    {"i": 1, "x": "a"},  # another memory's id
    {"i": True, "x": "a"}, {"i": 0.0, "x": "a"}, {"i": -1, "x": "a"}, {"x": "a"},
    {"i": 0, "x": b"a"}, {"i": 0, "x": None}, {"i": 0},
    {"i": 0, "x": "a", "m": _nested(64)},  # containers 65 deep
    [0, "a"], "x", None,
])  # fmt: skip
def test_read_memory_of_payloads_that_are_not_plain(payload):
    packed = msgpack.packb(payload, use_bin_type=True, datetime=False)
    rows, dat = _store_bytes([packed])
    assert _same_memory("m0", rows.tobytes(), rows, 0, dat, len(dat)) is None


@pytest.mark.parametrize("packed", [
    b"\x82\xa1i\xd0\x00\xa1x\xa1a",  # "i" as int8: still the id 0
    b"\x82\xd9\x01i\x00\xa1x\xa1a",  # the key "i" as str8
    b"\x83\xa1i\x05\xa1x\xa1a\xa1i\x00",  # a repeated key: the last one counts
    b"\xde\x00\x02\xa1i\x00\xa1x\xa1a",  # map16
    b"\x82\xc4\x01i\x07\xa1i\x00",  # bytes key b"i" is not "i": no text
    b"\x82\xa1i\x00\xa1x\xa1a\x00",  # a byte after the map
    b"\x83\xa1i\x00\xa1x\xa1a\xa1\xff\x00",  # a key that is not UTF-8
    b"\x83\xa1i\x00\xa1x\xa1a\x01\x00",  # an int key
])  # fmt: skip
def test_read_memory_of_hand_packed_payloads(packed):
    rows, dat = _store_bytes([packed])
    _same_memory("m0", rows.tobytes(), rows, 0, dat, len(dat))


def test_read_memory_of_a_compressed_payload():
    payload = _payload(0, x="the same words again " * 40)
    raw = msgpack.packb(payload, use_bin_type=True)
    stored = lz4.block.compress(raw, store_size=False)
    rows, dat = _store_bytes([stored], raw_lens=[len(raw)])
    assert _same_memory("m0", rows.tobytes(), rows, 0, dat, len(dat)).text == payload["x"]
    rows, dat = _store_bytes([stored], raw_lens=[len(raw) + 1])  # the wrong raw length
    assert _same_memory("m0", rows.tobytes(), rows, 0, dat, len(dat)) is None
    rows, dat = _store_bytes([stored[:-3]], raw_lens=[len(raw)])  # not lz4 any more
    assert _same_memory("m0", rows.tobytes(), rows, 0, dat, len(dat)) is None


def test_read_memory_refuses_each_damaged_bit_of_the_record():
    rows, dat = _store_bytes([_payload(0, s="s")], dim=2)
    at, length = int(rows["offset"][0]), int(rows["length"][0])
    base = rows.tobytes()
    assert _same_memory("m0", base, rows, 0, dat, len(dat)) is not None
    for pos in range(at, at + length):
        for bit in range(8):
            damaged = bytearray(dat)
            damaged[pos] ^= 1 << bit
            assert _same_memory("m0", base, rows, 0, bytes(damaged), len(dat)) is None, (pos, bit)
    for end in range(at + length):  # the file cut short, or the map shorter than the file
        assert _same_memory("m0", base, rows, 0, dat[:end], end) is None
        assert _same_memory("m0", base, rows, 0, dat, end) is None


def test_read_memory_of_each_damaged_bit_of_the_row():
    # A row's damage may still name a readable memory (another importance, a pin): both
    # kernels and the brute force read the same thing, or refuse together.
    rows, dat = _store_bytes([_payload(0), _payload(1, s="s")])
    base = rows.tobytes()
    read = 0
    for pos in range(80, 160):
        for bit in range(8):
            damaged = bytearray(base)
            damaged[pos] ^= 1 << bit
            read += _same_memory("m1", bytes(damaged), rows, 0, dat, len(dat)) is not None
    assert 0 < read < 640


def test_read_memory_of_a_record_of_another_kind():
    payload = msgpack.packb(_payload(0), use_bin_type=True)
    for kind in (fmt.KIND_UPDATE, fmt.KIND_FORGET):
        rows, dat = _store_bytes([payload], kind=kind)  # a valid record, not a memory
        assert _same_memory("m0", rows.tobytes(), rows, 0, dat, len(dat)) is None
    rows, dat = _store_bytes([payload])
    rows["length"] += 1  # the row's length differs from the record's
    assert _same_memory("m0", rows.tobytes(), rows, 0, dat, len(dat)) is None


def test_read_memory_checks_its_arguments():
    rows, dat = _store_bytes([_payload(0)])
    for fn in (ext.read_memory, ref.read_memory):
        with pytest.raises(TypeError):
            fn("m0", rows.tobytes(), rows, 0, dat, len(dat), dict, f32)
        with pytest.raises(ValueError):
            fn("m0", b"", rows, 2, dat, len(dat), Memory, f32)  # more tail rows than given


def test_read_memory_importance_is_f32_of_the_row():
    rows, dat = _store_bytes([_payload(i) for i in range(200)])
    rows["importance"] = np.linspace(0, 1, 200, dtype=np.float32)
    rows["importance"][:3] = [0.1, 0.3, math.nan]
    for i in range(200):
        m = _same_memory(f"m{i}", rows.tobytes(), rows, 0, dat, len(dat))
        assert _typed(m.importance) == _typed(f32(float(rows["importance"][i])))
    # another function: its own answers, not those kept for f32
    for fn in (ext.read_memory, ref.read_memory):
        assert fn("m5", rows.tobytes(), rows, 0, dat, len(dat), Memory, lambda x: -x).importance == -float(
            rows["importance"][5]
        )
        assert fn("m5", rows.tobytes(), rows, 0, dat, len(dat), Memory, f32).importance == f32(
            float(rows["importance"][5])
        )


# --- read_hot: a restart's newest memories from the index's hot section -----------------


def _hot_bytes(rows, dat):
    """The hot section of ``rows`` (newest first, as a checkpoint writes it): the rows as
    they are, their records one after another, and where each starts."""
    spans = zip(rows["offset"].tolist(), rows["length"].tolist())
    records = b"".join(dat[o : o + n] for o, n in spans)
    starts = [0, *np.cumsum(rows["length"].astype(np.int64))[:-1].tolist()]
    return rows.tobytes(), starts, records


def _same_hot(rows, starts, records, n):
    """read_hot of both kernels, and the brute force: each row read alone, its record taken
    at its start in ``records`` (the row's own offset is the data file's: not used)."""
    got = ext.read_hot(rows, starts, records, n, Memory, f32)
    want = ref.read_hot(rows, starts, records, n, Memory, f32)
    assert (got is None) == (want is None)
    if got is not None:
        assert _typed([list(m) for m in got]) == _typed([list(m) for m in want])
        assert all(type(m) is Memory for m in got) and len(got) == n
    one_by_one = []
    for k in range(n):
        row = bytearray(rows[k * 80 : k * 80 + 80])
        if not 0 <= starts[k] < len(records):
            one_by_one.append(None)
            continue
        row[24:32] = struct.pack("<Q", starts[k])
        mid = f"m{struct.unpack_from('<Q', row)[0]}"
        one_by_one.append(_brute_memory(mid, bytes(row), b"", 0, records, len(records)))
    brute = None if any(m is None for m in one_by_one) else one_by_one
    assert (got is None) == (brute is None)
    if got is not None:
        assert _typed([list(m) for m in got]) == _typed([list(m) for m in brute])
    return got


def test_read_hot_of_plain_payloads():
    payloads = [_payload(0), _payload(1, y="fact", s="s", u="sum", m={"a": [1, None]}),
                _payload(2, x="é" * 40), _payload(3, x="the same words again " * 40)]  # fmt: skip
    packed = [msgpack.packb(p, use_bin_type=True) for p in payloads]
    packed[3] = lz4.block.compress(packed[3], store_size=False)
    raw = [len(msgpack.packb(p, use_bin_type=True)) for p in payloads]
    rows, dat = _store_bytes(packed, dim=3, flags=[0, fmt.FLAG_PINNED, 0, 0], raw_lens=raw)
    rows = rows[::-1].copy()  # newest first
    hot_rows, starts, records = _hot_bytes(rows, dat)
    for n in range(5):
        got = _same_hot(hot_rows, starts, records, n)
        assert [m.id for m in got] == ["m3", "m2", "m1", "m0"][:n]
    assert _same_hot(hot_rows, starts, records, 4)[0].text == payloads[3]["x"]


def test_read_hot_is_all_or_nothing():
    # One row the general path must read (forgotten, with a metadata record, a damaged
    # record, a start outside the records): None for all of them, so that the caller's
    # general path reads them and raises the precise error where there is one.
    rows, dat = _store_bytes([_payload(i) for i in range(3)], flags=[0, fmt.FLAG_FORGOTTEN, 0])
    hot_rows, starts, records = _hot_bytes(rows, dat)
    assert _same_hot(hot_rows, starts, records, 1) is not None
    assert _same_hot(hot_rows, starts, records, 2) is None
    rows, dat = _store_bytes([_payload(i) for i in range(3)], meta=[0, 0, 70])
    hot_rows, starts, records = _hot_bytes(rows, dat)
    assert _same_hot(hot_rows, starts, records, 2) is not None
    assert _same_hot(hot_rows, starts, records, 3) is None
    rows, dat = _store_bytes([_payload(i) for i in range(3)])
    hot_rows, starts, records = _hot_bytes(rows, dat)
    # A damaged index row may name any offset up to 2**64 - 1 (more than a C integer
    # holds): not the plain case either, not OverflowError.
    for bad in ([0, starts[1], len(records)], [0, starts[1], -1], [0, starts[1], starts[1]],
                [0, starts[1], 2**63], [0, starts[1], 2**64 - 1], [0, starts[1], -(2**63) - 1]):
        assert _same_hot(hot_rows, bad, records, 3) is None
        assert _same_hot(hot_rows, bad, records, 2) is not None


def test_read_hot_refuses_each_damaged_bit_of_the_records():
    rows, dat = _store_bytes([_payload(0, s="s"), _payload(1)], dim=2)
    hot_rows, starts, records = _hot_bytes(rows, dat)
    for pos in range(len(records)):
        for bit in range(8):
            damaged = bytearray(records)
            damaged[pos] ^= 1 << bit
            assert _same_hot(hot_rows, starts, bytes(damaged), 2) is None, (pos, bit)
    for end in range(len(records)):  # the section cut short
        assert _same_hot(hot_rows, starts, records[:end], 2) is None


def test_read_hot_of_each_damaged_bit_of_the_rows():
    # As for read_memory: a damaged row may still read (another importance, a pin), the
    # same memory in both kernels and the brute force, or neither.
    rows, dat = _store_bytes([_payload(0), _payload(1, s="s")])
    hot_rows, starts, records = _hot_bytes(rows, dat)
    read = 0
    for pos in range(len(hot_rows)):
        for bit in range(8):
            damaged = bytearray(hot_rows)
            damaged[pos] ^= 1 << bit
            read += _same_hot(bytes(damaged), starts, records, 2) is not None
    assert 0 < read < 1280


def test_read_hot_checks_its_arguments():
    rows, dat = _store_bytes([_payload(0)])
    hot_rows, starts, records = _hot_bytes(rows, dat)
    for fn in (ext.read_hot, ref.read_hot):
        with pytest.raises(TypeError):
            fn(hot_rows, starts, records, 1, dict, f32)
        for n in (-1, 2):
            with pytest.raises(ValueError):
                fn(hot_rows, starts, records, n, Memory, f32)
        with pytest.raises(ValueError):
            fn(hot_rows, starts * 2, records, 2, Memory, f32)  # starts for more rows than given


@pytest.fixture(params=["cython", "python"])
def kernels(request):
    """The kernels of each backend in turn (``_kernels.use``), then the ones before."""
    from fastmem import _kernels

    previous = _kernels.BACKEND
    _kernels.use(request.param)
    yield request.param
    _kernels.use(previous)


def test_recent_after_a_restart_equals_the_general_path(store_path, kernels):
    with fastmem.open(store_path, dim=4) as store:
        for i in range(30):
            store.add(f"memory {i} " * (1 + i % 7), type="fact" if i % 3 else "plan",
                      session=f"s{i % 2}", importance=i / 40, pinned=i % 5 == 0,
                      timestamp=1_700_000_000 + i)  # fmt: skip
        store.add("with metadata", metadata={"a": 1}, timestamp=1_700_000_100)
        store.add("compressible " * 100, timestamp=1_700_000_101, embedding=[0, 1.0, 0, 0])
        store.checkpoint()
    with fastmem.open(store_path, embedder=None) as store:
        engine = store._engine
        assert engine.index.hot_rows() is not None
        for n in (0, 1, 20, 32, 40):
            with engine.lock:
                newest = engine.index.by_time(newest_first=True)
                general = [engine.memory(g) for g in newest][:n]
                assert engine.hot_recent(n) in (general, None)
            assert store.recent(n) == general
        with engine.lock:
            assert engine.hot_recent(20) is not None  # the plain case: read_hot answers
        store.update("m30", metadata={"b": 2})  # the hot copy is stale: the rows answer
        assert store.recent(2)[1].metadata == {"b": 2}


# --- MemoryStore.get ---------------------------------------------------------------------


def test_get_equals_the_general_path(store_path, kernels):
    with fastmem.open(store_path, dim=4) as store:
        ids = [
            store.add("plain"),
            store.add("Ada prefers tea ☕", type="fact", timestamp=1_700_000_000.5, session="s-1",
                      importance=0.8123, pinned=True, summary="tea",
                      metadata={"k": [1, 2.5, "x", None, b"\x00"], "n": {"a": 1}}),
            store.add("long and compressible " * 50, embedding=[1.0, 0.0, 0.0, 0.0]),
            store.add("forgotten"),
            store.add("metadata changed later", metadata={"a": 1}),
        ]
        store.forget(ids[3])
        store.update(ids[4], metadata={"b": 2})
    with fastmem.open(store_path) as store:
        ids.append(store.add("in the tail", type="plan"))  # base rows, then a tail row
        engine = store._engine
        for mid in ids:
            with engine.lock:
                engine.check()
                if mid == ids[3]:
                    with pytest.raises(UnknownMemoryError):
                        store.get(mid)
                    continue
                row = engine.live_row(mid)[1]
                general = engine.decode(row, engine.data(), row[3], engine.dat_end)
            assert store.get(mid) == general
            assert store.get(mid[:1] + "0" + mid[1:]) == general  # m01: the same memory
        assert store.get(ids[4]).metadata == {"b": 2}
        assert store.get(ids[2]).text == "long and compressible " * 50


def test_get_of_a_damaged_record_raises(store_path):
    with fastmem.open(store_path) as store:
        mid = store.add("soon damaged")
        store.add("neighbour")
        offset = store._engine.live_row(mid)[1][3]
    with open(store_path + ".dat", "r+b") as f:
        f.seek(offset + fmt.RECORD_HEADER_SIZE + 4)
        byte = f.read(1)
        f.seek(offset + fmt.RECORD_HEADER_SIZE + 4)
        f.write(bytes([byte[0] ^ 0x10]))
    with warnings.catch_warnings(), fastmem.open(store_path) as store:
        warnings.simplefilter("ignore", fastmem.RecoveryWarning)
        with pytest.raises(CorruptRecordError):
            store.get(mid)
        assert store.get("m1").text == "neighbour"


@pytest.mark.parametrize("kernels", ["cython", "python"])
def test_get_sees_what_another_process_did_at_the_next_call(store_path, kernels):
    # Added, forgotten, changed, then the whole file replaced by a compaction: each seen by
    # the very next get of a handle that had already read those memories.
    import os
    import subprocess
    import sys

    from fastmem import _kernels

    previous = _kernels.BACKEND
    _kernels.use(kernels)
    env = {**os.environ, "FASTMEM_BACKEND": kernels}

    def elsewhere(code):
        code = f"import fastmem\nwith fastmem.open({store_path!r}) as s:\n" + code
        subprocess.run([sys.executable, "-c", code], check=True, env=env)

    try:
        with fastmem.open(store_path) as store:
            a, b = store.add("first"), store.add("second", metadata={"v": 1})
            assert store.get(a).text == "first" and store.get(b).metadata == {"v": 1}
            elsewhere(f" s.add('third')\n s.forget({a!r})\n s.update({b!r}, metadata={{'v': 2}})\n")
            with pytest.raises(UnknownMemoryError):
                store.get(a)
            assert store.get(b).metadata == {"v": 2} and store.get("m2").text == "third"
            elsewhere(" s.compact()\n")
            assert store.get(b).metadata == {"v": 2} and store.get("m2").text == "third"
            with pytest.raises(UnknownMemoryError):
                store.get(a)
    finally:
        _kernels.use(previous)
