"""The compiled replay of other processes' memory records (``_kernels.memory_rows``):
against its numpy reference, and against the general, record-by-record replay it stands in
for (the brute force), on plain, unusual and damaged payloads."""

from __future__ import annotations

import lz4.block
import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastmem import _format as fmt
from fastmem import _kernels
from fastmem.storage import replay as _replay
from fastmem._kernels import reference as ref
from fastmem.storage.index import MemoryIndex

ext = pytest.importorskip("fastmem._kernels._ext.reader")

DIM = 3
FINITE = np.arange(1, DIM + 1, dtype=np.float16)


@pytest.fixture(autouse=True)
def backend():
    """Each test here compares both kernels itself: run it once."""
    return "both"


def _frame(records: list[tuple[int, dict | bytes, np.ndarray | None]], compress: bool = False):
    """A data file of ``(kind, payload, vector or None)`` records (a payload given as dict
    is packed; ``compress``: lz4 where it is shorter) and the scan of it."""
    parts = []
    for kind, payload, vector in records:
        raw = payload if isinstance(payload, bytes) else msgpack.packb(payload, use_bin_type=True)
        stored = raw
        if compress:
            packed = lz4.block.compress(raw, store_size=False)
            stored = packed if len(packed) < len(raw) else raw
        vectors = (
            None
            if vector is None
            else np.asarray(vector, dtype=np.float16).view(np.uint16)[None, :]
        )
        has = None if vector is None else np.ones(1, dtype=np.uint8)
        framed, _, _ = ref.frame_records(
            kind, [stored], np.array([len(raw)], dtype=np.uint32), vectors, has
        )
        parts.append(framed)
    dat = bytes(fmt.DAT_HEADER_SIZE) + b"".join(parts)
    scanned = ref.scan_records(dat, fmt.DAT_HEADER_SIZE, len(dat))
    assert len(scanned[0]) == len(records) and not len(scanned[4])
    return dat, scanned


def _kernel_rows(fn, dat, scanned, first, stop, next_id, dim, type_codes, quantize=True):
    """``fn``'s answer (with its int8 rows and scales unless not ``quantize``), the
    quantized rows checked against quantizing each row alone (the brute force)."""
    offsets, lengths, kinds, dims = scanned[:4]
    rows = np.full(stop - first, 0xAB, dtype=np.uint8).repeat(80).view(fmt.INDEX_DTYPE)
    vectors = np.full((stop - first, dim), 0xABAB, dtype=np.uint16)
    quantized = np.full((stop - first, dim), 0x55, dtype=np.int8) if quantize else None
    sessions: dict = {None: 0}
    count, texts, vectored = fn(dat, offsets, lengths, kinds, dims, first, stop, next_id, dim,
                      dict(type_codes), fmt.DEFAULT_IMPORTANCE, fmt.DEFAULT_USER_TYPE_IMPORTANCE,
                      sessions, _replay.session_hash, rows, vectors, quantized)  # fmt: skip
    has = (rows[:count]["flags"] & fmt.FLAG_HAS_VECTOR) != 0
    if dim:
        assert vectored == int(has.sum())
    else:
        assert vectored == 0
    if quantize:
        for i in range(count):  # each row as quantize_half makes it alone; zeros without one
            want_q, want_s = ref.quantize_half(vectors[i : i + 1]) if has[i] else (0, 0.0)
            assert (quantized[i] == want_q).all() and rows[i]["scale"] == want_s
        assert (quantized[count:] == 0x55).all()
        quantized = quantized[:count].tobytes()
    scales = rows[:count]["scale"].copy()
    if not quantize:  # the scale is 0 (quantizing sets it)
        assert not scales.any()
    rows[:count]["scale"] = 0  # returned apart
    return (count, texts, vectored, rows[:count].tobytes(), vectors[:count].tobytes(),
            scales.tobytes(), quantized)  # fmt: skip


def _same(dat, scanned, first=0, stop=None, next_id=0, dim=DIM, type_codes=None):
    """Both kernels' answers, equal; returns the count."""
    stop = len(scanned[0]) if stop is None else stop
    codes = MemoryIndex(dim, b"u" * 16).type_codes if type_codes is None else type_codes
    got = _kernel_rows(ext.memory_rows, dat, scanned, first, stop, next_id, dim, codes)
    want = _kernel_rows(ref.memory_rows, dat, scanned, first, stop, next_id, dim, codes)
    assert got == want
    return got[0]


