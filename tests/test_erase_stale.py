"""An erase must never overwrite records at offsets of another data file.

A compaction renames its new data file into place, then its index (``_maintenance._commit``).
Between the two renames (a moment; for ever if the compacting process is killed there, until
a writer next opens the store) the index under the store's name is the old data file's. A
handle following the new data file meanwhile loaded that old index: its one check (the
last record it covers is in the data file, at its offset, with its CRC) passes whenever the
compaction only reordered records (no memory dropped or changed: same size, same last
record). The handle then held the old file's offsets: its next erase wrote an erased
record over live records of the new file (found by the several-writer SIGKILL soak).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any

import pytest

import fastmem
from fastmem import _format as fmt
from fastmem.storage import index as _index, maintenance as _maintenance
from fastmem.storage.replay import session_hash

_REAL_REPLACE = os.replace


class _Killed(BaseException):
    """Stands for the SIGKILL of the compacting process (raised through every handler)."""


def _reordering_store(path: str) -> fastmem.MemoryStore:
    """A store whose compaction only reorders its records: memories of two sessions
    interleaved in time (the compaction groups them by session), nothing forgotten or
    changed; its index file covers the whole data file. The last memory added is the
    last in the compaction's order too (its session sorts last: ``session_hash``)."""
    first, last = sorted(["s0", "s1"], key=session_hash)
    store = fastmem.open(path, dim=4, embedder=None, durability="none")
    for i in range(13):
        session = last if i % 2 == 0 else first
        store.add(f"memory {i} " + "x" * (5 * i), session=session, timestamp=1e9 + i,
                  embedding=[1.0, float(i), 0.0, 0.5])  # fmt: skip
    store.checkpoint()
    return store


def _compact_killed_at_rename(store: fastmem.MemoryStore, name: str) -> None:
    """Compact ``store``, which dies (``_Killed``) at the rename of its new ``name``
    (``".dat"`` or ``".idx"``) + ``.compact`` into place, before it is renamed."""

    def replace(src: str, dst: str) -> None:
        if src.endswith(name + _maintenance.COMPACT_SUFFIX):
            raise _Killed
        _REAL_REPLACE(src, dst)

    _maintenance.os.replace = replace  # type: ignore[assignment]
    try:
        with pytest.raises(_Killed):
            store.compact()
    finally:
        _maintenance.os.replace = _REAL_REPLACE  # type: ignore[assignment]


def _compact_killed_between_renames(path: str) -> None:
    """Compact ``path`` in a handle of its own that dies right after the data file's rename,
    before the index file's: the new data file is the store's, the old index file is still
    under the store's name, the new one under ``.idx.compact``."""
    _compact_killed_at_rename(fastmem.open(path, embedder=None, durability="none"), ".idx")
    assert os.path.exists(path + ".idx" + _maintenance.COMPACT_SUFFIX)


def _texts(path: str) -> dict[str, str]:
    with fastmem.open(path, embedder=None, readonly=True) as store:
        report = store.verify()
        assert report.ok, report.problems
        return {m.id: m.text for m in store}


def test_the_old_index_is_not_taken_for_the_compacted_file(tmp_path) -> None:
    path = str(tmp_path / "store")
    writer = _reordering_store(path)
    ids = [m.id for m in writer.recent(100)]
    before = {m.id: m.text for m in writer}
    size = os.path.getsize(path + ".dat")
    _compact_killed_between_renames(path)
    assert os.path.getsize(path + ".dat") == size  # reordered only: the check cannot tell
    # The writer follows the new data file (without the lock: the compactor is gone) and
    # erases a memory the compaction moved.
    victim = sorted(ids)[2]
    writer.forget(victim)
    writer.close()
    after = _texts(path)
    assert victim not in after
    del before[victim]
    assert after == before


def test_a_reader_following_the_compaction_reads_the_new_offsets(tmp_path) -> None:
    path = str(tmp_path / "store")
    _reordering_store(path).close()
    reader = fastmem.open(path, embedder=None, readonly=True)
    before = {m.id: m.text for m in reader}
    _compact_killed_between_renames(path)
    assert {m.id: m.text for m in reader} == before  # every memory read where it is now
    reader.close()


def test_a_compaction_killed_before_its_rename_after_one_killed_between(tmp_path) -> None:
    # The first compaction leaves its index under .idx.compact; a second one, by a handle
    # open since before, must put it into place before writing its own there: killed before
    # its commit, its files are removed at the next open, and the index under the name would
    # otherwise be the first data file's.
    path = str(tmp_path / "store")
    writer = _reordering_store(path)
    before = {m.id: m.text for m in writer}
    _compact_killed_between_renames(path)
    _compact_killed_at_rename(writer, ".dat")
    try:
        with fastmem.open(path, embedder=None) as store:  # a writer's open: the recovery rule
            victim = sorted(before)[2]
            store.forget(victim)
        del before[victim]
        assert _texts(path) == before
    finally:
        writer.close()


