"""A replay without the writer lock meeting a record another process is erasing.

An erase (``fastmem/storage/erase.py``) appends the forget record, then overwrites the memory's
records in place, under the writer lock. A handle that replays records without that lock
(its catch-up, or its open) may read a record while the overwrite is half done: the record
fails its CRC. Deterministic here as in ``tests/test_erase_concurrent.py``: two handles in
one process (each with its own descriptors and view, as two processes), the erase's
overwrite stopped halfway (``_erase.write_at``) while the other handle opens or catches up.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import fastmem
from fastmem.storage import erase as _erase

QUIET: dict[str, Any] = {"embedder": None, "summarizer": None,
                         "policy": fastmem.ContextPolicy(preload=0, recent=0)}  # fmt: skip


def _halfway(monkeypatch: pytest.MonkeyPatch, meanwhile: Callable[[], None]) -> None:
    """Make the next erase write half of each overwrite, call ``meanwhile()`` once (at the
    first), then write the rest."""
    real = _erase.write_at
    called: list[bool] = []

    def half_written(fd: int, data: bytes, offset: int) -> bool:
        half = len(data) // 2
        os.pwrite(fd, data[:half], offset)
        if not called:
            called.append(True)
            meanwhile()
        return real(fd, data[half:], offset + half)

    monkeypatch.setattr(_erase, "write_at", half_written)


def _vec(i: int) -> list[float]:
    return [1.0, float(i), 0.0, 0.0]


def test_an_open_while_the_last_record_the_index_covers_is_erased_loads_the_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The index file ends with the memory being erased: its check of the last record it
    covers meets the record half overwritten (CRC changed). The forget record after it
    names it: the index is loaded, not taken for stale and rebuilt with a RecoveryWarning."""
    path = str(tmp_path / "s")
    writer = fastmem.open(path, dim=4, **QUIET)
    writer.add("kept " + "k" * 300, embedding=_vec(0))
    writer.add("the secret " + "s" * 300, embedding=_vec(1))
    writer.checkpoint()  # the index covers the secret: its last record
    seen: list[Any] = []

    def open_reader() -> None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with fastmem.open(path, readonly=True, **QUIET) as reader:
                seen.append((reader.ids(), reader._engine.index.file is not None))
        seen.append([str(w.message) for w in caught])

    _halfway(monkeypatch, open_reader)
    writer.forget("m1")
    writer.close()
    assert seen == [(["m0"], True), []]  # the index file was loaded; no warning


@pytest.mark.parametrize("batch", [False, True])
def test_a_handle_behind_meets_a_record_mid_erase_and_sees_the_records_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch: bool
) -> None:
    """Caught up before the memory was added, another handle catches up while it is being
    erased: no error, no warning, the memory gone and every record after it there."""
    path = str(tmp_path / "s")
    writer = fastmem.open(path, dim=4, **QUIET)
    writer.add("before", embedding=_vec(0))
    other = fastmem.open(path, **QUIET)
    items = [{"text": f"batch {i} " + "b" * 300, "embedding": _vec(i)} for i in range(3)]
    if batch:
        writer.add_many(items)
    else:
        for item in items:
            writer.add(item["text"], embedding=item["embedding"])
    writer.add("after", embedding=_vec(9))
    seen: list[Any] = []

    def catch_up() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            seen.append([m.text[:7] for m in other])

    _halfway(monkeypatch, catch_up)
    writer.forget("m2")
    writer.close()
    assert seen == [["before", "batch 0", "batch 2", "after"]]
    other.close()


def test_a_handle_that_met_a_record_mid_erase_agrees_with_the_data_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "s")
    writer = fastmem.open(path, dim=4, **QUIET)
    writer.add("before", embedding=_vec(0))
    other = fastmem.open(path, **QUIET)  # a writer too (another process), caught up here
    writer.add("the secret " + "s" * 300, embedding=_vec(1))
    writer.add("after", embedding=_vec(2))
    _halfway(monkeypatch, other.ids)
    writer.forget("m1")
    writer.close()
    problems = [str(p) for p in other.verify().problems]
    other.add("by the other", embedding=_vec(3))
    other.checkpoint()  # its index file, as every later open loads it
    other.close()
    with fastmem.open(path, readonly=True, **QUIET) as fresh:
        problems += [str(p) for p in fresh.verify().problems]
        assert fresh.ids() == ["m0", "m2", "m3"]
    assert problems == []