def _general(dat, scanned, plain: bool, dim: int = 0):
    """The index (of vectors of ``dim``: 0, set by the first) a replay of all the records
    makes (``plain``: with the compiled kernel, else record by record) and its problems."""
    index = MemoryIndex(dim, b"u" * 16)
    problems: list = []
    backend = _kernels.BACKEND
    _kernels.BACKEND = "cython" if plain else "python"  # what Replayer.run asks
    try:
        _replay.Replayer(index, dat, "x.dat", problems).run(*scanned[:4])
    finally:
        _kernels.BACKEND = backend
    return index, problems


def _state(index, problems):
    n = index.tail.n
    rows = index.tail.rows[:n].copy()
    return (rows.tobytes(), index.tail.vectors[:n].tobytes(), [(p.offset, p.message) for p in problems],
            index.next_id, index.live, index.applied, index.last_offset, index.last_crc,
            list(index.user_types), index.keyword.tail_n)  # fmt: skip


def _memory(i, **fields):
    return {"i": i, "t": 1_700_000_000.5 + i, "x": f"text {i}", "k": [3, 0], **fields}


def test_plain_records_become_the_rows_the_general_replay_makes():
    records = [
        (fmt.KIND_MEMORY, _memory(0), FINITE),
        (fmt.KIND_MEMORY, _memory(1, y="fact", s="a session", u="a summary", p=0.25, n=True), None),
        (fmt.KIND_MEMORY, _memory(2, m={"k": [1, None]}, p=1, s="a session"), FINITE),
        (fmt.KIND_MEMORY, _memory(5, k=None, y="plan", x="é" * 300), FINITE),
    ]
    for compress in (False, True):
        dat, scanned = _frame(records, compress)
        assert _same(dat, scanned) == 4
        assert _same(dat, scanned, first=1, stop=3) == 2
        assert _same(dat, scanned, next_id=3) == 0  # ids below next_id
        assert _same(dat, scanned, first=3, next_id=3) == 1
        assert _same(dat, scanned, dim=0) == 0  # a vector the index has no room for yet
        plain, general = _general(dat, scanned, True), _general(dat, scanned, False)
        assert _state(*plain) == _state(*general)
        assert not plain[1] and plain[0].tail.n == 4


NOT_PLAIN = [
    _memory(0, t=5),  # an int time: the general way widens it
    _memory(0, y="a new type"),  # no code yet: the general way makes one
    _memory(0, y=None), _memory(0, y=""), _memory(0, y="t" * 65), _memory(0, y=7),
    _memory(0, s=""), _memory(0, s="s" * 257), _memory(0, s=b"bytes"),
    _memory(0, t=float("nan")), _memory(0, t=-1.0), _memory(0, t=2e11), _memory(0, x=b"bytes"),
    _memory(0, k=[1]), _memory(0, k=[1, -1]), _memory(0, k=[1, 2**32]), _memory(0, k=[1, True]),
    _memory(0, k=(1, 2.0)), _memory(0, k=3),
    _memory(0, u=3), _memory(0, m=[1]), _memory(0, n=1), _memory(0, n=None),
    _memory(0, p=None), _memory(0, p=True), _memory(0, p=1.5), _memory(0, p=-0.5), _memory(0, p=2),
    _memory(0, p=float("nan")), _memory(0, z=1), _memory(0, e=[1, 2]),
    _memory(2**63), _memory(-1), _memory(True),
    {"i": 0, "t": 1.5}, {"i": 0, "x": "no time"}, {"t": 1.5, "x": "no id"},
]  # fmt: skip


@pytest.mark.parametrize("payload", NOT_PLAIN, ids=range(len(NOT_PLAIN)))
def test_what_is_not_plain_is_left_to_the_general_replay(payload):
    second = dict(payload)
    if type(second.get("i")) is int and second["i"] == 0:
        second["i"] = 1  # above the first record's
    records = [(fmt.KIND_MEMORY, _memory(0), None), (fmt.KIND_MEMORY, second, None),
               (fmt.KIND_MEMORY, _memory(9), None)]  # fmt: skip
    dat, scanned = _frame(records)
    assert _same(dat, scanned) == 1  # the first only: the kernel stops at the second
    assert _state(*_general(dat, scanned, True)) == _state(*_general(dat, scanned, False))


