"""A multi-record write (``add_many``, ``forget_many``) is atomic to readers: another handle
catching up while the write is under way sees all of it or none of it (the batch frame,
docs/format.md). The writer's bytes are written in two steps here, with the check of a
second handle between them, through the engine's one write function."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastmem
from fastmem.storage import engine as _engine
from fastmem import _kernels
from fastmem import _format as fmt
from fastmem.errors import FormatVersionError, RecoveryWarning

QUIET: dict[str, Any] = {"embedder": None, "summarizer": None,
                         "policy": fastmem.ContextPolicy(preload=0, recent=0)}  # fmt: skip


def _items(n: int, tag: str = "batch") -> list[dict[str, Any]]:
    return [{"text": f"{tag} memory {i} " + "words " * 40, "embedding": np.ones(8) + i}
            for i in range(n)]  # fmt: skip


def _split_writes(monkeypatch: pytest.MonkeyPatch, at: Callable[[bytes], int],
                  between: Callable[[], None]) -> list[int]:  # fmt: skip
    """Make the engine's writes of more than one record go in two steps: the first
    ``at(bytes)`` bytes, then ``between()``, then the rest. Returns the sizes written."""
    real = _engine._write_all
    sizes: list[int] = []

    def split(fd: int, data: Any) -> None:
        view = memoryview(data)
        sizes.append(len(view))
        if len(view) < 2 * fmt.RECORD_HEADER_SIZE:
            real(fd, view)
            return
        cut = at(bytes(view))
        real(fd, view[:cut])
        between()
        real(fd, view[cut:])

    monkeypatch.setattr(_engine, "_write_all", split)
    return sizes


def _ids(store: fastmem.MemoryStore) -> list[str]:
    return store.ids()


@pytest.mark.parametrize("where", ["half", "after-first-record", "one-byte-short"])
def test_a_reader_sees_a_batch_whole_or_not_at_all(
    store_path: str, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    writer = fastmem.open(store_path, durability="none", **QUIET)
    writer.add("before", embedding=np.ones(8))
    reader = fastmem.open(store_path, readonly=True, **QUIET)
    assert len(_ids(reader)) == 1
    seen: list[int] = []

    def at(data: bytes) -> int:
        if where == "half":
            return len(data) // 2
        if where == "one-byte-short":
            return len(data) - 1
        # just past the first memory record (and the frame before it, if there is one)
        pos = 0
        while True:
            _, _, kind, dim, plen, _, _ = fmt.RECORD_HEADER.unpack_from(data, pos)
            pos += fmt.record_size(dim, plen)
            if kind == fmt.KIND_MEMORY:
                return pos

    def between() -> None:
        seen.append(len(_ids(reader)))

    _split_writes(monkeypatch, at, between)
    writer.add_many(_items(50))
    assert seen == [1], "the reader saw part of the batch while it was being written"
    assert len(_ids(reader)) == 51
    assert reader.verify().ok
    writer.close()
    reader.close()


def test_a_forget_of_many_is_whole_or_nothing(
    store_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = fastmem.open(store_path, durability="none", **QUIET)
    ids = writer.add_many(_items(20))
    reader = fastmem.open(store_path, readonly=True, **QUIET)
    seen: list[int] = []
    _split_writes(monkeypatch, lambda data: len(data) // 2, lambda: seen.append(len(_ids(reader))))
    writer.forget_many(ids[:10], erase=False)
    assert seen == [20]
    assert len(_ids(reader)) == 10
    writer.close()
    reader.close()


def test_a_batch_cut_short_by_a_crash_is_dropped_quietly(store_path: str) -> None:
    """A batch whose last records never reached the file (the writer was killed mid-write)
    is a torn append: the next writer cuts all of it, with no RecoveryWarning, and no
    reader ever took part of it."""
    with fastmem.open(store_path, durability="none", **QUIET) as s:
        s.add("before", embedding=np.ones(8))
    start = os.path.getsize(store_path + ".dat")
    index = Path(store_path + ".idx").read_bytes()  # the index before the batch: no crash
    with fastmem.open(store_path, durability="none", **QUIET) as s:  # leaves a later one
        s.add_many(_items(30))
    Path(store_path + ".idx").write_bytes(index)
    data = Path(store_path + ".dat").read_bytes()
    # cut at the end of a record in the middle of the batch: whole records only remain
    offsets = _kernels.scan_records(data, start, len(data))[0]
    cut = int(offsets[len(offsets) // 2])
    with open(store_path + ".dat", "r+b") as f:
        f.truncate(cut)
    with fastmem.open(store_path, readonly=True, **QUIET) as r:
        assert len(r.ids()) == 1
        assert r.verify().ok  # a torn tail is not damage
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecoveryWarning)
        with fastmem.open(store_path, **QUIET) as s:
            assert len(s.ids()) == 1
            assert s.verify().ok
            new = s.add_many(_items(3, "later"))
    assert os.path.getsize(store_path + ".dat") > start
    with fastmem.open(store_path, readonly=True, **QUIET) as r:
        assert r.ids() == [r.ids()[0], *new]
        assert r.verify().ok


def test_a_damaged_record_inside_a_whole_batch_keeps_the_others(store_path: str) -> None:
    """Bit rot in an acknowledged batch: the batch's other records are kept (as any other
    records are), the damage is reported."""
    with fastmem.open(store_path, durability="none", **QUIET) as s:
        s.add("before", embedding=np.ones(8))
        start = os.path.getsize(store_path + ".dat")
        s.add_many(_items(10))
        s.add("after", embedding=np.ones(8))
    data = bytearray(Path(store_path + ".dat").read_bytes())
    offsets = _kernels.scan_records(bytes(data), start, len(data))[0]
    data[int(offsets[4]) + 30] ^= 0x40
    Path(store_path + ".dat").write_bytes(bytes(data))
    Path(store_path + ".idx").unlink()
    with pytest.warns(RecoveryWarning):
        r = fastmem.open(store_path, readonly=True, **QUIET)
    with r:
        assert len(r.ids()) == 1 + 9 + 1
        report = r.verify()
        assert not report.ok and [p.offset for p in report.problems] == [int(offsets[4])]


def test_the_frame_is_honoured_by_the_scan_twins() -> None:
    """The compiled scan and its numpy reference agree on a frame that is whole, cut short
    and followed by damage."""
    from fastmem._kernels import reference as _kernels_py

    frame = fmt.pack_batch_frame(2)
    stored, raw = fmt.encode_payload({"i": 1, "t": 0.0})
    one = _kernels_py.frame_records(fmt.KIND_FORGET, [stored] * 2,
                                    np.array([raw] * 2, dtype=np.uint32), None, None)[0]  # fmt: skip
    head = bytes(fmt.DAT_HEADER_SIZE)
    cases = [head + frame + one, head + frame + one[:-3], head + frame + one[: len(one) // 2],
             head + frame + one + frame, head + frame + bytes(7) + one]  # fmt: skip
    first, size = fmt.DAT_HEADER_SIZE + fmt.BATCH_FRAME_SIZE, len(one) // 2
    want_good = [[first, first + size], [], [], [first, first + size],
                 [first + 7, first + 7 + size]]  # fmt: skip
    for data, good in zip(cases, want_good):
        got = [_kernels.scan_records(data, fmt.DAT_HEADER_SIZE, len(data)),
               _kernels_py.scan_records(data, fmt.DAT_HEADER_SIZE, len(data))]  # fmt: skip
        for a, b in zip(*got):
            assert a.tolist() == b.tolist()
        assert got[0][0].tolist() == good


def test_a_store_with_frames_says_version_2(store_path: str) -> None:
    """The previous release reads data file version 1 only and refuses any other with
    FormatVersionError (at open, before any record): a store that may hold frames says 2."""
    with fastmem.open(store_path, **QUIET) as s:
        s.add_many(_items(3))
    head = Path(store_path + ".dat").read_bytes()[: fmt.DAT_HEADER_SIZE]
    assert int.from_bytes(head[8:10], "little") == fmt.FORMAT_VERSION == 2
    damaged = head[:8] + (3).to_bytes(2, "little") + head[10:60]
    with pytest.raises(FormatVersionError):  # and this release refuses a later one
        fmt.unpack_dat_header(damaged + fmt.crc32(damaged).to_bytes(4, "little"), "x")


def test_a_store_of_the_previous_version_is_raised_by_its_first_batch(tmp_path: Path) -> None:
    """A version 1 data file (written by the release before batch frames) opens and reads;
    the first batch written to it raises its header to version 2 first (same fields), so
    that the previous release refuses it from then on instead of misreading a frame."""
    import shutil

    fixtures = Path(__file__).parent / "fixtures" / "v1"
    for name in ("store.dat", "store.idx"):
        shutil.copy(fixtures / name, tmp_path / name)
    path = str(tmp_path / "store")
    before = Path(path + ".dat").read_bytes()
    assert fmt.unpack_dat_header(before, "").version == 1
    with fastmem.open(path, **QUIET) as s:
        s.add("one record: no frame", embedding=np.ones(8))
        assert fmt.unpack_dat_header(Path(path + ".dat").read_bytes(), "").version == 1
        assert s.stats().format_version == 1  # what the file says, not what this release writes
        ids = s.add_many(_items(3))
        assert s.stats().format_version == 2
    after = Path(path + ".dat").read_bytes()
    new, old = fmt.unpack_dat_header(after, ""), fmt.unpack_dat_header(before, "")
    assert new.version == 2 and new._replace(version=1) == old
    assert after[fmt.DAT_HEADER_SIZE : len(before)] == before[fmt.DAT_HEADER_SIZE :]
    with fastmem.open(path, readonly=True, **QUIET) as r:
        assert r.verify().ok and len(r) == 5 + 1 + 3 and r.get(ids[2]).text.startswith("batch memory 2")


def _mixed(n: int) -> list[dict[str, Any]]:
    types = [None, "fact", "journal", "plan", "ñote"]
    return [{"text": f"mixed {i} " + "x" * (i % 300), "type": types[i % 5],
             "session": None if i % 3 == 0 else f"s{i % 7}", "timestamp": 1e9 + i,
             "importance": (i % 10) / 10, "pinned": i % 4 == 0,
             "metadata": {"n": i} if i % 6 == 0 else None,
             "embedding": np.ones(8) + (i % 13)} for i in range(n)]  # fmt: skip


def test_a_batch_packed_in_blocks_writes_the_bytes_of_one_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large batch is packed and written a block at a time: the files are the same as
    when it is packed whole, and a reader between two blocks sees none of it."""
    files = []
    for block in (10**9, 7):
        monkeypatch.setattr(_engine, "PACK_BLOCK", block)
        path = str(tmp_path / f"s{block}")
        with fastmem.open(path, durability="none", **QUIET) as s:
            s.add("before", embedding=np.ones(8), timestamp=1e9)
            with mock_time():
                s.add_many(_mixed(100))
                s.add_many(_mixed(30))
            with fastmem.open(path, readonly=True, **QUIET) as r:  # the rows as written
                assert r.verify().ok and len(r) == 131
                files.append([Path(path + ".dat").read_bytes()[fmt.DAT_HEADER_SIZE :],
                              [tuple(m)[:-1] for m in r], r.vector("m100").tolist()])  # fmt: skip
    assert files[0] == files[1]
    path = str(tmp_path / "s7")

    writer = fastmem.open(path, durability="none", **QUIET)
    reader = fastmem.open(path, readonly=True, **QUIET)
    seen: list[int] = []
    real = _engine._write_all

    def blockwise(fd: int, data: Any) -> None:
        real(fd, data)
        seen.append(len(reader.ids()))

    monkeypatch.setattr(_engine, "_write_all", blockwise)
    writer.add_many(_mixed(20))
    assert seen == [131, 131, 131, 151]  # after the frame, each block; whole after the last
    writer.close()
    reader.close()


