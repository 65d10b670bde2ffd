"""Incremental checkpoints (index version 2): a delta appended to the index file and
committed by one of its two slots, instead of the whole index written again.

Deltas are written only over a full checkpoint of ``DELTA_MIN_BASE`` rows or more; these
tests lower it so that small stores take the delta path. Each compares what a delta
gives with the same store read from its data file alone (the index deleted: rebuilt).
Their forgets are tombstones (``erase=False``): an erase of a checkpointed memory writes a
full checkpoint (tests/test_erase.py)."""

from __future__ import annotations

import errno
import mmap
import os
import shutil
import signal
import struct
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fastmem
from fastmem import _format as fmt
from fastmem.storage import index as _index

FIXTURES = Path(__file__).parent / "fixtures"
DIM = 8
WORDS = ["lisbon", "flights", "hotel", "vegetarian", "budget", "museum", "train"]


@pytest.fixture(autouse=True)
def small_deltas(monkeypatch):
    monkeypatch.setattr(_index, "DELTA_MIN_BASE", 1)


def _items(first: int, n: int) -> list[dict]:
    rng = np.random.default_rng(first)
    return [
        {"text": f"memory {i} about {WORDS[i % 7]} and {WORDS[(i * 3) % 7]}",
         "embedding": rng.standard_normal(DIM), "timestamp": 1000.0 + i,
         "session": f"s{i % 3}", "type": ["fact", "note", "plan"][i % 3]}
        for i in range(first, first + n)
    ]  # fmt: skip