def test_other_records_vectors_and_bytes_are_left_to_the_general_replay():
    nan = FINITE.copy()
    nan[1] = np.nan
    inf = FINITE.copy()
    inf[2] = np.inf
    first_length = len(_frame([(fmt.KIND_MEMORY, _memory(0), FINITE)])[0]) - fmt.DAT_HEADER_SIZE
    erase = {"i": 0, "e": [fmt.DAT_HEADER_SIZE, first_length], "w": 1.5, "y": "conversation"}
    for second in [
        (fmt.KIND_UPDATE, {"i": 0, "p": 0.5}, None),
        (fmt.KIND_UPDATE, {"i": 0, "n": True, "m": {"a": 1}}, None),
        (fmt.KIND_FORGET, erase, None),  # an erasing forget of the first
        (fmt.KIND_FORGET, {"i": 0}, None),
        (fmt.KIND_MEMORY, _memory(1), nan),
        (fmt.KIND_MEMORY, _memory(1), inf),
        (fmt.KIND_MEMORY, _memory(1), np.ones(DIM + 1)),  # another dimension
        (fmt.KIND_MEMORY, msgpack.packb(_memory(1)) + b"\x00", None),  # bytes after the map
        (fmt.KIND_MEMORY, b"\xd4\x01\x00", None),  # an ext type
        (fmt.KIND_MEMORY, msgpack.packb([1, 2]), None),  # not a map
        (fmt.KIND_MEMORY, b"", None),
    ]:
        dat, scanned = _frame([(fmt.KIND_MEMORY, _memory(0), FINITE), second,
                               (fmt.KIND_MEMORY, _memory(2), FINITE)])  # fmt: skip
        assert _same(dat, scanned) == 1, second
        assert _same(dat, scanned, first=2) == 1
        assert _state(*_general(dat, scanned, True)) == _state(*_general(dat, scanned, False))


def test_each_damaged_bit_of_a_record():
    # The scan checks the CRC; the kernel is given records the scan passed. Given the
    # damaged bytes anyway (as a scan that missed it would), both kernels agree, and what
    # they take is what the general replay of those bytes takes.
    dat, scanned = _frame([(fmt.KIND_MEMORY, _memory(0, s="s", y="fact"), FINITE)])
    taken = 0
    for pos in range(fmt.DAT_HEADER_SIZE, len(dat)):
        for bit in range(8):
            damaged = bytearray(dat)
            damaged[pos] ^= 1 << bit
            count = _same(bytes(damaged), scanned)
            taken += count
            if count:  # the general replay of those bytes makes the same index
                plain, general = (
                    _general(bytes(damaged), scanned, True),
                    _general(bytes(damaged), scanned, False),
                )
                assert _state(*plain) == _state(*general), (pos, bit)
    assert 0 < taken < 8 * (len(dat) - fmt.DAT_HEADER_SIZE)


def test_the_arguments_are_checked():
    dat, scanned = _frame([(fmt.KIND_MEMORY, _memory(0), None)])
    codes = MemoryIndex(0, b"u" * 16).type_codes
    for fn in (ext.memory_rows, ref.memory_rows):
        for first, stop in ((-1, 1), (1, 0), (0, 2)):
            with pytest.raises(ValueError):
                _kernel_rows(fn, dat, scanned, first, stop, 0, 0, codes)
        with pytest.raises(ValueError):
            _kernel_rows(fn, dat, scanned, 0, 1, -1, 0, codes)
        rows = np.zeros(0, dtype=fmt.INDEX_DTYPE)
        with pytest.raises(ValueError):
            fn(dat, *scanned[:4], 0, 1, 0, 0, codes, {}, 0.5, {}, _replay.session_hash, rows,
               np.zeros((1, 0), dtype=np.uint16))  # fmt: skip
        assert _kernel_rows(fn, dat, scanned, 0, 1, 2**63, 0, codes)[0] == 0  # no id is left
        rows, vectors = np.zeros(1, dtype=fmt.INDEX_DTYPE), np.zeros((1, 2), dtype=np.uint16)
        for quantized in (np.zeros((0, 2), dtype=np.int8), np.zeros((1, 3), dtype=np.int8)):
            with pytest.raises(ValueError):  # too few rows, another dimension
                fn(dat, *scanned[:4], 0, 1, 0, 2, codes, {}, 0.5, {}, _replay.session_hash,
                   rows, vectors, quantized)  # fmt: skip


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 40).flatmap(lambda dim: st.tuples(
    st.just(dim),
    st.lists(st.none() | st.lists(st.floats(-65504, 65504, width=16), min_size=dim, max_size=dim),
             min_size=1, max_size=6))))  # fmt: skip
