"""The compiled kernels against their numpy references, and both against brute force."""

from __future__ import annotations

import errno
import math
import os
import struct
import zlib

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fastmem import _format as fmt
from fastmem._kernels import reference as ref

ext = pytest.importorskip("fastmem._kernels._ext.records")
topk_ext = pytest.importorskip("fastmem._kernels._ext.topk")
vectors_ext = pytest.importorskip("fastmem._kernels._ext.vectors")


@pytest.fixture(autouse=True)
def backend():
    """Each test here compares both backends itself: run it once."""
    return "both"


def test_compiled_constants_match_the_format():
    c = ext.CONSTANTS
    assert c["HEADER_SIZE"] == fmt.RECORD_HEADER_SIZE
    assert c["CRC_AT"] == fmt.RECORD_CRC_AT
    assert c["RECORD_VERSION"] == fmt.RECORD_VERSION
    assert (c["KIND_BATCH"], c["BATCH_FRAME_SIZE"]) == (fmt.KIND_BATCH, fmt.BATCH_FRAME_SIZE)
    assert c["MAX_DIM"] == fmt.MAX_DIM
    assert c["MAX_RAW_PAYLOAD"] == fmt.MAX_RAW_PAYLOAD
    assert c["MAGIC"] == fmt.RECORD_MAGIC


def _instructions(request, use, fast):
    """Run with the processor's ``fast`` instructions (skipped where it has none), or
    without them; switched back on after."""
    used = use(request.param == fast)
    if request.param == fast and not used:
        pytest.skip(f"this processor has no {fast.upper()}")
    yield request.param
    use(True)


@pytest.fixture(params=["pclmul", "table"])
def crc_path(request):
    """The CRC: folded with PCLMULQDQ (where the processor has it), and the table alone."""
    yield from _instructions(request, ext.use_pclmul, "pclmul")


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=5000), st.integers(0, 2**32 - 1))
def test_crc32_equals_zlib(crc_path, data, start):
    assert ext.crc32(data, start) == zlib.crc32(data, start) == ref.crc32(data, start)


def test_crc32_of_every_length_and_alignment(crc_path):
    # Runs of 64 bytes or more are folded with carry-less multiplies where the CPU has them
    # (src_cython/_crc.h), what is left over and shorter runs go through the table: every
    # split between the two, at every alignment; and the table alone.
    data = np.random.default_rng(5).integers(0, 256, 720, dtype=np.uint8).tobytes()
    for start in range(16):
        for n in range(600):
            chunk = data[start : start + n]
            assert ext.crc32(chunk, 0x9E3779B9) == zlib.crc32(chunk, 0x9E3779B9), (start, n)
    assert ext.crc32(bytes(1 << 20)) == zlib.crc32(bytes(1 << 20))


def _records(draw_payloads, dim, rng):
    """A valid stream of records with random payloads and vectors."""
    n = len(draw_payloads)
    raw_lens = np.array([len(p) for p in draw_payloads], dtype=np.uint32)
    vectors = rng.integers(0, 2**16, size=(n, dim), dtype=np.uint16) if dim else None
    has = rng.integers(0, 2, size=n).astype(np.uint8) if dim else None
    return draw_payloads, raw_lens, vectors, has


@given(st.lists(st.binary(max_size=300), max_size=12), st.integers(0, 16), st.integers(1, 3),
       st.integers(0, 2**32))  # fmt: skip
def test_frame_records_matches_reference(payloads, dim, kind, seed):
    args = _records(payloads, dim, np.random.default_rng(seed))
    got = ext.frame_records(kind, *args)
    want = ref.frame_records(kind, *args)
    assert got[0] == want[0]
    assert np.array_equal(got[1], want[1]) and np.array_equal(got[2], want[2])


def _stream(payloads, dim, seed):
    data, lengths, _ = ref.frame_records(1, *_records(payloads, dim, np.random.default_rng(seed)))
    return bytes(fmt.DAT_HEADER_SIZE) + data, lengths


