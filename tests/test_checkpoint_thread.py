"""A bulk load's checkpoints written by a thread while the load goes on (fastmem.storage.checkpoint).

The tail limit is made small here, so that a few batches of bulk size (256 items or more)
start checkpoints in the thread. Each test compares what a reader sees with the same store
rebuilt from its data file alone (tests/test_checkpoint.py's ``_view``/``_rebuilt_view``).
"""

from __future__ import annotations

import errno
import glob
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from conftest import torn_tail_allowed
from test_checkpoint import DIM, _header, _items, _rebuilt_view, _view

import fastmem
from fastmem.storage import checkpoint as _checkpoint, index as _index

BATCH = 300  # a bulk append (>= _index._BULK_ROWS)


@pytest.fixture(autouse=True)
def small_limit(monkeypatch):
    monkeypatch.setattr(_index, "CHECKPOINT_TAIL_ROWS", 512)


@pytest.fixture
def started(monkeypatch):
    """Counts the checkpoints started in a thread."""
    count = []
    real = _checkpoint.Background.__init__

    def counting(self, *args, **kwargs):
        count.append(1)
        real(self, *args, **kwargs)

    monkeypatch.setattr(_checkpoint.Background, "__init__", counting)
    return count


@pytest.fixture
def gate(monkeypatch):
    """The thread's checkpoint waits for ``gate.set()`` before it writes anything."""
    opened = threading.Event()
    real = _index.MemoryIndex.save

    def gated(self, *args, **kwargs):
        if threading.current_thread().name == "fastmem-checkpoint":
            assert opened.wait(30)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(_index.MemoryIndex, "save", gated)
    yield opened
    opened.set()


def _running(store) -> bool:
    return store._engine._background is not None and not store._engine._background.done()


def test_a_bulk_load_checkpoints_in_a_thread_and_reads_as_a_rebuild(store_path, tmp_path, started):
    with fastmem.open(store_path, dim=DIM) as store:
        ids = []
        for first in range(0, 3000, BATCH):
            ids += store.add_many(_items(first, BATCH))
        store.checkpoint()  # waits for the thread, then writes what came after
    assert len(started) >= 2  # at 512 rows, then at twice the base, ...
    assert _header(store_path).rows == 3000
    assert _view(store_path) == _rebuilt_view(store_path, tmp_path)
    with fastmem.open(store_path, readonly=True) as reader:
        assert [m.id for m in reader] == ids


def test_rows_added_beside_the_thread_are_moved_into_the_new_tail(
    store_path, tmp_path, started, gate
):
    store = fastmem.open(store_path, dim=DIM)
    ids = []
    for first in range(0, 600, BATCH):  # the second batch starts a checkpoint (600 >= 512)
        ids += store.add_many(_items(first, BATCH))
    assert started == [1] and _running(store)
    ids += store.add_many(_items(600, BATCH))  # an append runs beside the thread
    assert _running(store)  # nothing waited for it (up to twice the limit: 1024 rows)
    tail = store._engine.index.tail
    rows_after = tail.rows[600:900].copy()
    vectors_after = tail.vectors[600:900].copy()
    gate.set()
    assert store.get(ids[-1]).text == _items(600, BATCH)[-1]["text"]  # a read waits for it
    engine = store._engine
    assert engine._background is None
    assert engine.index.n_base == 600 and engine.index.tail.n == 300  # the file, then the rest
    # ... moved to the front of the same arrays (their pages are written: fastmem.storage.index_tail)
    new = engine.index.tail
    assert new.rows.ctypes.data == tail.rows.ctypes.data
    assert new.vectors.ctypes.data == tail.vectors.ctypes.data
    assert np.array_equal(new.rows[:300], rows_after)
    assert np.array_equal(new.vectors[:300], vectors_after)
    with fastmem.open(store_path, readonly=True) as reader:  # the file and the rows after it
        assert store.search("hotel budget", 5, mode="keyword") == reader.search(
            "hotel budget", 5, mode="keyword"
        )
    store.close()
    assert _view(store_path) == _rebuilt_view(store_path, tmp_path)


@pytest.mark.parametrize("change", ["forget", "update", "touch", "search", "close"])
def test_every_other_call_waits_for_the_thread_first(store_path, tmp_path, started, gate, change):
    store = fastmem.open(store_path, dim=DIM)
    ids = store.add_many(_items(0, BATCH)) + store.add_many(_items(BATCH, BATCH))
    assert _running(store)
    timer = threading.Timer(0.2, gate.set)
    timer.start()
    t0 = time.monotonic()
    if change == "forget":
        store.forget(ids[3])  # a frozen row: the thread must not write it half-changed
    elif change == "update":
        store.update(ids[4], importance=0.9, pinned=True, metadata={"k": 1})
    elif change == "touch":
        store.record_access([ids[5]])
    elif change == "search":
        store.search("hotel", 3, mode="keyword")
    else:
        store.close()
    assert time.monotonic() - t0 >= 0.15  # it waited for the thread
    store.close()
    timer.join()
    view = _view(store_path)
    assert view == _rebuilt_view(store_path, tmp_path)
    assert (ids[3] in {m.id for m in view["memories"]}) is (change != "forget")


