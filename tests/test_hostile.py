"""Hostile files: mutated and random bytes as either file of a store, read every way.

Only fastmem's own errors may come out (``FastmemError``); the long runs are atheris
targets in ``fuzz/`` (``python fuzz/run.py``), this is their smoke test plus hypothesis
strategies over the same harness.
"""

from __future__ import annotations

import os
import struct
import sys
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastmem import _format as fmt
from fastmem import _kernels
from fastmem._kernels import reference as _kernels_py

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fuzz"))
import fuzz_open  # noqa: E402
import fuzz_readers  # noqa: E402

SEEDS = fuzz_open.seed_inputs()


def test_fuzz_smoke_mutated_and_random_files():
    """A few hundred inputs of the atheris targets' harness: mutated seeds and random bytes."""
    for data in fuzz_open.random_inputs(150, seed=7):
        fuzz_open.one_input(data)


def test_fuzz_readers_smoke():
    for data in fuzz_open.random_inputs(300, seed=8):
        fuzz_readers.one_input(bytes([data[0] % 4]) + data[1:])


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.integers(1, len(data) - 1))
        kind = draw(st.sampled_from(["set", "int", "cut", "insert"]))
        if kind == "set":
            data[at] = draw(st.integers(0, 255))
        elif kind == "int" and at + 8 <= len(data):
            value = draw(st.sampled_from([0, 1, 2**31, 2**32 - 1, 2**63, 2**64 - 1]))
            data[at : at + 8] = value.to_bytes(8, "little")
        elif kind == "cut":
            del data[max(at, 2) :]
        else:
            data[at:at] = draw(st.binary(min_size=1, max_size=32))
    return bytes(data)


@settings(max_examples=60)
@given(mutated())
def test_mutated_files_raise_only_fastmem_errors(data):
    fuzz_open.one_input(data)


@settings(max_examples=30)
@given(st.integers(0, 255), st.binary(max_size=6000))
def test_random_bytes_raise_only_fastmem_errors(mode, body):
    fuzz_open.one_input(bytes([mode]) + body)


def _record(payload: bytes, dim: int = 0) -> bytes:
    head = fmt.RECORD_MAGIC + bytes([fmt.RECORD_VERSION, fmt.KIND_MEMORY])
    head += struct.pack("<HII", dim, len(payload), len(payload))
    body = bytes(2 * dim) + payload
    return head + struct.pack("<I", zlib.crc32(body, zlib.crc32(head))) + body


@settings(max_examples=80)
@given(
    st.lists(
        st.one_of(
            st.binary(max_size=40).map(lambda p: ("rec", p)),
            st.integers(0, 600).map(lambda n: ("fake", n)),  # a plausible header, wrong CRC
            st.binary(min_size=1, max_size=24).map(lambda b: ("junk", b)),
        ),
        max_size=12,
    )
)
def test_resync_over_files_packed_with_headers(parts):
    """The compiled scan (prefix-CRC resync) finds exactly the reference's records."""
    chunks = [bytes(fmt.DAT_HEADER_SIZE)]
    for kind, value in parts:
        if kind == "rec":
            chunks.append(_record(value))
        elif kind == "fake":
            chunks.append(_record(bytes(value))[:16] + b"\x00\x00\x00\x00")
        else:
            chunks.append(value)
    buf = b"".join(chunks)
    got = _kernels.scan_records(buf, fmt.DAT_HEADER_SIZE, len(buf))
    want = _kernels_py.scan_records(buf, fmt.DAT_HEADER_SIZE, len(buf))
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_resync_does_not_reread_long_candidates():
    """A file packed with headers that each claim 64 KiB: every real record is found
    (the benchmark ``benchmarks/hostile_scan.py`` shows the scan stays linear)."""
    claimed = _record(bytes(1 << 16))[:16]
    buf = bytes(fmt.DAT_HEADER_SIZE) + claimed * 4096 + bytes(1 << 17) + _record(b"x") + claimed
    offsets, _, _, _, bad_starts, bad_ends = _kernels.scan_records(buf, fmt.DAT_HEADER_SIZE, len(buf))
    assert offsets.tolist() == [len(buf) - len(claimed) - len(_record(b"x"))]
    assert bad_starts.tolist() == [fmt.DAT_HEADER_SIZE, len(buf) - len(claimed)]
    assert bad_ends.tolist() == [offsets[0], len(buf)]


