"""Recovery: torn tails, lost or damaged indexes, damaged records, and SIGKILL.

What must hold whatever happened to the files: the store opens (a ``RecoveryWarning``
says what was repaired), every memory whose write completed is there byte for byte, a
memory whose record was cut is wholly absent (never garbled), and ``verify()`` is clean
once the writer has repaired the store.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import select
import signal
import struct
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import fastmem
from fastmem import _format as fmt
from fastmem import _kernels

DIM = 8
# The checkpoint time is the header's only float64 field: it is the only byte range
# (besides the header CRC) that differs between two writes of the same index.
assert fmt.IDX_HEADER.format.count("d") == 1
_TIME_AT = struct.calcsize(fmt.IDX_HEADER.format[: fmt.IDX_HEADER.format.index("d")])
CHECKPOINT_TIME = slice(_TIME_AT, _TIME_AT + 8)
HEADER_CRC = slice(fmt.IDX_HEADER_CRC_AT, fmt.IDX_HEADER_SIZE)


def _vec(seed: int) -> list[float]:
    return np.random.default_rng(seed).standard_normal(DIM).tolist()


def _open(path: str, **kwargs: Any) -> tuple[fastmem.MemoryStore, int]:
    """Open a store, collecting warnings: only RecoveryWarnings are allowed; returns how many."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store = fastmem.open(path, **kwargs)
    unexpected = [w for w in caught if not issubclass(w.category, fastmem.RecoveryWarning)]
    if unexpected:
        store.close()
        raise AssertionError(f"unexpected warnings: {[str(w.message) for w in unexpected]}")
    return store, len(caught)


def _contents(path: str) -> list[fastmem.Memory]:
    """Every live memory, oldest first, as a fresh reader sees it (must open without warning)."""
    with fastmem.open(path, readonly=True) as reader:
        return list(reader)


def _same_index_bytes(a: bytes, b: bytes) -> None:
    """Two index files are the same index: equal apart from the checkpoint time and CRC."""
    assert len(a) == len(b)
    ha, hb = fmt.unpack_idx_header(a, "a"), fmt.unpack_idx_header(b, "b")
    assert ha._replace(checkpoint_time=0.0) == hb._replace(checkpoint_time=0.0)
    assert a[: CHECKPOINT_TIME.start] == b[: CHECKPOINT_TIME.start]
    assert a[CHECKPOINT_TIME.stop : HEADER_CRC.start] == b[CHECKPOINT_TIME.stop : HEADER_CRC.start]
    layout = fmt.idx_layout(ha.rows, ha.dim, ha.types_len)
    for name, start, stop in [
        ("rows", layout.rows, layout.order),
        ("time order", layout.order, layout.vectors),
        ("vectors", layout.vectors, layout.types),
        ("types", layout.types, layout.size),
    ]:
        assert a[start:stop] == b[start:stop], f"the {name} section differs"


def _build_rich(path: str, *, dim: int | None = None) -> dict[str, str]:
    """A store with a bit of everything: a checkpoint in the middle (so the index has a base
    and a tail), changes to rows of both, forgets, custom types, vectors added after
    memories without one, metadata and summaries, timestamp ties. Returns names -> ids."""
    ids: dict[str, str] = {}
    with fastmem.open(path, dim=dim, durability="none") as s:
        ids["ada"] = s.add("The user's name is Ada.", type="fact", timestamp=100.0, session="s1")
        ids["plan"] = s.add("no vector: a plan", type="plan", timestamp=100.0, pinned=True)
        ids["uni"] = s.add(
            "ünïcødé ✓ \U0001f9e0 " * 20,  # long enough to be compressed
            type="observation",
            timestamp=50.0,
            metadata={"k": [1, 2.5, "x", b"\x00\xff", None, True], "nested": {"a": {"b": -7}}},
            embedding=_vec(1),
        )
        ids["gone"] = s.add("to be forgotten", timestamp=75.0, embedding=_vec(2))
        s.checkpoint()
        s.update(ids["ada"], importance=0.123, metadata={"changed": True})
        s.pin(ids["plan"], False)
        s.forget(ids["gone"])
        batch = s.add_many(
            [
                {"text": f"batch {i} ✓", "type": t, "timestamp": 100.0 + (i % 2), "session": sess,
                 "summary": f"b{i}", "importance": 0.05 * i, "embedding": _vec(10 + i)}
                for i, (t, sess) in enumerate(
                    [("tool_result", "s1"), ("ノート", None), ("observation", "s2"), ("fact", "s1")]
                )
            ]
        )  # fmt: skip
        ids.update({f"batch{i}": mid for i, mid in enumerate(batch)})
        s.update(batch[0], pinned=True, metadata={"tail": "update"})
        s.forget(batch[3])
        ids["last"] = s.add("the last one", timestamp=99.5, embedding=_vec(20), metadata={})
    return ids