def test_a_failed_checkpoint_in_the_thread_raises_once_and_loses_nothing(
    store_path, tmp_path, started, monkeypatch
):
    real = _index.MemoryIndex.save

    def full(self, path, *args, **kwargs):
        if threading.current_thread().name == "fastmem-checkpoint":
            with open(kwargs.get("aside") or path + ".tmp", "wb") as f:  # the file aside
                f.write(b"x" * 100)
            raise OSError(errno.ENOSPC, "injected: no space left")
        return real(self, path, *args, **kwargs)

    monkeypatch.setattr(_index.MemoryIndex, "save", full)
    store = fastmem.open(store_path, dim=DIM)
    ids = store.add_many(_items(0, BATCH)) + store.add_many(_items(BATCH, BATCH))
    store._engine._background.wait()
    with pytest.raises(fastmem.StoreFullError):
        store.add_many(_items(600, BATCH))  # raised before anything is written
    assert not glob.glob(store_path + ".idx*.tmp")  # the space is given back
    assert len(store) == 600
    monkeypatch.setattr(_index.MemoryIndex, "save", real)
    ids += store.add_many(_items(600, BATCH))  # the next limit starts another: it succeeds
    store.close()
    with fastmem.open(store_path, readonly=True) as reader:
        assert [m.id for m in reader] == ids
    assert _view(store_path) == _rebuilt_view(store_path, tmp_path)


def test_another_writer_goes_on_while_the_thread_writes_then_both_stay_correct(
    store_path, tmp_path, started, gate
):
    # The thread writes its file aside without the writer lock; it takes the lock only
    # to publish it (rename), after checking that nothing made it wrong meanwhile.
    first = fastmem.open(store_path, dim=DIM)
    second = fastmem.open(store_path, dim=DIM, timeout=0.1)
    second._engine.index.tail_limit = lambda: 1 << 20  # no checkpoint of its own here
    ids = first.add_many(_items(0, BATCH)) + first.add_many(_items(BATCH, BATCH))
    assert _running(first)
    ids += second.add_many(_items(600, 10))  # does not wait for the thread's write
    assert _running(first)
    gate.set()
    assert len(first) == 610  # waits for the thread, continues on its file, then the other's
    assert first._engine.index.n_base == 600 and _header(store_path).rows == 600  # published
    second.forget(ids[7])
    ids += first.add_many(_items(610, BATCH))
    assert ids == [f"m{i}" for i in range(910)]
    assert len(first) == 909
    first.close()
    second.close()
    view = _view(store_path)
    assert view == _rebuilt_view(store_path, tmp_path) and view["len"] == 909


@pytest.mark.parametrize("other", ["erase", "checkpoint"])
def test_a_checkpoint_made_wrong_meanwhile_is_discarded(store_path, tmp_path, started, gate, other):
    # Another process erased a frozen memory (the frozen copy still holds its row, vector
    # and terms), or checkpointed (the index file under the name is no longer the one the
    # freeze saw): the thread's file is removed, not renamed over the index.
    first = fastmem.open(store_path, dim=DIM)
    second = fastmem.open(store_path, dim=DIM)
    ids = first.add_many(_items(0, BATCH)) + first.add_many(_items(BATCH, BATCH))
    assert _running(first)
    if other == "erase":
        second.forget(ids[7])  # erases its records in place (the default)
    else:
        second.checkpoint()  # a delta or a whole index: another file under the name
    after = os.stat(store_path + ".idx")
    gate.set()
    assert len(first) == (599 if other == "erase" else 600)  # waits for the thread
    now = os.stat(store_path + ".idx")
    assert (now.st_ino, now.st_size, now.st_mtime_ns) == (after.st_ino, after.st_size, after.st_mtime_ns)
    assert not glob.glob(store_path + ".idx.*.tmp")  # its file is gone
    assert first._engine.index.n_base != 600  # nothing adopted: the index holds every row
    first.close()
    second.close()
    view = _view(store_path)
    assert view == _rebuilt_view(store_path, tmp_path)
    if other == "erase":
        assert ids[7] not in {m.id for m in view["memories"]}


# A writer in a child process: bulk batches with a small tail limit; it prints each batch's
# ids once add_many returned (acknowledged), and "thread" when a checkpoint's thread has
# written its file aside (before the rename), then waits there: the parent kills it.
KILLED_WRITER = r"""
import json, os, sys, threading, time
import numpy as np
import fastmem
from fastmem.storage import index as _index
_index.CHECKPOINT_TAIL_ROWS = 512
where = sys.argv[2]
real_replace = _index.os.replace
def published(src):  # a checkpoint's file aside renamed over the index (by the thread or the writer)
    return str(src).rsplit(".idx.", 1)[-1].endswith(".tmp") and "-" in str(src).rsplit(".idx.", 1)[-1]
def slow_replace(src, dst):
    if published(src) and where == "slow":
        os.write(1, b"thread\n")
        time.sleep(0.05)  # the thread's checkpoints take a while: the kill lands in one
    if published(src) and where == "before-rename":
        os.write(1, b"thread\n")
        time.sleep(60)
    real_replace(src, dst)
    if published(src) and where == "after-rename":
        os.write(1, b"thread\n")
        time.sleep(60)
_index.os.replace = slow_replace
rng = np.random.default_rng(0)
store = fastmem.open(sys.argv[1], dim=8, timeout=120)  # a publish paused 60 s holds the lock
for b in range(int(sys.argv[3]) if len(sys.argv) > 3 else 40):
    items = [{"text": f"batch {b} item {i}", "embedding": rng.standard_normal(8)} for i in range(300)]
    os.write(1, (json.dumps(store.add_many(items)) + "\n").encode())  # one write: whole lines
"""