def _damaged_stream(payloads, dim, seed, data, least_flips):
    """A stream with ``least_flips`` to 4 bits flipped past the file header and where it
    is cut (drawn from ``data``)."""
    buf, _ = _stream(payloads, dim, seed)
    damaged = bytearray(buf)
    for _ in range(data.draw(st.integers(least_flips, 4))):
        pos = data.draw(st.integers(fmt.DAT_HEADER_SIZE, len(buf) - 1))
        damaged[pos] ^= 1 << data.draw(st.integers(0, 7))
    return damaged, data.draw(st.integers(fmt.DAT_HEADER_SIZE, len(damaged)))


def _same_scan(buf, start, end):
    got = ext.scan_records(buf, start, end)
    want = ref.scan_records(buf, start, end)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and np.array_equal(g, w)
    return got


@given(st.lists(st.binary(max_size=200), max_size=10), st.integers(0, 8), st.integers(0, 2**32))
def test_scan_finds_every_record_of_a_clean_stream(payloads, dim, seed):
    buf, lengths = _stream(payloads, dim, seed)
    offsets, lens, kinds, dims, bad_starts, bad_ends = _same_scan(buf, fmt.DAT_HEADER_SIZE, len(buf))
    assert np.array_equal(lens, lengths)
    assert np.array_equal(offsets, fmt.DAT_HEADER_SIZE + np.concatenate(([0], np.cumsum(lengths)))[:-1])
    assert len(bad_starts) == len(bad_ends) == 0 and set(kinds.tolist()) <= {1}


@given(st.lists(st.binary(max_size=120), min_size=1, max_size=8), st.integers(0, 4),
       st.integers(0, 2**32), st.data())  # fmt: skip
def test_scan_of_damaged_streams_matches_reference(payloads, dim, seed, data):
    damaged, cut = _damaged_stream(payloads, dim, seed, data, 1)
    offsets, lens, _, _, bad_starts, bad_ends = _same_scan(bytes(damaged), fmt.DAT_HEADER_SIZE, cut)
    # Every byte is either in a valid record or in a damaged region, in order.
    spans = sorted([(int(o), int(o + n)) for o, n in zip(offsets, lens)]
                   + [(int(s), int(e)) for s, e in zip(bad_starts, bad_ends)])  # fmt: skip
    pos = fmt.DAT_HEADER_SIZE
    for s, e in spans:
        assert s == pos and e > s
        pos = e
    assert pos == cut


@given(st.binary(max_size=600), st.data())
def test_scan_of_random_bytes_matches_reference(noise, data):
    # Random bytes with record magics sprinkled in: the resync path.
    buf = bytearray(bytes(fmt.DAT_HEADER_SIZE) + noise)
    for _ in range(data.draw(st.integers(0, 5))):
        if len(buf) > fmt.DAT_HEADER_SIZE + 4:
            pos = data.draw(st.integers(fmt.DAT_HEADER_SIZE, len(buf) - 4))
            buf[pos : pos + 4] = fmt.RECORD_MAGIC
    _same_scan(bytes(buf), fmt.DAT_HEADER_SIZE, len(buf))


def test_scan_rejects_out_of_range():
    for fn in (ext.scan_records, ref.scan_records):
        with pytest.raises(ValueError):
            fn(bytes(10), 5, 11)
        with pytest.raises(ValueError):
            fn(bytes(10), 6, 5)


def _brute_record_payload(buf, offset, end):
    """The record at ``offset`` taken apart by hand from the format's description."""
    if not (0 <= offset and offset + 20 <= end <= len(buf)):
        return None
    magic, version, kind, dim, plen, rlen, crc = struct.unpack_from("<4sBBHIII", buf, offset)
    stop = offset + 20 + 2 * dim + plen
    if (magic != b"\x8fFMR" or version != 1 or kind not in (1, 2, 3) or dim > fmt.MAX_DIM
            or rlen > fmt.MAX_RAW_PAYLOAD or plen > rlen or stop > end):  # fmt: skip
        return None
    if zlib.crc32(buf[offset + 20 : stop], zlib.crc32(buf[offset : offset + 16])) != crc:
        return None
    return kind, dim, bytes(buf[stop - plen : stop]), rlen


