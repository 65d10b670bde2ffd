"""Format stability: a store written by fastmem 0.1.0 (``fixtures/v1``) is read as written,
and the current writer's output is pinned byte for byte (``fixtures/current``).

A deliberate change to what the writer produces regenerates ``fixtures/current`` with
``python tests/fixtures/build_v1.py tests/fixtures/current`` and says why in its commit;
``fixtures/v1`` never changes: every release must keep reading it."""

from __future__ import annotations

import json
import shutil
import sys
import warnings
from pathlib import Path

import pytest

import fastmem
import fastmem._kernels
from fastmem import _format as fmt

FIXTURES = Path(__file__).parent / "fixtures"
sys.path.insert(0, str(FIXTURES))
import build_v1  # noqa: E402


@pytest.fixture
def v1_copy(tmp_path):
    for name in ("store.dat", "store.idx"):
        shutil.copy(FIXTURES / "v1" / name, tmp_path / name)
    return str(tmp_path / "store")


def test_v1_store_reads_as_expected(v1_copy):
    want = json.loads((FIXTURES / "v1" / "expected.json").read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the committed index must load without a rebuild
        assert build_v1.expected(v1_copy) == want
        with fastmem.open(v1_copy, readonly=True) as store:
            assert store.verify().ok and len(store) == 5 and "m1" not in store
            assert [h.id for h in store.search(build_v1.items()[0]["embedding"], 2)][0] == "m0"
            # The committed index predates the keyword section: its postings are built
            # from the data file in the background, and the search waits for them.
            assert fmt.unpack_idx_header((FIXTURES / "v1" / "store.idx").read_bytes(), "").keyword_version == 0
            assert [h.id for h in store.search("LISBON", mode="keyword")] == ["m0"]
            assert [h.id for h in store.search("flights", mode="keyword")] == ["m2"]  # m1 is forgotten


def test_the_writer_output_is_pinned_byte_for_byte(tmp_path):
    with pytest.warns(fastmem.RecoveryWarning):  # the pre-made header has no index yet
        build_v1.build(str(tmp_path / "store"))
    for name in ("store.dat", "store.idx"):
        assert (tmp_path / name).read_bytes() == (FIXTURES / "current" / name).read_bytes(), name
    want = json.loads((FIXTURES / "current" / "expected.json").read_text())
    assert build_v1.expected(str(tmp_path / "store")) == want


def test_v1_index_gets_its_keyword_section_at_the_next_checkpoint(v1_copy):
    with fastmem.open(v1_copy) as store:
        store.checkpoint()
    raw = Path(v1_copy + ".idx").read_bytes()
    assert fmt.unpack_idx_header(raw, "idx").keyword_version == fmt.KEYWORD_VERSION
    with fastmem.open(v1_copy, readonly=True) as store:
        assert store._engine.index.keyword.base is not None  # mapped, not rebuilt
        assert [h.id for h in store.search("lisbon may", mode="keyword")] == ["m0"]


def test_v1_store_opens_for_writing(v1_copy):
    with fastmem.open(v1_copy) as store:
        mid = store.add("a new memory", embedding=[1.0] * 8)
        assert store.verify().ok
    with fastmem.open(v1_copy, readonly=True) as store:
        assert store.get(mid).text == "a new memory" and len(store) == 6


def test_v1_fixture_covers_raw_and_compressed_payloads():
    data = (FIXTURES / "v1" / "store.dat").read_bytes()
    offsets = fastmem._kernels.scan_records(data, fmt.DAT_HEADER_SIZE, len(data))[0]
    heads = [fmt.parse_record_header(data, int(o), len(data)) for o in offsets]
    assert any(h.payload_len < h.raw_len for h in heads)  # lz4
    assert any(h.payload_len == h.raw_len for h in heads)  # stored raw
    assert {h.kind for h in heads} == {fmt.KIND_MEMORY, fmt.KIND_UPDATE, fmt.KIND_FORGET}