def test_a_block_that_fails_to_pack_cuts_the_batch_back(
    store_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_engine, "PACK_BLOCK", 5)
    real = _engine.frame_batch
    calls = []

    def failing(batch: Any, *args: Any) -> Any:
        calls.append(len(batch))
        if len(calls) == 3:
            raise MemoryError("no memory for the third block")
        return real(batch, *args)

    with fastmem.open(store_path, durability="none", **QUIET) as s:
        s.add("before", embedding=np.ones(8))
        size = os.path.getsize(store_path + ".dat")
        monkeypatch.setattr(_engine, "frame_batch", failing)
        with pytest.raises(MemoryError):
            s.add_many(_mixed(12))
        assert os.path.getsize(store_path + ".dat") == size and len(s) == 1
        monkeypatch.setattr(_engine, "frame_batch", real)
        assert s.add_many(_mixed(12))[0] == "m1"  # the ids the failed call did not take
        assert s.verify().ok and len(s) == 13 and s.types().get("ñote") == 2


def mock_time() -> Any:
    from unittest import mock

    return mock.patch("fastmem.store.time.time", return_value=1_767_300_000.0)


@pytest.mark.parametrize("case", ["whole", "cut", "damaged", "cut-at-a-record"])
def test_the_catch_up_reads_a_big_batch_a_chunk_at_a_time(
    store_path: str, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """A reader far behind reads a batch larger than its scan's chunk a chunk at a time
    (not the whole batch in one read), with the full scan's answer, whether the batch is
    whole, cut short or damaged inside."""
    from fastmem.storage import replay as _replay

    with fastmem.open(store_path, durability="none", **QUIET) as s:
        s.add("before", embedding=np.ones(8))
        start = os.path.getsize(store_path + ".dat")
        s.add_many(_mixed(2000))  # ~250 KB: past the small scan's 64 KiB
        s.add_many(_mixed(3))
        s.add("after", embedding=np.ones(8))
    data = bytearray(Path(store_path + ".dat").read_bytes())
    offsets = _kernels.scan_records(bytes(data), start, len(data))[0]
    if case == "cut":
        data = data[: int(offsets[1500]) + 50]
    elif case == "cut-at-a-record":
        data = data[: int(offsets[1500])]
    elif case == "damaged":
        data[int(offsets[200]) + 25] ^= 1
    Path(store_path + ".dat").write_bytes(bytes(data))
    chunk = 8192
    monkeypatch.setattr(_replay, "_SCAN_CHUNK", chunk)
    reads: list[int] = []
    real = os.pread

    def pread(fd: int, n: int, at: int) -> bytes:
        reads.append(n)
        return real(fd, n, at)

    monkeypatch.setattr(_replay.os, "pread", pread)
    fd = os.open(store_path + ".dat", os.O_RDONLY)
    try:
        got = _replay.scan_file(fd, start, len(data))
    finally:
        os.close(fd)
    monkeypatch.undo()
    want = _kernels.scan_records(bytes(data), start, len(data))
    for a, b in zip(got, want):
        assert a.tolist() == b.tolist()
    assert len(got[0]) == {"whole": 2004, "cut": 0, "cut-at-a-record": 0, "damaged": 2003}[case]
    if case != "damaged":  # (damage inside: those bytes are scanned whole, as before)
        assert max(reads) <= chunk


def test_an_erase_never_writes_over_a_batch_frame() -> None:
    """A pending erase whose span names a batch frame (a damaged forget record, or one of
    another data file) does not own it: an erase writes over memory and update records only."""
    from fastmem.storage import erase as _erase

    frame = fmt.pack_batch_frame(5)
    for kind in (fmt.KIND_MEMORY, fmt.KIND_UPDATE):
        assert not _erase._owned(frame, len(frame), kind, 0)
        assert not _erase._owned(frame, len(frame), kind, 5)


def test_a_failed_raise_of_the_header_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The header of a version 1 file cannot be written (an I/O error): the batch raises,
    nothing is appended, the file stays version 1, and the next batch raises it."""
    import errno
    import shutil

    for name in ("store.dat", "store.idx"):
        shutil.copy(Path(__file__).parent / "fixtures" / "v1" / name, tmp_path / name)
    path = str(tmp_path / "store")
    size = os.path.getsize(path + ".dat")

    def failing(fd: int, data: bytes, at: int) -> int:
        raise OSError(errno.EIO, "injected")

    with fastmem.open(path, **QUIET) as s:
        monkeypatch.setattr(os, "pwrite", failing)
        with pytest.raises(OSError, match="injected"):
            s.add_many(_mixed(3))
        monkeypatch.undo()
        assert os.path.getsize(path + ".dat") == size and len(s) == 5
        assert fmt.unpack_dat_header(Path(path + ".dat").read_bytes(), "").version == 1
        s.add_many(_mixed(3))
        assert s.verify().ok and len(s) == 8  # (appended at the end: O_APPEND is back)
    assert fmt.unpack_dat_header(Path(path + ".dat").read_bytes(), "").version == 2


def test_a_frame_the_scanned_bytes_end_inside_is_left_for_a_later_call(store_path: str) -> None:
    """A catch-up scans up to the size it took; the file may grow before it reads the last
    batch's frame. A frame that starts before that end and reaches past it is not read: its
    count would make the scan of the batch start past the end (pread of a negative length,
    EINVAL, seen once with eight processes)."""
    from fastmem.storage.replay import kept_last_batch, scan_file

    with fastmem.open(store_path, durability="none", **QUIET) as store:
        store.add("before", embedding=np.ones(8))
        frame_at = os.path.getsize(store_path + ".dat")
        store.add_many(_items(5))
    fd = os.open(store_path + ".dat", os.O_RDONLY)
    try:
        for end in (frame_at + 1, frame_at + fmt.BATCH_FRAME_SIZE - 1):
            scanned = scan_file(fd, fmt.DAT_HEADER_SIZE, end)
            kept = kept_last_batch(fd, scanned, end)
            assert all(a is b for a, b in zip(kept, scanned)), "bytes past the end were taken"
            assert len(kept[0]) == 1
    finally:
        os.close(fd)