def _view(path: str) -> dict:
    """What a reader sees: every memory, a vector and a keyword search, the counters."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with fastmem.open(path, readonly=True) as store:
            q = np.random.default_rng(7).standard_normal(DIM)
            return {
                "memories": list(store),
                "recent": store.recent(5),
                "vector": [(h.id, round(h.score, 5)) for h in store.search(q, 10, mode="vector")],
                "keyword": [(h.id, round(h.score, 5)) for h in store.search("hotel budget", 10, mode="keyword")],
                "len": len(store),
                "verify": store.verify().ok,
            }  # fmt: skip


def _rebuilt_view(path: str, tmp: Path) -> dict:
    """The same store read from its data file alone."""
    copy = tmp / "rebuilt"
    shutil.rmtree(copy, ignore_errors=True)
    copy.mkdir()
    shutil.copy(path + ".dat", copy / "s.dat")
    with pytest.warns(fastmem.RecoveryWarning):
        fastmem.open(str(copy / "s")).close()
    return _view(str(copy / "s"))


def _header(path: str) -> fmt.IdxHeader:
    return fmt.unpack_idx_header(Path(path + ".idx").read_bytes(), path)


def _slot(path: str) -> fmt.Slot | None:
    raw = Path(path + ".idx").read_bytes()
    return fmt.current_slot(raw, fmt.slots_at(fmt.header_layout(fmt.unpack_idx_header(raw, ""))))[1]


def _build(path: str, n: int = 80) -> list[str]:
    with fastmem.open(path, dim=DIM) as store:
        ids = store.add_many(_items(0, n))
        store.checkpoint()  # a full one: the base was empty
    assert _header(path).rows == n and _slot(path) is None
    return ids


def test_a_delta_holds_new_changed_and_forgotten_memories(store_path, tmp_path):
    ids = _build(store_path)
    inode = os.stat(store_path + ".idx").st_ino
    with fastmem.open(store_path, dim=DIM) as store:
        store.add_many(_items(40, 5))
        store.update(ids[3], importance=0.05, metadata={"edited": True})
        store.pin(ids[4])
        store.forget(ids[5], erase=False)
        store.add("a custom type", type="journal", embedding=np.ones(DIM))
    # The same file, its full checkpoint untouched, a delta named by a slot.
    assert os.stat(store_path + ".idx").st_ino == inode
    assert _header(store_path).rows == 80 and _slot(store_path) is not None
    view = _view(store_path)
    assert view == _rebuilt_view(store_path, tmp_path)
    assert view["len"] == 85 and view["verify"]


@pytest.mark.parametrize("first", ["search", "add", "forget", "rows", "pin"])
def test_the_postings_are_made_at_their_first_use_and_equal_a_rebuild(store_path, tmp_path, first):
    """A restart (open, the newest memories) leaves the keyword postings unmade (issue 21);
    whichever call uses them first (with a delta's rows, changed and forgotten rows to
    apply), keyword search then answers as the same store read from its data file alone."""
    ids = _build(store_path)
    with fastmem.open(store_path, dim=DIM) as store:
        store.add_many(_items(80, 5))
        store.update(ids[3], importance=0.05)
        store.forget(ids[5], erase=False)
    assert _slot(store_path) is not None
    copy = tmp_path / "rebuilt"
    copy.mkdir()
    shutil.copy(store_path + ".dat", copy / "s.dat")
    views = []
    for path in (store_path, str(copy / "s")):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", fastmem.RecoveryWarning)  # the copy's rebuild
            store = fastmem.open(path, dim=DIM)
        with store:
            store.recent(5)
            if path == store_path:
                assert store._engine.index._keyword is None and store._engine.index._keyword_tail
            if first == "add":
                store.add("hotel budget once more", embedding=np.ones(DIM))
            elif first == "forget":
                store.forget(ids[6], erase=False)
            elif first == "rows":
                list(store)
            elif first == "pin":
                store.pin(ids[7])
            hits = store.search("hotel budget", 20, mode="keyword")
            views.append([(h.id, round(h.score, 5)) for h in hits])
    assert views[0] == views[1] and len(views[0]) == 20


def test_deltas_alternate_slots_and_each_supersedes_the_last(store_path, tmp_path):
    ids = _build(store_path)
    generations = []
    for r in range(4):
        with fastmem.open(store_path, dim=DIM) as store:
            store.add_many(_items(100 + 10 * r, 2))
            store.forget(ids[r], erase=False)
        slot = _slot(store_path)
        assert slot is not None
        generations.append(slot.generation)
        assert _view(store_path) == _rebuilt_view(store_path, tmp_path)
    assert generations == [1, 2, 3, 4]


def test_a_reader_keeps_its_view_across_deltas(store_path):
    _build(store_path)
    with fastmem.open(store_path, readonly=True) as reader:
        before = list(reader)
        with fastmem.open(store_path, dim=DIM) as writer:
            new = writer.add_many(_items(200, 4))
            writer.checkpoint()
            writer.add("after the delta", embedding=np.ones(DIM))
            writer.checkpoint()
        assert [m.id for m in reader][: len(before)] == [m.id for m in before]
        assert all(reader.get(mid).text for mid in new)  # replayed from the data file
        assert reader.verify().ok


def test_a_torn_slot_falls_back_to_the_other_one(store_path, tmp_path):
    _build(store_path)
    for r in range(2):
        with fastmem.open(store_path, dim=DIM) as store:
            store.add_many(_items(300 + 10 * r, 3))
    raw = bytearray(Path(store_path + ".idx").read_bytes())
    layout = fmt.header_layout(fmt.unpack_idx_header(bytes(raw), ""))
    at = fmt.slots_at(layout)
    which, newest = fmt.current_slot(bytes(raw), at)
    assert newest is not None and newest.generation == 2
    raw[at + (1 - which) * fmt.SLOT_PAGE + 12] ^= 0x10  # the newest slot: a torn write
    Path(store_path + ".idx").write_bytes(bytes(raw))
    older = _slot(store_path)
    assert older is not None and older.generation == 1
    # The older delta is whole; the records after it are replayed from the data file.
    assert _view(store_path) == _rebuilt_view(store_path, tmp_path)


def _build_with_delta(path: str, first: int) -> fmt.Slot:
    _build(path)
    with fastmem.open(path, dim=DIM) as store:
        store.add_many(_items(first, 3))
    slot = _slot(path)
    assert slot is not None
    return slot


def test_an_interrupted_delta_is_ignored(store_path, tmp_path):
    _build_with_delta(store_path, 400)
    expected = _view(store_path)
    with open(store_path + ".idx", "ab") as f:  # appended, never named by a slot
        f.write(fmt.DELTA_MAGIC + os.urandom(500))
    assert _view(store_path) == expected
    with fastmem.open(store_path, dim=DIM) as store:
        store.add("after it", embedding=np.ones(DIM))
    assert _view(store_path) == _rebuilt_view(store_path, tmp_path)


def test_a_damaged_delta_header_rebuilds_the_index(store_path, tmp_path):
    slot = _build_with_delta(store_path, 500)
    raw = bytearray(Path(store_path + ".idx").read_bytes())
    raw[slot.offset + 9] ^= 1
    Path(store_path + ".idx").write_bytes(bytes(raw))
    with pytest.warns(fastmem.RecoveryWarning, match="rebuilt"):
        fastmem.open(store_path, readonly=True).close()
    with pytest.warns(fastmem.RecoveryWarning):
        fastmem.open(store_path, dim=DIM).close()
    assert _view(store_path) == _rebuilt_view(store_path, tmp_path)


def test_a_delta_from_another_handle_is_superseded_whole(store_path, tmp_path):
    """Two writers: each checkpoint holds everything either wrote (the one holding the
    lock has applied the other's records first)."""
    _build(store_path)
    a = fastmem.open(store_path, dim=DIM)
    b = fastmem.open(store_path, dim=DIM)
    try:
        a.add_many(_items(600, 2))
        b.add_many(_items(610, 2))
        b.forget("m1", erase=False)
        b.close()
        assert _slot(store_path) is not None
        a.add("last", embedding=np.ones(DIM))
    finally:
        a.close()
    view = _view(store_path)
    assert view == _rebuilt_view(store_path, tmp_path) and view["len"] == 84


def test_a_full_checkpoint_elsewhere_makes_the_next_one_full(store_path, tmp_path, monkeypatch):
    _build(store_path)
    a = fastmem.open(store_path, dim=DIM)
    try:
        a.add("from a", embedding=np.ones(DIM))
        monkeypatch.setattr(_index, "DELTA_MIN_BASE", 10**9)
        with fastmem.open(store_path, dim=DIM) as b:  # renames a new index file in
            b.add("from b", embedding=np.ones(DIM))
        assert _slot(store_path) is None
        monkeypatch.setattr(_index, "DELTA_MIN_BASE", 1)
        a.add("from a again", embedding=np.ones(DIM))
    finally:
        a.close()  # its file is not the one under the name: a full checkpoint
    assert _header(store_path).rows == 83
    assert _view(store_path) == _rebuilt_view(store_path, tmp_path)


def test_a_delta_then_a_full_checkpoint_equals_a_rebuild(store_path, tmp_path, monkeypatch):
    ids = _build(store_path)
    with fastmem.open(store_path, dim=DIM) as store:
        store.add_many(_items(700, 6))
        store.update(ids[2], importance=0.9)
        store.forget(ids[7], erase=False)
    monkeypatch.setattr(_index, "DELTA_MIN_BASE", 10**9)
    with fastmem.open(store_path, dim=DIM) as store:
        store.checkpoint()
    ours = Path(store_path + ".idx").read_bytes()
    _rebuilt_view(store_path, tmp_path)
    theirs = (tmp_path / "rebuilt" / "s.idx").read_bytes()
    time_at = struct.calcsize(fmt.IDX_HEADER.format[: fmt.IDX_HEADER.format.index("d")])
    crc_at = fmt.IDX_HEADER_CRC_AT
    assert len(ours) == len(theirs)
    assert ours[:time_at] == theirs[:time_at] and ours[time_at + 8 : crc_at] == theirs[time_at + 8 : crc_at]
    assert ours[fmt.IDX_HEADER_SIZE :] == theirs[fmt.IDX_HEADER_SIZE :]


def test_a_delta_too_large_for_its_base_becomes_a_full_checkpoint(store_path):
    _build(store_path, n=16)
    with fastmem.open(store_path, dim=DIM) as store:
        store.add_many(_items(800, 3))  # more than an eighth of 16 rows
    assert _header(store_path).rows == 19 and _slot(store_path) is None


@pytest.mark.parametrize("fixture", ["v1", "v1-keyword"])
def test_a_version_1_index_is_read_then_replaced_by_version_2(tmp_path, fixture, monkeypatch):
    """Stores written before incremental checkpoints: ``v1`` by fastmem 0.1.0, ``v1-keyword``
    by the writer just before (index version 1 with its keyword section)."""
    monkeypatch.setattr(_index, "DELTA_SHARE", 1)  # five rows: let a delta take one more
    for name in ("store.dat", "store.idx"):
        shutil.copy(FIXTURES / fixture / name, tmp_path / name)
    path = str(tmp_path / "store")
    assert _header(path).version == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with fastmem.open(path, readonly=True) as store:
            assert store.verify().ok and len(store) == 5
        with fastmem.open(path) as store:
            store.add("a new memory", embedding=[1.0] * 8)
    assert _header(path).version == fmt.IDX_VERSION
    with fastmem.open(path) as store:
        store.add("and another", embedding=[0.5] * 8)
    assert _slot(path) is not None
    with fastmem.open(path, readonly=True) as store:
        assert len(store) == 7 and store.verify().ok
        assert [m.text for m in store.recent(2)] == ["and another", "a new memory"]


def test_damaged_changed_rows_rebuild_the_index(store_path, tmp_path):
    ids = _build(store_path)
    with fastmem.open(store_path, dim=DIM) as store:
        store.forget(ids[3], erase=False)
    slot = _slot(store_path)
    assert slot is not None
    raw = bytearray(Path(store_path + ".idx").read_bytes())
    h = fmt.unpack_delta_header(bytes(raw), slot.offset, "")
    at = slot.offset + fmt.delta_layout(h, DIM).patch_rows
    raw[at : at + 4] = struct.pack("<I", 10**6)  # a row past the index
    Path(store_path + ".idx").write_bytes(bytes(raw))
    with pytest.warns(fastmem.RecoveryWarning, match="changed rows are damaged"):
        fastmem.open(store_path, readonly=True).close()
    with pytest.warns(fastmem.RecoveryWarning):  # the writer rebuilds it
        fastmem.open(store_path, dim=DIM).close()
    assert _view(store_path) == _rebuilt_view(store_path, tmp_path)


@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=150), st.integers(0, 2**32))
def test_the_changed_rows_check_equals_numpy(values, limit):
    # A delta's changed rows: strictly increasing and below the base's row count; checked
    # in Python when there are few (a restart's usual case), by numpy when many.
    rows = np.array(values, dtype="<u4")
    want = bool(rows.max() < limit and (np.diff(rows.astype(np.int64)) > 0).all())
    assert _index._increasing_below(rows, limit) is want
    ordered = np.unique(rows)  # increasing: only the limit decides
    assert _index._increasing_below(ordered, limit) is bool(ordered[-1] < limit)