def _same_record_payload(buf, offset, end):
    got = ext.record_payload(buf, offset, end)
    assert got == ref.record_payload(buf, offset, end) == _brute_record_payload(buf, offset, end)
    info = ext.check_record(buf, offset, end)
    assert info == ref.check_record(buf, offset, end)
    assert (info is None) == (got is None)
    return got


@given(st.lists(st.binary(max_size=200), min_size=1, max_size=8), st.integers(0, 8),
       st.integers(0, 2**32))  # fmt: skip
def test_record_payload_of_a_clean_stream(payloads, dim, seed):
    buf, lengths = _stream(payloads, dim, seed)
    offsets = fmt.DAT_HEADER_SIZE + np.cumsum([0, *lengths.tolist()])[:-1]
    for payload, offset in zip(payloads, offsets.tolist()):
        kind, got_dim, got, raw_len = _same_record_payload(buf, offset, len(buf))
        assert (kind, got, raw_len) == (1, payload, len(payload)) and got_dim in (0, dim)
        assert _same_record_payload(memoryview(buf), offset, len(buf)) is not None


@given(st.lists(st.binary(max_size=120), min_size=1, max_size=6), st.integers(0, 4),
       st.integers(0, 2**32), st.data())  # fmt: skip
def test_record_payload_of_damaged_and_truncated_streams(payloads, dim, seed, data):
    # Every offset of a stream with flipped bits, cut short (a map of a truncated file) or
    # read with an end past the bytes there are: the kernels and the brute force agree.
    damaged, cut = _damaged_stream(payloads, dim, seed, data, 0)
    short = bytes(damaged[:cut])
    for offset in range(-1, cut + 2):
        _same_record_payload(short, offset, cut)
        _same_record_payload(short, offset, cut + 1)  # an end past the buffer: refused


def test_record_payload_refuses_each_damaged_byte():
    buf, _ = _stream([b"a payload of some bytes"], 3, 0)
    at = fmt.DAT_HEADER_SIZE
    assert _same_record_payload(buf, at, len(buf)) is not None
    for pos in range(at, len(buf)):
        for bit in range(8):
            damaged = bytearray(buf)
            damaged[pos] ^= 1 << bit
            assert _same_record_payload(bytes(damaged), at, len(buf)) is None, (pos, bit)
    for end in range(at, len(buf)):  # the record cut short
        assert _same_record_payload(buf[:end], at, end) is None
    for offset, end in ((2**70, len(buf)), (at, 2**70), (-(2**70), len(buf))):
        assert ext.record_payload(buf, offset, end) is None is ref.record_payload(buf, offset, end)


def test_file_size_equals_fstat(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 1234)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert ext.file_size(fd) == ref.file_size(fd) == os.fstat(fd).st_size == 1234
        with open(path, "ab") as f:
            f.write(b"y" * 10)  # another writer's append is seen at once
        assert ext.file_size(fd) == ref.file_size(fd) == 1244
        path.unlink()  # replaced or removed: no name links to it
        assert ext.file_size(fd) == ref.file_size(fd) == -1
    finally:
        os.close(fd)
    for fn in (ext.file_size, ref.file_size):
        with pytest.raises(OSError) as raised:
            fn(fd)
        assert raised.value.errno == errno.EBADF


def _topk_args(rng, n, dim):
    vectors = rng.integers(-128, 128, size=(n, dim), dtype=np.int8)  # -128 too: exact SIMD
    if n > 3:
        vectors[1] = vectors[0]  # exact ties
    rows = np.zeros(n, dtype=fmt.INDEX_DTYPE)
    rows["scale"] = rng.choice([0.5, 1.0, 0.25], size=n)
    rows["flags"] = rng.choice([fmt.FLAG_HAS_VECTOR, fmt.FLAG_HAS_VECTOR | fmt.FLAG_FORGOTTEN, 0], size=n, p=[0.8, 0.1, 0.1])
    rows["type"] = rng.integers(0, 3, size=n)
    rows["timestamp"] = rng.integers(0, 10, size=n)
    rows["session"] = rng.integers(1, 3, size=n)
    query = rng.integers(-128, 128, size=dim, dtype=np.int8)
    return (vectors, rows["scale"], rows["flags"], rows["type"], rows["timestamp"],
            rows["session"], query)  # fmt: skip


