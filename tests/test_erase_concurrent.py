"""A read racing another writer's erase (found by the several-writer SIGKILL soak,
``benchmarks/crash_soak.py --writers 4``): a forget with ``erase=True`` overwrites the
memory's records in place, after its forget record; a handle that caught up before the
forget record and reads the memory while the overwrite is half done meets a record that
fails its checksum. It must treat the memory as forgotten just now (as it does when the
overwrite is whole), not raise ``CorruptRecordError``.

Deterministic here: two handles in one process (each with its own descriptors and view,
as two processes), the erase's overwrite stopped halfway while the other handle reads."""

from __future__ import annotations

import os

import pytest

import fastmem
from fastmem.storage import engine as _engine, erase as _erase
from fastmem.storage.index import F_ID


@pytest.fixture(autouse=True)
def backend():
    """File I/O and views are the same under both kernel backends: one run."""
    yield fastmem.BACKEND


def _race(tmp_path, monkeypatch, read) -> list[str]:
    """``read(reader)``, where the reader's first decode of memory m1 meets the writer's
    erase of m1 with half of each overwrite written (the rest never is: the test ends)."""
    path = str(tmp_path / "s")
    writer = fastmem.open(path, embedder=None, dim=4)
    ids = [writer.add(f"memory {i} " + "x" * 200, embedding=[1.0, i, 0, 0]) for i in range(3)]
    writer.update(ids[1], metadata={"changed": True})  # an update record too: two records to erase
    reader = fastmem.open(path, embedder=None)
    assert len(reader) == 3  # caught up before the forget
    real_write_at, real_decode = _erase.write_at, _engine.Engine.decode
    halves: list[tuple[int, bytes, int]] = []  # (the rest of each overwrite, never written)

    def half_written(fd: int, data: bytes, offset: int) -> bool:
        half = len(data) // 2
        os.pwrite(fd, data[:half], offset)
        halves.append((fd, data[half:], offset + half))
        return True

    def decode(self, row, *args, **kwargs):  # the reader, between its catch-up and its read
        if self is reader._engine and int(row[F_ID]) == 1 and not halves:
            monkeypatch.setattr(_erase, "write_at", half_written)
            writer.forget(ids[1])
        return real_decode(self, row, *args, **kwargs)

    monkeypatch.setattr(_engine.Engine, "decode", decode)
    try:
        return read(reader)
    finally:
        monkeypatch.setattr(_engine.Engine, "decode", real_decode)
        monkeypatch.setattr(_erase, "write_at", real_write_at)
        writer.close()
        reader.close()


def test_iterating_while_another_writer_erases_skips_the_memory(tmp_path, monkeypatch):
    texts = _race(tmp_path, monkeypatch, lambda reader: [m.text[:8] for m in reader])
    assert texts == ["memory 0", "memory 2"]
