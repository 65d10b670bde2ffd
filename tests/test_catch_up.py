"""The catch-up's scan of what another process appended (``_replay.scan_file``) gives what
the full scan (``scan_records``) gives, for a few records and for everything else: a
record cut short, damage between records, a file cut while it reads."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastmem
from fastmem import _kernels
from fastmem.storage import replay as _replay

QUIET: dict[str, Any] = {"embedder": None, "summarizer": None,
                         "policy": fastmem.ContextPolicy(preload=0, recent=0)}  # fmt: skip


def _store(path: str) -> tuple[int, bytes]:
    with fastmem.open(path, **QUIET) as s:
        s.add("before")
    start = os.path.getsize(path + ".dat")
    with fastmem.open(path, durability="none", **QUIET) as s:
        s.add_many([{"text": f"appended {i}", "embedding": np.ones(8) * (i + 1)} for i in range(5)])
        s.update(s.recent(1)[0].id, importance=0.9)
    return start, Path(path + ".dat").read_bytes()


def _same(fd: int, start: int, end: int, data: bytes, monkeypatch: Any = None) -> None:
    want = _kernels.scan_records(data[:end], start, end)
    if monkeypatch is not None:  # whole records only: walked one by one, no full scan
        monkeypatch.setattr(_replay._kernels, "scan_records", None)
    got = _replay.scan_file(fd, start, end)
    if monkeypatch is not None:
        monkeypatch.undo()
    for a, b in zip(got, want):
        assert a.tolist() == b.tolist()


@pytest.mark.parametrize("damage", ["none", "cut", "flip", "zeros"])
def test_the_scan_of_a_small_tail_is_the_full_scans(
    store_path: str, damage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    start, data = _store(store_path)
    end = len(data)
    if damage == "cut":
        end -= 7
    elif damage == "flip":
        data = bytearray(data)
        data[start + 30] ^= 1  # the first appended record damaged, the others whole
        data = bytes(data)
    elif damage == "zeros":
        data += bytes(100)
        end = len(data)
    Path(store_path + ".dat").write_bytes(data)
    fd = os.open(store_path + ".dat", os.O_RDONLY)
    try:
        assert end - start <= _replay._SMALL_SCAN
        _same(fd, start, end, data, monkeypatch if damage == "none" else None)
        _same(fd, start, start, data, monkeypatch)  # nothing appended
    finally:
        os.close(fd)


def test_a_scan_of_bytes_cut_meanwhile_reads_what_is_left(store_path: str) -> None:
    start, data = _store(store_path)
    os.truncate(store_path + ".dat", len(data) - 7)  # cut after the size was taken
    fd = os.open(store_path + ".dat", os.O_RDONLY)
    try:
        got = _replay.scan_file(fd, start, len(data))
        want = _kernels.scan_records(data[: len(data) - 7], start, len(data) - 7)
        for a, b in zip(got, want):
            assert a.tolist() == b.tolist()
    finally:
        os.close(fd)