@given(st.integers(0, 300), st.integers(1, 40), st.integers(1, 50), st.booleans(), st.integers(0, 2**32))
def test_topk_matches_reference_and_brute_force(n, dim, k, with_filters, seed):
    rng = np.random.default_rng(seed)
    cols = _topk_args(rng, n, dim)
    allowed, since, until, session = (None, -math.inf, math.inf, 0)
    if with_filters:
        allowed = np.zeros(65536, dtype=np.uint8)
        allowed[[0, 2]] = 1
        since, until, session = 2.0, 7.0, 2
    args = (*cols, k, allowed, since, until, session, fmt.FLAG_HAS_VECTOR, fmt.FLAG_FORGOTTEN)
    got_rows, got_scores = topk_ext.topk_int8(*args)
    want_rows, want_scores = ref.topk_int8(*args)
    assert np.array_equal(got_rows, want_rows) and np.array_equal(got_scores, want_scores)
    # Brute force, written out row by row.
    vectors, scales, flags, types, ts, sessions, query = cols
    scored = []
    for r in range(n):
        f = int(flags[r])
        if not f & fmt.FLAG_HAS_VECTOR or f & fmt.FLAG_FORGOTTEN:
            continue
        if not since <= ts[r] <= until or (session and sessions[r] != session):
            continue
        if allowed is not None and not allowed[types[r]]:
            continue
        dot = sum(int(a) * int(b) for a, b in zip(vectors[r], query))
        scored.append((-(dot * float(scales[r])), r))
    scored.sort()
    assert got_rows.tolist() == [r for _, r in scored[:k]]


@pytest.fixture(params=["none", "avx2", "avx512vnni"])
def simd(request):
    """Each dot-product variant the processor has (the others are skipped)."""
    if topk_ext.set_simd(request.param) != request.param:
        topk_ext.set_simd("avx512vnni")
        pytest.skip(f"this processor has no {request.param}")
    yield request.param
    topk_ext.set_simd("avx512vnni")  # back to the best the processor has


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=60)
@given(st.integers(0, 200), st.integers(1, 200), st.integers(1, 20), st.booleans(),
       st.integers(0, 2**32))  # fmt: skip
def test_topk_every_simd_variant_matches_reference(simd, n, dim, k, with_filters, seed):
    rng = np.random.default_rng(seed)
    cols = _topk_args(rng, n, dim)
    filters = (None, -math.inf, math.inf, 0)
    if with_filters:
        filters = (None, 2.0, 7.0, 0)
    args = (*cols, k, *filters, fmt.FLAG_HAS_VECTOR, fmt.FLAG_FORGOTTEN)
    got, want = topk_ext.topk_int8(*args), ref.topk_int8(*args)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    # The exact int32 dot product, whatever the variant.
    assert got[1].tolist() == [
        int(cols[0][r].astype(np.int64) @ cols[6].astype(np.int64)) * float(cols[1][r])
        for r in got[0]
    ]


@pytest.fixture
def threaded():
    """Threads for scans of any size (by default only large scans use them)."""
    old = topk_ext._set_min_threaded_bytes(0)
    yield
    topk_ext._set_min_threaded_bytes(old)