@pytest.mark.parametrize("field", ["t", "p", "k", "x", "y", "s"])
def test_replay_refuses_out_of_range_fields(tmp_path, field):
    """A record whose CRC fits but whose fields break add's limits is reported, not applied."""
    import fastmem

    bad = {"t": float("nan"), "p": 1e300, "k": [-1, 5], "x": 7, "y": "", "s": "s" * 300}[field]
    payload = {"i": 0, "t": 1.0, "x": "hello", field: bad}
    stored, raw = fmt.encode_payload(payload)
    path = str(tmp_path / "s")
    with fastmem.open(path, embedder=None):
        pass
    head = fmt.RECORD_MAGIC + bytes([fmt.RECORD_VERSION, fmt.KIND_MEMORY]) + struct.pack("<HII", 0, len(stored), raw)
    record = head + struct.pack("<I", zlib.crc32(stored, zlib.crc32(head))) + stored
    with open(path + ".dat", "ab") as f:
        f.write(record)
    os.remove(path + ".idx")
    with pytest.warns(fastmem.RecoveryWarning):
        store = fastmem.open(path, embedder=None, readonly=True)
    with store:
        assert len(store) == 0
        report = store.verify()
        assert not report.ok and report.problems[0].offset == fmt.DAT_HEADER_SIZE


@pytest.mark.parametrize("next_id", [2**63 - 1, 2**63, 2**64 - 1])
def test_an_id_counter_near_the_limit(next_id):
    """An index (its checksum made to fit) whose id counter is at or past 2^63: refused as
    damage and rebuilt, or used up to the last id, never an overflow."""
    idx = bytearray(SEEDS[2][1:])  # the seed index
    fields = list(fmt.IDX_HEADER.unpack_from(idx, 0))
    fields[12] = next_id
    idx[: fmt.IDX_HEADER.size] = fmt.IDX_HEADER.pack(*fields)
    fuzz_open.one_input(bytes([2]) + bytes(idx))  # "idx-fixed-crc", writable


@pytest.mark.parametrize("field", ["importance", "scale"])
def test_signalling_nans_in_the_rows_float_fields(field):
    """A float32 field of every row overwritten with a signalling NaN (the header's
    checksum made to fit): searching and building contexts widen it to float64, which
    must not turn into a RuntimeWarning (an error under -W error) instead of a result."""
    idx = bytearray(SEEDS[2][1:])
    header = fmt.unpack_idx_header(idx, "seed")
    start = fmt.header_layout(header).rows
    at = fmt.INDEX_DTYPE.fields[field][1]
    for row in range(header.rows):
        offset = start + row * fmt.INDEX_DTYPE.itemsize + at
        idx[offset : offset + 4] = b"\x01\x00\x80\x7f"  # float32 sNaN: exponent all ones, quiet bit 0
    fuzz_open.one_input(bytes([2]) + bytes(idx))  # "idx-fixed-crc", writable


def _sections() -> dict[str, tuple[int, int]]:
    """Byte ranges of the seed index's sections (and of the header's fields)."""
    idx = SEEDS[2][1:]
    layout = fmt.header_layout(fmt.unpack_idx_header(idx, "seed"))
    kw = layout.keyword
    assert kw is not None and layout.hot < layout.size
    return {
        "header": (0, fmt.IDX_HEADER.size), "rows": (layout.rows, layout.order),
        "order": (layout.order, layout.vectors), "vectors": (layout.vectors, layout.types),
        "types": (layout.types, layout.hot), "hot": (layout.hot, kw.terms),
        "terms": (kw.terms, kw.offsets), "offsets": (kw.offsets, kw.rows),
        "posting rows": (kw.rows, kw.tf), "tf": (kw.tf, kw.doc_len), "doc_len": (kw.doc_len, kw.end),
    }  # fmt: skip


