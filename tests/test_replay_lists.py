"""A catch-up on a few records another process appended takes the scan's columns as lists
(``_replay.scan_file(lists=True)``, ``Replayer.run``, ``_kernels.memory_rows``): the same
rows, vectors and errors as with the columns as arrays."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

import fastmem
from fastmem import _format as fmt
from fastmem.storage import index as _index, replay as _replay
from fastmem.storage.index import MemoryIndex

ext = pytest.importorskip("fastmem._kernels._ext.reader")

QUIET = {"embedder": None, "summarizer": None, "policy": fastmem.ContextPolicy(preload=0, recent=0)}
DIM = 8


def _vec(i: int) -> np.ndarray:
    return np.random.default_rng(i).standard_normal(DIM).astype(np.float32)


def _records(path: str, items: list[dict[str, Any]]) -> tuple[bytes, int, int]:
    """The data file's bytes after adding ``items`` one by one, and where they start and end."""
    with fastmem.open(path, dim=DIM, durability="none", **QUIET) as store:
        store.add("the first", embedding=_vec(100))
        start = store._engine.dat_end
        for item in items:
            store.add(**item)
        end = store._engine.dat_end
    with open(path + ".dat", "rb") as f:
        return f.read(), start, end


def _rows(dat: bytes, columns: tuple[Any, ...]) -> tuple[Any, ...]:
    """``ext.memory_rows`` of all the columns' records: count, texts, rows, vectors, int8 rows."""
    n = len(columns[0])
    rows = np.full(n, 0xAB, dtype=np.uint8).repeat(80).view(fmt.INDEX_DTYPE)
    vectors = np.full((n, DIM), 0xABAB, dtype=np.uint16)
    quantized = np.full((n, DIM), 0x55, dtype=np.int8)
    codes = MemoryIndex(DIM, b"u" * 16).type_codes
    count, texts, vectored = ext.memory_rows(
        dat, *columns, 0, n, 0, DIM, codes, fmt.DEFAULT_IMPORTANCE,
        fmt.DEFAULT_USER_TYPE_IMPORTANCE, {None: 0}, _replay.session_hash, rows, vectors,
        quantized,
    )  # fmt: skip
    return count, texts, vectored, rows.tobytes(), vectors.tobytes(), quantized.tobytes()


ITEMS = [
    {"text": "plain", "embedding": _vec(1)},
    {"text": "in a session", "embedding": _vec(2), "session": "s1", "type": "fact"},
    {"text": "no vector"},
    {"text": "weighted", "embedding": _vec(3), "importance": 0.25},
]


def test_the_kernel_makes_the_same_rows_from_lists_as_from_arrays(tmp_path):
    dat, start, end = _records(str(tmp_path / "s"), ITEMS)
    fd = os.open(str(tmp_path / "s.dat"), os.O_RDONLY)
    try:
        lists = _replay.scan_file(fd, start, end, lists=True)
        arrays = _replay.scan_file(fd, start, end)
    finally:
        os.close(fd)
    assert all(type(c) is list for c in lists[:4]) and not len(lists[4]) and not len(lists[5])
    assert [a.tolist() for a in arrays[:4]] == [list(c) for c in lists[:4]]
    assert [a.dtype for a in arrays[:4]] == [np.int64, np.uint32, np.uint8, np.uint16]
    got = _rows(dat, lists[:4])
    assert got[0] == len(ITEMS) and got[1] == [item["text"] for item in ITEMS]
    assert got == _rows(dat, arrays[:4])


@pytest.mark.parametrize(
    "change, error",
    [
        (lambda c: (c[0], c[1][:-1], c[2], c[3]), ValueError),  # lengths shorter
        (lambda c: (c[0], tuple(c[1]), c[2], c[3]), ValueError),  # not a list like offsets
        (lambda c: (c[0], [-1] * len(c[1]), c[2], c[3]), OverflowError),  # not a uint32
        (lambda c: (c[0], c[1], [256] * len(c[2]), c[3]), OverflowError),  # not a uint8
        (lambda c: (["1"] * len(c[0]), c[1], c[2], c[3]), TypeError),  # not ints
    ],
)
def test_the_kernel_refuses_lists_that_are_not_columns(tmp_path, change, error):
    dat, start, end = _records(str(tmp_path / "s"), ITEMS[:2])
    fd = os.open(str(tmp_path / "s.dat"), os.O_RDONLY)
    try:
        columns = _replay.scan_file(fd, start, end, lists=True)[:4]
    finally:
        os.close(fd)
    with pytest.raises(error):
        _rows(dat, change(columns))


def test_first_and_stop_outside_the_lists_are_refused(tmp_path):
    dat, start, end = _records(str(tmp_path / "s"), ITEMS[:2])
    fd = os.open(str(tmp_path / "s.dat"), os.O_RDONLY)
    try:
        columns = _replay.scan_file(fd, start, end, lists=True)[:4]
    finally:
        os.close(fd)
    rows = np.zeros(3, dtype=fmt.INDEX_DTYPE)
    with pytest.raises(ValueError, match="first:stop"):
        ext.memory_rows(dat, *columns, 0, 3, 0, DIM, {}, {}, 0.5, {None: 0},
                        _replay.session_hash, rows, np.zeros((3, DIM), np.uint16))  # fmt: skip


def test_a_catch_up_on_a_few_records_takes_lists_and_matches_an_open(tmp_path, monkeypatch):
    """Another handle's adds, caught up with through the lists (every backend): the index
    rows, vectors and search answers a fresh open of the store has."""
    path = str(tmp_path / "s")
    writer = fastmem.open(path, dim=DIM, **QUIET)
    reader = fastmem.open(path, dim=DIM, **QUIET)
    writer.add("before", embedding=_vec(0))
    assert reader.ids() == ["m0"]
    seen: list[tuple[type, ...]] = []
    real = _index.scan_file

    def spy(fd: int, start: int, end: int) -> Any:
        scanned = real(fd, start, end)
        seen.append(tuple(type(c) for c in scanned[:4]))
        return scanned

    monkeypatch.setattr(_index, "scan_file", spy)
    ids = [writer.add(**item) for item in ITEMS]
    writer.add_many([{"text": f"batch {i}", "embedding": _vec(10 + i)} for i in range(3)])
    assert reader.get(ids[1]).session == "s1"
    assert seen == [(list, list, list, list)]  # one catch-up, of lists
    fresh = fastmem.open(path, dim=DIM, readonly=True, **QUIET)
    try:
        mine, theirs = reader._engine.index, fresh._engine.index
        assert len(mine) == len(theirs) == 8
        assert [mine.row(g) for g in range(8)] == [theirs.row(g) for g in range(8)]
        assert reader.ids() == fresh.ids()
        for i in range(8):
            assert reader.get(f"m{i}") == fresh.get(f"m{i}")
        query = _vec(3)
        assert [h.id for h in reader.search(query, k=3)] == [h.id for h in fresh.search(query, k=3)]
        assert [h.id for h in reader.search("weighted", k=3, mode="keyword")] == [ids[3]]
    finally:
        fresh.close()
        reader.close()
        writer.close()