@pytest.mark.parametrize("dim", [1, 63, 130, 384])
@pytest.mark.parametrize("filtered", [False, True])
def test_topk_many_chunks_match_reference(simd, threaded, dim, filtered):
    """Enough rows for several chunks and threads: the merged heaps are the reference's
    top-k, ties (duplicated rows) included; scales_out receives every row's scale."""
    rng = np.random.default_rng(dim)
    n = 70_000
    cols = list(_topk_args(rng, n, dim))
    cols[0][n // 2 :: 997] = cols[0][3]  # exact ties across chunks
    cols[1] = np.ascontiguousarray(cols[1])
    filters = (None, 3.0, 3.0, 0) if filtered else (None, -math.inf, math.inf, 0)
    for k in (1, 10, 72, 500):
        args = (*cols, k, *filters, fmt.FLAG_HAS_VECTOR, fmt.FLAG_FORGOTTEN)
        out_got = np.zeros(n, dtype=np.float32)
        out_want = np.zeros(n, dtype=np.float32)
        got = topk_ext.topk_int8(*args, out_got)
        want = ref.topk_int8(*args, out_want)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
        assert np.array_equal(out_got, cols[1]) and np.array_equal(out_want, cols[1])


def test_topk_skips_rows_excluded_by_flags_only_when_they_would_rank():
    """Without filters the flags are read only for rows that would enter the heap: a
    forgotten row with the best score must still be left out."""
    rng = np.random.default_rng(5)
    cols = list(_topk_args(rng, 50_000, 32))
    cols[2][:] = fmt.FLAG_HAS_VECTOR
    best = int(np.argmax(cols[0].astype(np.int32) @ cols[6].astype(np.int32)))
    cols[1][:] = 1.0
    cols[2][best] |= fmt.FLAG_FORGOTTEN
    args = (*cols, 5, None, -math.inf, math.inf, 0, fmt.FLAG_HAS_VECTOR, fmt.FLAG_FORGOTTEN)
    got, want = topk_ext.topk_int8(*args), ref.topk_int8(*args)
    assert best not in got[0].tolist()
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def _half_buffer(rng, count, dim, pad):
    vectors = rng.standard_normal((count, dim)).astype(np.float16)
    vectors[:, :1] = np.float16(6e-8)  # a subnormal
    gaps = rng.integers(0, 5, size=count)  # odd offsets too: records need not be aligned
    parts, offsets, at = [], [], pad
    parts.append(bytes(pad))
    for v, gap in zip(vectors, gaps):
        parts.append(bytes(int(gap)))
        at += int(gap)
        offsets.append(at)
        parts.append(v.astype("<f2").tobytes())
        at += 2 * dim
    return b"".join(parts), np.array(offsets, dtype=np.int64), vectors


@given(st.integers(0, 20), st.integers(0, 70), st.integers(0, 3), st.integers(0, 2**32))
def test_dot_half_matches_reference_and_brute_force(count, dim, pad, seed):
    rng = np.random.default_rng(seed)
    buf, offsets, vectors = _half_buffer(rng, count, dim, pad)
    query = rng.standard_normal(dim)
    got = topk_ext.dot_half(buf, offsets, query)
    want = ref.dot_half(buf, offsets, query)
    assert got.dtype == want.dtype == np.float64
    assert np.array_equal(got, want)
    brute = []
    for v in vectors:  # products rounded, summed in order
        acc = 0.0
        for a, b in zip(v.tolist(), query.tolist()):
            acc += a * b
        brute.append(acc)
    assert got.tolist() == brute


def test_dot_half_of_damaged_halves_is_nan_or_inf_in_both_kernels_without_a_warning():
    """A damaged file's vector may hold inf or NaN halves: the compiled kernel returns what
    IEEE arithmetic gives (inf times 0 is NaN), and so must the reference, without the
    RuntimeWarning numpy raises for it (a hostile file found it, the warning an error)."""
    halves = np.array([np.inf, 1.0, np.nan, -np.inf, 65504.0, 65504.0], dtype="<f2").tobytes()
    offsets = np.array([0, 4, 8], dtype=np.int64)
    for query in (np.array([0.0, 1.0]), np.array([1e308, 1e308])):
        got = topk_ext.dot_half(halves, offsets, query)
        want = ref.dot_half(halves, offsets, query)
        assert np.array_equal(got, want, equal_nan=True), (got, want)


def test_dot_half_rejects_offsets_outside_the_buffer():
    query = np.ones(4)
    for kernel in (topk_ext.dot_half, ref.dot_half):
        for offsets in ([-1], [3], [10]):
            with pytest.raises(ValueError):
                kernel(bytes(10), np.array(offsets, dtype=np.int64), query)
        assert kernel(bytes(10), np.array([2], dtype=np.int64), query).tolist() == [0.0]


def test_topk_validates_shapes():
    rng = np.random.default_rng(0)
    cols = list(_topk_args(rng, 10, 4))
    rest = (5, None, -math.inf, math.inf, 0, fmt.FLAG_HAS_VECTOR, fmt.FLAG_FORGOTTEN)
    with pytest.raises(ValueError):
        topk_ext.topk_int8(*cols[:6], cols[6][:3], *rest)
    with pytest.raises(ValueError):
        topk_ext.topk_int8(*cols, *rest, np.zeros(9, dtype=np.float32))
    cols[1] = cols[1][:5]
    with pytest.raises(ValueError):
        topk_ext.topk_int8(*cols, *rest)


float32_rows = hnp.arrays(
    np.float32,
    st.tuples(st.integers(0, 19), st.integers(1, 40)),  # the kernel sums 8 rows at once, the last < 8 one by one
    elements=st.floats(-1e6, 1e6, width=32) | st.sampled_from([0.0, 1e-30, -1e-41, 6e-8, 3.4e38]),
)


@pytest.fixture(params=["f16c", "portable"])
def conversions(request):
    """The float <-> half conversions: F16C instructions (where the processor has them)
    and the portable C ones."""
    yield from _instructions(request, vectors_ext.use_f16c, "f16c")


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(x=float32_rows)
def test_to_half_matches_reference_and_numpy(conversions, x):
    got, bad = vectors_ext.to_half(x)
    want, want_bad = ref.to_half(x)
    assert bad == want_bad
    good = bad if bad >= 0 else len(x)
    assert np.array_equal(got[:good], want[:good])
    if good:
        x64 = x[:good].astype(np.float64)
        unit = x64 / np.sqrt((x64 * x64).sum(axis=1, keepdims=True))
        # numpy's own rounding, through float32, up to the order of the norm's sum
        np.testing.assert_allclose(want[:good].view(np.float16).astype(np.float64), unit, atol=1e-3)


@given(st.integers(0, 2**32))
def test_to_half_flags_the_first_bad_row(seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((19, 8)).astype(np.float32)
    bad = int(rng.integers(0, 19))
    x[bad] = rng.choice([0.0, np.nan, np.inf])
    assert vectors_ext.to_half(x)[1] == ref.to_half(x)[1] == bad


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(x=float32_rows)
def test_to_half_quantized_is_to_half_then_quantize_half(conversions, x):
    half, q, scales, bad = vectors_ext.to_half_quantized(x)
    want_half, want_bad = ref.to_half(x)
    assert bad == want_bad
    good = bad if bad >= 0 else len(x)
    assert np.array_equal(half[:good], want_half[:good])
    want_q, want_scales = ref.quantize_half(want_half[:good])
    assert np.array_equal(q[:good], want_q) and np.array_equal(scales[:good], want_scales)
    # The reference's own composition, whole: with a bad row too (the rows from it on are
    # zeros with scale 1 there; the kernel does not zero its outputs first)
    for got, want in zip((half, q, scales), ref.to_half_quantized(x)[:3]):
        assert np.array_equal(got, want)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bits=hnp.arrays(np.uint16, st.tuples(st.integers(0, 6), st.integers(1, 40))))
def test_quantize_half_matches_reference(conversions, bits):
    finite = np.isfinite(bits.view(np.float16)).all(axis=1)
    assume(finite.all())
    qa, sa = vectors_ext.quantize_half(bits)
    qb, sb = ref.quantize_half(bits)
    assert np.array_equal(qa, qb) and np.array_equal(sa, sb)
    v = bits.view(np.float16).astype(np.float32)
    assert np.all(np.abs(qa.astype(np.float32) * sa[:, None] - v) <= sa[:, None] / 2 + 1e-6)


msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False)
    | st.text(max_size=300) | st.binary(max_size=300),
    lambda inner: st.lists(inner, max_size=20) | st.dictionaries(st.text(max_size=40), inner, max_size=20),
    max_leaves=40,
)  # fmt: skip