# --- (a) a data file cut inside its last records -------------------------------------------


def _build_history(path: str) -> tuple[list[int], list[list[fastmem.Memory]], bytes, int]:
    """Write a store one change at a time; after each, note the data file's size and what
    a reader sees. Returns (sizes, snapshots, old index bytes, size the old index covers)."""
    steps: list[Callable[[fastmem.MemoryStore], Any]] = [
        lambda s: s.add("first", timestamp=1.0, type="fact"),
        lambda s: s.add_many([{"text": f"bulk {i} ü", "timestamp": 2.0} for i in range(3)]),
        lambda s: s.add("vector ✓", timestamp=2.0, embedding=_vec(3), session="s"),
        lambda s: s.checkpoint(),  # the "old" index is copied here
        lambda s: s.add("after the old checkpoint", timestamp=0.5, metadata={"a": 1}),
        lambda s: s.update("m0", importance=0.25, metadata={"new": ["meta", 1.5]}),
        lambda s: s.add("a custom type", type="observation", timestamp=3.0, embedding=_vec(4)),
        lambda s: s.pin("m1"),
        # A tombstone: each size's snapshot is what the file's first bytes say (an erase
        # would change bytes before the cut; tests/test_erase.py cuts an erase short).
        lambda s: s.forget("m2", erase=False),
        lambda s: s.add("short", timestamp=3.0),
        lambda s: s.add(
            "The last memory: ünïcødé ✓ 日本語 \U0001f9e0 and a tail of text " + "xyz" * 20,
            type="plan",
            timestamp=3.0,
            session="セッション",
            importance=0.875,
            pinned=True,
            metadata={"source": "test", "n": [1, 2, 3], "bin": b"\x00\x01\xfe"},
            summary="the last",
            embedding=_vec(5),
        ),
    ]
    sizes: list[int] = []
    snapshots: list[list[fastmem.Memory]] = []
    old_idx, old_covered = b"", 0
    with fastmem.open(path, durability="none") as s:
        sizes.append(os.path.getsize(path + ".dat"))
        snapshots.append([])
        for step in steps:
            step(s)
            size = os.path.getsize(path + ".dat")
            if size == sizes[-1]:  # a checkpoint: no record
                old_idx, old_covered = Path(path + ".idx").read_bytes(), size
                continue
            sizes.append(size)
            snapshots.append(_contents(path))
    assert snapshots[-1][-1].text.startswith("The last memory")  # newest timestamp, highest id
    return sizes, snapshots, old_idx, old_covered


@pytest.mark.slow
@pytest.mark.parametrize("idx_mode", ["full", "missing", "old"])
def test_truncated_data_file(tmp_path: Path, idx_mode: str) -> None:
    """Cut the data file at every byte of its last record (and at some bytes of the few
    before it), with the index covering everything (then stale), missing, or an older one."""
    src = str(tmp_path / "src")
    sizes, snapshots, old_idx, old_covered = _build_history(src)
    dat = Path(src + ".dat").read_bytes()
    full_idx = Path(src + ".idx").read_bytes()
    assert sizes[-1] == len(dat)

    last_start = sizes[-2]
    rng = random.Random(1234)
    earlier = range(sizes[-6], last_start)
    before_old = range(sizes[2], sizes[3], 5)  # inside the record before the old checkpoint
    cuts = sorted(
        set(range(last_start, len(dat))) | set(rng.sample(earlier, 40)) | set(sizes[-6:-1])
        | set(before_old)
    )  # fmt: skip
    assert old_covered == sizes[3] and sizes[-6] > old_covered

    path = str(tmp_path / "cut")
    for n, cut in enumerate(cuts):
        k = max(i for i, size in enumerate(sizes) if size <= cut)
        expected, boundary = snapshots[k], sizes[k]
        Path(path + ".dat").write_bytes(dat[:cut])
        idx = {"full": full_idx, "old": old_idx, "missing": None}[idx_mode]
        if idx is None:
            Path(path + ".idx").unlink(missing_ok=True)
        else:
            Path(path + ".idx").write_bytes(idx)
        stale = idx_mode != "old" or cut < old_covered
        ctx = f"cut at {cut} (records end at {boundary}), index {idx_mode}"

        # A reader first: it repairs nothing, but sees every whole record and nothing else.
        reader, warned = _open(path, readonly=True)
        try:
            assert list(reader) == expected, ctx
            assert len(reader) == len(expected), ctx
            if stale:
                assert warned, ctx
        finally:
            reader.close()
        assert os.path.getsize(path + ".dat") == cut, "a reader must not change the files"

        writer, warned = _open(path, durability="none")
        try:
            # The torn tail is cut without a warning: nothing in it was acknowledged.
            assert warned == (1 if stale else 0), ctx
            assert os.path.getsize(path + ".dat") == boundary, ctx
            assert list(writer) == expected, ctx
            for m in expected:
                assert writer.get(m.id) == m, ctx
            report = writer.verify()
            assert report.ok, (ctx, report.problems)
            if n % 8 == 0 or cut == last_start:  # the writer goes on from the repaired end
                mid = writer.add("after recovery ✓", metadata={"cut": cut})
                assert writer.get(mid).metadata == {"cut": cut}
                assert writer.verify().ok, ctx
                expected = [*expected, writer.get(mid)]
        finally:
            writer.close()
        assert _contents(path) == expected, ctx  # repaired: opens without any warning


