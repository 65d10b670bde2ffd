"""The data file's map with room past the file's end (``fastmem._kernels._ext.reader.DataMap``): what
its readers see is what ``mmap.mmap(fd, size, access=ACCESS_READ)`` shows, a catch-up shows
more of the same map as the file grows (no new map), and a file cut back, or grown past the
room, is mapped again."""

from __future__ import annotations

import mmap
import os
from typing import Any

import numpy as np
import pytest

import fastmem
from fastmem import _kernels
from fastmem.storage import handle_state as _state

ext = pytest.importorskip("fastmem._kernels._ext.reader")

QUIET = {"embedder": None, "summarizer": None, "policy": fastmem.ContextPolicy(preload=0, recent=0)}


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(256)) * 40)
    fd = os.open(path, os.O_RDWR | os.O_APPEND)
    yield fd
    os.close(fd)


@pytest.mark.kernels_unused
def test_it_reads_as_a_read_only_mmap_does(data_file):
    fd = data_file
    room = ext.DataMap(fd, 10240, 1 << 20)
    plain = mmap.mmap(fd, 10240, access=mmap.ACCESS_READ)
    for item in [0, 255, -1, -10240, slice(0, 10), slice(10230, 20000), slice(-5, None),
                 slice(10, 5), slice(0, 30, 7), slice(None)]:  # fmt: skip
        assert room[item] == plain[item], item
    for item in [10240, -10241]:
        with pytest.raises(IndexError):
            room[item]
    assert len(room) == 10240
    assert bytes(memoryview(room)) == plain[:]
    array = np.frombuffer(room, dtype=np.uint8)
    assert not array.flags.writeable and array[300] == 300 % 256
    with pytest.raises(BufferError):
        room.close()  # a buffer of it is held, as mmap refuses
    del array
    with pytest.raises(TypeError):
        memoryview(room)[0] = 1
    room.madvise(mmap.MADV_WILLNEED, 4096, 4096)
    room.close()
    assert room.closed
    with pytest.raises(ValueError):
        room[0]
    with pytest.raises(ValueError):
        len(room)
    plain.close()


@pytest.mark.kernels_unused
def test_grow_shows_the_bytes_appended_within_its_room(data_file):
    fd = data_file
    room = ext.DataMap(fd, 10240, 16384)
    os.write(fd, b"appended")
    assert room.grow(10248) and len(room) == 10248 and room[-8:] == b"appended"
    assert not room.grow(10240) and len(room) == 10248  # never less than it shows
    assert not room.grow(16385) and len(room) == 10248  # past its room: map again
    with pytest.raises(ValueError):
        ext.DataMap(fd, 100, 99)


def _texts(store: Any) -> list[str]:
    return [m.text for m in store]


def test_a_follower_keeps_one_map_while_the_file_grows_within_its_room(store_path, monkeypatch, backend):
    monkeypatch.setattr(_state, "_MAP_ROOM", 8192)  # a small room, outgrown below
    writer = fastmem.open(store_path, **QUIET)
    follower = fastmem.open(store_path, readonly=True, **QUIET)
    try:
        writer.add("first")
        assert _texts(follower) == ["first"]
        kept = follower._engine._dat
        assert (type(kept) is ext.DataMap) == (_kernels.BACKEND == "cython")
        for i in range(5):
            writer.add(f"memory {i}")
            assert follower.get(f"m{i + 1}").text == f"memory {i}"
        if _kernels.BACKEND == "cython":
            assert follower._engine._dat is kept  # shown further, not mapped again
        writer.add_many([{"text": f"long {i} " + "x" * 200} for i in range(60)])  # past the room
        assert len(follower) == 66
        assert follower._engine._dat is not kept
        assert len(follower._engine._dat) == os.path.getsize(store_path + ".dat")
        assert _texts(follower) == _texts(writer)
        assert follower.verify().ok
    finally:
        follower.close()
        writer.close()


@pytest.mark.parametrize("longer", [True, False])
def test_a_follower_meets_torn_bytes_cut_after_it_took_the_size(store_path, monkeypatch, longer):
    """A follower took the data file's size with a torn append in it; before it looks, a
    writer cut the torn bytes and (``longer``) appended a record longer than them. Its map
    shows the size it took (bytes it does not read until a scan checked them): it applies
    what is whole, and the next call the rest, through a map of the file as it is then."""
    dat_path = store_path + ".dat"
    writer = fastmem.open(store_path, **QUIET)
    follower = fastmem.open(store_path, readonly=True, **QUIET)
    try:
        writer.add("one")
        assert len(follower) == 1
        acknowledged = os.path.getsize(dat_path)
        with open(dat_path, "ab") as f:
            f.write(b"\x00" * 40)  # a killed writer's torn append
        real = _kernels.file_size
        armed = [follower._engine._fd]

        def size_then_cut(fd: int) -> int:
            size = real(fd)
            if armed and fd == armed[0]:
                armed.clear()
                assert size == acknowledged + 40
                os.truncate(dat_path, acknowledged)  # the writer cuts the torn bytes...
                if longer:  # ...and appends a longer record, before the follower looks
                    writer.add("two, a record longer than the torn bytes it replaced")
            return size

        monkeypatch.setattr(_kernels, "file_size", size_then_cut)
        n = len(follower)
        monkeypatch.undo()
        assert not armed
        assert n in ((1, 2) if longer else (1,))
        assert len(follower) == (2 if longer else 1)
        assert len(follower._engine._dat) == os.path.getsize(dat_path)
        if longer:
            assert _texts(follower)[-1].startswith("two")
        assert follower.verify().ok
    finally:
        monkeypatch.undo()
        follower.close()
        writer.close()