# Opens the store read-only, paused right after it mapped the index file (see below).
PAUSED_READER = r"""
import sys, fastmem, fastmem.storage.index as index
real = index.map_data
def paused(*args, **kwargs):
    mapped = real(*args, **kwargs)
    print("mapped", flush=True)
    sys.stdin.readline()
    return mapped
index.map_data = paused
with fastmem.open(sys.argv[1], readonly=True) as store:
    print(len(store), flush=True)
"""


def test_a_delta_its_slot_names_stays_when_the_last_sync_fails(store_path, monkeypatch):
    """The sync after the slot write fails: the slot (in the page cache at least) names the
    delta, so its bytes stay. Cut off, the file would end before what the slot names: a
    reader that mapped it meanwhile would die of SIGBUS reading the delta, and every later
    open would find the index damaged."""
    _build(store_path, 2400)  # a delta may hold an eighth of its base
    idx = store_path + ".idx"
    readers: list[subprocess.Popen[str]] = []
    real_sync = os.fdatasync

    def failing_sync(fd: int) -> None:
        if readers or not os.path.samestat(os.fstat(fd), os.stat(idx)) or _slot(store_path) is None:
            return real_sync(fd)
        # The slot names the new delta: a reader maps the file now, then the sync fails.
        reader = subprocess.Popen([sys.executable, "-c", PAUSED_READER, store_path], text=True,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        readers.append(reader)
        assert reader.stdout.readline() == "mapped\n", reader.stderr.read()
        raise OSError(errno.EIO, "injected: the sync after the slot write")

    writer = fastmem.open(store_path, dim=DIM)
    try:
        writer.add_many(_items(2400, 300))  # a delta of several pages
        monkeypatch.setattr(os, "fdatasync", failing_sync)
        with pytest.raises(fastmem.DurabilityError):
            writer.checkpoint()
        monkeypatch.undo()
        assert readers, "the sync after the slot write never ran"
        out, err = readers[0].communicate("\n", timeout=120)
        assert readers[0].returncode != -signal.SIGBUS, "the delta the slot names was cut"
        assert readers[0].returncode == 0, err
        assert out == "2700\n"
        assert os.path.getsize(idx) >= _slot(store_path).offset + _slot(store_path).length
    finally:
        for reader in readers:
            if reader.returncode is None:
                reader.kill()
                reader.communicate()
        try:
            writer.close()
        except fastmem.DurabilityError:
            pass


class _AdvisedMap:
    """A data file's map that records what was advised and what was read, in order."""

    def __init__(self, dat) -> None:
        self.dat, self.log = dat, []

    def madvise(self, option, start, length):
        self.log.append(("advise", option, start, start + length))
        return self.dat.madvise(option, start, length)

    def __getitem__(self, key):
        self.log.append(("read", key.start, key.stop))
        return self.dat[key]

    def __len__(self):
        return len(self.dat)


def test_the_hot_section_reads_each_record_after_asking_for_it_alone(store_path):
    """Read through the map, a record not in the page cache is read with the kernel's
    read-around (read_ahead_kb: 8 MB on this project's machines): the 128 newest memories,
    scattered through a bulk load's data file, read all of it back into memory (a close of
    a 300k store opened cold: 138-549 ms and 258 MB, against 35 ms advised)."""
    with fastmem.open(store_path, dim=DIM) as store:
        store.add_many(_items(0, 300))
        dat = _AdvisedMap(store._engine.data())
        store._engine.index._hot(dat)
    reads = [entry for entry in dat.log if entry[0] == "read"]
    assert len(reads) == fmt.HOT_MEMORIES
    advised = []
    for entry in dat.log:
        if entry[0] == "advise":
            assert entry[1] == mmap.MADV_WILLNEED and entry[2] % mmap.PAGESIZE == 0
            advised.append(entry[2:])
        else:
            assert any(a <= entry[1] and entry[2] <= b for a, b in advised)


def test_a_failed_checkpoint_leaves_no_merge_of_the_postings_running(store_path, monkeypatch):
    """A full checkpoint merges the keyword postings on the helper thread while it writes
    the rows. When a write fails first, save() must not return while that merge still runs
    on the live keyword index: the next call would change the index under it (a fault
    sweep's verify() then found the postings' offsets wrong)."""
    import threading
    import time

    from fastmem import _kernels

    started, running = threading.Event(), []
    real_merge = _kernels.merge_postings_runs

    def slow_merge(*args):
        running.append(1)
        started.set()
        time.sleep(0.3)
        try:
            return real_merge(*args)
        finally:
            running.pop()

    def failing_write(f, arr):
        started.wait(10)  # the merge is under way, on the helper thread or in this one
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with fastmem.open(store_path, dim=DIM) as store:
        ids = store.add_many(_items(0, 300))
        before = store.search("hotel budget", 5, mode="keyword")
        monkeypatch.setattr(_kernels, "merge_postings_runs", slow_merge)
        monkeypatch.setattr(_index, "_write", failing_write)
        with pytest.raises(OSError):
            store.checkpoint()
        assert running == []  # nothing of the failed checkpoint runs on after it
        monkeypatch.undo()
        assert store.search("hotel budget", 5, mode="keyword") == before
        assert [m.id for m in store] == ids
    with fastmem.open(store_path, readonly=True) as store:
        assert store.verify().ok