def test_reader_open_before_the_writer_repairs(store_path: str) -> None:
    """A reader that opened a torn file keeps working after the writer cuts the tail and
    writes more than it cut."""
    with fastmem.open(store_path, durability="none") as s:
        s.add("one", timestamp=1.0)
        s.add("two", timestamp=2.0)
    size = os.path.getsize(store_path + ".dat")
    with fastmem.open(store_path, durability="none") as s:
        s.add("three, torn", timestamp=3.0)
    os.truncate(store_path + ".dat", os.path.getsize(store_path + ".dat") - 3)
    reader, _ = _open(store_path, readonly=True)
    try:
        assert [m.text for m in reader] == ["one", "two"]
        writer, warned = _open(store_path, durability="none")
        with writer:
            # the index was stale (it covered the torn record); the tail was cut, quietly
            assert warned == 1 and os.path.getsize(store_path + ".dat") == size
            writer.add_many([{"text": f"new {i}", "timestamp": 4.0 + i} for i in range(3)])
            assert [m.text for m in reader] == ["one", "two", "new 0", "new 1", "new 2"]
            assert reader.verify().ok
    finally:
        reader.close()


def test_reader_sees_a_write_as_long_as_the_cut_tail(store_path: str) -> None:
    with fastmem.open(store_path, durability="none") as s:
        s.add("one", timestamp=1.0)
    size = os.path.getsize(store_path + ".dat")
    with fastmem.open(store_path, durability="none") as s:
        s.add("two", timestamp=2.0)
    torn = os.path.getsize(store_path + ".dat") - 1
    os.truncate(store_path + ".dat", torn)
    reader, _ = _open(store_path, readonly=True)
    try:
        writer, _ = _open(store_path, durability="none")
        with writer:
            assert os.path.getsize(store_path + ".dat") == size
            # A memory whose record is exactly as long as the tail that was cut.
            text = next(
                "x" * n
                for n in range(1, 100)
                if len(fmt.encode_payload({"i": 1, "t": 3.0, "x": "x" * n, "k": [writer.tokens.count("x" * n), 0]})[0])
                == torn - size - fmt.RECORD_HEADER_SIZE
            )
            mid = writer.add(text, timestamp=3.0)
            assert os.path.getsize(store_path + ".dat") == torn
            assert writer.get(mid).text == text
            assert mid in reader
    finally:
        reader.close()


