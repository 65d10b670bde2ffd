"""An append that a crash interrupted is not damage: nothing in it was acknowledged.

A process killed while appending leaves the first bytes of its records (a torn tail); a
power loss during an append that was never synced can keep the file's new size but not all
of the append's pages, which then read as zeros. Either way the bytes past the last whole
record hold nothing a call returned: ``verify()`` on any handle (a reader's, another
writer's) does not report them as damage, no ``RecoveryWarning`` is raised about them, and
the next write cuts them. Bytes that may be an acknowledged record hit by bit rot are still
kept, warned about once and reported (tests/test_recovery.py holds that too).
"""

from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path
from typing import Any

import pytest

import fastmem
from fastmem import _format as fmt

PAGE = 4096
QUIET: dict[str, Any] = {"embedder": None, "summarizer": None,
                         "policy": fastmem.ContextPolicy(preload=0, recent=0)}


def _warnings_of(call: Any) -> tuple[Any, list[str]]:
    """Run ``call``; its result and the messages of the warnings it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = call()
    return result, [str(w.message) for w in caught]


def _acknowledged(path: str) -> int:
    """Two synced memories and a checkpoint; the data file's size after them."""
    with fastmem.open(path, durability="always", **QUIET) as s:
        s.add("first")
        s.add("second, acknowledged")
    return os.path.getsize(path + ".dat")


def _unsynced_append(path: str, text: str) -> bytes:
    """Append one memory without a sync or a checkpoint (the process then 'crashes'); the
    data file's bytes after it."""
    s = fastmem.open(path, durability="none", **QUIET)
    s.add(text)
    s._engine.abandon()  # no close: no checkpoint covers the record
    return Path(path + ".dat").read_bytes()


@pytest.mark.parametrize("readonly", [True, False])
def test_a_killed_writers_torn_append_is_not_reported_by_other_handles(
    store_path: str, readonly: bool
) -> None:
    size = _acknowledged(store_path)
    other = fastmem.open(store_path, readonly=readonly, **QUIET)  # a process already running
    try:
        data = _unsynced_append(store_path, "third, never acknowledged " * 20)
        cut = size + (len(data) - size) // 2  # killed half-way through the append
        os.truncate(store_path + ".dat", cut)
        report, warned = _warnings_of(other.verify)
        assert report.ok, report.problems
        assert warned == []
        assert [m.text for m in other] == ["first", "second, acknowledged"]
        if not readonly:  # its next write cuts the torn bytes, quietly
            _, warned = _warnings_of(lambda: other.add("fourth"))
            assert warned == [] and os.path.getsize(store_path + ".dat") > size
            assert [m.text for m in other] == ["first", "second, acknowledged", "fourth"]
            assert other.verify().ok
    finally:
        other.close()


def test_a_new_writer_cuts_a_torn_append_without_a_warning(store_path: str) -> None:
    size = _acknowledged(store_path)
    data = _unsynced_append(store_path, "third, never acknowledged " * 20)
    os.truncate(store_path + ".dat", size + 7)
    reader, warned = _warnings_of(lambda: fastmem.open(store_path, readonly=True, **QUIET))
    with reader:
        assert warned == [] and reader.verify().ok
        writer, warned = _warnings_of(lambda: fastmem.open(store_path, **QUIET))
        with writer:
            assert warned == [] and os.path.getsize(store_path + ".dat") == size
            assert writer.verify().ok and reader.verify().ok
    assert len(data) > size + 7


def _partly_persisted(path: str, lost: str) -> tuple[int, int]:
    """An unsynced append of several pages of which a power loss kept the file's size and
    some pages, not all (a lost page reads as zeros). Returns (acknowledged size, size)."""
    acknowledged = _acknowledged(path)
    text = "never synced " + " ".join(hashlib.sha256(b"%d" % i).hexdigest() for i in range(200))
    data = bytearray(_unsynced_append(path, text))
    assert len(data) - acknowledged > 3 * PAGE  # the append spans pages
    first = -(-acknowledged // PAGE) * PAGE  # the first page boundary inside the append
    if lost == "first page":  # the append's part of the page it shares with the last record
        lost_range = slice(acknowledged, first)
    elif lost == "a middle page":
        lost_range = slice(first + PAGE, first + 2 * PAGE)
    else:  # the last page, written partly
        lost_range = slice(len(data) // PAGE * PAGE, len(data))
    data[lost_range] = bytes(len(data[lost_range]))
    Path(path + ".dat").write_bytes(bytes(data))
    return acknowledged, len(data)


@pytest.mark.parametrize("lost", ["first page", "a middle page", "last page"])
def test_a_partly_persisted_unsynced_append_is_cut_not_reported(store_path: str, lost: str) -> None:
    acknowledged, size = _partly_persisted(store_path, lost)
    reader, warned = _warnings_of(lambda: fastmem.open(store_path, readonly=True, **QUIET))
    with reader:
        assert warned == []
        assert [m.text for m in reader] == ["first", "second, acknowledged"]
        report = reader.verify()
        assert report.ok, report.problems
        assert os.path.getsize(store_path + ".dat") == size  # a reader changes nothing
    writer, warned = _warnings_of(lambda: fastmem.open(store_path, **QUIET))
    with writer:
        assert warned == [] and os.path.getsize(store_path + ".dat") == acknowledged
        writer.add("third")
        assert writer.verify().ok
    with fastmem.open(store_path, readonly=True, **QUIET) as r:
        assert [m.text for m in r] == ["first", "second, acknowledged", "third"]


def test_a_damaged_last_record_is_still_kept_and_reported(store_path: str) -> None:
    """The other side of the rule: a whole last record with a flipped bit may be an
    acknowledged memory hit by bit rot: kept, warned about, reported until repair()."""
    _acknowledged(store_path)
    data = bytearray(Path(store_path + ".dat").read_bytes())
    data[-3] ^= 0x10
    Path(store_path + ".dat").write_bytes(bytes(data))
    os.remove(store_path + ".idx")  # rebuilt: the scan meets the record
    writer, warned = _warnings_of(lambda: fastmem.open(store_path, **QUIET))
    with writer:
        assert any("damaged bytes at the end" in w for w in warned)
        assert os.path.getsize(store_path + ".dat") == len(data)
        report = writer.verify()
        assert not report.ok and [p.file for p in report.problems] == ["dat"]


def test_a_record_header_cut_short_is_a_torn_append(store_path: str) -> None:
    size = _acknowledged(store_path)
    data = _unsynced_append(store_path, "third")
    for keep in (1, fmt.RECORD_HEADER_SIZE - 1, fmt.RECORD_HEADER_SIZE + 1):
        Path(store_path + ".dat").write_bytes(data[: size + keep])
        with fastmem.open(store_path, readonly=True, **QUIET) as reader:
            assert reader.verify().ok, keep
