"""_format: headers and records round-trip, and every damage is refused with fastmem's errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastmem import _format as fmt
from fastmem import _kernels
from fastmem.errors import CorruptIndexError, CorruptionError, CorruptRecordError, FormatVersionError


def test_layout_constants():
    assert fmt.DAT_HEADER_SIZE == 64 and fmt.RECORD_HEADER_SIZE == 20
    assert fmt.IDX_HEADER.size <= fmt.IDX_HEADER_CRC_AT and fmt.INDEX_DTYPE.itemsize == 80
    assert fmt.INDEX_DTYPE.isnative or fmt.INDEX_DTYPE.fields["id"][0].byteorder in "<="
    layout = fmt.idx_layout(3, 8, 5)
    assert all(x % fmt.SECTION_ALIGN == 0 for x in layout[:4]) and layout.size == layout.types + 5


def test_dat_header_roundtrip_and_damage():
    raw = fmt.pack_dat_header(b"u" * 16, 384, 1.5)
    assert fmt.unpack_dat_header(raw, "x") == fmt.DatHeader(b"u" * 16, 384, 1.5)
    for pos in range(len(raw)):
        bad = bytearray(raw)
        bad[pos] ^= 0x40
        with pytest.raises((CorruptionError, FormatVersionError)):
            fmt.unpack_dat_header(bytes(bad), "x")
    with pytest.raises(CorruptionError):
        fmt.unpack_dat_header(raw[:40], "x")


def test_idx_header_roundtrip_and_damage():
    h = fmt.IdxHeader(b"u" * 16, 10, 9, 384, 4000, 3900, 1234, 7, 11, 2.5)
    raw = fmt.pack_idx_header(h)
    assert len(raw) == fmt.IDX_HEADER_SIZE and fmt.unpack_idx_header(raw, "x") == h
    for pos in (0, 9, 20, 33, 50, 60, 4000, 4093):
        bad = bytearray(raw)
        bad[pos] ^= 1
        with pytest.raises((CorruptIndexError, FormatVersionError)):
            fmt.unpack_idx_header(bytes(bad), "x")


def _record(payload, vector=b""):
    stored, raw_len = fmt.encode_payload(payload)
    data, lengths, crcs = _kernels.frame_records(
        fmt.KIND_MEMORY, [stored], np.array([raw_len], dtype=np.uint32),
        np.frombuffer(vector, dtype=np.uint16)[None] if vector else None,
        np.ones(1, dtype=np.uint8) if vector else None,
    )  # fmt: skip
    return bytes(fmt.DAT_HEADER_SIZE) + data


@given(st.text(min_size=1, max_size=400), st.integers(0, 2**63 - 1), st.floats(0, 1e11))
def test_record_roundtrip(text, mid, ts):
    buf = _record({"i": mid, "t": ts, "x": text}, np.arange(6, dtype="<f2").tobytes())
    head, payload = fmt.read_record(buf, fmt.DAT_HEADER_SIZE, len(buf))
    assert payload == {"i": mid, "t": ts, "x": text} and head.kind == fmt.KIND_MEMORY
    assert head.length == len(buf) - fmt.DAT_HEADER_SIZE
    assert fmt.record_vector(buf, fmt.DAT_HEADER_SIZE, head.dim).tolist() == list(range(6))


def test_long_payloads_are_compressed():
    buf = _record({"i": 1, "t": 0.0, "x": "abc " * 500})
    head = fmt.parse_record_header(buf, fmt.DAT_HEADER_SIZE, len(buf))
    assert head.payload_len < head.raw_len


def test_every_damaged_byte_and_truncation_is_refused():
    buf = _record({"i": 1, "t": 0.0, "x": "hello " * 30}, np.ones(4, dtype="<f2").tobytes())
    for pos in range(fmt.DAT_HEADER_SIZE, len(buf)):
        for bit in (0, 7):
            bad = bytearray(buf)
            bad[pos] ^= 1 << bit
            with pytest.raises((CorruptRecordError, FormatVersionError)):
                fmt.read_record(bytes(bad), fmt.DAT_HEADER_SIZE, len(bad))
    for end in range(fmt.DAT_HEADER_SIZE, len(buf)):
        with pytest.raises(CorruptRecordError) as info:
            fmt.read_record(buf, fmt.DAT_HEADER_SIZE, end)
        assert info.value.offset == fmt.DAT_HEADER_SIZE


def test_payload_that_is_not_a_memory_is_refused():
    buf = _record({"x": "no id"})
    with pytest.raises(CorruptRecordError, match="no id"):
        fmt.read_record(buf, fmt.DAT_HEADER_SIZE, len(buf))


def test_type_table():
    assert fmt.unpack_types(fmt.pack_types(["a", "ü"]), "x") == ["a", "ü"]
    assert fmt.unpack_types(b"", "x") == []
    for bad in (b"\xc1", b"\x91\x01", b"\x81\xa1a\x01"):
        with pytest.raises(CorruptIndexError):
            fmt.unpack_types(bad, "x")