def test_reader_that_sized_a_torn_tail_just_before_the_writer_cut_it(
    store_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader took the file's size with a torn append in it, and a writer cut the
    tail off before the reader mapped that size: not a raw "mmap length is greater than
    file size", the reader reads the file as it is now."""
    with fastmem.open(store_path, durability="none") as s:
        s.add_many([{"text": f"memory {i}", "timestamp": 1.0 + i} for i in range(5)])
    reader, _ = _open(store_path, readonly=True)
    with open(store_path + ".dat", "ab") as f:
        f.write(bytes(300))  # an interrupted append: blocks allocated, never written
    torn_size = os.path.getsize(store_path + ".dat")
    real_file_size = _kernels.file_size
    armed = [True]

    def file_size(fd: int) -> int:  # where a reader's call sizes the data file (its fstat)
        size = real_file_size(fd)
        if armed and size == torn_size:
            armed.clear()
            writer, warned = _open(store_path, durability="none")  # cuts the torn tail
            writer.close()
            assert warned == 0  # (quietly: nothing in it was acknowledged)
        return size

    try:
        monkeypatch.setattr(_kernels, "file_size", file_size)
        assert len(reader) == 5
        monkeypatch.undo()
        assert not armed and [m.text for m in reader] == [f"memory {i}" for i in range(5)]
        assert reader.verify().ok
    finally:
        monkeypatch.undo()
        reader.close()


def test_reader_that_sized_an_index_just_before_a_failed_delta_was_cut_off(
    store_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delta checkpoint that fails (a full disk) cuts its bytes off the index file again;
    a reader that took the index's size just before reads the index as it is now: not a
    raw "mmap length is greater than file size", nor a rebuild."""
    with fastmem.open(store_path, durability="none") as s:
        s.add_many([{"text": f"memory {i}", "timestamp": 1.0 + i} for i in range(5)])
    idx = store_path + ".idx"
    whole = os.path.getsize(idx)
    with open(idx, "ab") as f:
        f.write(b"\xff" * 5000)  # a delta being written: no slot names it yet
    real_fstat = os.fstat
    armed = [True]

    def fstat(fd: Any) -> os.stat_result:
        st = real_fstat(fd)
        if armed and st.st_size == whole + 5000:  # the reader sizes the index
            armed.clear()
            os.truncate(idx, whole)  # the failed delta's space given back
        return st

    monkeypatch.setattr(os, "fstat", fstat)
    reader, warned = _open(store_path, readonly=True)
    monkeypatch.undo()
    with reader:
        assert not armed and warned == 0  # the index was read, not rebuilt
        assert [m.text for m in reader] == [f"memory {i}" for i in range(5)]
        assert reader.verify().ok


def test_interrupted_creation(store_path: str) -> None:
    header = fmt.pack_dat_header(os.urandom(16), 0, time.time())
    for size in (4, 8, 30, fmt.DAT_HEADER_SIZE - 1):
        Path(store_path + ".dat").write_bytes(header[:size])
        with fastmem.open(store_path) as s:
            assert len(s) == 0
            s.add("works")
        assert [m.text for m in _contents(store_path)] == ["works"]
        os.remove(store_path + ".idx")


# --- (b) a lost index is rebuilt, identical ---------------------------------------------------


@pytest.mark.parametrize("dim", [None, DIM])
def test_rebuilt_index_is_identical(store_path: str, dim: int | None) -> None:
    ids = _build_rich(store_path, dim=dim)
    before = _contents(store_path)
    original = Path(store_path + ".idx").read_bytes()
    with fastmem.open(store_path, readonly=True) as r:
        hits_before = [(h.id, h.score) for h in r.search(_vec(99), 10)]
    assert [m.id for m in before] != [] and ids["gone"] not in {m.id for m in before}

    os.remove(store_path + ".idx")
    with pytest.warns(fastmem.RecoveryWarning):
        reader = fastmem.open(store_path, readonly=True)
    with reader:
        assert list(reader) == before
        assert [(h.id, h.score) for h in reader.search(_vec(99), 10)] == hits_before
    assert not os.path.exists(store_path + ".idx"), "a reader must not write the index"

    with pytest.warns(fastmem.RecoveryWarning):
        writer = fastmem.open(store_path)
    with writer:
        assert list(writer) == before
        assert writer.verify().ok
        assert [(h.id, h.score) for h in writer.search(_vec(99), 10)] == hits_before
    _same_index_bytes(original, Path(store_path + ".idx").read_bytes())
    assert _contents(store_path) == before


# --- (c) a damaged index -----------------------------------------------------------------------


def _check_damaged_index(
    path: str, damaged: bytes | None, before: list[fastmem.Memory], original: bytes
) -> None:
    """Put ``damaged`` in place of the index (None: no index file); the store must open,
    warn, and hold exactly ``before``; the writer then rewrites the index as it was."""
    if damaged is None:
        Path(path + ".idx").unlink(missing_ok=True)
    else:
        Path(path + ".idx").write_bytes(damaged)
    reader, warned = _open(path, readonly=True)
    with reader:
        assert warned >= 1
        assert list(reader) == before
    writer, warned = _open(path, durability="none")
    with writer:
        assert warned == 1
        assert list(writer) == before
        assert writer.verify().ok
    _same_index_bytes(original, Path(path + ".idx").read_bytes())
    assert _contents(path) == before


def test_index_header_byte_flips(store_path: str) -> None:
    _build_rich(store_path)
    before, original = _contents(store_path), Path(store_path + ".idx").read_bytes()
    used = fmt.IDX_HEADER.size
    padding = [used, 1000, 2048, fmt.IDX_HEADER_CRC_AT - 1]
    positions = [*range(used), *padding, *range(HEADER_CRC.start, HEADER_CRC.stop)]
    for pos in positions:
        for mask in (0x01, 0x80) if pos < used else (0xFF,):
            damaged = bytearray(original)
            damaged[pos] ^= mask
            _check_damaged_index(store_path, bytes(damaged), before, original)


@pytest.mark.parametrize(
    "damage",
    ["empty", "one byte", "half a header", "header only", "one byte short", "one byte long",
     "doubled", "garbage", "garbage, same size", "zeros", "magic, then zeros"],
)  # fmt: skip
def test_index_truncated_or_garbage(store_path: str, damage: str) -> None:
    _build_rich(store_path)
    before, original = _contents(store_path), Path(store_path + ".idx").read_bytes()
    rng = random.Random(damage)
    damaged = {
        "empty": b"",
        "one byte": original[:1],
        "half a header": original[: fmt.IDX_HEADER_SIZE // 2],
        "header only": original[: fmt.IDX_HEADER_SIZE],
        "one byte short": original[:-1],
        "one byte long": original + b"\0",
        "doubled": original + original,
        "garbage": rng.randbytes(6000),
        "garbage, same size": rng.randbytes(len(original)),
        "zeros": bytes(len(original)),
        "magic, then zeros": fmt.IDX_MAGIC + bytes(len(original) - 8),
    }[damage]
    if damage in ("one byte long", "doubled"):
        # Bytes after the commit slots are what an interrupted incremental checkpoint
        # leaves (nothing names them): the index loads as it is, without a rebuild.
        Path(store_path + ".idx").write_bytes(damaged)
        reader, warned = _open(store_path, readonly=True)
        with reader:
            assert warned == 0 and list(reader) == before and reader.verify().ok
        return
    _check_damaged_index(store_path, damaged, before, original)


def test_index_of_another_store(tmp_path: Path) -> None:
    """Same history, same sizes, another store: its index must be refused (uuid)."""
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    _build_rich(a)
    _build_rich(b)
    before, original = _contents(a), Path(a + ".idx").read_bytes()
    other = Path(b + ".idx").read_bytes()
    assert len(other) == len(original) and other != original
    _check_damaged_index(a, other, before, original)


def test_index_of_the_same_store_older_is_caught_up(store_path: str) -> None:
    """An older index of the same store is not damage: the records after it are replayed."""
    with fastmem.open(store_path, durability="none") as s:
        s.add("one", embedding=_vec(1))
        s.checkpoint()
        old = Path(store_path + ".idx").read_bytes()
        s.add("two", type="observation")
        s.update("m0", metadata={"x": 1})
        s.forget("m1")
        s.add("three")
    before, original = _contents(store_path), Path(store_path + ".idx").read_bytes()
    Path(store_path + ".idx").write_bytes(old)
    with fastmem.open(store_path, readonly=True) as r:  # no warning
        assert list(r) == before
    with fastmem.open(store_path) as w:
        assert list(w) == before and w.verify().ok
    _same_index_bytes(original, Path(store_path + ".idx").read_bytes())


def test_index_of_a_diverged_history(store_path: str) -> None:
    """An index of the same store that covers exactly as many bytes as the data file, but
    of records that were since cut and written again differently (same lengths): the
    CRC of the last record it covers tells them apart."""
    with fastmem.open(store_path, durability="none") as s:
        s.add("one", timestamp=1.0)
    size = os.path.getsize(store_path + ".dat")
    with fastmem.open(store_path, durability="none") as s:
        s.add("AAAA", timestamp=2.0)
    diverged_idx = Path(store_path + ".idx").read_bytes()
    os.truncate(store_path + ".dat", size)  # as if "AAAA" had been torn...
    os.remove(store_path + ".idx")
    with pytest.warns(fastmem.RecoveryWarning):
        s = fastmem.open(store_path, durability="none")
    with s:
        s.add("BBBB", timestamp=2.0)  # ...and another memory written in its place
    before, original = _contents(store_path), Path(store_path + ".idx").read_bytes()
    assert len(diverged_idx) == len(original) and [m.text for m in before] == ["one", "BBBB"]
    _check_damaged_index(store_path, diverged_idx, before, original)


def test_leftover_temporary_index_is_ignored(store_path: str) -> None:
    """A checkpoint killed before its rename leaves ``.idx.tmp`` behind: harmless."""
    _build_rich(store_path)
    before = _contents(store_path)
    Path(store_path + ".idx.tmp").write_bytes(b"half a checkpoint")
    with fastmem.open(store_path) as s:
        assert list(s) == before
        s.add("more")
        s.checkpoint()
    after = _contents(store_path)
    assert after[:-1] == before and after[-1].text == "more"  # "more" is the newest
    assert not os.path.exists(store_path + ".idx.tmp")


def _idx_section(original: bytes, section: str) -> int:
    h = fmt.unpack_idx_header(original, "idx")
    layout = fmt.idx_layout(h.rows, h.dim, h.types_len)
    return {
        "rows": layout.rows + fmt.INDEX_DTYPE.itemsize + fmt.INDEX_DTYPE.fields["timestamp"][1],
        "vectors": layout.vectors + h.dim + 3,
        "types": layout.types + 2,
        "time order": layout.order,
    }[section]


@pytest.mark.parametrize(
    "section",
    [
        "rows",
        "vectors",
        "types",
        "time order",
    ],
)
def test_damaged_index_body_is_found_by_verify(store_path: str, section: str) -> None:
    """The header's CRC does not cover the sections (an open reads only the header): damage
    there is what ``verify()`` is for, and deleting the index repairs it."""
    _build_rich(store_path)
    before, original = _contents(store_path), Path(store_path + ".idx").read_bytes()
    damaged = bytearray(original)
    pos = _idx_section(original, section)
    damaged[pos] ^= 0x01 if section == "time order" else 0x40
    Path(store_path + ".idx").write_bytes(bytes(damaged))
    with fastmem.open(store_path, readonly=True) as r:
        report = r.verify()
        assert not report.ok and any(p.file == "idx" for p in report.problems), report
    os.remove(store_path + ".idx")
    with pytest.warns(fastmem.RecoveryWarning):
        fastmem.open(store_path).close()
    assert _contents(store_path) == before
    _same_index_bytes(original, Path(store_path + ".idx").read_bytes())


# --- (d) a damaged record in the middle of the data file --------------------------------------


def _build_for_flips(path: str) -> tuple[list[str], dict[str, fastmem.Memory], list[int]]:
    """Nine memories, one record each; returns ids, memories by id, and record offsets."""
    offsets = []
    with fastmem.open(path, durability="none") as s:
        ids = []
        for i in range(9):
            offsets.append(os.path.getsize(path + ".dat"))
            ids.append(
                s.add(
                    f"memory {i}: ✓ ünïcødé " + "abc" * i,
                    timestamp=float(i),
                    metadata={"i": i},
                    embedding=_vec(i),
                    session="s" if i % 2 else None,
                )
            )
        offsets.append(os.path.getsize(path + ".dat"))
    return ids, {m.id: m for m in _contents(path)}, offsets


VERSION_BYTE = 4  # of a record header: magic(4) version(1) kind(1) dim(2) lengths(8) crc(4)


@pytest.mark.slow
@pytest.mark.parametrize("with_index", [True, False], ids=["index", "no index"])
def test_bit_flip_in_a_middle_record(store_path: str, with_index: bool) -> None:
    ids, memories, offsets = _build_for_flips(store_path)
    dat = Path(store_path + ".dat").read_bytes()
    idx = Path(store_path + ".idx").read_bytes()
    victim = 4
    start, end = offsets[victim], offsets[victim + 1]
    for pos in range(start, end):
        damaged = bytearray(dat)
        damaged[pos] ^= 1 << (pos % 8)
        Path(store_path + ".dat").write_bytes(bytes(damaged))
        if with_index:
            Path(store_path + ".idx").write_bytes(idx)
        else:
            Path(store_path + ".idx").unlink(missing_ok=True)
        ctx = f"bit {pos % 8} of byte {pos - start} of the record at {start}"
        for readonly in (True, False):
            store, warned = _open(store_path, readonly=readonly, durability="none")
            with store:
                assert warned == (0 if with_index else 1), ctx
                report = store.verify()
                assert not report.ok, ctx
                dat_problems = [p for p in report.problems if p.file == "dat"]
                assert [p.offset for p in dat_problems] == [start], (ctx, report.problems)
                if with_index:
                    with pytest.raises(fastmem.CorruptRecordError) as info:
                        store.get(ids[victim])
                    assert info.value.offset == start, ctx
                else:  # the rebuilt index has no row for it
                    assert ids[victim] not in store
                    with pytest.raises(fastmem.UnknownMemoryError):
                        store.get(ids[victim])
                for i, mid in enumerate(ids):
                    if i != victim:
                        assert store.get(mid) == memories[mid], ctx
        # Middle damage is not a torn tail: the writer cut nothing.
        assert os.path.getsize(store_path + ".dat") == len(dat), ctx


def test_version_byte_flip_is_reported_as_corruption(store_path: str) -> None:
    """Regression: the version byte was checked before the CRC, so get() of a record whose
    version byte was damaged raised FormatVersionError instead of CorruptRecordError."""
    ids, _, offsets = _build_for_flips(store_path)
    damaged = bytearray(Path(store_path + ".dat").read_bytes())
    damaged[offsets[4] + VERSION_BYTE] ^= 0x02
    Path(store_path + ".dat").write_bytes(bytes(damaged))
    with fastmem.open(store_path) as s:
        assert [p.offset for p in s.verify().problems if p.file == "dat"] == [offsets[4]]
        with pytest.raises(fastmem.CorruptRecordError):
            s.get(ids[4])


# --- (e) SIGKILL -----------------------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import base64, hashlib, json, os, sys, warnings
    import numpy as np
    import fastmem

    def ack(*msg):
        print(json.dumps(msg), flush=True)

    def digest(text):
        return hashlib.sha256(text.encode()).hexdigest()

    warnings.simplefilter("ignore")  # the parent checks what recovery did
    path, run, durability = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    store = fastmem.open(path, durability=durability)
    store.tokens.encoding  # loaded in the background; wait, so the kills land in writes
    ack("ready")
    rng = np.random.default_rng(run)
    mine, i = [], 0
    while True:
        if i % 7 == 6 and mine:
            mid = mine.pop(int(rng.integers(len(mine))))
            ack("forgetting", mid)  # killed from here on, it may be forgotten or not
            store.forget(mid)
            ack("forgot", mid)
        elif i % 5 == 4:
            # One bigger write (~100 KB, incompressible): a kill may land in the middle of it.
            def blob():
                return base64.b64encode(os.urandom(20_000)).decode()

            items = [
                {"text": f"run {run} batch {i}.{j} ü✓ " + blob(), "timestamp": float(i),
                 "metadata": {"run": run, "i": i, "j": j}}
                for j in range(4)
            ]
            for mid, item in zip(store.add_many(items), items):
                mine.append(mid)
                ack("add", mid, digest(item["text"]), item["metadata"])
        else:
            text = f"run {run} item {i} " + "日本" * int(rng.integers(0, 200))
            meta = {"run": run, "i": i}
            vec = rng.standard_normal(8)
            mid = store.add(text, metadata=meta, embedding=vec, timestamp=float(i))
            mine.append(mid)
            ack("add", mid, digest(text), meta)
        i += 1
    """
)

KILLS = 12  # per backend: both backends run it, so ~24 kills in all


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.slow
def test_sigkill_loses_nothing_acknowledged(tmp_path: Path, backend: str) -> None:
    path = str(tmp_path / "killed")
    env = dict(os.environ, FASTMEM_BACKEND=backend, PYTHONWARNINGS="ignore")
    rng = random.Random(f"kill-{backend}")
    acked: dict[str, tuple[str, dict[str, Any]]] = {}  # id -> (sha256 of the text, metadata)
    forgotten: set[str] = set()  # acknowledged forgets
    forgetting: set[str] = set()  # forgets that may or may not have happened
    for run in range(KILLS):
        # "always" as a rule; now and then "none": with no fsync to wait for, the child
        # spends its time in write(), so a kill tears records. The promise is the same:
        # under every mode, an acknowledged write survives the process being killed.
        durability = "none" if run % 3 == 2 else "always"
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, path, str(run), durability],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        first = ""
        try:
            if run % 4 == 3:  # now and then, kill it while it starts or opens (recovers)
                time.sleep(rng.uniform(0.05, 0.4))
            else:
                ready, _, _ = select.select([proc.stdout], [], [], 300)  # a hang guard
                assert ready, "the child did not start"
                line = proc.stdout.readline()
                if line.strip() != '["ready"]':
                    proc.kill()
                    proc.wait()
                    raise AssertionError(f"the child did not start: {line!r} {proc.stderr.read()}")
                if run % 4 == 1:  # a slow machine may not ack before a quick kill: wait for one
                    first = proc.stdout.readline()
                time.sleep(rng.uniform(0.0, 0.08))
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            out, err = first + proc.stdout.read(), proc.stderr.read()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
            proc.stderr.close()
        assert proc.returncode == -signal.SIGKILL, (proc.returncode, err)
        for line in out.splitlines():
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:  # the kill cut the line: not acknowledged to us
                continue
            if msg[0] == "add":
                assert msg[1] not in acked, f"id {msg[1]} was handed out twice"
                acked[msg[1]] = (msg[2], msg[3])
            elif msg[0] == "forgetting":
                forgetting.add(msg[1])
            elif msg[0] == "forgot":
                forgotten.add(msg[1])

        store, _ = _open(path, durability="none")
        with store:
            for mid, (text, meta) in acked.items():
                if mid in forgotten:
                    assert mid not in store, f"run {run}: forgotten {mid} is back"
                    continue
                if mid in forgetting and mid not in store:
                    continue  # killed between the forget and its acknowledgement
                m = store.get(mid)
                assert (_digest(m.text), m.metadata) == (text, meta), f"run {run}: {mid}"
            assert len(store) >= len(acked) - len(forgetting)
            report = store.verify()
            assert report.ok, (run, report.problems)
    assert len(acked) >= KILLS // 4, "the children acknowledged too little to test anything"
    assert _contents(path)  # repaired: a reader opens it without a warning