@given(st.lists(st.dictionaries(st.sampled_from(["i", "t", "x", "k", "u", "m"]) | st.text(max_size=3),
                                msgpack_values, max_size=12),
                max_size=5), st.integers(0, 2**62), st.data())
def test_pack_memories_equals_msgpack_with_id_and_counts(payloads, first_id, data):
    counts = [hnp.arrays(np.uint32, len(payloads)) for _ in range(2)]
    text, summary = data.draw(counts[0]), data.draw(counts[1])
    got = ext.pack_memories(payloads, first_id, text, summary)
    want = [msgpack.packb({**p, "i": first_id + j, "k": [int(a), int(b)]}, use_bin_type=True)
            for j, (p, a, b) in enumerate(zip(payloads, text, summary))]  # fmt: skip
    assert got[0] == want and got[1].tolist() == [len(w) for w in want]
    assert ref.pack_memories(payloads, first_id, text, summary)[0] == want
    with pytest.raises(ValueError):
        ext.pack_memories(payloads, first_id, text[:-1] if len(text) else np.zeros(1, np.uint32), summary)


def test_pack_memories_refuses_what_msgpack_refuses():
    counts = np.zeros(1, dtype=np.uint32)
    for bad in ({"x": object()}, {"x": 2**64}, {"x": -(2**63) - 1}, {"x": {"y": set()}}):
        for pack in (ext.pack_memories, ref.pack_memories):
            with pytest.raises((TypeError, OverflowError)):
                pack([bad], 0, counts, counts)
    odd = [{1: {2.5: None}, "x": [b"\x00", {3: True}]}]  # keys that are not strings
    assert ext.pack_memories(odd, 7, counts, counts)[0] == ref.pack_memories(odd, 7, counts, counts)[0]