def test_the_int8_rows_are_those_quantizing_makes(case):
    # Any finite halves (zeros, ties, the largest): the kernel's int8 rows and scales are
    # quantize_half's of each row, zeros and scale 0 without a vector, in both kernels
    # (_kernel_rows checks each row alone), and the replay's index holds them.
    dim, vectors = case
    records = [(fmt.KIND_MEMORY, _memory(i), None if v is None else np.array(v, dtype=np.float16))
               for i, v in enumerate(vectors)]  # fmt: skip
    dat, scanned = _frame(records)
    assert _same(dat, scanned, dim=dim) == len(vectors)
    got = _kernel_rows(ext.memory_rows, dat, scanned, 0, len(vectors), 0, dim, {"conversation": 0})
    without = _kernel_rows(ext.memory_rows, dat, scanned, 0, len(vectors), 0, dim,
                           {"conversation": 0}, quantize=False)  # fmt: skip
    assert got[:5] == without[:5]  # the rest is the same with the int8 rows or without
    plain, general = _general(dat, scanned, True, dim), _general(dat, scanned, False, dim)
    assert _state(*plain) == _state(*general)


_values = st.none() | st.booleans() | st.integers(-3, 2**64 - 1) | st.floats() | st.text(max_size=3)
_fields = st.fixed_dictionaries(
    {},
    optional={
        "t": st.floats(0, 2e11) | _values, "x": st.text(max_size=8) | _values,
        "k": st.lists(st.integers(-1, 2**32), min_size=2, max_size=2) | _values,
        "y": st.sampled_from(["fact", "plan", "new"]) | _values,
        "s": st.sampled_from(["a", "b"]) | _values, "u": st.text(max_size=3) | _values,
        "p": st.floats(0, 1) | _values, "n": st.booleans() | _values,
        "m": st.dictionaries(st.text(max_size=2), st.integers(-9, 9)) | _values, "z": _values,
    },
)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from([fmt.KIND_MEMORY] * 6 + [fmt.KIND_UPDATE, fmt.KIND_FORGET]),
                          _fields, st.booleans(), st.booleans()), max_size=12),
       st.booleans())  # fmt: skip
def test_random_streams_replay_as_the_general_replay_does(steps, compress):
    records, mid = [], 0
    for gap, kind, fields, vector, plain in steps:
        if kind == fmt.KIND_MEMORY:
            mid += gap if gap < 3 else -1
            payload = _memory(mid) if plain else {"i": mid, **_memory(mid), **fields}
            records.append((kind, payload, FINITE if vector else None))
        else:
            records.append(
                (kind, {"i": max(mid - gap, 0), **({"p": 0.5} if plain else fields)}, None)
            )
    dat, scanned = _frame(records, compress)
    for first in range(len(records)):
        _same(dat, scanned, first=first, next_id=first)
    assert _state(*_general(dat, scanned, True)) == _state(*_general(dat, scanned, False))


def test_a_long_run_is_decoded_in_calls_of_a_bounded_size(monkeypatch):
    # Each compiled call holds the GIL: a long run is cut into calls of _PLAIN_ROWS records.
    calls = []
    real = _kernels.memory_rows

    def counted(*args):
        calls.append(args[6] - args[5])  # stop - first
        return real(*args)

    monkeypatch.setattr(_replay, "_PLAIN_ROWS", 3)
    monkeypatch.setattr(_kernels, "memory_rows", counted)
    records = [
        (fmt.KIND_MEMORY, _memory(i, s=f"s{i % 2}"), FINITE if i % 3 else None) for i in range(8)
    ]
    dat, scanned = _frame(records)
    plain = _general(dat, scanned, True, DIM)
    assert calls == [3, 3, 2]
    assert _state(*plain) == _state(*_general(dat, scanned, False, DIM))
    assert plain[0].tail.n == 8
    # A fresh index: the first vector sets the dimension the general way, then runs again.
    calls.clear()
    records = [(fmt.KIND_MEMORY, _memory(i), FINITE) for i in range(8)]
    dat, scanned = _frame(records)
    plain = _general(dat, scanned, True)
    assert calls == [3, 3, 3, 1]
    assert _state(*plain) == _state(*_general(dat, scanned, False))