SECTIONS = _sections()


@settings(max_examples=80)
@given(st.sampled_from(sorted(SECTIONS)), st.data())
def test_damage_in_each_index_section(name, data):
    """Bytes of one section (hot, keyword postings, rows...) overwritten, the header's
    checksum made to fit: reads still raise only fastmem errors."""
    idx = bytearray(SEEDS[2][1:])
    lo, hi = SECTIONS[name]
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(lo, max(lo, hi - 1)))
        value = data.draw(st.sampled_from([b"\xff" * 8, b"\x00" * 4, b"\x7f\xff\xff\xff", b"\x01"]) | st.binary(min_size=1, max_size=8))
        idx[at : at + len(value)] = value
    readonly = data.draw(st.booleans())
    fuzz_open.one_input(bytes([2 | (fuzz_open.READONLY_BIT if readonly else 0)]) + bytes(idx[: len(SEEDS[2]) - 1]))


@pytest.mark.parametrize("last_offset", [2**64 - 1, 2**64 - 8, 2**64 - 20])
def test_a_last_record_offset_near_2_64_is_refused(last_offset):
    """The header's offset of the last record it covers damaged to near 2**64, the checksum
    made to fit: the index is refused as stale (and rebuilt), as the reference refuses it.
    The compiled open added a record header's size to it, the sum wrapped around, passed
    the bounds check, and the record was read far outside the data file's map: a
    segmentation fault, found by CI's hypothesis run of the test above."""
    idx = bytearray(SEEDS[2][1:])
    at = 64  # last_offset, after covered
    idx[at : at + 8] = last_offset.to_bytes(8, "little")
    assert fmt.IDX_HEADER.unpack_from(idx)[9] == last_offset  # that field
    fuzz_open.one_input(bytes([2]) + bytes(idx))


@pytest.mark.parametrize("live_tokens", [0, 2**64 - 1])
def test_a_damaged_keyword_token_count_raises_only_fastmem_errors(live_tokens):
    """The header's count of the live rows' keyword tokens (BM25's average length), the
    fixed header's last field, out of step with the rows, the checksum made to fit: the
    writes, forget and checkpoint raise only fastmem errors. (A count near 2**64 once
    overflowed the header's u64 at the next checkpoint: struct.error from close. A count
    too low: the next test.)"""
    idx = bytearray(SEEDS[2][1:])
    at = fmt.IDX_HEADER.size - 8
    idx[at : at + 8] = live_tokens.to_bytes(8, "little")
    assert fmt.IDX_HEADER.unpack_from(idx)[-1] == live_tokens  # that field
    fuzz_open.one_input(bytes([2]) + bytes(idx))


def test_a_keyword_token_count_damaged_low_is_counted_again_when_forgets_pass_it(tmp_path):
    """The header's count damaged to 0 (which no bound can tell from a store of empty
    texts), then forgets of rows with tokens: the count went negative and the next
    checkpoint's header could not hold it (struct.error from close). It is counted again
    from the rows' own token counts, so the checkpoint and a reopen's search work."""
    import fastmem

    path = str(tmp_path / "store")
    with fastmem.open(path, dim=8, embedder=None, summarizer=None) as store:
        ids = store.add_many([{"text": f"alpha beta word{i} more words", "embedding": fuzz_open._vector(i)}
                              for i in range(20)])  # fmt: skip
    with open(path + ".idx", "rb") as f:
        idx = bytearray(f.read())
    at = fmt.IDX_HEADER.size - 8  # keyword_live_tokens, the fixed header's last field
    assert int.from_bytes(idx[at : at + 8], "little") == 20 * 5
    idx[at : at + 8] = bytes(8)
    with open(path + ".idx", "wb") as f:
        f.write(fuzz_open.fix_idx_crc(bytes(idx)))
    with fastmem.open(path, embedder=None, summarizer=None) as store:
        for mid in ids[:10]:
            store.forget(mid)
        store.checkpoint()
    with fastmem.open(path, embedder=None, summarizer=None) as store:
        assert len(store.search("alpha", 20, mode="keyword")) == 10
        assert store.verify().ok