def _open_after_kill(store_path) -> fastmem.MemoryStore:
    """The kill can land inside an append as well as in the thread's checkpoint."""
    with torn_tail_allowed():
        return fastmem.open(store_path, dim=8)


@pytest.mark.parametrize("where", ["before-rename", "after-rename"])
def test_a_kill_during_the_threads_checkpoint_loses_nothing_acknowledged(
    store_path, tmp_path, where, backend
):
    if backend != "cython":
        pytest.skip("the writer is another process, with the default kernels: once is enough")
    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, store_path, where],
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    acknowledged: list[str] = []
    seen_thread = False
    assert child.stdout is not None
    for line in child.stdout:
        if line == "thread\n":
            seen_thread = True
        else:
            acknowledged += json.loads(line)
        # Every batch the frozen copy holds acknowledged (the publish holds the writer lock,
        # so the batches beside it may wait for it: the kill lands in the pause).
        if seen_thread and len(acknowledged) >= 600:
            break
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    child.stdout.close()
    assert seen_thread and len(acknowledged) >= 600
    with _open_after_kill(store_path) as store:
        assert store.verify().ok
        texts = {m.id: m.text for m in store}
    for n, mid in enumerate(acknowledged):
        assert texts[mid] == f"batch {n // 300} item {n % 300}"
    assert _view(store_path) == _rebuilt_view(store_path, tmp_path)


def test_the_frozen_copy_shares_the_base_and_holds_its_own_tail(store_path):
    with fastmem.open(store_path, dim=DIM) as store:
        store.add_many(_items(0, 100))
        index = store._engine.index
        copy = _checkpoint.frozen(index)
        store.add_many(_items(100, 50))  # below the limit: no checkpoint
        assert index.tail.n == 150 and copy.tail.n == 100 and len(copy) == 100
        assert copy.keyword.tail_n == 100 and copy.keyword._pending == []
        assert np.array_equal(copy.tail.rows["id"], np.arange(100))
        assert copy.user_types is not index.user_types


def test_kills_at_random_moments_of_a_load_that_checkpoints_in_a_thread(
    store_path, tmp_path, backend
):
    """Five writers, one after another on the same store, each killed at a random moment
    of one of its checkpoints in the thread (at 600, 1,200, 2,400... rows: the thread
    pauses 50 ms before its rename), while its load goes on beside it."""
    if backend != "cython":
        pytest.skip("the writers are other processes, with the default kernels: once is enough")
    rng = np.random.default_rng(5)
    acknowledged: dict[str, str] = {}
    for _ in range(5):
        child = subprocess.Popen(
            [sys.executable, "-c", KILLED_WRITER, store_path, "slow", "300"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        lines, threads, wanted = [], 0, int(rng.integers(1, 4))
        for line in child.stdout:
            threads += line == "thread\n"
            lines.append(line)
            if threads == wanted:
                time.sleep(rng.uniform(0, 0.06))
                break
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        lines += child.stdout.read().splitlines(keepends=True)  # whole lines only
        child.stdout.close()
        assert threads == wanted
        batches = [json.loads(line) for line in lines if line != "thread\n"]
        for b, ids in enumerate(batches):
            acknowledged.update((mid, f"batch {b} item {i}") for i, mid in enumerate(ids))
    with _open_after_kill(store_path) as store:
        assert store.verify().ok
        texts = {m.id: m.text for m in store}
    assert len(acknowledged) >= 300 and all(
        texts[mid] == text for mid, text in acknowledged.items()
    )
    assert _view(store_path) == _rebuilt_view(store_path, tmp_path)


def test_a_supersedes_link_goes_into_the_checkpoint_its_add_starts(store_path, started):
    # The link changes the old memory's row in the same write as the new memory: applied
    # before the add that reaches the limit freezes the index for the thread.
    with fastmem.open(store_path, dim=DIM) as store:
        ids = store.add_many(_items(0, 511))
        assert not started
        new = store.add(
            "The user moved to Berlin.", embedding=np.ones(DIM, np.float32), supersedes=ids[0]
        )
        assert started
        store._engine.finish_checkpoint()
        assert _header(store_path).rows == 512  # the thread's checkpoint holds both
        assert store.get(ids[0]).metadata["superseded_by"] == new
    with fastmem.open(store_path, dim=DIM) as store:
        assert store.get(ids[0]).metadata["superseded_by"] == new
        assert store.verify().ok