@pytest.mark.parametrize("lost", ["first page", "last page"])
def test_a_partly_persisted_unsynced_append_is_cut_as_a_torn_append(store_path: str, lost: str) -> None:
    """A power loss kept an unsynced append's size and some of its pages, not all (a page
    not kept reads as zeros): a torn tail by the rule (docs/format.md, "What is cut, and
    what is kept"), cut by the next writer without a warning; verify() is clean before
    and after (tests/test_torn_append.py has more of it)."""
    with fastmem.open(store_path, durability="always") as s:
        s.add("first")
        s.add("second, acknowledged")
    acknowledged = os.path.getsize(store_path + ".dat")
    with fastmem.open(store_path, durability="none") as s:
        s.add("never synced " + " ".join(hashlib.sha256(b"%d" % i).hexdigest() for i in range(200)))
    data = bytearray(Path(store_path + ".dat").read_bytes())
    assert len(data) - acknowledged > 3 * 4096  # the append spans pages
    page = (acknowledged // 4096 + 1) * 4096
    lost_range = slice(acknowledged, page) if lost == "first page" else slice(len(data) // 4096 * 4096, len(data))
    data[lost_range] = bytes(len(data[lost_range]))
    Path(store_path + ".dat").write_bytes(bytes(data))
    os.remove(store_path + ".idx")  # no checkpoint had covered it
    s, warned = _open(store_path)
    with s:
        assert warned == 1  # the index rebuilt; the torn append cut quietly
        assert os.path.getsize(store_path + ".dat") == acknowledged
        assert [m.text for m in s] == ["first", "second, acknowledged"]
        s.add("third")
        assert s.verify().ok
    assert [m.text for m in _contents(store_path)] == ["first", "second, acknowledged", "third"]


def test_damaged_last_record_is_kept_not_cut(store_path: str) -> None:
    """A whole last record that fails its CRC may be an acknowledged memory hit by bit rot:
    the writer keeps its bytes (verify() reports them) instead of cutting them as a torn
    write, and goes on appending after them."""
    with fastmem.open(store_path, durability="always") as s:
        s.add("first")
        s.add("second, acknowledged")
    data = bytearray(Path(store_path + ".dat").read_bytes())
    data[-3] ^= 0x10
    Path(store_path + ".dat").write_bytes(bytes(data))
    os.remove(store_path + ".idx")
    with pytest.warns(fastmem.RecoveryWarning) as caught:
        s = fastmem.open(store_path)
    assert any("damaged bytes at the end" in str(w.message) for w in caught)
    with s:
        assert os.path.getsize(store_path + ".dat") == len(data)
        assert [m.text for m in s] == ["first"]
        s.add("third")
        report = s.verify()
        assert not report.ok and [p.file for p in report.problems] == ["dat"]
    with fastmem.open(store_path, readonly=True) as r:
        assert [m.text for m in r] == ["first", "third"]
