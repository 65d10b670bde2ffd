"""Access statistics of several processes are never lost or counted twice, whichever write of
the index file comes between them: a bulk load's checkpoint written by a thread, another
process's checkpoint over a file that thread published, a compaction (committed, or killed
between its renames of the data file and of the index), and following another process's
compaction. The other process is a real one each time; the counts are read back from the
files by a fresh handle.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from test_erase_stale import _reordering_store, compaction_killed_in_another_process

import fastmem
from fastmem.storage import index as _index

BULK = 600  # one add_many past the tail limit below: its checkpoint is written by a thread
COMPACT_INDEX = ".idx.compact"


@pytest.fixture(autouse=True)
def backend() -> str:
    """The processes run the default kernels: one run is enough."""
    return fastmem.BACKEND


@pytest.fixture(autouse=True)
def small_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_index, "CHECKPOINT_TAIL_ROWS", 512)


# Another process: opens the store, counts ``times`` accesses to each id at ``when``, then
# checkpoints ("checkpoint") or compacts ("compact"), and closes.
_OTHER = textwrap.dedent(
    """
    import sys
    import fastmem
    path, ids, times, when, then = sys.argv[1:6]
    store = fastmem.open(path, embedder=None)
    for _ in range(int(times)):
        store.record_access(ids.split(","), now=float(when))
    getattr(store, then)()
    store.close()
    """
)


def _other(path: str, ids: list[str], times: int, when: float, then: str) -> int:
    """Run the other process to its end; its exit status."""
    env = dict(os.environ, FASTMEM_EMBEDDER="none")
    args = [sys.executable, "-c", _OTHER, path, ",".join(ids), str(times), str(when), then]
    return subprocess.run(args, check=False, env=env, timeout=120).returncode


def _stats(path: str, ids: list[str]) -> list[tuple[int, float]]:
    """(access count, last access) of each of ``ids``, as the files hold them."""
    with fastmem.open(path, embedder=None, readonly=True) as store:
        return [(store.info(m).access_count, store.info(m).last_access) for m in ids]


def _store(path: str, n: int = 20) -> list[str]:
    with fastmem.open(path, embedder=None) as store:
        return store.add_many([{"text": f"memory {i}"} for i in range(n)])


def _bulk_load_checkpointed_by_thread(store: fastmem.MemoryStore) -> None:
    """Add past the tail limit and wait until the thread has published its checkpoint
    (nothing of the store is called meanwhile: a call would take the file over)."""
    store.add_many([{"text": f"bulk {i}"} for i in range(BULK)])
    background = store._engine._background
    assert background is not None
    background.wait()
    assert background.error is None and background._written is not None  # published


def test_a_checkpoint_written_by_a_thread_keeps_another_process_counts(store_path: str) -> None:
    ids = _store(store_path)
    loader = fastmem.open(store_path, embedder=None)  # loads the index first
    loader.record_access([ids[2]], now=1500.0)
    assert _other(store_path, [ids[1]], 3, 2000.0, "checkpoint") == 0
    _bulk_load_checkpointed_by_thread(loader)
    loader.close()
    assert _stats(store_path, ids[1:3]) == [(3, 2000.0), (1, 1500.0)]


def test_a_checkpoint_over_the_published_file_counts_nothing_twice(store_path: str) -> None:
    ids = _store(store_path)
    loader = fastmem.open(store_path, embedder=None)
    loader.record_access([ids[2]], now=1500.0)
    _bulk_load_checkpointed_by_thread(loader)
    # Another process checkpoints over the file the thread published (it holds the
    # loader's access), before the loader continues on that file.
    assert _other(store_path, [ids[1]], 3, 2000.0, "checkpoint") == 0
    loader.close()
    assert _stats(store_path, ids[1:3]) == [(3, 2000.0), (1, 1500.0)]


def test_a_compaction_keeps_another_process_counts(store_path: str) -> None:
    ids = _store(store_path)
    compactor = fastmem.open(store_path, embedder=None)  # loads the index first
    compactor.record_access([ids[2]], now=1500.0)
    assert _other(store_path, [ids[1]], 3, 2000.0, "checkpoint") == 0
    compactor.compact()
    compactor.close()
    assert _stats(store_path, ids[1:3]) == [(3, 2000.0), (1, 1500.0)]


def test_following_another_process_compaction_keeps_this_process_counts(store_path: str) -> None:
    ids = _store(store_path)
    reader = fastmem.open(store_path, embedder=None)
    reader.record_access([ids[2]], now=1500.0)  # not in any file yet
    assert _other(store_path, [ids[1]], 3, 2000.0, "compact") == 0
    assert len(reader) == len(ids)  # follows the compaction
    reader.close()
    assert _stats(store_path, ids[1:3]) == [(3, 2000.0), (1, 1500.0)]


def test_a_compaction_killed_between_its_renames_loses_no_counts(tmp_path) -> None:
    """The compacting process is killed after renaming its data file into place, before its
    index (which holds its accesses): a writer open since before follows the new data file
    and checkpoints. Its checkpoint must not be made over the old data file's index (nor be
    replaced later by the compaction's): every process's counts are kept."""
    path = str(tmp_path / "store")
    first = _reordering_store(path)
    ids = sorted(m.id for m in first)
    for _ in range(5):
        first.record_access([ids[0]], now=1000.0)
    first.close()  # a checkpoint: 5 accesses of ids[0]
    writer = fastmem.open(path, embedder=None)  # loads that index
    compaction_killed_in_another_process(path, (ids[1],), 3, 2000.0)
    writer.record_access([ids[2]], now=1500.0)
    writer.checkpoint()
    # The writer held the lock: the compaction's index is in place, not waiting to be
    # renamed over what the writer wrote.
    assert not os.path.exists(path + COMPACT_INDEX)
    writer.close()
    with fastmem.open(path, embedder=None):  # a writer's open: the recovery rule, if needed
        pass
    assert _stats(path, ids[:3]) == [(5, 1000.0), (3, 2000.0), (1, 1500.0)]


def test_a_repair_keeps_the_counts(store_path: str) -> None:
    """A repair builds its index from the data file, which holds no access statistics: they
    come from the index it replaces (and another process's checkpoint since)."""
    ids = _store(store_path)
    repairer = fastmem.open(store_path, embedder=None)
    repairer.record_access([ids[2]], now=1500.0)
    assert _other(store_path, [ids[1]], 3, 2000.0, "checkpoint") == 0
    assert repairer.repair().ok
    repairer.close()
    assert _stats(store_path, ids[1:3]) == [(3, 2000.0), (1, 1500.0)]


def test_accesses_during_this_process_compaction_are_kept(
    store_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Accesses counted while this process's compaction writes its files (after its
    snapshot read the counts) are not in its new index: they stay this process's own."""
    from fastmem.storage import maintenance as _maintenance

    ids = _store(store_path)
    store = fastmem.open(store_path, embedder=None)
    store.record_access([ids[1]], now=1000.0)  # before the snapshot: in the new index
    real = _maintenance._write_index

    def write_index(*args: object, **kwargs: object) -> None:
        store.record_access([ids[1], ids[2]], now=2000.0)  # after it
        real(*args, **kwargs)

    monkeypatch.setattr(_maintenance, "_write_index", write_index)
    store.compact()
    monkeypatch.undo()
    store.close()
    assert _stats(store_path, ids[1:3]) == [(2, 2000.0), (1, 2000.0)]