FORK_CHILD = """
import math, os, sys
import numpy as np
from fastmem import _format as fmt
from fastmem._kernels._ext import scoring, topk
n = 200_000
rng = np.random.default_rng(0)
v = rng.integers(-127, 128, (n, 16), dtype=np.int8)
rows = np.zeros(n, dtype=fmt.INDEX_DTYPE)
rows["scale"], rows["flags"] = 1, fmt.FLAG_HAS_VECTOR
topk._set_min_threaded_bytes(0)
scoring._set_min_threaded_rows(0)
def run():
    out = np.zeros(n, dtype=np.float32)
    scoring.importance(rows["importance"], rows["flags"], rows["access_count"], rows["last_access"],
                       rows["timestamp"], out, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 2, 1)
    return topk.topk_int8(v, rows["scale"], rows["flags"], rows["type"], rows["timestamp"],
                          rows["session"], v[3].copy(), 10, None, -math.inf, math.inf, 0,
                          fmt.FLAG_HAS_VECTOR, fmt.FLAG_FORGOTTEN)[0]
first = run()  # the parent's OpenMP threads exist from here on
pid = os.fork()
if pid == 0:
    os._exit(0 if np.array_equal(run(), first) else 3)
print(os.waitpid(pid, 0)[1])
"""


def test_threaded_kernels_work_in_a_forked_child():
    """GNU OpenMP's pool does not survive fork: a forked child must not hang in a scan."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", FORK_CHILD], capture_output=True, text=True,
                         timeout=120, check=False)  # fmt: skip
    assert out.returncode == 0 and out.stdout.strip() == "0", out.stderr


@pytest.mark.parametrize("given, expected", [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_openmp_threads_wait_passively_unless_the_user_says(given, expected, tmp_path):
    """The top-k scan's OpenMP threads must not spin between scans (a core taken from the
    caller's other threads), and a user's own OMP_WAIT_POLICY is left as it is."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if given is not None:
        env["OMP_WAIT_POLICY"] = given
    env["PYTHONSAFEPATH"] = "1"  # the installed fastmem, not a checkout's unbuilt tree
    code = "import os, fastmem; print(os.environ['OMP_WAIT_POLICY'])"
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path,
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == expected