def test_a_damaged_last_covered_record_no_forget_names_is_still_stale(tmp_path: Path) -> None:
    """The other side of the rule above: the last record the index covers fails its CRC and
    no forget record after it names it (bit rot, or another file): rebuilt, and warned."""
    path = str(tmp_path / "s")
    with fastmem.open(path, dim=4, **QUIET) as writer:
        writer.add("kept", embedding=_vec(0))
        writer.add("damaged " + "d" * 300, embedding=_vec(1))
    data = bytearray(Path(path + ".dat").read_bytes())
    data[-50] ^= 0x01  # in the last record, which the index (written at close) ends with
    Path(path + ".dat").write_bytes(bytes(data))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with fastmem.open(path, readonly=True, **QUIET) as reader:
            assert reader.ids() == ["m0"]
    assert any("stale" in str(w.message) for w in caught), [str(w.message) for w in caught]


@pytest.mark.parametrize("batch", [False, True])
def test_a_catch_up_that_read_the_size_before_the_forget_sees_the_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch: bool
) -> None:
    """The other handle takes the file's size, then the writer appends the forget and
    starts overwriting the last record before that size, then the handle scans up to it: the
    record half overwritten is the last thing it reads. The memories written before its call
    (the rest of that batch) are there: it is not a batch cut short."""
    from fastmem.storage import index as _index

    path = str(tmp_path / "s")
    writer = fastmem.open(path, dim=4, **QUIET)
    writer.add("before", embedding=_vec(0))
    other = fastmem.open(path, readonly=True, **QUIET)
    assert other.ids() == ["m0"]
    items = [{"text": f"batch {i} " + "b" * 300, "embedding": _vec(i)} for i in range(3)]
    if batch:
        writer.add_many(items)
    else:
        for item in items:
            writer.add(item["text"], embedding=item["embedding"])
    real_scan = _index.scan_file
    scanned: list[Any] = []

    def scan_meanwhile(fd: int, start: int, end: int) -> Any:
        if scanned:
            return real_scan(fd, start, end)
        _halfway(monkeypatch, lambda: scanned.append(real_scan(fd, start, end)))
        writer.forget("m3")  # the last record before ``end``
        return scanned[0]

    monkeypatch.setattr(_index, "scan_file", scan_meanwhile)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            first = other.ids()
        monkeypatch.setattr(_index, "scan_file", real_scan)
        assert {"m1", "m2"} <= set(first), first  # committed before the call
        assert other.ids() == ["m0", "m1", "m2"]
    finally:
        writer.close()
        other.close()


def test_an_open_that_met_a_record_mid_erase_agrees_with_the_data_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The open's side of the rule above: a read-only handle that builds its index from the
    data file (none under the name) while the memory record is half overwritten and the
    forget naming it is already there gives the memory its forgotten row, as the finished
    erase reads back: its verify() is clean once the erase is done, and it sees the records
    after it."""
    path = str(tmp_path / "s")
    writer = fastmem.open(path, dim=4, **QUIET)
    writer.add("before", embedding=_vec(0))
    writer.add("the secret " + "s" * 300, embedding=_vec(1))
    writer.add("after", embedding=_vec(2))
    opened: list[Any] = []

    def open_reader() -> None:
        os.remove(path + ".idx")  # (written by nobody yet: the open rebuilds)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", fastmem.RecoveryWarning)  # "rebuilt the index"
            opened.append(fastmem.open(path, readonly=True, **QUIET))

    writer.checkpoint()
    _halfway(monkeypatch, open_reader)
    writer.forget("m1")
    writer.close()
    with opened[0] as reader:
        assert reader.ids() == ["m0", "m2"]
        assert [str(p) for p in reader.verify().problems] == []