# A compaction in a process of its own, SIGKILLed at the rename of its ``name`` + .compact
# into place; first it counts ``times`` accesses to each of ``ids`` at ``when`` (its
# compaction's index holds them).
_KILLED_COMPACTION = """
import os, signal, sys
import fastmem
path, name, ids, times, when = sys.argv[1:6]
store = fastmem.open(path, embedder=None, durability="none")
for _ in range(int(times)):
    store.record_access([i for i in ids.split(",") if i], now=float(when))
real = os.replace
def replace(src, dst):
    if src.endswith(name + ".compact"):
        os.kill(os.getpid(), signal.SIGKILL)
    real(src, dst)
os.replace = replace
store.compact()
"""


def compaction_killed_in_another_process(path: str, ids: tuple[str, ...] = (), times: int = 0,
                                         when: float = 0.0, at: str = ".idx") -> None:  # fmt: skip
    """Compact ``path`` in a process that counts accesses first (see above) and is SIGKILLed
    at the rename of its new ``at`` file (``".idx"``: between the compaction's renames, its
    index left waiting under ``.idx.compact``; ``".dat"``: before its commit, both of its
    files left beside the store's)."""
    env = dict(os.environ, FASTMEM_EMBEDDER="none")
    args = [sys.executable, "-c", _KILLED_COMPACTION, path, at, ",".join(ids), str(times)]
    args.append(str(when))
    assert subprocess.run(args, check=False, env=env, timeout=120).returncode == -signal.SIGKILL
    assert os.path.exists(path + ".idx" + _maintenance.COMPACT_SUFFIX)


def test_an_erase_after_a_compaction_killed_between_its_renames_leaves_no_trace(tmp_path) -> None:
    """The killed compaction's index, waiting under ``.idx.compact``, holds the memory (its
    row, vector and, in the hot section, its text). A writer open since before erases the
    memory: no file of the store may hold its text afterwards (that index renamed into
    place and rewritten, not left to be renamed over the erasing checkpoint later)."""
    path = str(tmp_path / "store")
    writer = _reordering_store(path)
    victim = next(m for m in writer if m.text.startswith("memory 12 "))
    compaction_killed_in_another_process(path)
    waiting = path + ".idx" + _maintenance.COMPACT_SUFFIX
    with open(waiting, "rb") as f:
        assert b"memory 12 " in f.read()
    writer.forget(victim.id)
    # (as the erase returns, before the close's checkpoint)
    traces = [f.name for f in tmp_path.iterdir() if b"memory 12 " in f.read_bytes()]
    writer.close()
    assert traces == []
    assert victim.id not in _texts(path) and len(_texts(path)) == 12


# Another process's writer: opens the store (the recovery rule renames a waiting
# .idx.compact into place), erases one memory, adds one, closes.
_ERASER = """
import sys
import fastmem
with fastmem.open(sys.argv[1], embedder=None, durability="none") as store:
    store.forget(sys.argv[2])
    store.add("added meanwhile", embedding=[0.0, 1.0, 0.0, 0.0])
"""


def test_a_reader_rebuilding_while_the_waiting_index_is_put_in_place(tmp_path, monkeypatch) -> None:
    """A reader that opens while a killed compaction's index waits under ``.idx.compact``
    builds its index from the data file, without the lock. Just as its replay starts,
    another process's writer renames that index into place, erases a memory in place and
    appends: the reader reads the erased record as forgotten, catches up with the appended
    records at its next call, and ends where a fresh reader is."""
    path = str(tmp_path / "store")
    writer = _reordering_store(path)
    victim = next(m.id for m in writer if m.text.startswith("memory 4 "))
    writer.close()
    compaction_killed_in_another_process(path)
    real_replay = _index.MemoryIndex.replay
    met: list[bool] = []

    def replay(self: Any, dat: Any, start: int, end: int, *args: Any, **kwargs: Any) -> Any:
        if not met and start == fmt.DAT_HEADER_SIZE:  # the full replay of a rebuild
            met.append(os.path.exists(path + ".idx" + _maintenance.COMPACT_SUFFIX))
            env = dict(os.environ, FASTMEM_EMBEDDER="none")
            eraser = [sys.executable, "-c", _ERASER, path, victim]
            assert subprocess.run(eraser, check=False, env=env, timeout=120).returncode == 0
            assert not os.path.exists(path + ".idx" + _maintenance.COMPACT_SUFFIX)
        return real_replay(self, dat, start, end, *args, **kwargs)

    monkeypatch.setattr(_index.MemoryIndex, "replay", replay)
    reader = fastmem.open(path, embedder=None, readonly=True)
    monkeypatch.undo()
    try:
        assert met == [True]
        texts = {m.id: m.text for m in reader}
        assert victim not in texts and "added meanwhile" in texts.values() and len(texts) == 13
        assert texts == _texts(path)  # a fresh reader's view
        assert reader.verify().ok, reader.verify().problems
    finally:
        reader.close()
